"""The edit grammar of the embedded world: a source scene, an instruction, and the target scene it implies.

Instructions (all lowercase, single spaces; ``REF`` is a group without its article, "red circle" or "two red
circles")::

    instruction := "make the" REF COLOUR                  "make the red circle green"               (recolour)
                 | "add" OBJECT RELATION "the" REF        "add a blue square left of the red circle" (add)
                 | "remove the" REF                       "remove the blue square"                  (remove)
                 | "make it" GROUP                        "make it three red circles"               (count)
                 | "move the" REF RELATION "the" REF      "move the red circle above the blue square" (move)

Each edit kind acts on source scenes of the text-to-image grammar (:mod:`flowrl.world.grammar`) and its target
is a scene of that grammar too:

- ``recolour``: any source; one group takes another colour (the target's two groups must still differ).
- ``add``: a single object; a new single object is added in a relation to it (the target is a relation scene).
- ``remove``: a scene of two groups (pair or relation); one of them is removed.
- ``count``: a single group (one to three objects); its count changes.
- ``move``: a relation scene; one object moves to a side of the other at right angles to where it was ("left of"
  becomes "above" or "below"). Moving to the opposite side does not fit on the world's board (a 4 x 4 grid of
  object cells with a free cell between objects), so the grammar asks for the moves every board can draw.

What the edit keeps (the objects it does not name stay where they were, a recoloured object keeps its place, a
count change keeps the copies it can) is checked by :mod:`flowrl.world.edit_verify`, from the source image.

Splits, as the text-to-image world's: an edit is ``"novel"`` when its source or target uses a held-out colour-shape
pair (:data:`~flowrl.world.grammar.HELDOUT_PAIRS`, never in pre-training) or it recolours along one of six held-out
colour changes (:data:`HELDOUT_RECOLOURS`); the other edits are divided, kind by kind and by a fixed permutation
(:data:`EDIT_TEST_SEED`), in half into ``"train"`` and ``"test"``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import attrs
import numpy as np

from flowrl.world.grammar import (
    COLOUR_NAMES,
    COUNT_WORDS,
    RELATION_AXES,
    RELATIONS,
    SPLITS,
    ObjectGroup,
    Relation,
    Scene,
    _parse_group,
    enumerate_scenes,
    scene_split,
    vocabulary,
)

EDIT_KINDS: tuple[str, ...] = ("recolour", "add", "remove", "count", "move")
EDIT_TEST_SEED = 20261215  # fixes the train / test division of the edits
OPPOSITE: dict[str, str] = {"left of": "right of", "right of": "left of", "above": "below", "below": "above"}
# the relations at right angles to each (a move's destinations)
ACROSS: dict[str, tuple[str, ...]] = {
    r: tuple(q for q in RELATIONS if RELATION_AXES[q][0] != RELATION_AXES[r][0]) for r in RELATIONS
}
# six held-out colour changes, one from each colour (colour i becomes colour i + 1): recolourings along them are
# novel compositions of known words, as the held-out colour-shape pairs are for scenes
HELDOUT_RECOLOURS: frozenset[tuple[str, str]] = frozenset(
    (c, COLOUR_NAMES[(i + 1) % len(COLOUR_NAMES)]) for i, c in enumerate(COLOUR_NAMES)
)
INSTRUCTION_WORDS: tuple[str, ...] = ("add", "it", "make", "move", "remove", "the")


def ref(group: ObjectGroup) -> str:
    """A group as an instruction names it: without the article of a single object ("red circle", "two red circles")."""
    return group.text.removeprefix("a ")


@attrs.frozen
class Instruction:
    """What an instruction says, without its source: ``named`` is the group it acts on as written (for ``count``
    the group it asks for, for ``add`` the new object), ``colour`` a recolouring's new colour, ``relation`` where
    the named object ends up relative to ``other`` (``add``: the anchor; ``move``: the object it moves around)."""

    kind: str = attrs.field(validator=attrs.validators.in_(EDIT_KINDS))
    named: ObjectGroup
    colour: str = ""
    relation: str = ""
    other: ObjectGroup | None = None

    @property
    def text(self) -> str:
        """The canonical instruction (inverted exactly by :func:`parse_instruction`)."""
        if self.kind == "recolour":
            return f"make the {ref(self.named)} {self.colour}"
        if self.kind == "count":
            return f"make it {self.named.text}"
        if self.kind == "remove":
            return f"remove the {ref(self.named)}"
        assert self.other is not None
        head = f"add {self.named.text}" if self.kind == "add" else f"move the {ref(self.named)}"
        return f"{head} {self.relation} the {ref(self.other)}"


def _parse_ref(words: list[str], i: int, text: str) -> tuple[ObjectGroup, int]:
    """``REF`` at ``words[i:]`` (a group without the article of a single object)."""
    if words[i : i + 1] == ["a"]:
        raise ValueError(f"instruction {text!r}: write 'the {' '.join(words[i + 1 : i + 3])}', not 'the a ...'")
    forms = words[i : i + 3] if i < len(words) and words[i] in ("two", "three") else ["a", *words[i : i + 2]]
    group, _ = _parse_group(forms, 0, text)
    return group, i + len(forms) - (forms[0] == "a")


def _expect(words: list[str], i: int, word: str, text: str) -> int:
    if words[i : i + 1] != [word]:
        got = repr(words[i]) if i < len(words) else "the end"
        raise ValueError(f"instruction {text!r}: expected {word!r} at word {i + 1}, got {got}")
    return i + 1


def _parse_relation(words: list[str], i: int, text: str) -> tuple[str, int]:
    for relation in RELATIONS:
        n = len(relation.split())
        if words[i : i + n] == relation.split():
            return relation, i + n
    raise ValueError(f"instruction {text!r}: expected a relation {list(RELATIONS)} at word {i + 1}")


def parse_instruction(text: str) -> Instruction:
    """Invert :attr:`Instruction.text`; raise ``ValueError`` on text outside the edit grammar."""
    words = text.split()
    verb = words[0] if words else ""
    if verb == "make" and words[1:2] == ["it"]:
        group, end = _parse_group(words, 2, text)
        instruction = Instruction("count", group)
    elif verb in ("make", "remove"):
        named, end = _parse_ref(words, _expect(words, 1, "the", text), text)
        if verb == "remove":
            instruction = Instruction("remove", named)
        else:
            if end >= len(words) or words[end] not in COLOUR_NAMES:
                raise ValueError(f"instruction {text!r}: expected a colour {list(COLOUR_NAMES)} at the end")
            instruction, end = Instruction("recolour", named, colour=words[end]), end + 1
    elif verb in ("add", "move"):
        if verb == "add":
            named, i = _parse_group(words, 1, text)
        else:
            named, i = _parse_ref(words, _expect(words, 1, "the", text), text)
        relation, i = _parse_relation(words, i, text)
        other, end = _parse_ref(words, _expect(words, i, "the", text), text)
        instruction = Instruction(verb, named, relation=relation, other=other)
    else:
        raise ValueError(f"instruction {text!r}: expected it to start with 'make', 'add', 'remove' or 'move'")
    if end != len(words):
        raise ValueError(f"instruction {text!r}: unexpected words after {' '.join(words[:end])!r}")
    return instruction


@attrs.frozen
class Edit:
    """One edit of a source scene: ``group`` is the source group it acts on (``move``: the one that moves; ``add``:
    the anchor, 0), ``colour`` a recolouring's new colour, ``count`` a count change's new count, ``added`` and
    ``relation`` the object an ``add`` draws and its relation to the anchor, ``relation`` also where a ``move``
    puts the mover relative to the other object. Invalid combinations raise ``ValueError``."""

    kind: str = attrs.field(validator=attrs.validators.in_(EDIT_KINDS))
    source: Scene
    group: int = 0
    colour: str = ""
    count: int = 0
    added: ObjectGroup | None = None
    relation: str = ""

    def __attrs_post_init__(self) -> None:
        self.target  # noqa: B018 (validates)

    @property
    def named(self) -> ObjectGroup:
        """The source group the edit acts on."""
        if not 0 <= self.group < len(self.source.groups):
            raise ValueError(f"{self.kind}: no group {self.group} in {self.source.text!r}")
        return self.source.groups[self.group]

    @functools.cached_property
    def target(self) -> Scene:  # noqa: C901 (one branch per kind)
        """The scene after the edit (a scene of the text-to-image grammar)."""
        src, named = self.source, self.named
        if self.kind == "recolour":
            if self.colour not in COLOUR_NAMES or self.colour == named.colour:
                raise ValueError(f"recolour: {self.colour!r} is not another colour for {named.text!r}")
            groups = list(src.groups)
            groups[self.group] = attrs.evolve(named, colour=self.colour)
            return Scene(groups, src.relation)
        if self.kind == "add":
            if src.kind != "single" or self.added is None or self.added.count != 1 or self.relation not in RELATIONS:
                raise ValueError("add: a single object to a single-object scene, in one of the relations")
            return Scene((self.added, named), Relation(0, self.relation, 1))
        if self.kind == "remove":
            if len(src.groups) != 2:
                raise ValueError(f"remove: the source needs two groups, got {src.text!r}")
            return Scene((src.groups[1 - self.group],))
        if self.kind == "count":
            if len(src.groups) != 1 or self.count not in COUNT_WORDS or self.count == named.count:
                raise ValueError(f"count: another count (1-3) of the one group of {src.text!r}, got {self.count}")
            return Scene((attrs.evolve(named, count=self.count),))
        if src.relation is None:
            raise ValueError(f"move: the source needs a relation, got {src.text!r}")
        now = src.relation.relation if self.group == 0 else OPPOSITE[src.relation.relation]  # the mover's, now
        if self.relation not in ACROSS[now]:
            raise ValueError(f"move: the mover is {now} the other; it moves to one of {list(ACROSS[now])}")
        subject_relation = self.relation if self.group == 0 else OPPOSITE[self.relation]
        return Scene(src.groups, Relation(0, subject_relation, 1))

    @property
    def instruction(self) -> Instruction:
        """What the instruction says."""
        if self.kind == "recolour":
            return Instruction("recolour", self.named, colour=self.colour)
        if self.kind == "count":
            return Instruction("count", self.target.groups[0])
        if self.kind == "remove":
            return Instruction("remove", self.named)
        if self.kind == "add":
            assert self.added is not None
            return Instruction("add", self.added, relation=self.relation, other=self.named)
        return Instruction("move", self.named, relation=self.relation, other=self.source.groups[1 - self.group])

    @property
    def text(self) -> str:
        """The instruction's words."""
        return self.instruction.text


