"""The house rules that code review alone would let slip: file sizes and the core never importing the zoo."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

MAX_LINES = 500  # one concept per file
# the loop reads top to bottom, one statement a line; its phases' details live in flowrl/trainer/*
MAX_LOOP_LINES = 300
MAX_INIT_LINES = 45  # Trainer.__init__ on one screen: named build steps, each part's details in its own module


def test_no_source_file_passes_500_lines() -> None:
    sources = sorted((ROOT / "flowrl").rglob("*.py")) + sorted((ROOT / "zoo").rglob("*.py"))
    assert len(sources) > 50  # the walk found the packages
    long = {str(p.relative_to(ROOT)): n for p in sources if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these files (over {MAX_LINES} lines): {long}"


def test_the_loop_stays_readable() -> None:
    n = len((ROOT / "flowrl" / "trainer" / "loop.py").read_text().splitlines())
    assert n <= MAX_LOOP_LINES, f"flowrl/trainer/loop.py has {n} lines; move a phase's details out of it"
    tree = ast.parse((ROOT / "flowrl" / "trainer" / "loop.py").read_text())
    trainer = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Trainer")
    init = next(node for node in trainer.body if isinstance(node, ast.FunctionDef) and node.name == "__init__")
    lines = (init.end_lineno or 0) - init.lineno + 1
    assert lines <= MAX_INIT_LINES, f"Trainer.__init__ has {lines} lines; build a group of parts in a named step"


def test_importing_every_core_module_leaves_the_zoo_unimported() -> None:
    # In a fresh interpreter: the test session itself has imported the zoo long ago.
    code = (
        "import importlib, pkgutil, sys\n"
        "import flowrl\n"
        "names = [m.name for m in pkgutil.walk_packages(flowrl.__path__, 'flowrl.')]\n"
        "for name in names:\n"
        "    importlib.import_module(name)\n"
        "zoo = sorted(m for m in sys.modules if m.split('.')[0] == 'flowrl_zoo')\n"
        "print(len(names), zoo)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    count, zoo = out.stdout.strip().split(" ", 1)
    assert int(count) > 50
    assert zoo == "[]", f"core modules imported the zoo: {zoo}"


def test_the_core_sets_no_attribute_its_types_do_not_declare() -> None:
    """`type: ignore[attr-defined]` in the core means an attribute assigned from outside its class: declare it."""
    sources = sorted((ROOT / "flowrl").rglob("*.py"))
    found = [f"{p.relative_to(ROOT)}:{n}" for p in sources for n, line in enumerate(p.read_text().splitlines(), 1)
             if "type: ignore[attr-defined]" in line]
    assert not found, found


def test_validating_a_recipe_imports_no_model_library() -> None:
    """`flowrl validate` checks every part's settings without diffusers, transformers or peft (seconds, not tens)."""
    code = (
        "import sys\n"
        "from flowrl.cli.main import parser\n"
        "from flowrl.config.recipe import load_recipe\n"
        "parser()\n"
        "for name in ('egrpo', 'aegpo', 'diffusion_nft', 'branch_grpo'):\n"
        "    load_recipe(f'recipes/{name}.toml')\n"
        "print(sorted(m for m in ('diffusers', 'transformers', 'peft', 'accelerate') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]", out.stdout


def _imports(path: Path, module: str, modules: set[str]) -> set[str]:
    """The flowrl modules ``module`` imports anywhere in its body, function-local and ``if TYPE_CHECKING:`` imports
    included (a type-only import still ties two files together)."""
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            base = ".".join(parts[: len(parts) - node.level + 1] + [node.module or ""]) if node.level else node.module
            base = (base or "").strip(".")
            submodules = {f"{base}.{a.name}" for a in node.names} & modules
            found |= submodules
            if base in modules and len(submodules) < len(node.names):
                found.add(base)
    return found - {module}


def test_no_import_cycle_among_core_modules() -> None:
    """Function-local and type-only imports count too: a cycle hidden in a function or behind TYPE_CHECKING is
    still two files that need each other."""
    paths = {
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
        for p in (ROOT / "flowrl").rglob("*.py")
    }
    graph = {m: _imports(p, m, set(paths)) for m, p in paths.items()}
    assert sum(map(len, graph.values())) > 100  # the walk saw the imports
    cycles = []
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        for dep in sorted(graph[module]):
            if dep in path:
                cycles.append(" -> ".join([*path[path.index(dep) :], dep]))
            elif dep not in done:
                visit(dep, [*path, dep])
        done.add(module)

    for module in sorted(graph):
        if module not in done:
            visit(module, [module])
    assert not cycles, "import cycles among flowrl modules:\n" + "\n".join(sorted(set(cycles))[:10])


def test_every_error_the_user_must_fix_is_a_user_error() -> None:
    """The command line prints a UserError on one line with exit status 2; any other exception is internal and
    keeps its traceback. An error class defined in flowrl is one or the other, on purpose."""
    import importlib
    import inspect
    import pkgutil

    import flowrl
    from flowrl.core.errors import UserError

    internal = {"PlanError", "ConformanceError"}  # a part's bug: the traceback is what its author needs
    found: dict[str, bool] = {}
    for info in pkgutil.walk_packages(flowrl.__path__, "flowrl."):
        module = importlib.import_module(info.name)
        for name, cls in vars(module).items():
            if inspect.isclass(cls) and issubclass(cls, Exception) and cls.__module__ == info.name and name[0] != "_":
                found[name] = issubclass(cls, UserError)
    assert len(found) >= 12, found
    assert {name for name, user in found.items() if not user} == internal, found


# A package never imports the packages that load it: the command line loads the bench's and pretraining's
# commands, and the bench's reports sit beside the run report, which must not need the bench. The registry sits
# below every part (the suites give their kind its interface themselves), and the checkpoint package saves the
# trained policy, so the policy never imports it (what both need to put loaded state in place is in state_io).
_NEVER_UPWARD = {
    "flowrl.bench": ("flowrl.cli",), "flowrl.pretrain": ("flowrl.cli",), "flowrl.serve": ("flowrl.cli",),
    "flowrl.suites": ("flowrl.cli",), "flowrl.report": ("flowrl.bench",),
    "flowrl.core.registry": ("flowrl.suites",), "flowrl.trainer.policy": ("flowrl.trainer.checkpoints",),
    "flowrl.trainer.state_io": ("flowrl.trainer.checkpoints", "flowrl.trainer.policy"),
}


def test_no_package_imports_the_one_above_it() -> None:
    paths = {
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
        for p in (ROOT / "flowrl").rglob("*.py")
    }
    upward = []
    for module, path in paths.items():
        for package, above in _NEVER_UPWARD.items():
            if module == package or module.startswith(package + "."):
                upward += [f"{module} -> {dep}" for dep in sorted(_imports(path, module, set(paths)))
                           if any(dep == a or dep.startswith(a + ".") for a in above)]
    assert len(paths) > 50  # the walk found the modules
    assert not upward, "imports up the layers:\n" + "\n".join(upward)


MODEL_LIBRARIES = ("diffusers", "transformers", "peft", "accelerate", "tokenizers")
BASES = ("flux", "flux2", "sd3", "qwen_image", "wan")


def _module_level_imports(path: Path) -> set[str]:
    """The top-level packages a module imports at module level (not inside a function or class)."""
    found: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return found


def test_each_base_is_a_package_whose_probe_never_imports_its_adapter() -> None:
    """docs/backbones.md: a base is ``flowrl/backbones/<base>/`` with ``adapter.py`` and ``tiny.py`` (and ``probe.py``
    where it has AEGPO's probe); the adapter calls the probe, never the other way round, and a base's files import
    no other base (what they share lives in ``common/`` and ``lora/``)."""
    folder = ROOT / "flowrl" / "backbones"
    modules = {
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
        for p in (ROOT / "flowrl").rglob("*.py")
    }
    assert sorted(p.name for p in folder.iterdir() if p.is_dir() and p.name != "__pycache__") == sorted(
        (*BASES, "common", "lora")
    )
    wrong = []
    for base in BASES:
        assert (folder / base / "adapter.py").is_file() and (folder / base / "tiny.py").is_file(), base
        for path in sorted((folder / base).glob("*.py")):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            for dep in sorted(_imports(path, module, set(modules))):
                other_base = dep.startswith("flowrl.backbones.") and dep.split(".")[2] not in (base, "common", "lora")
                adapter_from_probe = path.name == "probe.py" and dep == f"flowrl.backbones.{base}.adapter"
                if other_base or adapter_from_probe:
                    wrong.append(f"{module} -> {dep}")
    for path in sorted((folder / "common").glob("*.py")) + sorted((folder / "lora").glob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        wrong += [f"{module} -> {dep}" for dep in sorted(_imports(path, module, set(modules)))
                  if dep.startswith("flowrl.backbones.") and dep.split(".")[2] in BASES]
    assert not wrong, "imports across the backbone packages:\n" + "\n".join(wrong)


def test_only_probes_and_tokenizers_import_model_libraries_at_module_level() -> None:
    """Adapters, twins and the shared modules import diffusers and transformers inside the functions that build or
    load models, so registering every base (and so ``flowrl validate``) stays model-free; a probe subclasses diffusers'
    processors and a twin's tokenizer builds on ``tokenizers``, and only the adapter's probe call or a twin's
    builder imports them."""
    sources = sorted((ROOT / "flowrl" / "backbones").rglob("*.py"))
    assert len(sources) > 25  # the walk found the packages
    eager = {
        str(p.relative_to(ROOT)): sorted(libraries)
        for p in sources
        if p.name not in ("probe.py", "tokenizer.py") and (libraries := _module_level_imports(p) & set(MODEL_LIBRARIES))
    }
    assert not eager, f"model libraries imported at module level: {eager}"



# A file name says one concept: two modules named alike for two things sent readers to the wrong one (issue 65).
# An old public path kept as a re-export of the renamed module is not a second module of that name.
_ONCE_CLASHED = (  # two files of one name for two concepts, each pair renamed once
    ("flowrl/reference.py", "flowrl/trainer/reference.py"),
    ("flowrl/errors.py", "flowrl/trainer/errors.py"),
    ("flowrl/components.py", "flowrl/world/components.py"),
    ("flowrl/bench/errors.py", "flowrl/core/errors.py"),
)


def test_no_two_core_modules_share_a_name_that_once_clashed() -> None:
    clashes = [pair for pair in _ONCE_CLASHED if all((ROOT / p).is_file() for p in pair)]
    assert not clashes, f"two modules of one name for two concepts: {clashes}"
