"""The Wan adapter: a diffusers ``WanPipeline`` (Wan 2.1 / 2.2 text-to-video) behind flowrl's :class:`Backbone`.

Latents are the pipeline's own video latents ``(C, F', H/s, W/s)``, with ``F' = (num_frames - 1) / t + 1``
latent frames (the VAE's temporal factor ``t`` is 4 and its spatial factor ``s`` 8 for Wan 2.1; 16 for
the Wan 2.2 TI2V VAE). Conventions, as ``WanPipeline.__call__`` of diffusers 0.42:

- the transformer gets the timestep in [0, 1000] (``sigma * num_train_timesteps``, not divided);
- the text is UMT5's last hidden state, each prompt's states past its real length zeroed and the whole
  padded to ``max_sequence_length`` (``WanPipeline.encode_prompt``; flowrl caches it per prompt);
- classifier-free guidance is the ordinary ``v_uncond + scale (v_cond - v_uncond)``, the negative prompt
  encoded once and its forward run without gradient (as the SD3 adapter); ``nfe`` counts transformer rows,
  2 per guided latent;
- the flow shift is static (Wan: 3.0 at 480p, 5.0 at 720p): the recipe's ``[schedule] shift``; ``grid``
  chooses flowrl's shifted grid (``uniform``, as DanceGRPO; Wan's own UniPC flow sigmas differ from it only
  by starting at 0.9997) or the one ``WanPipeline`` walks with its ``FlowMatchEulerDiscreteScheduler``
  (``diffusers``);
- decoding undoes the VAE's per-channel ``latents_mean`` / ``latents_std`` normalisation.

``decode`` returns a clip ``(B, F, 3, H, W)`` in [0, 1] (frames-major, ``F = num_frames``); with
``num_frames = 1`` (one latent frame: DanceGRPO's image-mode Wan recipe) it returns images ``(B, 3, H, W)``.
Wan 2.2 TI2V (``expand_timesteps``) is supported for text-to-video: the timestep is given per token, as the
pipeline does. Wan 2.2 A14B's second expert (``transformer_2`` with ``boundary_ratio``) is refused at load.
AEGPO's attention-entropy probe is :mod:`flowrl.backbones.wan.probe`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import torch
from attrs.validators import ge, gt
from torch import Tensor

from flowrl.backbones.common.pipeline import DTYPES, PipelineAdapter, load_from_pretrained, unit_images
from flowrl.backbones.common.probe_options import AttentionEntropyOptions
from flowrl.backbones.common.settings import DType, SigmaGrid
from flowrl.core.choices import one_of
from flowrl.core.registry import register
from flowrl.core.types import Conditioning

TEMPORAL = 4  # the temporal factor of every Wan VAE (2.1 and 2.2)
# Wan's published LoRA targets: Flow-GRPO's train_wan2_1.py lists these plus add_{k,q,v}_proj / to_add_out,
# which exist only in the image-to-video transformer; these four catch self- (attn1) and cross-attention (attn2).
LORA_TARGETS = ("to_q", "to_k", "to_v", "to_out.0")


def frame_problems(config: Any) -> list[tuple[str, str]]:
    """``check_config`` rules shared by ``wan`` and ``tiny_wan``: the frame count and the image sides."""
    problems: list[tuple[str, str]] = []
    if (config.num_frames - 1) % TEMPORAL:
        problems.append(("num_frames", f"num_frames - 1 must be divisible by {TEMPORAL} (Wan's VAE packs "
                         f"{TEMPORAL} frames per latent frame after the first), got num_frames = {config.num_frames}"))
    return problems


def refused_experts(index: dict[str, Any], where: str) -> str | None:
    """Why a saved pipeline (its ``model_index.json``) cannot be driven, or None: Wan 2.2 A14B's second expert."""
    second = index.get("transformer_2")
    has_second = isinstance(second, list) and second[0] is not None
    if has_second or index.get("boundary_ratio") is not None:
        return (f"{where} is a two-expert Wan 2.2 pipeline (transformer_2, boundary_ratio = "
                f"{index.get('boundary_ratio')}), which the wan backbone does not support: training would have to "
                "adapt both experts; use a single-transformer Wan pipeline (Wan2.1-T2V, Wan2.2-TI2V-5B)")
    return None