def _edits_of(scene: Scene) -> list[Edit]:
    """Every edit of one source scene, in a fixed order."""
    out: list[Edit] = []
    for g, group in enumerate(scene.groups):
        for colour in COLOUR_NAMES:
            pair = (colour, group.shape)
            if colour != group.colour and all(h.pair != pair for h in scene.groups):
                out.append(Edit("recolour", scene, g, colour=colour))
    if scene.kind == "single":
        for colour in COLOUR_NAMES:
            for shape in ("circle", "square", "triangle"):
                if (colour, shape) != scene.groups[0].pair:
                    added = ObjectGroup(colour, shape)
                    out.extend(Edit("add", scene, added=added, relation=r) for r in RELATIONS)
    if len(scene.groups) == 2:
        out.extend(Edit("remove", scene, g) for g in (0, 1))
    if len(scene.groups) == 1:
        out.extend(Edit("count", scene, count=n) for n in COUNT_WORDS if n != scene.groups[0].count)
    if scene.relation is not None:
        for g in (0, 1):
            now = scene.relation.relation if g == 0 else OPPOSITE[scene.relation.relation]
            out.extend(Edit("move", scene, g, relation=r) for r in ACROSS[now])
    return out


def _is_novel(edit: Edit) -> bool:
    if "novel" in (scene_split(edit.source), scene_split(edit.target)):
        return True
    return edit.kind == "recolour" and (edit.named.colour, edit.colour) in HELDOUT_RECOLOURS


