"""The FLUX.2 adapter: diffusers' ``Flux2Pipeline`` (FLUX.2-dev) or ``Flux2KleinPipeline`` (FLUX.2-klein,
klein-base) behind flowrl's :class:`Backbone`.

The base's conventions, as the pipelines apply them (diffusers 0.42):

- **Latents.** The VAE's ``[B, C, H/8, W/8]`` maps are patchified 2x2 into ``[B, 4C, H/16, W/16]``, normalised
  per channel by the VAE's batch-norm running statistics, ``(z - mean) / sqrt(var + eps)``, and packed into
  ``[B, (H/16)(W/16), 4C]`` tokens (a plain transpose). flowrl's latent is that token tensor; :meth:`decode`
  undoes the three steps before the VAE decodes.
- **Positions.** 4-D ids ``(t, h, w, l)`` with a batch dimension: image tokens ``(0, row, col, 0)``, text tokens
  ``(0, 0, 0, index)``. The transformer reads the first row only, so one id tensor serves every row.
- **Timestep.** The transformer takes ``t`` in [0, 1] (the pipeline divides its scheduler timestep by 1000, and
  the transformer multiplies by 1000 again); flowrl's noise level ``s`` is that ``t``.
- **Guidance rule**, by pipeline class: ``Flux2Pipeline`` (dev) is guidance-distilled: ``guidance_scale`` goes
  into the ``guidance`` embedder, one forward per step. ``Flux2KleinPipeline`` calls the transformer with
  ``guidance=None``; the distilled klein (``is_distilled``) runs one forward and ignores ``guidance_scale``;
  klein-base with ``guidance_scale > 1`` runs real CFG, ``v = v_neg + scale (v_cond - v_neg)``, the negative
  prompt being ``""`` (the pipeline's; ``negative_prompt`` may change it). The negative branch is frozen (encoded
  once, its forward without gradient) and ``nfe`` counts 2 rows per guided latent, as for SD3.
- **Text.** The text encoder's hidden states of three layers (dev: Mistral-3 layers 10, 20, 30; klein: Qwen-3
  layers 9, 18, 27) are stacked along the feature axis; prompts are padded to ``max_sequence_length``.
- **Sigma grid.** ``grid = "diffusers"`` (the default): the pipeline's, ``linspace(1, 1/N, N)`` shifted with
  ``mu = compute_empirical_mu(image tokens, N)`` (depends on the step count, not only the resolution), so an
  ODE rollout equals the pipeline's; the recipe's ``schedule.shift`` is then unused. ``"uniform"``: flowrl's
  shifted grid with ``schedule.shift``.

Velocities come back as fp32 (``v ~ eps - x0``, the same sign as FLUX.1: the pipelines' Euler step is
``x + (s_next - s) v``); bf16/fp16 run under autocast as in :mod:`flowrl.backbones.flux.adapter`.
"""

from __future__ import annotations

from typing import Any, Self

import attrs
import numpy as np
import torch
from attrs.validators import ge, gt
from torch import Tensor

from flowrl.backbones.common.checks import packed_vae_multiple, saved_json
from flowrl.backbones.common.pipeline import DTYPES, PipelineAdapter, load_from_pretrained, unit_images
from flowrl.backbones.common.probe_options import AttentionEntropyOptions
from flowrl.backbones.common.settings import DType, SigmaGrid
from flowrl.core.choices import one_of
from flowrl.core.registry import register
from flowrl.core.types import Conditioning

PIPELINES = ("Flux2Pipeline", "Flux2KleinPipeline")
# diffusers' dreambooth FLUX.2 LoRA list (train_dreambooth_lora_flux2.py): the double blocks' attention
# projections, the single blocks' fused qkv+mlp input, and the single blocks' fused output projection
# ``single_transformer_blocks.N.attn.to_out`` (a plain Linear, unlike the double blocks' ``to_out`` ModuleList,
# which a bare ``attn.to_out`` would also select and peft refuses), named per block for FLUX.2-dev's 48.
SINGLE_BLOCKS_DEV = 48
BASE_TARGETS = ("to_k", "to_q", "to_v", "to_out.0", "to_qkv_mlp_proj")


def single_block_outputs(n: int) -> tuple[str, ...]:
    """The names of the first ``n`` single blocks' output projections."""
    return tuple(f"single_transformer_blocks.{i}.attn.to_out" for i in range(n))


