"""The prompt grammar of the embedded world: coloured shapes, counts and spatial relations.

Prompts (all lowercase, single spaces)::

    prompt   := group                     "a red circle", "two blue squares"     (kinds single, count)
              | group "and" group         "a red circle and a blue square"       (kind pair)
              | group RELATION group      "a blue square left of a yellow triangle" (kind relation)
    group    := "a" COLOUR SHAPE | ("two" | "three") COLOUR SHAPE "s"
    RELATION := "left of" | "right of" | "above" | "below"

Two-group prompts use single objects ("a ...") with distinct (colour, shape) pairs.

Splits: :data:`HELDOUT_PAIRS` holds six (colour, shape) pairs, one per colour, chosen so every shape is
held out for exactly two colours (colour ``i`` of :data:`COLOUR_NAMES` loses shape ``i % 3``). Every scene
using one of them is in the ``"novel"`` split (novel compositions of known words: every colour and shape
word still occurs elsewhere). The other scenes are divided, kind by kind and by a fixed permutation, into
``"train"`` (the prompts reinforcement learning trains on) and ``"test"`` (the primary evaluation, like
GenEval's: the same vocabulary and colour-shape pairs in other scenes). Pre-training sees train and test
scenes (:data:`PRETRAIN_SPLITS`), never novel ones.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable, Sequence
from typing import Literal

import attrs
import numpy as np

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (225, 35, 35),
    "green": (25, 195, 40),
    "blue": (35, 65, 235),
    "yellow": (240, 220, 35),
    "magenta": (210, 40, 215),
    "cyan": (35, 210, 215),
}
COLOUR_NAMES: tuple[str, ...] = tuple(COLOURS)
SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
RELATIONS: tuple[str, ...] = ("left of", "right of", "above", "below")
# relation -> (axis: 0 = x / 1 = y, sign): it holds when sign * (object - subject) along axis is > 0.
RELATION_AXES: dict[str, tuple[int, int]] = {
    "left of": (0, 1),
    "right of": (0, -1),
    "above": (1, 1),
    "below": (1, -1),
}
COUNT_WORDS: dict[int, str] = {1: "a", 2: "two", 3: "three"}
KINDS: tuple[str, ...] = ("single", "count", "pair", "relation")
SPLITS: tuple[str, ...] = ("train", "test", "novel")
EvalSplit = Literal["test", "novel", "train"]  # a prompt source's `eval_split` setting: SPLITS, the default first
PRETRAIN_SPLITS: tuple[str, ...] = ("train", "test")  # what the base model is pre-trained on
TEST_SEED = 20261201  # fixes the train / test division

ALL_PAIRS: tuple[tuple[str, str], ...] = tuple(itertools.product(COLOUR_NAMES, SHAPES))
HELDOUT_PAIRS: frozenset[tuple[str, str]] = frozenset(
    (colour, SHAPES[i % len(SHAPES)]) for i, colour in enumerate(COLOUR_NAMES)
)
TRAIN_PAIRS: tuple[tuple[str, str], ...] = tuple(p for p in ALL_PAIRS if p not in HELDOUT_PAIRS)


@attrs.frozen
class ObjectGroup:
    """``count`` objects of one colour and shape."""

    colour: str = attrs.field(validator=attrs.validators.in_(COLOUR_NAMES))
    shape: str = attrs.field(validator=attrs.validators.in_(SHAPES))
    count: int = attrs.field(default=1, validator=attrs.validators.in_(tuple(COUNT_WORDS)))

    @property
    def pair(self) -> tuple[str, str]:
        return (self.colour, self.shape)

    @property
    def text(self) -> str:
        noun = self.shape if self.count == 1 else self.shape + "s"
        return f"{COUNT_WORDS[self.count]} {self.colour} {noun}"


@attrs.frozen
class Relation:
    """``groups[subject]`` stands in ``relation`` to ``groups[object]``."""

    subject: int
    relation: str = attrs.field(validator=attrs.validators.in_(RELATIONS))
    object: int


def _as_groups(groups: Iterable[ObjectGroup]) -> tuple[ObjectGroup, ...]:
    return tuple(groups)


@attrs.frozen
class Scene:
    """The constraints of one prompt: object groups and an optional relation between groups 0 and 1."""

    groups: tuple[ObjectGroup, ...] = attrs.field(converter=_as_groups)
    relation: Relation | None = None

    def __attrs_post_init__(self) -> None:
        n = len(self.groups)
        if n not in (1, 2):
            raise ValueError(f"a scene has 1 or 2 object groups, got {n}")
        if n == 2:
            if any(g.count != 1 for g in self.groups):
                raise ValueError("two-group prompts use single objects ('a ...')")
            if self.groups[0].pair == self.groups[1].pair:
                raise ValueError(f"the two groups must differ, both are {self.groups[0].text!r}")
        if self.relation is not None and (n != 2 or (self.relation.subject, self.relation.object) != (0, 1)):
            raise ValueError("a relation needs two groups, subject 0 and object 1")

    @property
    def kind(self) -> str:
        """One of :data:`KINDS`."""
        if self.relation is not None:
            return "relation"
        if len(self.groups) == 2:
            return "pair"
        return "count" if self.groups[0].count > 1 else "single"

    @property
    def num_objects(self) -> int:
        return sum(g.count for g in self.groups)

    @property
    def text(self) -> str:
        """The canonical English prompt (inverted exactly by :func:`parse`)."""
        if len(self.groups) == 1:
            return self.groups[0].text
        joiner = "and" if self.relation is None else self.relation.relation
        return f"{self.groups[0].text} {joiner} {self.groups[1].text}"


def _parse_group(words: list[str], i: int, text: str) -> tuple[ObjectGroup, int]:
    """Parse ``COUNT COLOUR SHAPE`` at ``words[i:]``; return the group and the next index."""
    if len(words) < i + 3:
        raise ValueError(f"prompt {text!r}: expected 'COUNT COLOUR SHAPE' at word {i + 1}")
    count_word, colour, noun = words[i : i + 3]
    counts = {w: c for c, w in COUNT_WORDS.items()}
    if count_word not in counts:
        raise ValueError(
            f"prompt {text!r}: unknown count word {count_word!r} (expected one of {list(counts)})"
        )
    if colour not in COLOURS:
        raise ValueError(f"prompt {text!r}: unknown colour {colour!r} (expected one of {list(COLOUR_NAMES)})")
    count = counts[count_word]
    shape = noun if count == 1 else noun.removesuffix("s")
    if shape not in SHAPES or (count > 1 and not noun.endswith("s")):
        form = "singular" if count == 1 else "plural"
        raise ValueError(f"prompt {text!r}: expected a {form} shape noun, got {noun!r}")
    return ObjectGroup(colour, shape, count), i + 3


def parse(text: str) -> Scene:
    """Invert :attr:`Scene.text`; raise ``ValueError`` on text outside the grammar."""
    words = text.split()
    if not words:
        raise ValueError("empty prompt")
    first, i = _parse_group(words, 0, text)
    if i == len(words):
        return Scene((first,))
    joiners = {"and": None, **{r: r for r in RELATIONS}}
    for joiner, relation in joiners.items():
        jw = joiner.split()
        if words[i : i + len(jw)] == jw:
            second, end = _parse_group(words, i + len(jw), text)
            if end != len(words):
                raise ValueError(f"prompt {text!r}: unexpected words after the second object")
            rel = None if relation is None else Relation(0, relation, 1)
            try:
                return Scene((first, second), rel)
            except ValueError as err:
                raise ValueError(f"prompt {text!r}: {err}") from None
    raise ValueError(f"prompt {text!r}: expected 'and' or a relation {list(RELATIONS)} after {first.text!r}")


def _all_scenes() -> list[Scene]:
    """Every scene of the grammar, in a fixed order."""
    scenes = [Scene((ObjectGroup(c, s, n),)) for c, s in ALL_PAIRS for n in COUNT_WORDS]
    for a, b in itertools.permutations(ALL_PAIRS, 2):
        groups = (ObjectGroup(*a), ObjectGroup(*b))
        scenes.append(Scene(groups))
        scenes.extend(Scene(groups, Relation(0, r, 1)) for r in RELATIONS)
    return scenes


@functools.cache
def _test_scenes() -> frozenset[Scene]:
    """The test split: of each kind's non-novel scenes, the first half of a fixed permutation."""
    rng = np.random.default_rng(TEST_SEED)
    seen = [s for s in _all_scenes() if not _is_novel(s)]
    test: set[Scene] = set()
    for kind in KINDS:
        of_kind = [s for s in seen if s.kind == kind]
        order = rng.permutation(len(of_kind))
        test.update(of_kind[int(i)] for i in order[: len(of_kind) // 2])
    return frozenset(test)


def _is_novel(scene: Scene) -> bool:
    return any(g.pair in HELDOUT_PAIRS for g in scene.groups)


def scene_split(scene: Scene) -> str:
    """``"novel"`` if the scene uses a held-out (colour, shape) pair, else ``"test"`` or ``"train"``."""
    if _is_novel(scene):
        return "novel"
    return "test" if scene in _test_scenes() else "train"


def _splits(split: str | Sequence[str]) -> tuple[str, ...]:
    names = (split,) if isinstance(split, str) else tuple(split)
    for name in names:
        if name not in SPLITS:
            raise ValueError(f"unknown split {name!r}; expected one of {SPLITS}")
    return names


@functools.cache
def _enumerate(splits: tuple[str, ...]) -> tuple[Scene, ...]:
    return tuple(s for s in _all_scenes() if scene_split(s) in splits)


def enumerate_scenes(split: str | Sequence[str]) -> list[Scene]:
    """Every scene of a split (or of several), in a fixed order."""
    return list(_enumerate(_splits(split)))


def _by_kind(split: str | Sequence[str], kinds: Sequence[str]) -> dict[str, list[Scene]]:
    if not kinds or any(k not in KINDS for k in kinds):
        raise ValueError(f"kinds must be a non-empty subset of {KINDS}, got {kinds!r}")
    scenes = enumerate_scenes(split)
    return {k: [s for s in scenes if s.kind == k] for k in dict.fromkeys(kinds)}


def _compose(rng: np.random.Generator, kind: str, novel: bool) -> Scene:
    """One random scene of ``kind``: from train pairs only, or (``novel``) with a held-out pair in it."""
    held = sorted(HELDOUT_PAIRS)

    def pick(pool: Sequence[tuple[str, str]]) -> tuple[str, str]:
        return pool[int(rng.integers(len(pool)))]

    if kind in ("single", "count"):
        count = 1 if kind == "single" else int(rng.integers(2, 4))
        return Scene((ObjectGroup(*pick(held if novel else TRAIN_PAIRS), count),))
    if not novel:
        first = pick(TRAIN_PAIRS)
        second = pick([p for p in TRAIN_PAIRS if p != first])
    else:  # one held-out pair in a random position, the other from anywhere
        first = pick(held)
        second = pick([p for p in ALL_PAIRS if p != first])
        if rng.random() < 0.5:
            first, second = second, first
    rel = None if kind == "pair" else Relation(0, RELATIONS[int(rng.integers(len(RELATIONS)))], 1)
    return Scene((ObjectGroup(*first), ObjectGroup(*second)), rel)


def sample_scenes(split: str | Sequence[str], n: int, seed: int, kinds: Sequence[str] = KINDS) -> list[Scene]:
    """``n`` scenes of ``split`` (or of several splits), kinds drawn uniformly from ``kinds``; deterministic
    given ``seed``. Scenes are composed from random colour-shape pairs (with a held-out pair for ``novel``)
    and those outside the requested splits are drawn again."""
    names = _splits(split)
    _by_kind(names, kinds)  # checks the kinds
    if "novel" in names and len(names) > 1:
        raise ValueError(f"sample novel scenes on their own, not with {[s for s in names if s != 'novel']}")
    rng = np.random.default_rng(seed)
    scenes: list[Scene] = []
    while len(scenes) < n:
        scene = _compose(rng, kinds[int(rng.integers(len(kinds)))], novel=names == ("novel",))
        if scene_split(scene) in names:
            scenes.append(scene)
    return scenes


def balanced_scenes(split: str, n: int, seed: int, kinds: Sequence[str] = KINDS) -> list[Scene]:
    """``n`` evaluation scenes of ``split``, the kinds taking turns (so any prefix is balanced too); each
    kind cycles through its scenes in a seeded order, so every scene appears before any repeats."""
    pools = list(_by_kind(split, kinds).values())
    rng = np.random.default_rng(seed)
    orders = [rng.permutation(len(pool)) for pool in pools]
    out: list[Scene] = []
    for i in range(n):
        k, j = i % len(pools), i // len(pools)
        out.append(pools[k][int(orders[k][j % len(pools[k])])])
    return out


def vocabulary() -> list[str]:
    """Every word that can appear in a prompt, sorted."""
    words = set(COUNT_WORDS.values()) | set(COLOUR_NAMES) | set(SHAPES) | {s + "s" for s in SHAPES}
    words |= {"and"} | {w for r in RELATIONS for w in r.split()}
    return sorted(words)


def max_prompt_words() -> int:
    """The most words any prompt has (two groups of three words around the longest joiner)."""
    return 6 + max(len(j.split()) for j in ("and", *RELATIONS))