@functools.cache
def _all_edits() -> tuple[Edit, ...]:
    """Every edit of the grammar, in a fixed order."""
    return tuple(e for scene in enumerate_scenes(SPLITS) for e in _edits_of(scene))


@functools.cache
def _test_edits() -> frozenset[Edit]:
    """The test split: of each kind's non-novel edits, the first half of a fixed permutation."""
    rng = np.random.default_rng(EDIT_TEST_SEED)
    seen = [e for e in _all_edits() if not _is_novel(e)]
    test: set[Edit] = set()
    for kind in EDIT_KINDS:
        of_kind = [e for e in seen if e.kind == kind]
        order = rng.permutation(len(of_kind))
        test.update(of_kind[int(i)] for i in order[: len(of_kind) // 2])
    return frozenset(test)


def edit_split(edit: Edit) -> str:
    """``"novel"`` if the edit uses a held-out pair or colour change, else ``"test"`` or ``"train"``."""
    if _is_novel(edit):
        return "novel"
    return "test" if edit in _test_edits() else "train"


@functools.cache
def _by_kind(split: str) -> dict[str, tuple[Edit, ...]]:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    edits = [e for e in _all_edits() if edit_split(e) == split]
    return {k: tuple(e for e in edits if e.kind == k) for k in EDIT_KINDS}


def _pools(split: str, kinds: Sequence[str]) -> list[tuple[Edit, ...]]:
    if not kinds or any(k not in EDIT_KINDS for k in kinds):
        raise ValueError(f"kinds must be a non-empty subset of {EDIT_KINDS}, got {kinds!r}")
    return [_by_kind(split)[k] for k in dict.fromkeys(kinds)]


def enumerate_edits(split: str, kinds: Sequence[str] = EDIT_KINDS) -> list[Edit]:
    """Every edit of a split (of these kinds), in a fixed order."""
    return [e for pool in _pools(split, kinds) for e in pool]


def sample_edits(split: str, n: int, seed: int, kinds: Sequence[str] = EDIT_KINDS) -> list[Edit]:
    """``n`` edits of ``split``, the kind drawn uniformly from ``kinds``, then an edit of that kind uniformly;
    deterministic given ``seed``."""
    pools = _pools(split, kinds)
    rng = np.random.default_rng(seed)
    out: list[Edit] = []
    for _ in range(n):
        pool = pools[int(rng.integers(len(pools)))]
        out.append(pool[int(rng.integers(len(pool)))])
    return out


def balanced_edits(split: str, n: int, seed: int, kinds: Sequence[str] = EDIT_KINDS) -> list[Edit]:
    """``n`` evaluation edits of ``split``, the kinds taking turns (any prefix is balanced too); each kind cycles
    through its edits in a seeded order, so every edit appears before any repeats."""
    pools = _pools(split, kinds)
    rng = np.random.default_rng(seed)
    orders = [rng.permutation(len(pool)) for pool in pools]
    return [
        pools[i % len(pools)][int(orders[i % len(pools)][(i // len(pools)) % len(pools[i % len(pools)])])]
        for i in range(n)
    ]


def edit_vocabulary() -> list[str]:
    """Every word an instruction can use, sorted (the world's words and :data:`INSTRUCTION_WORDS`)."""
    return sorted(set(vocabulary()) | set(INSTRUCTION_WORDS))


def max_instruction_words() -> int:
    """The most words any instruction has ("add a red circle right of the blue square": 9)."""
    longest = max(len(r.split()) for r in RELATIONS)
    return 1 + 3 + longest + 1 + 2  # add a C S RELATION the C S; a move is as long
