"""The ``edit_preservation`` reward: identical images score 1 exactly, a changed region lowers the score and a larger
change lowers it more, SSIM agrees with an independent SciPy implementation, the source is brought to the result's
frame by the edit bases' rule, and a recipe that uses it on prompts without a source is refused in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT, tiny_recipe

from flowrl.config.condition_checks import reward_condition_problems
from flowrl.config.recipe import RecipeError, recipe_from_dict
from flowrl.core.conditions import Condition, Prompt, fit_square
from flowrl.rewards.preservation import EditPreservation, ssim


def reward(**settings: object) -> EditPreservation:
    return EditPreservation(EditPreservation.Config(**settings))  # type: ignore[arg-type]


def sources(count: int = 3, size: tuple[int, int] = (32, 32)) -> list[np.ndarray]:
    """Smooth random RGB images (blurred noise: structure at several scales, as in a photograph)."""
    rng = np.random.default_rng(0)
    out = []
    for _ in range(count):
        noise = torch.from_numpy(rng.random((1, 3, size[1] // 4, size[0] // 4)))
        image = torch.nn.functional.interpolate(noise, size=(size[1], size[0]), mode="bilinear", align_corners=False)
        out.append((image[0].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8))
    return out


def as_tensor(pixels: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(pixels).permute(2, 0, 1).float() / 255


@pytest.mark.parametrize("metric", ["ssim", "l1"])
def test_identical_scores_one_and_a_changed_region_lowers_it_more_the_larger_it_is(metric: str) -> None:
    pixels = sources()
    prompts = [Prompt("make it brighter", [Condition(p)]) for p in pixels]
    same = torch.stack([as_tensor(p) for p in pixels])
    assert reward(metric=metric).score(same, prompts).tolist() == [1.0, 1.0, 1.0]  # exact by construction
    small, large = same.clone(), same.clone()
    small[:, :, 4:12, 4:12] = 1 - small[:, :, 4:12, 4:12]  # an 8 x 8 patch inverted
    large[:, :, 4:24, 4:24] = 1 - large[:, :, 4:24, 4:24]  # a 20 x 20 patch
    one, two = reward(metric=metric).score(small, prompts), reward(metric=metric).score(large, prompts)
    assert (one < 1).all() and (two < one).all(), (one, two)


def test_ssim_agrees_with_scipys_gaussian_filter() -> None:
    """SSIM as Wang et al. define it, computed independently: SciPy's separable Gaussian filter (radius 5 for sigma
    1.5 with truncate 3.5, as an 11-pixel window), the borders it pads cropped away, in float64."""
    from scipy.ndimage import gaussian_filter

    x = torch.rand(2, 3, 24, 20, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    y = (x + 0.2 * torch.rand(x.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)).clamp(0, 1)

    def reference(a: np.ndarray, b: np.ndarray) -> float:
        values = []
        for c in range(a.shape[0]):
            f = lambda t: gaussian_filter(t, 1.5, truncate=3.5)[5:-5, 5:-5]  # noqa: E731
            ma, mb = f(a[c]), f(b[c])
            va, vb, cov = f(a[c] ** 2) - ma**2, f(b[c] ** 2) - mb**2, f(a[c] * b[c]) - ma * mb
            c1, c2 = 0.01**2, 0.03**2
            values.append((((2 * ma * mb + c1) * (2 * cov + c2)) / ((ma**2 + mb**2 + c1) * (va + vb + c2))).mean())
        return float(np.mean(values))

    expected = [reference(x[i].numpy(), y[i].numpy()) for i in range(2)]
    got = ssim(x, y).tolist()
    assert 0.3 < min(expected) < 0.99  # a real difference, not the trivial 1
    # both float64 sums of ~500 terms of size ~1 in different orders: 1e-12 relative is far above their rounding
    assert got == pytest.approx(expected, rel=1e-12)


def test_the_source_is_brought_to_the_results_frame_as_the_edit_bases_do() -> None:
    (wide,) = sources(1, (48, 32))
    condition = Condition(wide)
    result = fit_square(condition, 32)[None]  # FLUX.1-Kontext's rule in flowrl: short side, centre crop
    assert reward().score(result, [Prompt("keep it", [condition])]).tolist() == [1.0]
    grey = Condition(wide[:, :, 0], "L")  # a greyscale source is compared on its RGB rendering
    assert reward().score(fit_square(Condition(np.repeat(wide[:, :, :1], 3, 2)), 32)[None],
                          [Prompt("keep it", [grey])]).tolist() == [1.0]
    with pytest.raises(ValueError, match="a 48x32 source and a 40x32 result"):
        reward().score(torch.zeros(1, 3, 32, 40), [Prompt("keep it", [condition])])
    with pytest.raises(ValueError, match="'keep it' has none"):
        reward().score(torch.zeros(1, 3, 32, 32), ["keep it"])


def test_settings_and_prompts_without_a_source_are_refused_before_anything_runs(tmp_path: Path) -> None:
    data = tiny_recipe()
    data["reward"] = [{"type": "edit_preservation", "window": 10}]
    with pytest.raises(RecipeError, match=r"reward.window.*must be odd"):
        recipe_from_dict(data)
    data["reward"] = [{"type": "edit_preservation"}]
    ((key, message),) = reward_condition_problems(recipe_from_dict(data))
    assert key == "reward" and message.startswith("'edit_preservation' needs each prompt's condition images")
    text = (ROOT / "recipes" / "egrpo.toml").read_text()
    recipe = tmp_path / "preserve.toml"
    recipe.write_text(text.replace('type = "world_verifier"', 'type = "edit_preservation"'))
    out = subprocess.run([sys.executable, "-m", "flowrl.cli.main", "validate", str(recipe)], capture_output=True,
                         text=True, cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300)
    lines = out.stdout.strip().splitlines()
    assert out.returncode == 2 and "Traceback" not in out.stdout + out.stderr
    assert lines == [f"recipe error: 1 problem in {recipe}",
                     "  [reward] 'edit_preservation' needs each prompt's condition images (it scores the result "
                     "against them), but [prompts] type = 'world' gives prompts without any (a text-to-image task); "
                     "use prompts with condition images (an edit task) or a reward that scores the result alone"]
