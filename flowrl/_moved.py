"""The import paths from before flowrl's top level was grouped into packages keep working: ``flowrl.selectors``
is :mod:`flowrl.parts.selectors`, ``flowrl.samplers.walk`` is :mod:`flowrl.parts.samplers.walk`, and so on
(docs/concepts.md, "Where things live"). A plugin, a notebook or a pickle that names an old path gets the very
module object of the new one, imported through :class:`MovedFinder`; nothing is imported before it is asked for."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

_GROUPS = {
    "core": ("interfaces", "types", "extras", "contracts", "conditions", "errors", "levels", "rng", "schedule",
             "registry", "choices"),
    "config": ("recipe", "settings", "composition", "condition_checks", "part_docs", "tomlwrite", "update_modes"),
    "parts": ("selectors", "kernels", "advantages", "losses", "prompts", "entropy", "samplers"),
    "evaluation": ("evaluate", "profile"),
    "export": ("loading",),
    "utils": ("jsonl", "quiet", "finite", "video", "cluster", "lr_schedule"),
}
MOVED = {f"flowrl.{name}": f"flowrl.{group}.{name}" for group, names in _GROUPS.items() for name in names}
MOVED["flowrl.components"] = "flowrl.register_builtins"  # its name before it was renamed
MOVED["flowrl.export.manifest"] = "flowrl.trainer.checkpoints.manifest"  # a checkpoint folder's kin, read by both
# ``flowrl.config`` is now the recipes' package; the settings converter it was re-exports its names from there


def new_name(old: str) -> str | None:
    """The module an old import path names now (a moved package's submodules included), or None."""
    for before, after in MOVED.items():
        if old == before or old.startswith(before + "."):
            return after + old[len(before):]
    return None


class _Alias(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        # the import system hands the caller whatever sys.modules holds under the old name once this returns
        sys.modules[module.__name__] = importlib.import_module(self.target)


class MovedFinder(importlib.abc.MetaPathFinder):
    """Finds an old import path and loads it as its new module."""

    def find_spec(self, fullname: str, path: Any = None, target: ModuleType | None = None) -> ModuleSpec | None:
        new = new_name(fullname)
        return importlib.util.spec_from_loader(fullname, _Alias(new)) if new is not None else None


def install() -> None:
    if not any(isinstance(finder, MovedFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedFinder())


install()  # importing flowrl imports this module first


def keep_exports(package: dict[str, Any]) -> None:
    """Where an old module path's last name is also one of ``flowrl``'s exports (``flowrl.registry`` the module,
    ``flowrl.registry`` the function), enter the module under the old path now: importing it later would bind the
    module over the export (the import system sets a new submodule as an attribute of its parent)."""
    for old, new in MOVED.items():
        name = old.removeprefix("flowrl.")
        if "." not in name and name in package and not isinstance(package[name], ModuleType):
            sys.modules.setdefault(old, importlib.import_module(new))


def attribute(name: str) -> ModuleType:
    """``flowrl.<name>`` for a moved module (``from flowrl import selectors``); AttributeError otherwise."""
    new = new_name(f"flowrl.{name}")
    if new is None:
        raise AttributeError(f"module 'flowrl' has no attribute '{name}'")
    return importlib.import_module(new)
