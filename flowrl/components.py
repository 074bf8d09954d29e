"""Old name of :mod:`flowrl.register_builtins` (kept for installs and plugins that name ``flowrl.components``)."""

from flowrl import register_builtins  # noqa: F401  (importing it registers every built-in part)
