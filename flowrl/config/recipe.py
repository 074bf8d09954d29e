"""Recipes: TOML files with one table per part, validated before any model loads.

Every problem is collected with its file and key path; :class:`RecipeError` prints them all.
"""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from flowrl.config.composition import composition_checks
from flowrl.config.reward_weights import Weight, parse_weight, weight_table
from flowrl.config.settings import LoraConfig, OptimConfig, ScheduleConfig, TrainerConfig
from flowrl.config.update_modes import update_checks
from flowrl.core.convert import ConfigError, structure, unstructure
from flowrl.core.errors import UserError
from flowrl.core.interfaces import ForwardProcessLoss
from flowrl.core.registry import RegistryError, registry
from flowrl.core.rng import SEED_LIMIT
from flowrl.utils.video import frame_choice_problem

# Recipe table -> registry kind; every one of these tables is required.
COMPONENT_TABLES = ("backbone", "prompts", "selector", "sampler", "kernel", "advantage", "loss")
SETTING_TABLES = {"schedule": ScheduleConfig, "optim": OptimConfig, "trainer": TrainerConfig, "lora": LoraConfig}
SCHEDULE_KEYS = ("num_steps", "shift")  # [schedule] keys; recipes before it set them in [sampler]
TOP_KEYS = ("name", "seed", "reward", *COMPONENT_TABLES, *SETTING_TABLES)


class RecipeError(UserError):
    """Problems in a recipe; ``str()`` is the report a user sees."""

    def __init__(self, source: str, problems: list[tuple[str, str]]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(self.report())

    def report(self) -> str:
        n = len(self.problems)
        head = f"recipe error: {n} problem{'s' if n != 1 else ''} in {self.source}"
        return "\n".join([head, *(f"  [{path}] {msg}" for path, msg in self.problems)])


@attrs.frozen
class Part:
    """A resolved component: its registered name, class and validated config."""

    type: str
    cls: Any  # the component class
    config: Any

    def build(self) -> Any:
        return self.cls(self.config)

    def to_table(self) -> dict[str, Any]:
        return {"type": self.type, **unstructure(self.config)}


@attrs.frozen
class RewardPart(Part):
    weight: Weight = 1.0  # a number, or a schedule over the iterations (flowrl.config.reward_weights)
    name: str = ""
    frames: Any = None  # which frames of a video clip an image reward scores (None: the default choice)

    def build(self) -> Any:
        model = self.cls(self.config)
        if self.frames is not None:
            model.frames = self.frames
        return model

    def to_table(self) -> dict[str, Any]:
        table = {"type": self.type, "weight": weight_table(self.weight), "name": self.name, **unstructure(self.config)}
        return table if self.frames is None else {**table, "frames": unstructure(self.frames)}


@attrs.frozen
class Recipe:
    """A validated recipe. ``parts`` maps each component table to its resolved :class:`Part`."""

    name: str
    seed: int
    parts: dict[str, Part]
    rewards: tuple[RewardPart, ...]
    schedule: ScheduleConfig
    optim: OptimConfig
    trainer: TrainerConfig
    lora: LoraConfig | None
    source: str = "<recipe>"

    def build(self, table: str) -> Any:
        """The part of ``table``, built. A settings problem its constructor or library finds (a ValueError
        that ``check_config`` did not foresee) becomes a :class:`RecipeError` naming the table; flowrl's own
        error types pass unchanged."""
        try:
            return self.parts[table].build()
        except ValueError as error:
            if type(error).__module__.startswith(("flowrl", "flowrl_zoo")):
                raise  # flowrl's own errors (a missing prompt file, ...) already name the file and the key
            raise RecipeError(self.source, [(table, f"cannot be built with these settings: {error}")]) from error

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"name": self.name, "seed": self.seed}
        for table in COMPONENT_TABLES:
            if table == "selector":
                data["schedule"] = unstructure(self.schedule)
            data[table] = self.parts[table].to_table()
        data["reward"] = [r.to_table() for r in self.rewards]
        data["optim"] = unstructure(self.optim)
        data["trainer"] = unstructure(self.trainer)
        if self.lora is not None:
            data["lora"] = unstructure(self.lora)
        return data

    def to_toml(self) -> str:
        from flowrl.config.tomlwrite import dumps

        return dumps(self.to_dict())


def load_recipe(path: str | Path, overrides: Sequence[str] = ()) -> Recipe:
    """Read, override (``table.key=value``) and validate a recipe file; raise :class:`RecipeError`."""
    path = Path(path)
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise RecipeError(source, [("file", "no such recipe file")]) from None
    except (OSError, UnicodeDecodeError) as error:
        raise RecipeError(source, [("file", f"cannot read: {error}")]) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise RecipeError(source, [("toml", f"syntax error: {error}")]) from None
    return recipe_from_dict(data, overrides, source)