class WanAdapter(PipelineAdapter):
    """Shared Wan plumbing; subclasses say where the pipeline comes from (:meth:`load_pipeline`).

    The config must provide ``resolution``, ``height``, ``width`` (0: ``resolution``), ``num_frames``,
    ``guidance_scale``, ``negative_prompt``, ``max_sequence_length``, ``grid`` and ``dtype``.
    """

    lora_targets: tuple[str, ...] = LORA_TARGETS
    takes_experts = False  # drives a second expert (transformer_2): the image-to-video adapter does

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        why = None if self.takes_experts else refused_experts(dict(self.pipe.config), "this pipeline")
        if why is not None or (not self.takes_experts and getattr(self.pipe, "transformer_2", None) is not None):
            raise ValueError(why or "this Wan pipeline has a transformer_2, which the wan backbone does not support")
        _, ph, pw = self.pipe.transformer.config.patch_size
        spatial = self.pipe.vae_scale_factor_spatial
        for name, side in (("height", self.height), ("width", self.width)):
            if side % (spatial * ph):
                raise ValueError(f"{name} {side} must be a multiple of {spatial * ph} for this Wan model "
                                 f"(VAE factor {spatial} x patch {ph})")
        if (config.num_frames - 1) % self.pipe.vae_scale_factor_temporal:
            raise ValueError(f"num_frames - 1 must be divisible by {self.pipe.vae_scale_factor_temporal}")

    # -- geometry --------------------------------------------------------------------------------
    @property
    def height(self) -> int:
        return int(self.config.height or self.config.resolution)

    @property
    def width(self) -> int:
        return int(self.config.width or self.config.resolution)

    @property
    def latent_frames(self) -> int:
        return (int(self.config.num_frames) - 1) // self.pipe.vae_scale_factor_temporal + 1

    @property
    def latent_shape(self) -> tuple[int, int, int, int]:
        s = self.pipe.vae_scale_factor_spatial
        return (self.pipe.transformer.config.in_channels, self.latent_frames, self.height // s, self.width // s)

    @property
    def output_pixels(self) -> int:
        """Pixels of one decoded rollout, every frame (the memory pre-check's image bound)."""
        return int(self.config.num_frames) * self.height * self.width

    @property
    def guided(self) -> bool:
        """Classifier-free guidance is on (``guidance_scale > 1``, as in diffusers)."""
        return float(self.config.guidance_scale) > 1.0

    @property
    def num_train_timesteps(self) -> int:
        return int(self.pipe.scheduler.config.get("num_train_timesteps", 1000))

    def schedule_sigmas(self, num_steps: int, shift: float) -> tuple[float, ...]:
        """``grid = "uniform"``: flowrl's shifted grid; ``"diffusers"``: ``FlowMatchEulerDiscreteScheduler(shift)``'s
        ``set_timesteps(N)`` grid, the one ``WanPipeline`` walks with its default scheduler class."""
        if self.config.grid == "uniform":
            return super().schedule_sigmas(num_steps, shift)
        from diffusers import FlowMatchEulerDiscreteScheduler

        scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=self.num_train_timesteps, shift=shift)
        scheduler.set_timesteps(num_steps)
        return tuple(float(s) for s in scheduler.sigmas)

    # -- Backbone interface --------------------------------------------------------------------------
    def encode_rows(self, prompts: list[str]) -> Tensor:
        """UMT5 states, zeroed past each prompt's length and padded to ``max_sequence_length`` (the pipeline's)."""
        with torch.no_grad():
            embeds, _ = self.pipe.encode_prompt(
                prompt=prompts,
                do_classifier_free_guidance=False,
                max_sequence_length=self.config.max_sequence_length,
                device=self.device,
            )
        return embeds.float()  # type: ignore[no-any-return]

    def encode(self, prompts: list[str]) -> Conditioning:
        return Conditioning({"embeds": torch.stack(self.cached_rows(prompts))})

    def _timestep(self, t: Tensor, x: Tensor) -> Tensor:
        """``(B,)``, or ``(B, tokens)`` for Wan 2.2 TI2V (``expand_timesteps``: one timestep per latent token;
        in text-to-video every token has the step's)."""
        if not self.pipe.config.get("expand_timesteps", False):
            return t
        pt, ph, pw = self.pipe.transformer.config.patch_size
        tokens = (x.shape[2] // pt) * (x.shape[3] // ph) * (x.shape[4] // pw)
        return t[:, None].expand(-1, tokens)

    def _forward(self, x: Tensor, t: Tensor, embeds: Tensor) -> Tensor:
        return self.forward(
            hidden_states=x.to(self.dtype),
            timestep=self._timestep(t, x),  # fp32, in [0, 1000] as the pipeline passes it
            encoder_hidden_states=embeds.to(self.dtype),
        )

    def velocity(self, x: Tensor, s: Tensor, cond: Conditioning) -> Tensor:
        n = int(x.shape[0])
        embeds = cond.tensors["embeds"]
        t = s.float() * float(self.num_train_timesteps)
        if not self.guided:
            self.nfe += n
            return self._forward(x, t, embeds)
        u_embeds = self.unconditional().unsqueeze(0).expand(n, -1, -1)
        return self.classifier_free(self._forward, x, (t, embeds), (t, u_embeds), float(self.config.guidance_scale))

    def velocity_and_entropy(self, x: Tensor, s: Tensor, cond: Conditioning, options: Any) -> tuple[Tensor, Tensor]:
        """AEGPO's probe (:mod:`flowrl.backbones.wan.probe`): the velocity and the softmax entropy ``(B,)`` of
        the video-query rows of self-attention (``options.keys = "all"``) or cross-attention (``"text"``)."""
        from flowrl.backbones.wan.probe import entropy_probe

        options = options or AttentionEntropyOptions()
        with torch.no_grad(), entropy_probe(self.module, options) as recorder:
            v = self.velocity(x, s, cond)
        return v, recorder.entropy()[-int(x.shape[0]) :]  # guided: rows [uncond; cond], the conditional half

    def decode(self, x: Tensor) -> Tensor:
        """Clips ``(B, F, 3, H, W)`` in [0, 1]; images ``(B, 3, H, W)`` when ``num_frames = 1``."""
        vae = self.pipe.vae
        shape = (1, vae.config.z_dim, 1, 1, 1)
        mean = torch.tensor(vae.config.latents_mean, dtype=torch.float32, device=x.device).view(shape)
        inv_std = 1.0 / torch.tensor(vae.config.latents_std, dtype=torch.float32, device=x.device).view(shape)
        with torch.no_grad():
            latents = x.float() / inv_std + mean  # the pipeline's order of operations
            video = vae.decode(latents.to(vae.dtype), return_dict=False)[0]  # (B, 3, F, H, W) in [-1, 1]
        clip = unit_images(video).permute(0, 2, 1, 3, 4).contiguous()
        return clip[:, 0] if self.config.num_frames == 1 else clip


def _model_index(path: str) -> dict[str, Any] | None:
    """The saved pipeline's ``model_index.json`` from a local folder or the hub cache; None if not on this machine."""
    file = Path(path) / "model_index.json"
    if not file.is_file():
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(path, "model_index.json")
        except Exception:  # not a valid repo id either
            return None
        if not isinstance(cached, str):
            return None
        file = Path(cached)
    return json.loads(file.read_text())  # type: ignore[no-any-return]


@register("backbone", "wan")
class WanFromPretrained(WanAdapter):
    """Wan 2.1 / 2.2 text-to-video (any saved single-transformer WanPipeline), from a local folder or a hub id
    (offline respected). ``num_frames`` pixel frames (``num_frames - 1`` divisible by 4; 1 = image mode);
    ``height`` / ``width`` default to ``resolution``; CFG with a frozen negative branch (2 rows per guided
    latent); ``grid`` as SD3's; ``dtype``: the transformer's storage and autocast dtype."""

    @attrs.frozen
    class Config:
        path: str = attrs.field(validator=attrs.validators.min_len(1))  # folder of save_pretrained, or hub id
        resolution: int = attrs.field(default=480, validator=gt(0))  # frame side in pixels (square)
        height: int = attrs.field(default=0, validator=ge(0))  # frame height (0: resolution)
        width: int = attrs.field(default=0, validator=ge(0))  # frame width (0: resolution)
        num_frames: int = attrs.field(default=33, validator=ge(1))  # pixel frames; num_frames - 1 divisible by 4
        guidance_scale: float = attrs.field(default=5.0, validator=ge(1.0))  # CFG scale (WanPipeline: 5); 1 disables
        negative_prompt: str = ""  # the unconditional branch's prompt (encoded once)
        max_sequence_length: int = attrs.field(default=512, validator=gt(0))  # UMT5 tokens (Wan: 512)
        grid: SigmaGrid = attrs.field(default="uniform", validator=one_of(SigmaGrid))  # sigma grid
        dtype: DType = attrs.field(default="bfloat16", validator=one_of(DType))

    @staticmethod
    def check_config(config: Config) -> list[tuple[str, str]]:
        problems = frame_problems(config)
        for name in ("height", "width"):
            side = getattr(config, name) or config.resolution
            if side % 16:  # WanPipeline.check_inputs; Wan 2.1's VAE factor 8 x patch 2
                problems.append((name if getattr(config, name) else "resolution",
                                 f"{name} {side} must be a multiple of 16 for Wan"))
        index = _model_index(config.path)
        why = refused_experts(index, f"'{config.path}'") if index is not None else None
        if why is not None:
            problems.append(("path", why))
        return problems

    @staticmethod
    def transformer_on_meta(config: Any) -> Any:
        """The saved transformer without weights, when its config is on this machine (module_names)."""
        from flowrl.backbones.lora.targets import saved_transformer

        return saved_transformer(config.path)

    def load_pipeline(self) -> Any:
        from diffusers import WanPipeline

        index = _model_index(self.config.path)
        why = refused_experts(index, f"'{self.config.path}'") if index is not None else None
        if why is not None:
            raise ValueError(why)
        return load_from_pretrained(WanPipeline, self.config.path, DTYPES[self.config.dtype])