class Flux2Adapter(PipelineAdapter):
    """Shared FLUX.2 plumbing; subclasses say where the pipeline comes from (:meth:`load_pipeline`).

    The config must provide ``resolution``, ``guidance_scale``, ``negative_prompt``, ``max_sequence_length``,
    ``grid`` and ``dtype``.
    """

    lora_targets = BASE_TARGETS + single_block_outputs(SINGLE_BLOCKS_DEV)

    def __init__(self, config: Any) -> None:
        self._text_ids: Tensor | None = None  # (1, L, 4): every prompt is padded to the same length
        super().__init__(config)
        kind = type(self.pipe).__name__
        if kind not in PIPELINES:
            raise ValueError(f"the flux2 backbone drives {' or '.join(PIPELINES)}, not {kind}")
        factor = self.pipe.vae_scale_factor * 2
        if config.resolution % factor:
            raise ValueError(f"resolution {config.resolution} must be a multiple of {factor} for this FLUX.2 model")
        self.side = config.resolution // factor  # tokens per side
        self._img_ids = self.pipe._prepare_latent_ids(torch.zeros(1, 1, self.side, self.side))  # (1, h w, 4)

    def vocabulary(self) -> Any:
        return getattr(self.pipe.tokenizer, "tokenizer", self.pipe.tokenizer)  # dev's processor holds one

    # -- the base's rules --------------------------------------------------------------------------
    @property
    def klein(self) -> bool:
        return type(self.pipe).__name__ == "Flux2KleinPipeline"

    @property
    def guided(self) -> bool:
        """Real CFG with a negative forward: klein-base (not distilled) with ``guidance_scale > 1``."""
        return self.klein and not self.pipe.config.is_distilled and float(self.config.guidance_scale) > 1.0

    @property
    def embedded_guidance(self) -> bool:
        """dev: ``guidance_scale`` goes into the transformer's guidance embedder."""
        return not self.klein and self.pipe.transformer.config.guidance_embeds

    @property
    def latent_shape(self) -> tuple[int, int]:
        return (self.side**2, self.pipe.transformer.config.in_channels)

    def schedule_sigmas(self, num_steps: int, shift: float) -> tuple[float, ...]:
        """``grid = "diffusers"``: the pipeline's grid (``linspace(1, 1/N, N)`` with its scheduler and
        ``mu = compute_empirical_mu(tokens, N)``); ``"uniform"``: flowrl's shifted grid."""
        if self.config.grid == "uniform":
            return super().schedule_sigmas(num_steps, shift)
        from diffusers.pipelines.flux2.pipeline_flux2 import compute_empirical_mu

        scheduler = type(self.pipe.scheduler).from_config(self.pipe.scheduler.config)
        sigmas: Any = np.linspace(1.0, 1 / num_steps, num_steps)
        if getattr(scheduler.config, "use_flow_sigmas", False):
            sigmas = None  # as the pipeline: the scheduler makes its own
        mu = compute_empirical_mu(image_seq_len=self.side**2, num_steps=num_steps)
        scheduler.set_timesteps(num_steps, sigmas=sigmas, mu=mu)
        return tuple(float(s) for s in scheduler.sigmas)

    # -- Backbone interface ------------------------------------------------------------------------
    def to(self, device: torch.device) -> Self:
        super().to(device)
        self._img_ids = self._img_ids.to(self.device)
        self._text_ids = None
        return self

    def encode_rows(self, prompts: list[str]) -> Tensor:
        with torch.no_grad():
            embeds, text_ids = self.pipe.encode_prompt(
                prompt=prompts, device=self.device, max_sequence_length=self.config.max_sequence_length
            )
        self._text_ids = text_ids[:1]
        return embeds.float()  # type: ignore[no-any-return]

    def encode(self, prompts: list[str]) -> Conditioning:
        return Conditioning({"embeds": torch.stack(self.cached_rows(prompts))})

    def timestep(self, s: Tensor) -> Tensor:
        """The transformer's timestep for noise levels ``s``: the pipeline's scheduler timestep ``1000 s`` (fp32)
        divided by 1000 again, rounded as the pipeline rounds it."""
        steps = float(self.pipe.scheduler.config.get("num_train_timesteps", 1000))
        return (s.float() * steps) / steps

    def _forward(self, x: Tensor, t: Tensor, embeds: Tensor) -> Tensor:
        n = int(x.shape[0])
        guidance = None
        if self.embedded_guidance:
            guidance = torch.full((n,), float(self.config.guidance_scale), device=x.device, dtype=torch.float32)
        assert self._text_ids is not None, "encode() runs before velocity()"
        return self.forward(
            hidden_states=x.to(self.dtype),
            encoder_hidden_states=embeds.to(self.dtype),
            timestep=t,
            guidance=guidance,
            txt_ids=self._text_ids.expand(n, -1, -1),
            img_ids=self._img_ids.expand(n, -1, -1),
        )

    def velocity(self, x: Tensor, s: Tensor, cond: Conditioning) -> Tensor:
        n = int(x.shape[0])
        embeds, t = cond.tensors["embeds"], self.timestep(s)
        if not self.guided:
            self.nfe += n
            return self._forward(x, t, embeds)
        negative = self.unconditional().unsqueeze(0).expand(n, *embeds.shape[1:])
        return self.classifier_free(self._forward, x, (t, embeds), (t, negative), float(self.config.guidance_scale))

    def latents_from_tokens(self, x: Tensor) -> Tensor:
        """The VAE's latent maps ``[B, C, H/8, W/8]`` for tokens ``x`` (unpack, undo the batch-norm
        normalisation, unpatchify): what ``Flux2KleinPipeline`` returns for ``output_type="latent"``."""
        vae = self.pipe.vae
        b, _, channels = x.shape
        maps = x.transpose(1, 2).reshape(b, channels, self.side, self.side)
        mean = vae.bn.running_mean.view(1, -1, 1, 1).to(maps.device, maps.dtype)
        std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps).to(maps.device, maps.dtype)
        return self.pipe._unpatchify_latents(maps * std + mean)  # type: ignore[no-any-return]

    def decode(self, x: Tensor) -> Tensor:
        vae = self.pipe.vae
        with torch.no_grad():
            latents = self.latents_from_tokens(x.float())
            return unit_images(vae.decode(latents.to(vae.dtype), return_dict=False)[0])

    def velocity_and_entropy(self, x: Tensor, s: Tensor, cond: Conditioning, options: Any) -> tuple[Tensor, Tensor]:
        """AEGPO's probe: one probed forward gives the velocity and the image-query attention entropy ``(B,)``
        (:mod:`flowrl.backbones.flux2.probe`; counted in ``nfe`` like :meth:`velocity`)."""
        from flowrl.backbones.flux2.probe import entropy_probe

        options = options or AttentionEntropyOptions()
        n, text_len = int(x.shape[0]), int(cond.tensors["embeds"].shape[1])
        with torch.no_grad(), entropy_probe(self.module, options, text_len) as recorder:
            v = self.velocity(x, s, cond)
        return v, recorder.entropy()[-n:]  # with CFG the forward is batched [negative; cond]: the conditional rows


