"""Write docs/composition.md: which registered parts compose, pair by pair, as ``flowrl validate`` decides.

    python scripts/gen_composition.py            # (re)write docs/composition.md
    python scripts/gen_composition.py --check    # exit 1 if docs/composition.md is out of date
    python scripts/gen_composition.py --train    # also train one iteration of every pair that validates

Three matrices: every registered selector x sampler, sampler x advantage and sampler x loss. Each pair is put into
a small recipe on the tiny random FLUX (16 px, 4 steps, 2 rollouts a group, 2 prompts) whose other parts are the
neutral defaults below (:data:`DEFAULTS`); when the defaults refuse the pair only because of a third part (a tree
sampler needs a tree estimator for a policy loss), the other registered parts of the free kinds are tried in
order and the first recipe that validates is the one reported, with the partner named. A pair that no partner
makes valid is refused, and the table gives validate's one-line reason.

Part settings that a 4-step grid needs (a window of 2 rather than 4, a split list that fits) are in
:data:`TINY`; a part without an entry runs on its defaults. The table depends only on what is registered and on
the checks parts declare (``provides`` / ``requires``, :mod:`flowrl.core.contracts`), not on training: ``--train``
is the evidence that every pair it calls composing trains (tests/test_composition.py trains a sample of them,
and all of them in its slow test).
"""

from __future__ import annotations

import argparse
import difflib
import itertools
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "composition.md"
KINDS = ("selector", "sampler", "advantage", "loss")
PAIRS = (("selector", "sampler"), ("sampler", "advantage"), ("sampler", "loss"), ("selector", "loss"))

# The part of each kind a pair's recipe uses when the pair does not name that kind.
DEFAULTS = {"selector": "explicit", "sampler": "independent", "advantage": "group_norm", "loss": "ppo_clip"}

# Settings a part needs on the tiny 4-step grid with groups of 2 (anything else: the part's defaults).
TINY: dict[str, dict[str, dict[str, Any]]] = {
    "selector": {
        "explicit": {"units": [[0, 1], [1, 1]]},
        "aegpo_topk": {"k": 2},
        "branch_splits": {"splits": [0, 2]},
        "egrpo_entropy": {"tau": 1.3, "budget": 0.5},  # the rule merges steps 0-1 into one unit (0, 2) here
        "flow_grpo_fast_window": {"max_size": 2},
        "mix_grpo_window": {"window_size": 2},
    },
    "sampler": {
        "independent": {"group_size": 2},
        "anchor_branch": {"group_size": 2},
        "tempflow_branch": {"group_size": 2},
        "mix_grpo_flash": {"group_size": 2, "tail_steps": 1},
        "aegpo_allocate": {"host": {"type": "independent", "group_size": 2}},
        "branch_tree": {"factor": 2},
        "preference_file": {"path": str(Path(__file__).resolve().parents[1] / "recipes/data/dpo_world/pairs.jsonl")},
    },
}

WORLD: dict[str, Any] = {
    "name": "composition",
    "seed": 0,
    "backbone": {"type": "tiny_flux", "resolution": 16, "num_layers": 1, "num_single_layers": 1},
    "prompts": {"type": "list", "prompts": ["a red circle", "two blue squares", "a cat"], "heldout": ["a dog"]},
    "schedule": {"num_steps": 4, "shift": 3.0},
    "kernel": {"type": "flow_grpo_sde", "noise_level": 0.7},
    "reward": [{"type": "jpeg_compressibility", "scale_kb": 1.0}],
    "optim": {"lr": 1e-4},
    "trainer": {
        "max_steps": 1, "prompts_per_step": 2, "checkpoint_every": 0, "image_every": 0, "eval_every": 0,
        "kl_every": 0,
    },
}

@attrs.frozen
class Outcome:
    """One pair: whether it validates, with which partners, and otherwise validate's first reason."""

    pair: tuple[str, str]
    composes: bool
    partners: dict[str, str]  # the parts of the free kinds that made the recipe (only where not the default)
    reason: str = ""  # validate's first problem line for the default partners, when refused


def registered() -> dict[str, list[str]]:
    from flowrl.core.registry import available

    return {kind: available(kind) for kind in KINDS}


def part_table(kind: str, name: str) -> dict[str, Any]:
    return {"type": name, **TINY.get(kind, {}).get(name, {})}


