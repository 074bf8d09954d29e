"""Registries: one per kind of part, each mapping a name to a component class and its config class.

A component class declares ``Config`` (an attrs class) and takes an instance of it in ``__init__``.
Lookup order: registered names, then the ``flowrl.plugins`` entry points (imported once, on the first
miss), then a dotted path ``package.module:Class``; otherwise a :class:`LookupError` with "did you mean".
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import re
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, TypeVar

import attrs

from flowrl.core.errors import UserError

KINDS = ("selector", "sampler", "advantage", "reward", "loss", "kernel", "backbone", "prompts", "suite", "judge")
PLUGIN_GROUP = "flowrl.plugins"
BUILTINS = "builtins"  # the entry point naming flowrl's own parts (pyproject.toml)
BUILTINS_MODULE = "flowrl.register_builtins"

if TYPE_CHECKING:
    from flowrl.core.interfaces import Component

C = TypeVar("C", bound="type[Component]")


class RegistryError(UserError, LookupError):
    """A name that cannot be resolved, registered twice, or a class that breaks its interface."""


class Registry:
    """Names to component classes for one kind of part (``selector``, ``kernel``, ...)."""

    def __init__(self, kind: str, interface: type) -> None:
        self.kind = kind
        self.interface = interface
        self._classes: dict[str, type] = {}

    def register(self, name: str) -> Callable[[C], C]:
        """Class decorator: register ``cls`` under ``name`` after checking it against the interface."""

        def decorate(cls: C) -> C:
            if name in self._classes:
                raise RegistryError(f"{self.kind} '{name}' is already registered by {self._classes[name]!r}")
            check_component(cls, self.interface, self.kind)
            cls.registered_name = name
            self._classes[name] = cls
            return cls

        return decorate

    def names(self) -> list[str]:
        load_plugins()
        return sorted(self._classes)

    def items(self) -> list[tuple[str, type]]:
        return [(name, self._classes[name]) for name in self.names()]

    def get(self, name: str) -> type:
        """The class for ``name``: a registered name, a plugin's name, or ``package.module:Class``."""
        if name in self._classes:
            return self._classes[name]
        load_plugins()
        if name in self._classes:
            return self._classes[name]
        if ":" in name:
            cls = _import_dotted(name)
            check_component(cls, self.interface, self.kind)
            return cls
        close = difflib.get_close_matches(name, list(self._classes), n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        if "." in name and not close:  # "pkg.module.Class": a class in a module is named with a colon
            module, _, attr = name.rpartition(".")
            hint = f"; a class in a module is named 'module:Class', did you mean '{module}:{attr}'?"
        raise RegistryError(f"unknown {self.kind} type '{name}'{hint} (flowrl ls {self.kind})")


CLASS_HOOKS = ("check_config", "check_steps")  # hooks the recipe loader calls on a part's class


def check_component(cls: type, interface: type, kind: str) -> None:
    """Raise unless ``cls`` subclasses ``interface``, has an attrs ``Config`` and implements every method."""
    if not (isinstance(cls, type) and issubclass(cls, interface)):
        raise RegistryError(f"{cls!r} is not a {interface.__name__} (required for kind '{kind}')")
    config = getattr(cls, "Config", None)
    if config is None or not attrs.has(config):
        raise RegistryError(f"{cls.__name__} must define an attrs class `Config` for its parameters")
    missing = sorted(getattr(cls, "__abstractmethods__", ()))
    if missing:
        raise RegistryError(f"{cls.__name__} does not implement {', '.join(missing)} of {interface.__name__}")
    for hook in CLASS_HOOKS:  # called on the class with the config, before any instance exists
        found = inspect.getattr_static(cls, hook, None)
        if found is not None and not isinstance(found, staticmethod | classmethod):
            raise RegistryError(
                f"{cls.__name__}.{hook} must be a @staticmethod (it is called as {hook}(config, ...) on the class,"
                " before any instance exists)"
            )


def _import_dotted(path: str) -> type:
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise RegistryError(f"cannot import '{module_name}' for '{path}': {error}") from error
    try:
        return getattr(module, attr)  # type: ignore[no-any-return]
    except AttributeError as error:
        raise RegistryError(f"module '{module_name}' has no attribute '{attr}'") from error


_plugins_loaded = False


def load_plugins() -> None:
    """Import every module named in the ``flowrl.plugins`` entry-point group: flowrl's own parts
    (``builtins``) first, then the zoo and third parties."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    points = sorted(entry_points(group=PLUGIN_GROUP), key=lambda point: point.name != BUILTINS)
    if not any(point.name == BUILTINS for point in points):
        # Run from a source tree without installing it (or with metadata older than this entry point).
        importlib.import_module(BUILTINS_MODULE)
    failed = []
    for point in points:
        try:
            point.load()
        except Exception as error:  # one broken plugin must not hide the others
            failed.append(f"plugin '{point.name}' ({point.value}) failed to import: {type(error).__name__}: {error}")
    if failed:
        raise RegistryError("; ".join(failed))


_REGISTRIES: dict[str, Registry] = {}


def registry(kind: str) -> Registry:
    """The registry of one kind."""
    if kind not in KINDS:
        raise RegistryError(f"unknown kind '{kind}'; kinds are {', '.join(KINDS)}")
    if kind not in _REGISTRIES:  # only while the package that declares the kind is half imported
        raise RegistryError(f"kind '{kind}' has no interface yet: the package that declares it is not imported")
    return _REGISTRIES[kind]


def add_kind(kind: str, interface: type) -> None:
    """Give a kind of :data:`KINDS` its interface, from the package that defines the interface (``flowrl.suites``
    declares ``suite``), so the registry imports nothing above it."""
    if kind not in KINDS:
        raise RegistryError(f"unknown kind '{kind}'; kinds are {', '.join(KINDS)}")
    known = _REGISTRIES.get(kind)
    if known is not None and known.interface is not interface:
        raise RegistryError(f"kind '{kind}' already has the interface {known.interface!r}")
    if known is None:
        _REGISTRIES[kind] = Registry(kind, interface)


def register(kind: str, name: str) -> Callable[[C], C]:
    """Decorator registering a component class: ``@register("selector", "my_selector")``."""
    return registry(kind).register(name)


def available(kind: str) -> list[str]:
    """The names a recipe can use for ``kind``."""
    return registry(kind).names()


def summary(cls: type) -> str:
    """The first sentence of a component's docstring on one line (a sentence wrapped over lines is whole)."""
    paragraph = " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())
    return re.split(r"(?<=[.!?])\s(?=[A-Z`(])", paragraph, maxsplit=1)[0]


def make_config(cls: Any, params: Mapping[str, Any]) -> Any:
    """Build ``cls.Config`` from plain parameters (validated; see :mod:`flowrl.core.convert`)."""
    from flowrl.core.convert import structure

    return structure(cls.Config, dict(params))


def build(kind: str, spec: Mapping[str, Any]) -> Any:
    """Build a component from a spec dict ``{"type": name, **params}``: ``flowrl.build("kernel", {...})``."""
    spec = dict(spec)
    if "type" not in spec:
        raise RegistryError(f"a {kind} spec needs a 'type' ({', '.join(available(kind))})")
    cls = registry(kind).get(str(spec.pop("type")))
    return cls(make_config(cls, spec))


def _init_registries() -> None:
    """The kinds whose interfaces are in :mod:`flowrl.core.interfaces` (``judge``: :mod:`flowrl.core.judges`);
    ``suite`` is added by ``flowrl.suites`` (:func:`add_kind`), which ``import flowrl`` imports."""
    from flowrl.core import interfaces as i
    from flowrl.core.judges import PairwiseJudge

    for kind, interface in (
        ("selector", i.TimestepSelector),
        ("sampler", i.RolloutSampler),
        ("advantage", i.AdvantageEstimator),
        ("reward", i.RewardModel),
        ("loss", i.Loss),
        ("kernel", i.TransitionKernel),
        ("backbone", i.Backbone),
        ("prompts", i.PromptSource),
        ("judge", PairwiseJudge),
    ):
        _REGISTRIES[kind] = Registry(kind, interface)


_init_registries()