def recipe_from_dict(data: Mapping[str, Any], overrides: Sequence[str] = (), source: str = "<recipe>") -> Recipe:
    """Validate recipe data (already parsed); collects every problem before raising."""
    data = dict(_deep_copy(data))
    problems: list[tuple[str, str]] = []
    for item in overrides:
        apply_override(data, item, problems)
    _schedule_from_sampler(data, problems)
    for key in data:
        if key not in TOP_KEYS:
            close = difflib.get_close_matches(key, TOP_KEYS, n=1)
            problems.append((key, f"unknown table or key{'; did you mean ' + repr(close[0]) + '?' if close else ''}"))
    parts: dict[str, Part] = {}
    for table in COMPONENT_TABLES:
        if table not in data:
            problems.append((table, f"missing table [{table}] (see flowrl ls {table})"))
            continue
        part = _resolve_part(table, data[table], table, problems)
        if part is not None:
            parts[table] = part
    rewards = tuple(_resolve_rewards(data.get("reward"), problems))
    settings = {k: _structure_table(cls, data.get(k, {}), k, problems) for k, cls in SETTING_TABLES.items()}
    name = data.get("name", Path(source).stem)
    seed = data.get("seed", 0)
    if not isinstance(name, str):
        problems.append(("name", f"expected a string, got {name!r}"))
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < SEED_LIMIT:
        problems.append(("seed", f"expected an integer in [0, 2**63), got {seed!r}"))
    if problems:
        raise RecipeError(source, problems)
    recipe = Recipe(
        name=name,
        seed=seed,
        parts=parts,
        rewards=rewards,
        schedule=settings["schedule"],
        optim=settings["optim"],
        trainer=settings["trainer"],
        lora=_with_base_targets(settings["lora"], parts) if "lora" in data else None,
        source=source,
    )
    problems = list(cross_checks(recipe))
    if problems:
        raise RecipeError(source, problems)
    return recipe


def _with_base_targets(lora: LoraConfig, parts: dict[str, Part]) -> LoraConfig:
    """``[lora]`` with ``target_modules`` filled in from the backbone's ``lora_targets`` when the recipe omits it
    (so the resolved recipe, validate's module check and the adapters all see one explicit list)."""
    if lora.target_modules is not None:
        return lora
    backbone = parts["backbone"]
    return attrs.evolve(lora, target_modules=tuple(backbone.cls.default_lora_targets(backbone.config)))


def _schedule_from_sampler(data: dict[str, Any], problems: list[tuple[str, str]]) -> None:
    """Recipes written before ``[schedule]`` set ``num_steps`` and ``shift`` in ``[sampler]``: move them (a run
    folder's recipe.toml from then still resumes). Set in both tables, it is a problem."""
    sampler = data.get("sampler")
    if not isinstance(sampler, Mapping) or not any(key in sampler for key in SCHEDULE_KEYS):
        return
    schedule = data.setdefault("schedule", {})
    if not isinstance(schedule, dict):
        return  # reported as a bad [schedule] table
    sampler = data["sampler"] = dict(sampler)
    for key in SCHEDULE_KEYS:
        if key not in sampler:
            continue
        if key in schedule:
            problems.append((f"sampler.{key}", f"set in [schedule] too; keep it only there (schedule.{key})"))
        else:
            schedule[key] = sampler[key]
        del sampler[key]


def offers(backbone: type, capability: type) -> bool:
    """Whether a backbone class defines every method of a capability protocol (without building it)."""
    methods = [name for name in vars(capability) if not name.startswith("_") and callable(vars(capability)[name])]
    return all(callable(getattr(backbone, name, None)) for name in methods)


def capability_checks(recipe: Recipe) -> Iterable[tuple[str, str]]:
    """Each part's ``needs_backbone`` capabilities against the recipe's backbone class."""
    backbone = recipe.parts["backbone"]
    for table, part in recipe.parts.items():
        for capability in getattr(part.cls, "needs_backbone", ()):
            if offers(backbone.cls, capability):
                continue
            able = [name for name, cls in registry("backbone").items() if offers(cls, capability)]
            yield (
                table,
                f"{table} '{part.type}' needs {capability.__name__}, which backbone '{backbone.type}' does not offer"
                f" (backbones that do: {', '.join(able) or 'none'})",
            )