def recipe_data(choice: dict[str, str]) -> dict[str, Any]:
    """The tiny recipe with one registered part of each kind (``choice`` maps every kind to a name)."""
    data = {key: (dict(value) if isinstance(value, dict) else value) for key, value in WORLD.items()}
    for kind in KINDS:
        data[kind] = part_table(kind, choice[kind])
    return data


def problems_of(choice: dict[str, str]) -> list[tuple[str, str]]:
    """validate's problems for this choice of parts ([] when it loads)."""
    from flowrl.config.recipe import RecipeError, recipe_from_dict

    try:
        recipe_from_dict(recipe_data(choice), source="composition")
    except RecipeError as error:
        return list(error.problems)
    return []


def partner_choices(pair: dict[str, str], names: dict[str, list[str]]) -> Iterator[dict[str, str]]:
    """The defaults first, then the free kinds' other registered parts: fewest changes first, then a change of an
    earlier kind (in :data:`KINDS` order) first, then registry order."""
    free = [kind for kind in KINDS if kind not in pair]
    options = [[DEFAULTS[k], *(n for n in names[k] if n != DEFAULTS[k])] for k in free]
    combos = list(itertools.product(*options))

    def order(combo: tuple[str, ...]) -> tuple[int, tuple[int, ...]]:
        changed = tuple(int(name != DEFAULTS[k]) for k, name in zip(free, combo, strict=True))
        return sum(changed), tuple(-c for c in changed)

    for combo in sorted(combos, key=order):  # sorted() is stable: registry order within a rank
        yield {**pair, **dict(zip(free, combo, strict=True))}


def outcome(kinds: tuple[str, str], pair_names: tuple[str, str], names: dict[str, list[str]]) -> Outcome:
    pair = dict(zip(kinds, pair_names, strict=True))
    tried: list[list[str]] = []
    for choice in partner_choices(pair, names):
        problems = problems_of(choice)
        if not problems:
            partners = {k: v for k, v in choice.items() if k not in pair and v != DEFAULTS[k]}
            return Outcome(pair_names, True, partners)
        tried.append([f"[{path}] {message}" for path, message in problems])
    # the reason every partner meets (the pair's own); else the defaults' first
    common = [line for line in tried[0] if all(line in other for other in tried)]
    return Outcome(pair_names, False, {}, (common or tried[0])[0])


def outcomes() -> dict[tuple[str, str], list[Outcome]]:
    names = registered()
    return {
        kinds: [outcome(kinds, (a, b), names) for a in names[kinds[0]] for b in names[kinds[1]]] for kinds in PAIRS
    }


def train_choice(choice: dict[str, str]) -> str:
    """Train one iteration of the recipe; '' when it ran, else the error as one line."""
    from flowrl.config.recipe import recipe_from_dict
    from flowrl.trainer import train

    recipe = recipe_from_dict(recipe_data(choice), source="composition")
    with tempfile.TemporaryDirectory() as folder:
        try:
            train(recipe, Path(folder) / "run", quiet=True)
        except Exception as error:  # the evidence: what a pair that validates does when it runs
            return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    return ""


# -- the page --------------------------------------------------------------------------------------------------
TITLES = {
    ("selector", "sampler"): "Selector x sampler",
    ("sampler", "advantage"): "Sampler x advantage",
    ("sampler", "loss"): "Sampler x loss",
    ("selector", "loss"): "Selector x loss",
}
PLURAL = {"selector": "selectors", "sampler": "samplers", "advantage": "advantage estimators", "loss": "losses"}

INTRO = """\
A method is a choice of parts, and most choices compose: a selector's plan drives any sampler, any sampler's
rollouts feed a group estimator, any loss trains them. Some do not, and `flowrl validate` refuses those with
one line that says why, before any model loads (never a traceback in the middle of a run, never a run that
silently trains nothing). This page lists every registered selector x sampler, sampler x advantage and sampler x
loss pair, and selector x loss, and what validate says about each.

{summary}

How a pair is decided: it is put into a small recipe (the tiny random FLUX, 16 px, a 4-step grid, groups of 2)
whose other parts are the defaults ({defaults}). When those refuse the pair only because of a third part, the
other registered parts of the free kinds are tried and the cell names the one that makes the recipe valid; a pair
no partner makes valid is refused, with the reason every attempt met.

Every pair marked **yes** trains: `python scripts/gen_composition.py --train` runs one iteration of each
(tests/test_composition.py trains a sample of them on every run and all of them in its slow test). Tried before
its refusal existed, every refused pair crashed mid-run, trained nothing, or (a tree split at every step) grew
exponentially; the reasons say which. The page is generated from the parts' declarations
([below](#how-parts-declare-what-they-need)), and a test fails when it is out of date.

`aegpo_allocate` shares the rollout budget out and runs a host sampler (`independent` here): with another host it
takes the host's declarations, so the host's row applies.
"""

