"""What a recipe asks of its prompts' condition images, checked before any model loads: a reward that reads them
(``RewardModel.needs_conditions``) needs prompts that give them (``PromptSource.gives_conditions``). Recipe-level,
so apart from :mod:`flowrl.core.conditions` (the data model), which the core's interfaces import."""

from __future__ import annotations

from typing import Any

from flowrl.config.recipe import RecipeError
from flowrl.core.conditions import conditions_of
from flowrl.core.errors import UserError


def reward_condition_problems(recipe: Any, source: Any = None) -> list[tuple[str, str]]:
    """A recipe's rewards that need condition images (``RewardModel.needs_conditions``) held to its prompts
    (``PromptSource.gives_conditions``; the built ``source``'s :meth:`condition_records` when the class cannot
    tell, built here when not given): one ``(key, message)`` per reward that would receive a prompt without any,
    as a recipe's other problems (``flowrl validate``, ``flowrl train``)."""
    needing = [(i, part) for i, part in enumerate(recipe.rewards) if _needs(part)]
    if not needing:
        return []
    prompts = recipe.parts["prompts"]
    given = prompts.cls.gives_conditions(prompts.config)
    lacking = {"none": "gives prompts without any (a text-to-image task)", "some": "gives some prompts without any"}
    problem = lacking.get(given or "")
    if given is None:
        if source is None:
            try:
                source = prompts.build()
            except UserError as error:
                return [("prompts", str(error))]
        records = list(source.condition_records())
        without = [where.rstrip(":") for where, prompt in records if not conditions_of(prompt)]
        if records and len(without) == len(records):
            problem = lacking["none"]
        elif without:
            problem = f"gives prompts without any ({without[0]} has none)"
    if problem is None:
        return []
    out = []
    for i, part in needing:
        named = f"'{part.name}'" + (f" ({part.type})" if part.name != part.type else "")
        out.append((
            f"reward[{i}]" if len(recipe.rewards) > 1 else "reward",
            f"{named} needs each prompt's condition images (it scores the result against them), but [prompts] type"
            f" = '{prompts.type}' {problem}; use prompts with condition images (an edit task) or a reward that"
            " scores the result alone",
        ))
    return out


def _needs(part: Any) -> bool:
    needs = getattr(part.cls, "needs_conditions", None)  # a reward class that is not a RewardModel: none
    return bool(needs(part.config)) if callable(needs) else False


def check_reward_conditions(recipe: Any, source: Any) -> None:
    """:func:`reward_condition_problems` with the built prompt ``source``, raised as the recipe's error."""
    problems = reward_condition_problems(recipe, source)
    if problems:
        raise RecipeError(recipe.source, problems)
