"""The vocabulary of part contracts: what a part provides to a recipe and what it requires of the other parts.

A part states facts about what it hands on (``provides``: a set of tokens such as ``"tree"``) and conditions on
the rest of the recipe (``requires``: :class:`Need` objects, each either a token some other part must provide or
one no part may provide). Either attribute is a class attribute, or a staticmethod of the part's config when it
depends on the settings (a selector that merges steps only with some settings). Declarations add up along the
class hierarchy: a subclass keeps its parents' and adds its own (``tempflow_branch`` keeps ``anchor_branch``'s;
every policy loss keeps :class:`~flowrl.core.interfaces.PolicyLoss`'s ``policy_loss`` token).

:mod:`flowrl.config.composition` checks a recipe's parts against each other. The core names no part: the tokens below
are a shared vocabulary, and a plugin may add its own (any string). This module imports nothing from flowrl, so
the interfaces can declare with it.
"""

from __future__ import annotations

from typing import Any

import attrs

# The shared vocabulary: token -> what it means, as a message names it.
TOKENS = {
    "policy_loss": "a policy loss",
    "forward_process_loss": "a forward-process loss",
    "no_trained_units": "plans that train no unit",
    "merged_units": "merged units (merge > 1)",
    "unit_every_step": "plans with an SDE unit at every step",
    "tree": "rollout trees (Rollout.extras['tree'])",
    "node_advantages": "per-node advantages (Advantages.nodes)",
    "granular_rollouts": "rollouts finishing every jump at several tail granularities (extras['granularity'])",
    "granular_advantages": "advantages that sum each jump's granularities (one value per jump)",
}


@attrs.frozen
class Need:
    """One condition a part puts on the rest of the recipe.

    ``present`` true: some part of the recipe must provide ``token``; false: no part may. ``when``: the condition
    holds only in recipes where some part provides that token (a tree sampler needs per-node advantages only
    with a policy loss). ``why`` completes the message: what goes wrong otherwise, and what to use instead.
    """

    token: str
    why: str
    present: bool = True
    when: str | None = None


def needs(token: str, why: str, when: str | None = None) -> Need:
    """Some part of the recipe must provide ``token``."""
    return Need(token, why, True, when)


def refuses(token: str, why: str, when: str | None = None) -> Need:
    """No part of the recipe may provide ``token``."""
    return Need(token, why, False, when)


def describe(token: str) -> str:
    return TOKENS.get(token, repr(token))


def _declared(cls: type, config: Any, attribute: str) -> list[Any]:
    """The values of ``attribute`` declared by ``cls`` and its bases (each class's own), evaluated with ``config``."""
    found: list[Any] = []
    for klass in cls.__mro__:
        value = vars(klass).get(attribute)
        if value is None:
            continue
        if isinstance(value, staticmethod | classmethod):
            value = value.__get__(None, cls)(config)
        found.extend(value)
    return found


def provided(cls: type, config: Any) -> frozenset[str]:
    """The tokens a part provides with these settings."""
    return frozenset(_declared(cls, config, "provides"))


def required(cls: type, config: Any) -> tuple[Need, ...]:
    """The conditions a part puts on the rest of the recipe with these settings."""
    needs_ = _declared(cls, config, "requires")
    bad = [n for n in needs_ if not isinstance(n, Need)]
    if bad:
        raise TypeError(f"{cls.__name__}.requires must hold flowrl.core.contracts.Need objects, got {bad[0]!r}")
    return tuple(dict.fromkeys(needs_))