# Pairs that compose but deserve a word (how the parts meet), in matrix order of the names.
NOTES: dict[tuple[str, str], str] = {
    ("dance_random_subset", "anchor_branch"): "a branching sampler jumps only at the trained units; the plan's "
    "untrained SDE units are ODE steps of the anchor.",
    ("dance_random_subset", "tempflow_branch"): "as with `anchor_branch`: only the trained units are branched.",
    ("dance_random_subset", "iso_temporal"): "each prompt draws its one SDE step from the trained units; the "
    "untrained ones are ODE steps.",
    ("flow_grpo_prefix", "mix_grpo_flash"): "the window reaches the end of the grid, so the coarse tail is empty: "
    "the rollouts are `independent`'s.",
    ("dance_random_subset", "mix_grpo_flash"): "as with `flow_grpo_prefix`: no tail, `independent`'s rollouts.",
    ("branch_tree", "group_norm"): "only with a forward-process loss, which reads the leaves' advantages "
    "(normalised per prompt); a policy loss trains the tree's inner edges, which need per-node advantages.",
    ("tempflow_branch", "crd"): "a forward-process loss does not read transition weights: the noise-aware step "
    "weights have no effect.",
    ("tempflow_branch", "diffusion_nft"): "as with `crd`: the step weights have no effect.",
    ("anchor_branch", "crd"): "the advantages are normalised per (prompt, unit) group, so they are also centred "
    "per prompt, where CRD centres its implicit reward.",
}


def render(found: dict[tuple[str, str], list[Outcome]] | None = None) -> str:
    found = outcomes() if found is None else found
    reasons: dict[str, int] = {}
    body: list[str] = []
    summary = []
    for kinds in PAIRS:
        rows = found[kinds]
        columns = list(dict.fromkeys(o.pair[1] for o in rows))
        body += [f"## {TITLES[kinds]}", "", f"Rows: {PLURAL[kinds[0]]}; columns: {PLURAL[kinds[1]]}.", ""]
        body.append("| " + " | ".join([kinds[0], *(f"`{c}`" for c in columns)]) + " |")
        body.append("| --- |" + " --- |" * len(columns))
        for row in dict.fromkeys(o.pair[0] for o in rows):
            body.append("| " + " | ".join([f"`{row}`", *(cell(o, reasons) for o in rows if o.pair[0] == row)]) + " |")
        yes = sum(o.composes for o in rows)
        summary.append(f"{TITLES[kinds].lower()}: {yes} of {len(rows)}")
        notes = [(o, NOTES[o.pair]) for o in rows if o.composes and o.pair in NOTES]
        body += ["", *(f"- `{o.pair[0]}` x `{o.pair[1]}`: {note}" for o, note in notes), *([""] if notes else [])]
    body += ["## Why pairs are refused", "", "| # | what validate says |", "| --- | --- |"]
    body += [f"| {n} | {escape(reason)} |" for reason, n in reasons.items()]
    body += ["", *declarations()]
    defaults = ", ".join(f"{k} `{v}`" for k, v in DEFAULTS.items())
    head = [
        "# Composition: which parts work together",
        "",
        "<!-- generated by scripts/gen_composition.py from the parts' declarations; do not edit by hand -->",
        "",
        INTRO.format(summary="Pairs that compose: " + "; ".join(summary) + ".", defaults=defaults).rstrip(),
        "",
    ]
    return "\n".join(head + body).rstrip() + "\n"


def cell(o: Outcome, reasons: dict[str, int]) -> str:
    if o.composes:
        return "yes" + "".join(f" (with {k} `{v}`)" for k, v in o.partners.items())
    n = reasons.setdefault(o.reason, len(reasons) + 1)
    return f"**no** ({n})"


