"""The SD3 adapter: a diffusers ``StableDiffusion3Pipeline`` (SD3, SD3.5) behind flowrl's :class:`Backbone`.

Latents are the pipeline's own ``(C, H/8, W/8)`` maps (no packing). Classifier-free guidance follows the
pipeline, ``v = v_uncond + scale (v_cond - v_uncond)``, with the unconditional branch frozen: the negative
prompt is encoded once, and its forward runs without gradient (the policy gradient flows through the
conditional branch only; in a no-grad rollout both branches share one batched forward, as in diffusers).

NFE convention: ``nfe`` counts transformer rows, so a guided step costs **2** per latent (conditional and
unconditional rows) and an unguided one (``guidance_scale = 1``) costs 1.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch
from attrs.validators import ge, gt
from torch import Tensor

from flowrl.backbones.common.pipeline import DTYPES, PipelineAdapter, load_from_pretrained, unit_images
from flowrl.backbones.common.settings import DType, SigmaGrid
from flowrl.core.choices import one_of
from flowrl.core.registry import register
from flowrl.core.types import Conditioning


class SD3Adapter(PipelineAdapter):
    """Shared SD3 plumbing; subclasses say where the pipeline comes from (:meth:`load_pipeline`).

    The config must provide ``resolution``, ``guidance_scale``, ``negative_prompt``,
    ``max_sequence_length``, ``grid`` and ``dtype``.
    """

    frozen = ("text_encoder", "text_encoder_2", "text_encoder_3", "vae")

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        factor = self.pipe.vae_scale_factor * self.pipe.transformer.config.patch_size
        if config.resolution % factor:
            raise ValueError(f"resolution {config.resolution} must be a multiple of {factor} for this SD3 model")

    def vocabulary(self) -> Any:
        return getattr(self.pipe, "tokenizer_3", None)  # T5's

    # -- geometry --------------------------------------------------------------------------------
    @property
    def latent_shape(self) -> tuple[int, int, int]:
        side = self.config.resolution // self.pipe.vae_scale_factor
        return (self.pipe.transformer.config.in_channels, side, side)

    @property
    def guided(self) -> bool:
        """Classifier-free guidance is on (``guidance_scale > 1``, as in diffusers)."""
        return float(self.config.guidance_scale) > 1.0

    def schedule_sigmas(self, num_steps: int, shift: float) -> tuple[float, ...]:
        """``grid = "uniform"``: flowrl's shifted grid (as FluxPipeline); ``"diffusers"``: the grid that
        ``StableDiffusion3Pipeline`` uses by default (``FlowMatchEulerDiscreteScheduler.set_timesteps(N)``,
        whose last non-zero level is far smaller), as in Flow-GRPO's SD3 code."""
        if self.config.grid == "uniform":
            return super().schedule_sigmas(num_steps, shift)
        from diffusers import FlowMatchEulerDiscreteScheduler

        steps = int(self.pipe.scheduler.config.get("num_train_timesteps", 1000))
        scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=steps, shift=shift)
        scheduler.set_timesteps(num_steps)
        return tuple(float(s) for s in scheduler.sigmas)

    # -- Backbone interface --------------------------------------------------------------------------
    def encode_rows(self, prompts: list[str]) -> list[tuple[Tensor, Tensor]]:
        """Each prompt's ``(embeds, pooled)``."""
        with torch.no_grad():
            embeds, _, pooled, _ = self.pipe.encode_prompt(
                prompt=prompts,
                prompt_2=None,
                prompt_3=None,
                device=self.device,
                do_classifier_free_guidance=False,
                max_sequence_length=self.config.max_sequence_length,
            )
        return list(zip(embeds.float(), pooled.float(), strict=True))

    def encode(self, prompts: list[str]) -> Conditioning:
        rows = self.cached_rows(prompts)
        return Conditioning({"embeds": torch.stack([r[0] for r in rows]), "pooled": torch.stack([r[1] for r in rows])})

    def _forward(self, x: Tensor, t: Tensor, embeds: Tensor, pooled: Tensor) -> Tensor:
        return self.forward(
            hidden_states=x.to(self.dtype),
            timestep=t,  # fp32, in [0, 1000] as the pipeline passes it
            encoder_hidden_states=embeds.to(self.dtype),
            pooled_projections=pooled.to(self.dtype),
        )

    def velocity(self, x: Tensor, s: Tensor, cond: Conditioning) -> Tensor:
        n = int(x.shape[0])
        embeds, pooled = cond.tensors["embeds"], cond.tensors["pooled"]
        t = s.float() * float(self.pipe.scheduler.config.get("num_train_timesteps", 1000))
        if not self.guided:
            self.nfe += n
            return self._forward(x, t, embeds, pooled)
        u_embeds, u_pooled = (u.unsqueeze(0).expand(n, *u.shape) for u in self.unconditional())
        return self.classifier_free(
            self._forward, x, (t, embeds, pooled), (t, u_embeds, u_pooled), float(self.config.guidance_scale)
        )

    def decode(self, x: Tensor) -> Tensor:
        vae = self.pipe.vae
        with torch.no_grad():
            latents = x.float() / vae.config.scaling_factor + (vae.config.shift_factor or 0.0)
            return unit_images(vae.decode(latents.to(vae.dtype), return_dict=False)[0])


@register("backbone", "sd3")
class SD3FromPretrained(SD3Adapter):
    """SD3 / SD3.5 (any saved StableDiffusion3Pipeline) from a local folder or a hub id (offline respected).

    CFG with a frozen unconditional branch (``guidance_scale > 1``; NFE counts 2 transformer rows per guided
    step); ``grid``: ``uniform`` is flowrl's shifted grid, ``diffusers`` the pipeline's default one
    (Flow-GRPO's SD3 code); ``dtype``: the transformer's storage and autocast dtype (docs/models.md).
    """

    @attrs.frozen
    class Config:
        path: str = attrs.field(validator=attrs.validators.min_len(1))  # folder of save_pretrained, or hub id
        resolution: int = attrs.field(default=512, validator=gt(0))  # image side in pixels
        guidance_scale: float = attrs.field(default=4.5, validator=ge(1.0))  # CFG scale (Flow-GRPO: 4.5); 1 disables
        negative_prompt: str = ""  # the unconditional branch's prompt (encoded once)
        max_sequence_length: int = attrs.field(default=256, validator=gt(0))  # T5 tokens
        grid: SigmaGrid = attrs.field(default="uniform", validator=one_of(SigmaGrid))  # sigma grid
        dtype: DType = attrs.field(default="bfloat16", validator=one_of(DType))

    @staticmethod
    def transformer_on_meta(config: Any) -> Any:
        """The saved transformer without weights, when its config is on this machine (module_names)."""
        from flowrl.backbones.lora.targets import saved_transformer

        return saved_transformer(config.path)

    def load_pipeline(self) -> Any:
        from diffusers import StableDiffusion3Pipeline

        return load_from_pretrained(StableDiffusion3Pipeline, self.config.path, DTYPES[self.config.dtype])
