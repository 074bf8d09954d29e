"""The top level names the architecture: a few packages in layers, each importing only the ones below it, and the
module paths from before the grouping still importing (docs/concepts.md, "Where things live")."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from test_layout import _imports

import flowrl
from flowrl import _moved

# each package, and what it may import of flowrl besides itself
LAYERS = {
    "flowrl.core": (),
    "flowrl.utils": ("flowrl.core",),
    "flowrl.config": ("flowrl.core", "flowrl.utils"),
    "flowrl.parts": ("flowrl.core", "flowrl.utils", "flowrl.config"),
}
TOP_LEVEL = {"__init__.py", "_moved.py", "register_builtins.py"}


def _modules() -> dict[str, Path]:
    return {
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
        for p in (ROOT / "flowrl").rglob("*.py")
    }


def test_each_lower_package_imports_only_the_layers_below_it() -> None:
    modules = _modules()
    wrong = []
    for module, path in modules.items():
        for package, below in LAYERS.items():
            if module == package or module.startswith(package + "."):
                allowed = (package, *below)
                wrong += [f"{module} -> {dep}" for dep in sorted(_imports(path, module, set(modules)))
                          if not any(dep == a or dep.startswith(a + ".") for a in allowed)]
    assert len(modules) > 50  # the walk found the modules
    assert not wrong, "imports across the layers:\n" + "\n".join(wrong)


def test_the_top_level_holds_packages_only() -> None:
    """A new module goes into the package of its concept; the three files left are the package's own, the old
    paths' finder and the built-in plugin (it imports every package, so it sits above them all)."""
    files = {p.name for p in (ROOT / "flowrl").glob("*.py")}
    assert files == TOP_LEVEL, f"modules at the top of flowrl/: {sorted(files - TOP_LEVEL)}"


@pytest.mark.parametrize("old", sorted(_moved.MOVED))
def test_an_old_module_path_imports_the_new_module_itself(old: str) -> None:
    new = _moved.MOVED[old]
    assert importlib.import_module(old) is importlib.import_module(new)
    assert old not in {m.__name__ for m in sys.modules.values() if hasattr(m, "__name__")} - {new}
    assert not (ROOT / (old.replace(".", "/") + ".py")).exists()  # the old file is gone: one home per module


def test_importing_every_old_path_leaves_flowrls_exports_as_they_were() -> None:
    """``flowrl.registry`` is both an old module path and the exported function: importing the path must not bind
    the module over the function (the import system sets a submodule on its parent when it first loads it)."""
    before = {name: getattr(flowrl, name) for name in flowrl.__all__}
    for old in sorted(_moved.MOVED):
        importlib.import_module(old)
    changed = sorted(name for name in flowrl.__all__ if getattr(flowrl, name) is not before[name])
    assert not changed, f"importing an old path rebound flowrl's exports: {changed}"
    assert callable(flowrl.registry) and flowrl.registry("sampler").get("independent") is not None


def test_old_paths_reach_submodules_and_attributes_and_nothing_else() -> None:
    walk = importlib.import_module("flowrl.samplers.walk")
    assert walk is importlib.import_module("flowrl.parts.samplers.walk")
    from flowrl import selectors  # type: ignore[attr-defined]
    from flowrl.config import structure
    from flowrl.core.convert import structure as converter

    assert selectors is importlib.import_module("flowrl.parts.selectors")
    assert structure is converter  # flowrl.config was the converter: its names stay importable there
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("flowrl.no_such_module")
    with pytest.raises(AttributeError, match="no_such_name"):
        flowrl.no_such_name  # noqa: B018
