"""flowrl's version (``flowrl.__version__``): the one place it is written besides pyproject.toml, importable without
importing the rest of flowrl (a node of a launch reports it before anything else loads)."""

__version__ = "0.1.0"