@register("backbone", "flux2")
class Flux2FromPretrained(Flux2Adapter):
    """FLUX.2-dev, FLUX.2-klein or klein-base (any saved Flux2Pipeline / Flux2KleinPipeline: the class named in
    ``model_index.json``) from a local folder or a hub id (offline respected).

    ``guidance_scale``: dev's embedded guidance; klein-base's CFG scale (> 1: a frozen negative forward, 2 rows
    of NFE per step); ignored by the distilled klein. ``grid``: ``diffusers`` is the pipeline's ``mu``-shifted
    grid (exact parity), ``uniform`` flowrl's shifted one.
    """

    @classmethod
    def default_lora_targets(cls, config: Any) -> tuple[str, ...]:
        """The published list with one output projection per single block of this model: the saved
        transformer's ``num_single_layers`` when its config is on this machine (klein has fewer), else dev's 48."""
        saved = saved_json(config.path, "transformer/config.json") or {}
        return BASE_TARGETS + single_block_outputs(int(saved.get("num_single_layers", SINGLE_BLOCKS_DEV)))

    @attrs.frozen
    class Config:
        path: str = attrs.field(validator=attrs.validators.min_len(1))  # folder of save_pretrained, or hub id
        resolution: int = attrs.field(default=1024, validator=gt(0))  # image side in pixels (the pipelines' default)
        guidance_scale: float = attrs.field(default=4.0, validator=ge(0.0))  # both pipelines' default
        negative_prompt: str = ""  # klein-base's negative branch (the pipeline's is "")
        max_sequence_length: int = attrs.field(default=512, validator=gt(0))  # text tokens (the pipelines')
        grid: SigmaGrid = attrs.field(default="diffusers", validator=one_of(SigmaGrid))
        dtype: DType = attrs.field(default="bfloat16", validator=one_of(DType))

    @staticmethod
    def check_config(config: Config) -> list[tuple[str, str]]:
        """What the saved model's files on this machine (if any) already refute: the pipeline class and the
        resolution's multiple."""
        problems: list[tuple[str, str]] = []
        index = saved_json(config.path, "model_index.json")
        if index is not None and index.get("_class_name") not in PIPELINES:
            found = index.get("_class_name")
            problems.append(("path", f"'{config.path}' holds a {found}, not {' or '.join(PIPELINES)}"))
        vae = saved_json(config.path, "vae/config.json")
        if vae is not None:
            factor = packed_vae_multiple(vae)
            if config.resolution % factor:
                problems.append(("resolution", f"{config.resolution} must be a multiple of {factor} for this model"))
        return problems

    @staticmethod
    def transformer_on_meta(config: Any) -> Any:
        """The saved transformer without weights, when its config is on this machine (module_names)."""
        from flowrl.backbones.lora.targets import saved_transformer

        return saved_transformer(config.path)

    def load_pipeline(self) -> Any:
        import diffusers

        index = saved_json(self.config.path, "model_index.json") or {}
        name = str(index.get("_class_name", ""))
        cls = getattr(diffusers, name) if name in PIPELINES else diffusers.DiffusionPipeline
        return load_from_pretrained(cls, self.config.path, DTYPES[self.config.dtype])
