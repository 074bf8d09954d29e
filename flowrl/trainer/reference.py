"""The reference policy: the initial one, which KL terms, drift and reference probes compare against.

With LoRA it is the base with the adapters switched off; in full fine-tuning a frozen copy of the initial
transformer, made only when some part needs it. :func:`install_reference` is called once, by the trained
policy (:mod:`flowrl.trainer.policy`), which keeps the factory; the backbone gets it too, as
``backbone.reference_policy()``, for the parts that probe it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import torch

from flowrl.core.interfaces import Backbone
from flowrl.trainer.lora import adapters_disabled


def no_reference() -> AbstractContextManager[None]:
    """The factory when no part needs a reference (and the run is not LoRA): a no-op."""
    return nullcontext()


def _frozen_copy(module: torch.nn.Module) -> torch.nn.Module:
    ref = copy.deepcopy(module)
    ref.requires_grad_(False).eval()
    return ref


def install_reference(
    backbone: Backbone,
    lora: bool,
    needed: bool,
    prepare: Callable[[torch.nn.Module], torch.nn.Module] = lambda module: module,
) -> Callable[[], AbstractContextManager[None]]:
    """The reference (base) policy as a context-manager factory, also installed as
    ``backbone.reference_policy``: LoRA switched off, or a frozen copy of the initial transformer (passed
    through ``prepare``, e.g. sharded) when some part needs a reference. With neither, a no-op factory (and
    the backbone keeps raising when asked)."""
    transformer = backbone.transformer
    if lora:
        factory: Callable[[], AbstractContextManager[None]] = lambda: adapters_disabled(transformer)  # noqa: E731
    elif needed:
        frozen = prepare(_frozen_copy(transformer))
        factory = lambda: backbone.module_swapped(frozen)  # noqa: E731
    else:
        return no_reference
    backbone.set_reference(factory)
    return factory
