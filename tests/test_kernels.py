import math

import attrs
import pytest
import torch

from flowrl.core.interfaces import entropy_per_dim, gaussian_log_prob
from flowrl.core.schedule import shifted_sigmas
from flowrl.parts.kernels import CPSKernel, DanceGRPOKernel, FlowGRPOKernel, ODEKernel

S_AT_ONE = 0.97


def _batch(seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(8, 4, 3, 3, generator=g)
    v = torch.randn(8, 4, 3, 3, generator=g)
    s = torch.tensor([1.0, 1.0, 0.97, 0.8, 0.5, 0.3, 0.2, 0.05])
    # ordinary steps, merged jumps and steps to 0
    s_next = torch.tensor([0.97, 0.6, 0.9, 0.79, 0.1, 0.0, 0.15, 0.0])
    return x, v, s, s_next


def _col(t: torch.Tensor) -> torch.Tensor:
    return t.double()[:, None, None, None]


def _ref_flow(x, v, s, s_next, a):
    x, v, sc, nc = x.double(), v.double(), _col(s), _col(s_next)
    denom = torch.tensor([1 - (S_AT_ONE if float(si) == 1.0 else float(si)) for si in s], dtype=torch.float64)
    sigma = a * torch.sqrt(s.double() / denom)
    sig = sigma[:, None, None, None]
    dt = nc - sc
    mean = x * (1 + sig**2 * dt / (2 * sc)) + v * (1 + sig**2 * (1 - sc) / (2 * sc)) * dt
    return mean, sigma * torch.sqrt(s.double() - s_next.double())


def _ref_dance(x, v, s, s_next, eta):
    x, v, sc, nc = x.double(), v.double(), _col(s), _col(s_next)
    dt = nc - sc
    x0_hat = x - sc * v
    score = -(x - (1 - sc) * x0_hat) / sc**2
    return x + v * dt - 0.5 * eta**2 * score * dt, eta * torch.sqrt(s.double() - s_next.double())


def _ref_cps(x, v, s, s_next, a):
    x, v, sc, nc = x.double(), v.double(), _col(s), _col(s_next)
    std = s_next.double() * math.sin(a * math.pi / 2)
    x0_hat, eps_hat = x - sc * v, x + (1 - sc) * v
    return (1 - nc) * x0_hat + torch.sqrt(nc**2 - _col(std) ** 2) * eps_hat, std


def _ref_ode(x, v, s, s_next):
    return x.double() + v.double() * (_col(s_next) - _col(s)), torch.zeros(s.shape[0], dtype=torch.float64)


CASES = [
    (lambda: FlowGRPOKernel(FlowGRPOKernel.Config(noise_level=0.7)), lambda *b: _ref_flow(*b, 0.7)),
    (lambda: FlowGRPOKernel(FlowGRPOKernel.Config(noise_level=1.3)), lambda *b: _ref_flow(*b, 1.3)),
    (lambda: DanceGRPOKernel(DanceGRPOKernel.Config(eta=0.3)), lambda *b: _ref_dance(*b, 0.3)),
    (lambda: CPSKernel(CPSKernel.Config(noise_level=0.7)), lambda *b: _ref_cps(*b, 0.7)),
    (lambda: CPSKernel(CPSKernel.Config(noise_level=1.0)), lambda *b: _ref_cps(*b, 1.0)),
    (lambda: ODEKernel(ODEKernel.Config()), _ref_ode),
]


def _check(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("make, ref", CASES)
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_formula(make, ref, seed: int) -> None:
    x, v, s, s_next = _batch(seed)
    mean, std = make().mean_std(x, v, s, s_next, S_AT_ONE)
    want_mean, want_std = ref(x, v, s, s_next)
    assert mean.shape == x.shape and std.shape == (x.shape[0],)
    _check(mean, want_mean)
    _check(std, want_std)


def test_flow_grpo_guard_at_one() -> None:
    x, v, s, s_next = _batch()
    kernel = FlowGRPOKernel(FlowGRPOKernel.Config(noise_level=0.7))
    mean, std = kernel.mean_std(x, v, s, s_next, S_AT_ONE)
    assert torch.isfinite(mean).all() and torch.isfinite(std).all()
    # at s = 1 and one grid step (s_next = s_at_one): std = a sqrt(1 / (1 - s1)) sqrt(1 - s1) = a
    assert abs(float(std[0]) - 0.7) < 1e-6


@pytest.mark.parametrize(
    "kernel",
    [
        FlowGRPOKernel(FlowGRPOKernel.Config(noise_level=0.0)),
        DanceGRPOKernel(DanceGRPOKernel.Config(eta=0.0)),
        CPSKernel(CPSKernel.Config(noise_level=0.0)),
    ],
)
def test_noise_level_zero_is_ode(kernel) -> None:
    x, v, s, s_next = _batch(3)
    mean, std = kernel.mean_std(x, v, s, s_next, S_AT_ONE)
    ode_mean, _ = ODEKernel(ODEKernel.Config()).mean_std(x, v, s, s_next, S_AT_ONE)
    torch.testing.assert_close(mean, ode_mean, atol=1e-6, rtol=0)
    assert float(std.abs().max()) <= 1e-6


@pytest.mark.parametrize("make, _ref", CASES[:4])
def test_step_log_prob_by_hand(make, _ref) -> None:
    x, v, s, s_next = _batch(5)
    keep = s_next > 0  # rows with std > 0 for every SDE kernel
    x, v, s, s_next = x[keep], v[keep], s[keep], s_next[keep]
    noise = torch.randn(x.shape, generator=torch.Generator().manual_seed(9))
    out = make().step(x, v, s, s_next, S_AT_ONE, noise)
    assert (out.std > 0).all()
    torch.testing.assert_close(out.next, out.mean + out.std[:, None, None, None] * noise)
    n, std = noise.double(), out.std.double()
    want = (-0.5 * n**2).flatten(1).mean(1) - torch.log(std) - 0.5 * math.log(2 * math.pi)
    torch.testing.assert_close(out.log_prob.double(), want, atol=1e-5, rtol=1e-6)
    assert out.log_prob.shape == (x.shape[0],)


@pytest.mark.parametrize("kernel", [ODEKernel(ODEKernel.Config()), CPSKernel(CPSKernel.Config())])
def test_std_zero_step_is_finite(kernel) -> None:
    x, v, _, _ = _batch(7)
    x.requires_grad_(True)
    s, s_next = torch.full((8,), 0.3), torch.zeros(8)
    out = kernel.step(x, v, s, s_next, S_AT_ONE, torch.randn(x.shape))
    assert (out.std == 0).all()
    assert torch.isfinite(out.next).all() and torch.equal(out.next, out.mean)  # exact: mean + 0 * noise
    assert torch.isposinf(out.log_prob).all()  # a point mass; never trained
    out.next.sum().backward()
    assert torch.isfinite(x.grad).all()


def test_gaussian_log_prob_matches_torch() -> None:
    g = torch.Generator().manual_seed(2)
    x, mean = torch.randn(5, 6, generator=g), torch.randn(5, 6, generator=g)
    std = torch.rand(5, generator=g) + 0.1
    want = torch.distributions.Normal(mean, std[:, None]).log_prob(x).mean(1)
    torch.testing.assert_close(gaussian_log_prob(x, mean, std), want)


def test_entropy_per_dim() -> None:
    std = torch.tensor([0.05, 0.17, 0.7, 1.0, 3.0])
    want = 0.5 * math.log(2 * math.pi * math.e) + torch.log(std.double())
    torch.testing.assert_close(entropy_per_dim(std).double(), want, atol=1e-6, rtol=0)
    torch.testing.assert_close(entropy_per_dim(std), torch.distributions.Normal(0.0, std).entropy())


def test_design_figure_single_step_std() -> None:
    """docs/algorithms.md (entropy): N = 16, shift 3, Flow-GRPO a = 0.7: std 0.70 at step 0, 0.17 at step 14."""
    sig = shifted_sigmas(16, 3.0)
    kernel = FlowGRPOKernel(FlowGRPOKernel.Config(noise_level=0.7))
    std = kernel.std_only(sig[:-1], sig[1:], float(sig[1]))
    assert round(float(std[0]), 2) == 0.70
    assert round(float(std[14]), 2) == 0.17
    assert bool((std[1:] < std[:-1])[1:].all())  # decreasing after step 1


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        FlowGRPOKernel.Config(noise_level=-0.1)
    with pytest.raises(ValueError):
        DanceGRPOKernel.Config(eta=-1.0)
    with pytest.raises(ValueError):
        CPSKernel.Config(noise_level=1.5)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        FlowGRPOKernel.Config().noise_level = 1.0  # type: ignore[misc]


def test_cps_official_log_prob_is_the_gaussian_one_times_two_std_squared() -> None:
    """Log-ratios (what the losses use) of the two CPS forms differ by exactly the factor 2 std^2."""
    g = torch.Generator().manual_seed(0)
    x, v1, v2 = (torch.randn(4, 6, 8, generator=g) for _ in range(3))
    s, s_next = torch.full((4,), 0.75), torch.full((4,), 0.5)
    gaussian = CPSKernel(CPSKernel.Config(noise_level=0.7))
    official = CPSKernel(CPSKernel.Config(noise_level=0.7, log_prob="official"))
    out = gaussian.step(x, v1, s, s_next, 0.964, torch.randn(4, 6, 8, generator=g))
    mean2, std = gaussian.mean_std(x, v2, s, s_next, 0.964)
    assert official.log_prob(out.next, out.mean, std) == pytest.approx(
        -((out.next - out.mean) ** 2).flatten(1).mean(1), rel=1e-6
    )
    ratio_g = gaussian.log_prob(out.next, mean2, std) - gaussian.log_prob(out.next, out.mean, std)
    ratio_o = official.log_prob(out.next, mean2, std) - official.log_prob(out.next, out.mean, std)
    torch.testing.assert_close(ratio_o, ratio_g * 2 * std**2, rtol=1e-4, atol=1e-6)  # fp32 differences
    last = official.log_prob(out.next, out.mean, torch.zeros(4))  # std 0: a point mass, as the Gaussian form
    assert torch.isinf(last).all()


@pytest.mark.parametrize("name", ["flow_grpo_sde", "dance_grpo_sde", "cps", "ode"])
def test_noise_levels_may_be_plain_numbers(name: str) -> None:
    """`schedule.sigmas[i]` is a float: every kernel's mean_std and std_only take it for every row (it used to fail
    deep inside with "'float' object has no attribute 'to'"), give exactly what the (B,) tensor gives, and refuse
    anything else in one line naming the argument."""
    import flowrl

    kernel = flowrl.build("kernel", {"type": name})
    sigmas = tuple(shifted_sigmas(10, 3.0).tolist())
    x, v = torch.randn(3, 4, 5), torch.randn(3, 4, 5)
    rows = torch.full((3,), sigmas[2]), torch.full((3,), sigmas[3])
    by_tensor = kernel.mean_std(x, v, *rows, sigmas[1])
    for given in ((sigmas[2], sigmas[3]), ([sigmas[2]] * 3, [sigmas[3]] * 3)):
        by_number = kernel.mean_std(x, v, *given, sigmas[1])
        assert torch.equal(by_number[0], by_tensor[0]) and torch.equal(by_number[1], by_tensor[1])
    assert torch.equal(kernel.std_only(sigmas[2], sigmas[3], sigmas[1]), by_tensor[1][:1])
    with pytest.raises(TypeError, match=r"mean_std: s_next: expected a noise level as a float tensor of shape \(3,\)"):
        kernel.mean_std(x, v, sigmas[2], "0.5", sigmas[1])