def cross_checks(recipe: Recipe) -> Iterable[tuple[str, str]]:
    """Checks that span tables: group size, steps within the schedule, reward names."""
    sampler = recipe.parts["sampler"].config
    group = getattr(sampler, "group_size", None)
    if group is not None and group < 2:
        yield ("sampler.group_size", f"group-relative advantages need at least 2 rollouts per prompt, got {group}")
    steps = recipe.schedule.num_steps
    for table, part in recipe.parts.items():
        yield from ((f"{table}.{key}" if key else table, msg) for key, msg in part.cls.check_steps(part.config, steps))
    if (
        issubclass(recipe.parts["loss"].cls, ForwardProcessLoss)
        and recipe.trainer.inner_epochs > 1
    ):
        yield (
            "trainer.inner_epochs",
            "a forward-process loss takes one inner epoch (its old policy is the current one)",
        )
    if (
        issubclass(recipe.parts["loss"].cls, ForwardProcessLoss)
        and recipe.trainer.sharding != "none"
        and recipe.parts["loss"].build().lagged_decay(0) is not None
    ):
        why = f"loss {recipe.parts['loss'].type!r} keeps a lagged copy of the weights, which sharded runs lack"
        yield ("trainer.sharding", f"{why}; use 'none', or loss settings that keep no lagged copy")
    if recipe.trainer.compile != "off" and recipe.trainer.sharding != "none":
        yield ("trainer.compile", "compiling a sharded transformer is not supported here (FSDP2's per-block hooks "
                                  "are untested under torch.compile); use 'off' with sharding")
    yield from update_checks(recipe)
    yield from capability_checks(recipe)
    # what each part provides and requires of the others; the rewards too (a group-wise reward needs groups it can use)
    rewards = {f"reward[{i}]" if len(recipe.rewards) > 1 else "reward": r for i, r in enumerate(recipe.rewards)}
    yield from composition_checks({**recipe.parts, **rewards})
    for table, part in recipe.parts.items():
        yield from ((f"{table}.{key}" if key else table, msg) for key, msg in part.cls.check_config(part.config))
    for i, reward in enumerate(recipe.rewards):
        label = f"reward[{i}]" if len(recipe.rewards) > 1 else "reward"  # as the loader names it
        yield from ((f"{label}.{key}" if key else label, msg) for key, msg in reward.cls.check_config(reward.config))
    names = [r.name for r in recipe.rewards]
    for dup in sorted({n for n in names if names.count(n) > 1}):
        yield ("reward", f"two rewards are named '{dup}'; give each [[reward]] a distinct name")


def _resolve_part(table: str, spec: Any, path: str, problems: list[tuple[str, str]]) -> Part | None:
    if not isinstance(spec, dict):
        problems.append((path, f"expected a table, got {spec!r}"))
        return None
    spec = dict(spec)
    kind = "reward" if table == "reward" else table
    type_name = spec.pop("type", None)
    if not isinstance(type_name, str):
        problems.append((path, f"missing 'type' (one of: {', '.join(registry(kind).names())})"))
        return None
    try:
        cls: Any = registry(kind).get(type_name)
    except RegistryError as error:
        problems.append((path, str(error)))
        return None
    try:
        config = structure(cls.Config, spec, path)
    except ConfigError as error:
        problems.extend(error.problems)
        return None
    return Part(type=type_name, cls=cls, config=config)


def _resolve_rewards(specs: Any, problems: list[tuple[str, str]]) -> list[RewardPart]:
    if specs is None:
        problems.append(("reward", "missing [[reward]]: at least one reward is needed (flowrl ls reward)"))
        return []
    if isinstance(specs, dict):
        specs = [specs]
    rewards = []
    for i, spec in enumerate(specs):
        path = f"reward[{i}]" if len(specs) > 1 else "reward"
        if not isinstance(spec, dict):
            problems.append((path, f"expected a table, got {spec!r}"))
            continue
        spec = dict(spec)
        weight = parse_weight(spec.pop("weight", 1.0), f"{path}.weight", problems)
        name = spec.pop("name", spec.get("type", ""))
        frames = spec.pop("frames", None)
        if weight is None:
            continue
        why = frame_choice_problem(frames)
        if why is not None:
            problems.append((f"{path}.frames", why))
            continue
        part = _resolve_part("reward", spec, path, problems)
        if part is not None:
            frames = tuple(frames) if isinstance(frames, list) else frames
            rewards.append(RewardPart(part.type, part.cls, part.config, weight, str(name), frames))
    return rewards


def _structure_table(cls: type, data: Any, path: str, problems: list[tuple[str, str]]) -> Any:
    if not isinstance(data, dict):
        problems.append((path, f"expected a table, got {data!r}"))
        return cls()
    try:
        return structure(cls, data, path)
    except ConfigError as error:
        problems.extend(error.problems)
        return cls()


def apply_override(data: dict[str, Any], item: str, problems: list[tuple[str, str]]) -> None:
    """Apply one ``--set table.key=value`` to parsed recipe data in place; a malformed one adds a problem.

    The value is read as TOML (a bare word is a string); ``[[reward]]`` lists are addressed at their first
    table; a key below a plain value (``sampler.group_size.x``) is a problem, not a crash."""
    key, sep, raw = item.partition("=")
    names = key.strip().split(".")
    if not sep or not all(names):
        problems.append(("--set", f"expected table.key=value, got {item!r}"))
        return
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # a bare word is a string
    *tables, last = names
    node: Any = data
    for depth, table in enumerate(tables):
        if isinstance(node, list):  # [[reward]]: address the first table
            node = node[0] if node else {}
        node = node.setdefault(table, {})
        if not isinstance(node, dict | list) or (isinstance(node, list) and node and not isinstance(node[0], dict)):
            where = ".".join(tables[: depth + 1])
            problems.append(("--set", f"{where} is a value ({node!r}), not a table, so {key.strip()} cannot be set"))
            return
    if isinstance(node, list):
        node = node[0] if node else {}
    node[last] = value


def _deep_copy(data: Any) -> Any:
    if isinstance(data, Mapping):
        return {k: _deep_copy(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_deep_copy(v) for v in data]
    return data
