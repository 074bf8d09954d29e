"""``edit_preservation``: how much of the source image an edit kept, in pixel space, weight-free.

Why pixels, and SSIM by default. An edit reward built on a judge alone is open to two hacks: redrawing the whole
picture in a form the judge likes (the judge's over-editing score is a single coarse number), and drifting colours
or textures the judge does not look at. A pixel-space term measures exactly what stayed, needs no weights (so it
cannot be fooled by features a network ignores, and it costs nothing next to a VLM), and is the same number on
every machine. SSIM (Wang et al., IEEE TIP 2004) compares local means, contrasts and correlations in a Gaussian
window, so it rewards kept *structure* and shrugs off small uniform shifts in brightness that an L1 distance
punishes in full; ``metric = "l1"`` gives ``1 - mean |result - source|`` for those who want the plain distance.
The price: a pixel measure also penalises the edit itself, and a global edit (a style, a season, the tone) changes
nearly every pixel. So this term is never the reward alone: a recipe weighs it against an edit judge and ramps it in
with a weight schedule (docs/rewards.md, ``recipes/flux/kontext_edit_judge.toml``), so the policy first learns to
follow the instruction, then to keep the rest. A feature-space similarity tolerates global edits better:
``edit_feature_similarity`` (:mod:`flowrl.rewards.feature_preservation`, DINOv2). flowrl's conditions carry no edit
mask, so the whole image is compared.

The source is brought to the result's frame by the rule the edit bases use: taken as it is when it already has the
result's size, else (a square result) scaled on its short side and centre-cropped
(:func:`~flowrl.core.conditions.fit_square`, FLUX.1-Kontext's rule in flowrl). The first condition image is the
source; a greyscale or RGBA source is compared on its RGB rendering.

SSIM here, per image: each RGB channel in [0, 1], a normalised Gaussian window of side ``window`` (odd, shrunk to the
image's short side when larger, kept odd) and standard deviation ``sigma``, valid positions only (no padding),
``C1 = (0.01)^2``, ``C2 = (0.03)^2``; the map ``(2 mu_x mu_y + C1)(2 cov + C2) / ((mu_x^2 + mu_y^2 + C1)(var_x +
var_y + C2))`` averaged over positions and channels. It is 1 exactly for identical images (numerator and denominator
are then the same floating-point numbers) and at most 1; it can go below 0 for anti-correlated images.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

import attrs
import numpy as np
import torch
import torch.nn.functional as F
from attrs.validators import ge, gt
from torch import Tensor

from flowrl.core.choices import one_of
from flowrl.core.conditions import Condition, conditions_of, fit_square
from flowrl.core.interfaces import RewardModel
from flowrl.core.registry import register

Metric = Literal["ssim", "l1"]
C1, C2 = 0.01**2, 0.03**2  # SSIM's stabilisers for a data range of 1


def gaussian_window(side: int, sigma: float) -> Tensor:
    """A normalised 2-D Gaussian ``(side, side)`` in float64."""
    x = torch.arange(side, dtype=torch.float64) - (side - 1) / 2
    g = torch.exp(-(x**2) / (2 * sigma**2))
    g = g / g.sum()
    return g[:, None] * g[None, :]


def ssim(x: Tensor, y: Tensor, window: int = 11, sigma: float = 1.5) -> Tensor:
    """Mean SSIM ``(B,)`` of images ``x``, ``y`` ``(B, C, H, W)`` in [0, 1] (module docstring), in float64."""
    x, y = x.double(), y.double()
    side = min(window, x.shape[-1], x.shape[-2])
    side -= 1 - side % 2  # odd
    channels = x.shape[1]
    kernel = gaussian_window(side, sigma).expand(channels, 1, side, side).to(x.device)

    def blur(t: Tensor) -> Tensor:
        return F.conv2d(t, kernel, groups=channels)

    mu_x, mu_y = blur(x), blur(y)
    var_x, var_y = blur(x * x) - mu_x * mu_x, blur(y * y) - mu_y * mu_y
    cov = blur(x * y) - mu_x * mu_y
    top = (2 * mu_x * mu_y + C1) * (2 * cov + C2)
    bottom = (mu_x * mu_x + mu_y * mu_y + C1) * (var_x + var_y + C2)
    return (top / bottom).mean(dim=(1, 2, 3))


def source_like(condition: Condition, height: int, width: int) -> Tensor:
    """The source as RGB float32 ``(3, height, width)`` in [0, 1], in the result's frame (module docstring)."""
    if condition.mode != "RGB":
        from PIL import Image

        pixels = np.asarray(condition.pixels)
        image = Image.fromarray(pixels[:, :, 0] if condition.mode == "L" else pixels, condition.mode).convert("RGB")
        condition = Condition(np.asarray(image, dtype=np.uint8))
    if condition.size == (width, height):
        return condition.tensor()
    if height == width:
        return fit_square(condition, height)
    raise ValueError(f"edit_preservation: a {condition.size[0]}x{condition.size[1]} source and a {width}x{height} "
                     "result: a non-square result must have the source's size")


def edit_sources(prompts: list[Any], height: int, width: int, reward: str) -> list[Tensor]:
    """Each prompt's first condition image brought to a ``height`` x ``width`` result's frame (:func:`source_like`);
    a prompt without one is a ValueError naming ``reward``."""
    sources = []
    for prompt in prompts:
        conditions = conditions_of(prompt)
        if not conditions:
            raise ValueError(f"{reward} compares an edit with its source image; {str(prompt)[:40]!r} has none (use"
                             " prompts with condition images: an edit task)")
        sources.append(source_like(conditions[0], height, width))
    return sources


@register("reward", "edit_preservation")
class EditPreservation(RewardModel):
    """How much of the source an edit kept: SSIM (default) or 1 - mean L1 against the source image (1: all)."""

    @attrs.frozen
    class Config:
        metric: Metric = attrs.field(default="ssim", validator=one_of(Metric))
        window: int = attrs.field(default=11, validator=ge(3))  # SSIM: the Gaussian window's side (odd)
        sigma: float = attrs.field(default=1.5, validator=gt(0))  # SSIM: its standard deviation in pixels

    @staticmethod
    def check_config(config: Any) -> Iterable[tuple[str, str]]:
        if config.window % 2 == 0:
            yield ("window", f"must be odd (a window centred on a pixel), got {config.window}")

    @classmethod
    def needs_conditions(cls, config: Config) -> bool:
        return True  # the source image the result is compared with

    def score(self, images: Tensor, prompts: list[str]) -> Tensor:
        if len(prompts) != images.shape[0]:
            raise ValueError(f"{images.shape[0]} images but {len(prompts)} prompts")
        results = images.detach().float().cpu()
        height, width = results.shape[-2:]
        sources = edit_sources(prompts, height, width, "edit_preservation")
        source = torch.stack(sources) if sources else results.clone()
        if self.config.metric == "l1":
            return (1 - (results.double() - source.double()).abs().mean(dim=(1, 2, 3))).float()
        return ssim(results, source, self.config.window, self.config.sigma).float()
