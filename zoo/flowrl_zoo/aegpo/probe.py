"""Attention-entropy curves along a deterministic ODE trajectory, shared by AEGPO's selector and allocator.

Everything model-specific stays behind the backbone's ``velocity_and_entropy``; this module only walks the
schedule. Each prompt starts from its own fixed noise (seeded by the prompt text), so the entropy of
the current policy and the cached entropy of the base policy are measured along comparable paths.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from flowrl import Backbone, Conditioning, Schedule, UserError
from flowrl.core.interfaces import AttentionEntropyProbe
from flowrl.parts.samplers.solvers import euler_step
from flowrl.parts.samplers.untrained import untrained_forwards


def velocity_and_entropy(
    backbone: Backbone, x: Tensor, s: Tensor, cond: Conditioning, options: Any
) -> tuple[Tensor, Tensor]:
    """Velocity and attention entropy ``(B,)`` at one step: one probed forward of a backbone that offers
    the capability (:class:`flowrl.core.interfaces.AttentionEntropyProbe`)."""
    if not isinstance(backbone, AttentionEntropyProbe):
        from flowrl.config.recipe import offers
        from flowrl.core.registry import registry

        able = ", ".join(name for name, cls in registry("backbone").items() if offers(cls, AttentionEntropyProbe))
        raise UserError(
            f"AEGPO measures attention entropy, which backbone '{backbone.registered_name or type(backbone).__name__}'"
            f" does not expose; use a backbone that does ({able})"
        )
    return backbone.velocity_and_entropy(x, s, cond, options)


def probe_noise(backbone: Backbone, prompts: Sequence[str], seed: int) -> Tensor:
    """One initial latent per prompt, a function of (seed, prompt text) only."""
    rows = []
    for prompt in prompts:
        digest = hashlib.sha256(f"aegpo:{seed}:{prompt}".encode()).digest()
        generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") % 2**63)
        rows.append(backbone.noise(1, generator))
    return torch.cat(rows)


def entropy_curves(
    backbone: Backbone, prompts: Sequence[str], schedule: Schedule, options: Any, steps: Sequence[int], seed: int
) -> Tensor:
    """Attention entropy ``(P, len(steps))`` at grid ``steps`` of one ODE trajectory per prompt.

    The trajectory stops after the last requested step; at probed steps the probe's velocity advances
    the ODE (no extra forward when the backbone fuses them). Every forward is counted in ``backbone.nfe``.
    """
    wanted = sorted(set(int(k) for k in steps))
    if not wanted or wanted[0] < 0 or wanted[-1] >= schedule.num_steps:
        raise ValueError(f"probe steps {list(steps)} must lie in 0..{schedule.num_steps - 1}")
    cond = backbone.encode(list(prompts))
    x = probe_noise(backbone, prompts, seed).float()
    sigmas = schedule.tensor().to(x.device)
    found: dict[int, Tensor] = {}
    with torch.no_grad(), untrained_forwards():  # a probe's forwards are never trained inputs
        for step in range(wanted[-1] + 1):
            s = sigmas[step].expand(x.shape[0])
            if step in wanted:
                v, found[step] = velocity_and_entropy(backbone, x, s, cond, options)
            else:
                v = backbone.velocity(x, s, cond)
            x = euler_step(x, v.float(), sigmas[step], sigmas[step + 1])
    columns = [found[k].float().cpu() for k in wanted]
    return torch.stack(columns, dim=1)[:, [wanted.index(int(k)) for k in steps]]
