"""Recipes: the TOML file read and validated before any model loads (:mod:`~flowrl.config.recipe`), its
non-part tables (:mod:`~flowrl.config.settings`, :mod:`~flowrl.config.update_modes`), the checks a recipe's
parts make of each other (:mod:`~flowrl.config.composition`, :mod:`~flowrl.config.condition_checks`), a part's
documentation as data (:mod:`~flowrl.config.part_docs`) and the TOML writer of resolved recipes.

Before the top level was grouped, ``flowrl.config`` was the settings converter: its names stay importable
from here (they live in :mod:`flowrl.core.convert`)."""

from flowrl.core.convert import ConfigError, convert, structure, unstructure

__all__ = ["ConfigError", "convert", "structure", "unstructure"]
