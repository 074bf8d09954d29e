"""Conformance of backbones (:class:`~flowrl.core.interfaces.Backbone`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor

from flowrl.conformance.common import close, counting_rows, finite, require
from flowrl.core.interfaces import AttentionEntropyProbe, Backbone

# Velocities of a float32 transformer move with the batch shape (BLAS blocking) by about 1e-7 of their scale:
# 2.2e-6 measured for velocities up to 6 (tiny FLUX, tiny SD3, the world's model). 1e-4 of the largest
# velocity leaves a margin of about 100 (other thread counts, other processors) and still fails when a row's
# velocity depends on the other rows of its batch. Reduced-precision backbones (bfloat16 autocast, 8 bits of
# mantissa) need about 3e-2.
TOLERANCE = 1e-4


@contextlib.contextmanager
def _transformer_rows(backbone: Backbone) -> Iterator[list[int]]:
    """:func:`counting_rows` over ``module`` and the frozen transformers a backbone also calls (its
    ``frozen_modules``: Wan 2.2 A14B's untrained expert); the total is ``[rows]``, read after the calls."""
    total = [0]
    with contextlib.ExitStack() as stack:
        modules = (backbone.module, *getattr(backbone, "frozen_modules", ()))
        counts = [stack.enter_context(counting_rows(m)) for m in modules]
        yield total
        total[0] = sum(c[0] for c in counts)


def _velocity(backbone: Backbone, x: Tensor, s: Tensor, cond: Any, where: str) -> Tensor:
    """One velocity call whose NFE must equal the transformer rows it evaluated."""
    nfe0 = backbone.nfe
    with _transformer_rows(backbone) as rows:
        v = backbone.velocity(x, s, cond)
    require(rows[0] >= x.shape[0], backbone,
            f"{where}: the transformer evaluated {rows[0]} rows for {x.shape[0]} latents")
    require(backbone.nfe - nfe0 == rows[0], backbone,
            f"{where}: nfe grew by {backbone.nfe - nfe0} but the transformer evaluated {rows[0]} rows")
    return v


def _schedules(backbone: Backbone, grids: Sequence[tuple[int, float]]) -> None:
    for steps, shift in grids:
        sigmas = backbone.schedule_sigmas(steps, shift)
        ok = len(sigmas) == steps + 1 and abs(sigmas[0] - 1.0) <= 1e-6 and sigmas[-1] == 0.0
        ok = ok and all(a > b for a, b in zip(sigmas, sigmas[1:], strict=False))
        require(ok, backbone,
                f"schedule_sigmas({steps}, {shift}) must fall strictly from 1 to 0 in {steps} steps, got {sigmas}")


def check_backbone(
    make: Callable[[], Backbone],
    prompts: Sequence[str],
    grids: Sequence[tuple[int, float]] = ((1, 1.0), (4, 3.0), (10, 3.0)),
    tolerance: float = TOLERANCE,
) -> None:
    """Rules, on a fresh backbone from ``make`` and two or more ``prompts`` (words the model knows):

    - ``latent_shape`` is a tuple of positive sizes; ``noise(n, generator)`` gives ``(n, *latent_shape)``,
      the same for the same generator seed;
    - ``encode`` gives one row per prompt, each row independent of the other prompts of the call;
    - ``velocity`` is float32, shaped like the latent, finite and deterministic; a row's velocity does not
      depend on the other rows of its batch, nor on whether gradients are on (rollouts run without, training
      with: the ratio at the trust-region centre is 1 only then), up to ``tolerance`` times the largest
      velocity; with gradients on it is differentiable with respect to the transformer's parameters;
    - ``nfe`` grows by exactly the rows the transformer (``module``) evaluates (2 per latent for a guided step
      of a backbone with classifier-free guidance), never fewer than the latents;
    - ``velocity_and_entropy``, where the backbone has it: the same velocity, an entropy ``(B,)`` finite and
      non-negative, and its forwards counted;
    - ``schedule_sigmas(steps, shift)`` falls strictly from 1 to 0 in ``steps`` steps, for every ``grids`` pair;
    - ``decode`` gives finite images ``(B, 3, H, W)`` (a video backbone: clips ``(B, F, 3, H, W)``) in [0, 1],
      deterministic and independent per latent;
    - a second instance from ``make``, loaded with the first one's ``state_dict()``, gives the same velocity
      (the reference policy and a resumed run are rebuilt from the config).
    """
    backbone = make()
    prompts = list(prompts)
    n = len(prompts)
    require(n >= 2, backbone, "the check needs at least two prompts")
    shape = backbone.latent_shape
    require(isinstance(shape, tuple) and all(isinstance(d, int) and d > 0 for d in shape), backbone,
            f"latent_shape must be a tuple of positive ints, got {shape!r}")
    x = backbone.noise(n, torch.Generator().manual_seed(0))
    require(tuple(x.shape) == (n, *shape), backbone, f"noise({n}) must be ({n}, *latent_shape), got {tuple(x.shape)}")
    require(torch.equal(x, backbone.noise(n, torch.Generator().manual_seed(0))), backbone,
            "noise must draw only from its generator")
    cond = backbone.encode(prompts)
    require(len(cond) == n, backbone, f"encode must give one row per prompt, got {len(cond)} for {n}")
    for i in range(n):
        alone = backbone.encode([prompts[i]])
        row = cond.take(torch.tensor([i]))
        same = alone.tensors.keys() == row.tensors.keys()
        require(same and all(close(row.tensors[k], alone.tensors[k], tolerance) for k in row.tensors), backbone,
                f"encode: prompt {i}'s row depends on the other prompts of the call")
    s = torch.linspace(0.9, 0.2, n)

    with torch.no_grad():
        v = _velocity(backbone, x, s, cond, "velocity")
        require(v.dtype == torch.float32, backbone, f"velocities must be returned as float32, got {v.dtype}")
        require(tuple(v.shape) == tuple(x.shape) and finite(v), backbone,
                "the velocity must be finite and shaped like the latent")
        require(torch.equal(v, backbone.velocity(x, s, cond)), backbone, "the same inputs gave another velocity")
        rows = [
            _velocity(backbone, x[i : i + 1], s[i : i + 1], cond.take(torch.tensor([i])), "one row") for i in range(n)
        ]
        require(close(torch.cat(rows), v, tolerance), backbone,
                "a row's velocity depends on the other rows of its batch")

    params = [p for p in backbone.transformer.parameters()]
    trainable = [p.requires_grad for p in params]
    try:
        for p in params:
            p.requires_grad_(True)
            p.grad = None
        with torch.enable_grad():
            v_grad = _velocity(backbone, x, s, cond, "velocity with gradients")
            require(close(v_grad.detach(), v, tolerance), backbone, "the velocity differs with gradients on and off")
            require(v_grad.requires_grad, backbone, "the velocity must be differentiable (no gradient path)")
            v_grad.square().mean().backward()
        reached = [p.grad for p in params if p.grad is not None]
        require(bool(reached) and all(finite(g) for g in reached) and any(bool(g.abs().sum() > 0) for g in reached),
                backbone, "the velocity's gradient must reach the transformer's parameters (finite, not all zero)")
    finally:
        for p, flag in zip(params, trainable, strict=True):
            p.grad = None
            p.requires_grad_(flag)

    if isinstance(backbone, AttentionEntropyProbe):  # an optional capability
        with torch.no_grad():
            nfe0 = backbone.nfe
            with _transformer_rows(backbone) as counted:
                probed, entropy = backbone.velocity_and_entropy(x, s, cond, None)
        require(close(probed, v, tolerance), backbone, "velocity_and_entropy gives another velocity")
        require(tuple(entropy.shape) == (n,) and finite(entropy) and bool((entropy >= 0).all()), backbone,
                "the attention entropy must be (B,), finite and non-negative")
        require(backbone.nfe - nfe0 == counted[0], backbone,
                f"velocity_and_entropy: nfe grew by {backbone.nfe - nfe0} for {counted[0]} transformer rows")

    _schedules(backbone, grids)

    images = backbone.decode(x)
    pictures = images.dim() == 4 and images.shape[:2] == (n, 3)
    clips = images.dim() == 5 and images.shape[0] == n and images.shape[2] == 3 and images.shape[1] >= 1
    require((pictures or clips) and finite(images), backbone,
            f"decode must give finite images ({n}, 3, H, W) or clips ({n}, F, 3, H, W), got {tuple(images.shape)}")
    require(float(images.min()) >= 0 and float(images.max()) <= 1, backbone, "decoded images must lie in [0, 1]")
    require(torch.equal(images, backbone.decode(x)), backbone, "decode is not deterministic")
    one_by_one = torch.cat([backbone.decode(x[i : i + 1]) for i in range(n)])
    require(close(one_by_one, images, tolerance), backbone, "a decoded image depends on the other latents of its batch")

    twin = make()
    twin.load_state_dict(backbone.state_dict())
    with torch.no_grad():
        require(torch.equal(twin.velocity(x, s, twin.encode(prompts)), v), backbone,
                "a second instance of the same config, loaded with state_dict(), gives another velocity")
