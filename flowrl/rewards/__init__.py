"""Built-in reward models."""
