"""The ``flowrl`` command line."""