def escape(text: str) -> str:
    return text.replace("|", "\\|")


MECHANISM = """\
## How parts declare what they need

A part states what it hands on to the recipe, `provides` (a set of tokens), and what it requires of the other
parts, `requires` (`flowrl.core.contracts.Need` objects: `needs(token, why)`, some part must provide the token;
`refuses(token, why)`, no part may; either with `when = token`, the condition holds only when some part provides
that one). Each is a class attribute, or a staticmethod of the part's config when it depends on the settings; a
subclass adds to its bases' declarations. Every recipe load checks them (`flowrl.config.composition.composition_checks`,
called by the recipe's cross-table checks) and reports each unmet need in one line naming both parts, the reason
and the parts that provide what is missing. The core names no part: a plugin declares its parts the same way, with
these tokens or its own.

```python
from flowrl.core.contracts import needs, refuses

@register("sampler", "my_branching")
class MyBranching(RolloutSampler):
    provides = frozenset({"tree"})
    requires = (
        needs("node_advantages", "its transitions are tree edges; use a tree estimator", when="policy_loss"),
        refuses("merged_units", "it branches single steps"),
    )
```

The loss's interface gives the two loss tokens: `policy_loss` for a `PolicyLoss`, `forward_process_loss` for a
`ForwardProcessLoss`. The shared tokens:
"""


def declarations() -> list[str]:
    """The mechanism, the token vocabulary and every registered part's declarations (with default settings)."""
    from flowrl.core.contracts import TOKENS, provided, required
    from flowrl.core.registry import registry

    lines = [MECHANISM.rstrip(), "", "| token | means |", "| --- | --- |"]
    lines += [f"| `{token}` | {escape(meaning)} |" for token, meaning in TOKENS.items()]
    lines += [
        "",
        "The declarations of the registered parts, with their default settings (the loss tokens left out):",
        "",
        "| part | provides | requires |",
        "| --- | --- | --- |",
    ]
    for kind in ("selector", "sampler", "advantage", "loss"):
        for name, cls in registry(kind).items():
            config = cls.Config()  # type: ignore[attr-defined]
            tokens = sorted(provided(cls, config) - {"policy_loss", "forward_process_loss"})
            conditions = [
                ("" if n.present else "not ") + f"`{n.token}`" + (f" (with `{n.when}`)" if n.when else "")
                for n in required(cls, config)
            ]
            if tokens or conditions:
                shown = ", ".join(f"`{t}`" for t in tokens) or "-"
                lines.append(f"| {kind} `{name}` | {shown} | {', '.join(conditions) or '-'} |")
    return lines


# -- the command ---------------------------------------------------------------------------------------------------
def train_all() -> int:
    """Train one iteration of every pair that validates; print each and exit 1 if any fails."""
    import torch

    torch.set_num_threads(1)
    names, failed = registered(), 0
    for kinds in PAIRS:
        for a, b in itertools.product(names[kinds[0]], names[kinds[1]]):
            o = outcome(kinds, (a, b), names)
            if not o.composes:
                print(f"refused  {kinds[0]} {a} x {kinds[1]} {b}: {o.reason}", flush=True)
                continue
            choice = next(c for c in partner_choices(dict(zip(kinds, (a, b), strict=True)), names)
                          if not problems_of(c))
            start = time.perf_counter()
            error = train_choice(choice)
            failed += bool(error)
            status = "FAILED " if error else "trained"
            took = time.perf_counter() - start
            print(f"{status}  {kinds[0]} {a} x {kinds[1]} {b} ({took:.1f} s) {error}", flush=True)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/composition.md is out of date")
    parser.add_argument("--train", action="store_true", help="train one iteration of every pair that validates")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.train:
        return train_all()
    text = render()
    rel = PAGE.relative_to(ROOT)
    if args.check:
        current = PAGE.read_text(encoding="utf-8") if PAGE.exists() else ""
        if current == text:
            return 0
        diff = list(difflib.unified_diff(current.splitlines(), text.splitlines(), str(rel), "generated", lineterm=""))
        print(f"{rel} is out of date with the parts' declarations; run: python scripts/gen_composition.py")
        print("\n".join(diff[:40] + (["..."] if len(diff) > 40 else [])))
        return 1
    PAGE.write_text(text, encoding="utf-8")
    print(f"wrote {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
