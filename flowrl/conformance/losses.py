"""Conformance of training objectives: :class:`~flowrl.core.interfaces.PolicyLoss` (recorded transitions) and
:class:`~flowrl.core.interfaces.ForwardProcessLoss` (re-noised final latents).

The inputs are built as the trainer builds them (flowrl/trainer/micro_batches.py): the policy's velocity ``v`` is the
only tensor with a gradient; the old log-densities, the old velocity, the reference and the advantages come
without one. The trust-region centre is where the policy equals the rollout-time policy (ratio 1, ``v = v_old``)
and the reference; it is where the first inner epoch of every update starts.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import torch
from torch import Tensor

from flowrl.conformance.common import finite, finite_stats, require
from flowrl.core.interfaces import ForwardProcessLoss, Loss, PolicyLoss, gaussian_log_prob
from flowrl.core.types import ForwardProcessInputs, LossInputs

# Losses are float32 means over a handful of rows of magnitude about 1: a micro-batch split or a reordered sum
# moves them by a few ulps (1e-7 relative); a loss that is not a mean over rows is off by a factor.
SPLIT_TOL = 1e-5
GRAD_TOL = 1e-6  # a gradient that must vanish at the centre: float32 cancellation leaves ~1e-8 here


def _num(t: Tensor) -> float:
    return float(t.detach())


def _rows(value: Any, rows: slice) -> Any:
    return value[rows] if isinstance(value, Tensor) else value


def _expand(t: Tensor, like: Tensor) -> Tensor:
    return t.reshape(-1, *[1] * (like.dim() - 1))


def _call(loss: Loss, run: Callable[[], Any]) -> tuple[Tensor, dict[str, float]]:
    out = run()
    ok = isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], Tensor)
    require(ok, loss, "must return (loss tensor, stats dict)")
    value, stats = out
    require(value.dim() == 0 and finite(value), loss,
            f"the loss must be a finite scalar, got shape {tuple(value.shape)}")
    require(finite_stats(stats), loss, "stats must map names to finite numbers")
    return value, stats


def _grad(value: Tensor, wrt: Tensor) -> Tensor | None:
    if not value.requires_grad:
        return None
    (grad,) = torch.autograd.grad(value, wrt, allow_unused=True)
    return grad


def _reference_rule(loss: Loss, build: Callable[[bool], Any], run: Callable[[Any], Any], field: str) -> None:
    require(isinstance(loss.needs_reference, bool), loss, "needs_reference must be a bool")
    if loss.needs_reference:
        a = _num(_call(loss, lambda: run(build(False)))[0])
        b = _num(_call(loss, lambda: run(build(True)))[0])
        require(a != b, loss, f"needs_reference is true but the loss does not read {field} (the trainer keeps a "
                "reference copy of the model for it)")


def _off_centre(loss: Loss, run: Callable[[Any], Any], build: Callable[[Tensor], Any], leaf: Callable[[], Tensor],
                wrt: str, rows_name: str, split: int | None = None) -> tuple[Tensor, dict[str, float]]:
    """The rules every loss keeps away from the trust-region centre, on ``build(v)`` for a fresh ``v = leaf()``:
    a finite scalar, deterministic, differentiable with respect to ``v``, and a mean over its rows (the batch's
    loss equals its two halves' share-weighted losses; the first half is rows ``:split``, by default half of
    them). Returns the loss and its stats."""
    v = leaf()
    batch = build(v)
    value, stats = _call(loss, lambda: run(batch))
    require(_num(_call(loss, lambda: run(build(leaf())))[0]) == _num(value), loss, "the same inputs gave another loss")
    grad = _grad(value, v)
    require(grad is not None and finite(grad) and bool(grad.abs().sum() > 0), loss,
            f"the loss must be differentiable with respect to {wrt} (a finite, non-zero gradient)")
    n = int(v.shape[0])
    weighted, half = 0.0, n // 2 if split is None else split
    for rows in (slice(0, half), slice(half, n)):
        part = type(batch)(**{k: _rows(t, rows) for k, t in attrs.asdict(batch, recurse=False).items()})
        weighted += _num(_call(loss, functools.partial(run, part))[0]) * (rows.stop - rows.start)
    require(abs(weighted / n - _num(value)) <= SPLIT_TOL * max(1.0, abs(_num(value))), loss,
            f"the loss must be a mean over {rows_name} (the batch's loss differs from its halves' share-weighted sum)")
    return value, stats


def _constants_rule(loss: Loss, run: Callable[[Any], Any], batch: Any, names: Sequence[str]) -> None:
    """The inputs ``names`` (old policy, reference, advantages) are constants of the objective: given with a
    gradient, none may reach them (a loss that let it through would train the old policy or the reward)."""
    leaves = {name: getattr(batch, name).detach().clone().requires_grad_(True) for name in names
              if isinstance(getattr(batch, name), Tensor)}
    value, _ = _call(loss, lambda: run(attrs.evolve(batch, **leaves)))
    if not value.requires_grad:
        return
    grads = torch.autograd.grad(value, list(leaves.values()), allow_unused=True)
    for name, grad in zip(leaves, grads, strict=True):
        require(grad is None or not bool(grad.abs().sum() > 0), loss,
                f"the loss must treat {name} as a constant (detach it): a gradient reached it")


# -- policy losses ---------------------------------------------------------------------------------
def check_policy_loss(
    loss: PolicyLoss, transitions: int = 8, latent_shape: Sequence[int] = (4, 6), seed: int = 0
) -> None:
    """Rules, on Gaussian transitions with the policy's velocity as the only input with a gradient:

    - a finite scalar loss and stats of finite numbers with ``clip_frac`` in [0, 1];
    - the loss is differentiable with respect to the policy (a finite, non-zero gradient reaches the velocity);
    - deterministic: the same inputs give the same loss;
    - the old log-densities, the advantages, the reference and the old means are constants: given with a
      gradient, none reaches them;
    - a mean over transitions: the loss of a batch equals the share-weighted losses of its two halves (the
      trainer backpropagates ``loss * share`` per micro-batch);
    - at the trust-region centre (ratio 1, reference = policy, old mean = mean): ``clip_frac`` is 0, the
      gradient with respect to the log-density is ``-k A w gradient_scale(std, dt)`` with one ``k > 0`` for all
      transitions (the policy gradient, weighted by noise level where the loss says so), and zero advantages
      give a zero gradient;
    - ``needs_reference`` is a bool, and when true the loss reads ``ref_mean``; ``needs_old_mean`` is a bool.
    """
    g = torch.Generator().manual_seed(seed)
    shape = (transitions, *latent_shape)
    x, v0, noise = (torch.randn(shape, generator=g) for _ in range(3))
    dt = -torch.full((transitions,), 0.1)
    std = 0.2 + torch.rand(transitions, generator=g) * 0.2
    advantages = torch.randn(transitions, generator=g)
    weight = 0.5 + torch.rand(transitions, generator=g)
    x_next = x + _expand(dt, x) * v0 + _expand(std, x) * noise
    old_mean_off = x + _expand(dt, x) * (v0 + 0.05 * torch.randn(shape, generator=g))
    old_off = gaussian_log_prob(x_next, old_mean_off, std)
    ref_off = x + _expand(dt, x) * (v0 + 0.1 * torch.randn(shape, generator=g))
    require(isinstance(loss.needs_old_mean, bool), loss, "needs_old_mean must be a bool")

    def inputs(v: Tensor, centre: bool, adv: Tensor, moved_ref: bool = False) -> LossInputs:
        mean = x + _expand(dt, x) * v
        log_prob = gaussian_log_prob(x_next, mean, std)
        old = log_prob.detach().clone() if centre else old_off
        old_mean = (mean.detach().clone() if centre else old_mean_off) if loss.needs_old_mean else None
        ref = (ref_off if moved_ref or not centre else mean.detach().clone()) if loss.needs_reference else None
        return LossInputs(log_prob=log_prob, old_log_prob=old, advantages=adv, weight=weight, mean=mean, std=std,
                          ref_mean=ref, dt=dt, old_mean=old_mean)

    def leaf() -> Tensor:
        return v0.clone().requires_grad_(True)

    # off the centre: shape, determinism, differentiability, a mean over transitions
    _, stats = _off_centre(loss, loss, lambda v: inputs(v, False, advantages), leaf, "the policy", "transitions")
    require("clip_frac" in stats and 0.0 <= float(stats["clip_frac"]) <= 1.0, loss, "stats need clip_frac in [0, 1]")
    constants = ("old_log_prob", "advantages", "ref_mean", "old_mean")
    _constants_rule(loss, loss, inputs(leaf(), False, advantages), constants)

    # the trust-region centre
    v = leaf()
    centre = inputs(v, True, advantages)
    centre.log_prob.retain_grad()
    value, stats = _call(loss, lambda: loss(centre))
    require(float(stats.get("clip_frac", 0.0)) == 0.0, loss, "at ratio 1 no transition may count as clipped")
    value.backward()
    dlogp = centre.log_prob.grad
    require(dlogp is not None and finite(dlogp), loss, "the gradient must reach the log-density at ratio 1")
    assert dlogp is not None
    scale = loss.gradient_scale(std, dt)
    require(isinstance(scale, Tensor) and tuple(scale.shape) == (transitions,) and finite(scale)
            and bool((scale > 0).all()), loss, "gradient_scale(std, dt) must give one positive factor per transition")
    k = -dlogp / (advantages * weight * scale)
    require(bool((k > 0).all()) and float((k - k.mean()).abs().max()) <= 1e-4 * float(k.abs().mean()), loss,
            "at ratio 1 the gradient with respect to the log-density must be -k A w gradient_scale(std, dt), one "
            "k > 0 (the policy gradient, weighted by noise level as the loss declares)")
    v = leaf()
    value, _ = _call(loss, lambda: loss(inputs(v, True, torch.zeros(transitions))))
    grad = _grad(value, v)
    require(grad is None or float(grad.abs().max()) <= GRAD_TOL, loss,
            "at the centre, zero advantages must give a zero gradient")
    _reference_rule(loss, lambda moved: inputs(leaf(), True, advantages, moved), loss, "ref_mean")


# -- forward-process losses ----------------------------------------------------------------------------
def check_forward_process_loss(
    loss: ForwardProcessLoss, rollouts: int = 8, latent_shape: Sequence[int] = (4, 6), seed: int = 0
) -> None:
    """Rules, on rollouts re-noised as the trainer does (the loss's :meth:`~ForwardProcessLoss.rows`, one
    ``x_t = (1 - t) x0 + t eps`` per draw, ``v_old`` detached):

    - ``sample_times(n, generator)``: ``n`` levels in (0, 1), the same for the same generator seed;
    - a finite scalar loss and stats of finite numbers; differentiable with respect to ``v`` (finite,
      non-zero gradient); deterministic; a mean over rows (a batch equals its halves, share-weighted; each
      half is one prompt's rows, which the trainer never splits: a loss may centre within a prompt);
    - ``v_old``, the advantages and ``v_ref`` are constants: given with a gradient, none reaches them;
    - at the centre (``v = v_old``, reference = policy): zero advantages give a zero gradient (or no row at all),
      and the step down the gradient moves a row's velocity towards its flow-matching target ``eps - x0`` when
      its advantage is positive and away from it when negative; rows re-noised alike (one draw) are compared
      instead: the one of the highest advantage moves towards its target, the one of the lowest away;
    - ``needs_reference`` is a bool, and when true the loss reads ``v_ref``.
    """
    times = loss.sample_times(rollouts, torch.Generator().manual_seed(seed))
    again = loss.sample_times(rollouts, torch.Generator().manual_seed(seed))
    require(isinstance(times, Tensor) and tuple(times.shape) == (rollouts,), loss,
            f"sample_times must give ({rollouts},) noise levels")
    require(finite(times) and bool(((times > 0) & (times < 1)).all()), loss, "noise levels must lie in (0, 1)")
    require(torch.equal(times, again), loss, "sample_times must draw only from its generator")
    g = torch.Generator().manual_seed(seed + 1)
    shape = (rollouts, *latent_shape)
    x0, eps, v0 = (torch.randn(shape, generator=g) for _ in range(3))
    v_old_off = v0 + 0.1 * torch.randn(shape, generator=g)
    v_ref_off = v0 + 0.1 * torch.randn(shape, generator=g)
    advantages = torch.randn(rollouts, generator=g)
    advantages[0] = abs(float(advantages[0])) + 0.1  # both signs present
    advantages[1] = -abs(float(advantages[1])) - 0.1
    group = (torch.arange(rollouts) >= rollouts // 2).long()  # two prompts: the halves the mean rule compares

    def layout(adv: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """The loss's rows for ``adv``: each row's rollout, draw, ``t``, noise and ``x_t`` (one ``t`` and noise a
        draw; by default one draw a rollout, which are ``times`` and ``eps`` themselves)."""
        of, draw = (torch.as_tensor(x).long().flatten() for x in loss.rows(adv, group))
        draws = int(draw.max()) + 1 if draw.numel() else 0
        t_draw = times if draws == rollouts else loss.sample_times(draws, torch.Generator().manual_seed(seed))
        more = torch.Generator().manual_seed(seed + 2)
        noise = eps if draws <= rollouts else torch.randn((draws, *latent_shape), generator=more)
        t, noise = t_draw.float()[draw], noise[draw]
        return of, draw, t, noise, (1 - _expand(t, x0)) * x0[of] + _expand(t, x0) * noise

    def inputs(v: Tensor, centre: bool, adv: Tensor, moved_ref: bool = False) -> ForwardProcessInputs:
        of, draw, t, _, x_t = layout(adv)
        v_old = v.detach().clone() if centre else v_old_off[of]
        v_ref = (v_ref_off[of] if moved_ref or not centre else v.detach().clone()) if loss.needs_reference else None
        return ForwardProcessInputs(x0=x0[of], x_t=x_t, t=t, v=v, v_old=v_old, advantages=adv[of], v_ref=v_ref,
                                    group=group[of], draw=draw)

    def leaf(adv: Tensor = advantages) -> Tensor:
        return v0[layout(adv)[0]].clone().requires_grad_(True)

    of, draw, _, noise, _ = layout(advantages)
    require(of.numel() > 0 and bool((group[of][1:] >= group[of][:-1]).all()), loss,
            "rows(advantages, prompt) must train some rows, in prompt order, when the advantages differ")
    split = int((group[of] == group[of][0]).sum())
    _off_centre(loss, loss.forward_process, lambda v: inputs(v, False, advantages), leaf, "v", "rows", split)
    _constants_rule(loss, loss.forward_process, inputs(leaf(), False, advantages), ("v_old", "advantages", "v_ref"))

    zeros = torch.zeros(rollouts)
    if layout(zeros)[0].numel():
        v = leaf(zeros)
        value, _ = _call(loss, lambda: loss.forward_process(inputs(v, True, zeros)))
        grad = _grad(value, v)
        require(grad is None or float(grad.abs().max()) <= GRAD_TOL, loss,
                "at the centre, zero advantages must give a zero gradient")
    v = leaf()
    value, _ = _call(loss, lambda: loss.forward_process(inputs(v, True, advantages)))
    grad = _grad(value, v)
    require(grad is not None and finite(grad), loss, "the gradient must reach v at the centre")
    assert grad is not None
    towards = ((-grad) * (noise - x0[of] - v0[of])).flatten(1).sum(1)  # the descent step against the way to the target
    row_adv = advantages[of]
    for d in torch.unique(draw).tolist():
        rows = (draw == d).nonzero().flatten()
        if len(rows) == 1:
            ok = bool(torch.sign(towards[rows[0]]) == torch.sign(row_adv[rows[0]]))
        else:
            ok = bool(towards[rows[row_adv[rows].argmax()]] > 0) and bool(towards[rows[row_adv[rows].argmin()]] < 0)
        require(ok, loss, "at the centre, a positive advantage must move v towards eps - x0 and a negative one away "
                "from it (of rows re-noised alike: the highest advantage towards it, the lowest away)")
    _reference_rule(loss, lambda moved: inputs(leaf(), True, advantages, moved), loss.forward_process, "v_ref")


def check_loss(loss: Loss, **options: Any) -> None:
    """:func:`check_policy_loss` or :func:`check_forward_process_loss`, by the loss's kind."""
    if isinstance(loss, PolicyLoss):
        check_policy_loss(loss, **options)
    elif isinstance(loss, ForwardProcessLoss):
        check_forward_process_loss(loss, **options)
    else:
        require(False, loss, "a loss must be a PolicyLoss or a ForwardProcessLoss (the trainer picks the update by it)")
