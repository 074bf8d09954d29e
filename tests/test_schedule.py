import numpy as np
import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler

from flowrl.core.schedule import shifted_sigmas


@pytest.mark.parametrize("num_steps", [1, 4, 10, 16, 25, 50])
@pytest.mark.parametrize("shift", [1.0, 3.0, 5.0, 0.5])
def test_matches_diffusers(num_steps: int, shift: float) -> None:
    sigmas = shifted_sigmas(num_steps, shift)
    assert sigmas.dtype == torch.float64 and sigmas.shape == (num_steps + 1,)
    assert sigmas[0] == 1.0 and sigmas[-1] == 0.0 and bool((sigmas[1:] < sigmas[:-1]).all())
    sched = FlowMatchEulerDiscreteScheduler(shift=shift, use_dynamic_shifting=False)
    sched.set_timesteps(sigmas=np.linspace(1.0, 1.0 / num_steps, num_steps))
    theirs = sched.sigmas.double()
    assert theirs.shape == sigmas.shape and float(theirs[-1]) == 0.0
    torch.testing.assert_close(theirs, sigmas, atol=1e-6, rtol=0)
    torch.testing.assert_close(sched.timesteps.double(), sigmas[:-1] * 1000, atol=1e-3, rtol=0)


def test_formula_by_hand() -> None:
    # N = 4, k = 3: u = 0.75 -> 2.25 / 2.5 = 0.9; u = 0.5 -> 1.5 / 2 = 0.75; u = 0.25 -> 0.75 / 1.5 = 0.5.
    want = torch.tensor([1.0, 0.9, 0.75, 0.5, 0.0], dtype=torch.float64)
    torch.testing.assert_close(shifted_sigmas(4, 3.0), want)


def test_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        shifted_sigmas(0, 3.0)
    with pytest.raises(ValueError):
        shifted_sigmas(4, 0.0)
