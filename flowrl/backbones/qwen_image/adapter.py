"""The Qwen-Image adapter: a diffusers ``QwenImagePipeline`` behind flowrl's :class:`Backbone` interface.

Qwen-Image's own conventions, as ``QwenImagePipeline.__call__`` (diffusers 0.42) applies them:

- **Latents** are the VAE's ``(C, H/8, W/8)`` maps cut into 2x2 patches and packed into
  ``(H/16 * W/16, 4 C)`` tokens (the pipeline's ``_pack_latents``); the transformer is told the token grid
  through ``img_shapes = [(1, H/16, W/16)]`` per latent (its 3-D RoPE; 1 frame).
- **Timestep**: the transformer takes ``t`` in [0, 1]: the pipeline divides the scheduler's timestep
  (``sigma * 1000``) by 1000, and so does this adapter, in the same fp32 operations.
- **Text**: the prompt goes through the pipeline's chat template, Qwen2.5-VL's last hidden states are kept
  without the template's first ``prompt_template_encode_start_idx`` tokens, and the padded rows of a batch
  are described by ``encoder_hidden_states_mask`` (diffusers 0.42 has no ``txt_seq_lens``: the transformer
  reads the lengths from the mask). flowrl caches each prompt's states at their own length and pads a
  batch to ``max_sequence_length``; a forward is trimmed to the batch's longest prompt and passes no mask
  when no row is padded (as the pipeline does).
- **True classifier-free guidance** (``true_cfg_scale > 1``): two forwards, the prompt's and the negative
  prompt's, ``comb = v_neg + s (v_cond - v_neg)``, then every token's velocity is rescaled to the norm of
  the conditional one, ``v = comb * |v_cond| / |comb|`` (over channels). The negative branch is frozen: its
  prompt is encoded once and its forward runs without gradient, so the policy gradient (and the log-density
  of a GRPO ratio) flows through the conditional velocity and the rescale. ``nfe`` counts transformer rows:
  2 per latent per guided step, 1 unguided.
- **Sigma grid** (``grid``): ``diffusers`` (the default) is the pipeline's, ``sigmas = linspace(1, 1/N, N)``
  given to its scheduler with the dynamic shift ``mu = calculate_shift(image tokens, ...)`` from the
  scheduler's config (Qwen-Image's also stretches the grid to end at 0.02 before the final 0); the recipe's
  ``schedule.shift`` is then unused. ``uniform`` is flowrl's shifted grid with ``schedule.shift``.
- The velocity follows flowrl's sign, ``v ~ eps - x0``: the transformer's output is used as it is (the
  pipeline's Euler step ``x + (sigma_next - sigma) v`` is flowrl's ODE step).

Precision as for FLUX (:mod:`flowrl.backbones.flux.adapter`): transformer weights stored in ``dtype``, forwards
under autocast, velocities (and the guidance arithmetic) in fp32.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import attrs
import torch
from attrs.validators import ge, gt
from torch import Tensor

from flowrl.backbones.common.pipeline import DTYPES, PipelineAdapter, load_from_pretrained, unit_images
from flowrl.backbones.common.probe import EntropyRecorder
from flowrl.backbones.common.probe_options import AttentionEntropyOptions
from flowrl.backbones.common.settings import DType, SigmaGrid
from flowrl.core.choices import one_of
from flowrl.core.registry import register
from flowrl.core.types import Conditioning

MAX_TEXT_TOKENS = 1024  # QwenImagePipeline refuses a longer max_sequence_length
# verl-omni / verl FlowGRPO on Qwen-Image (examples/flowgrpo_trainer/qwen_image/run_qwen_image_ocr_lora.sh):
# the joint attention's image and text projections and both streams' feed-forward layers
QWEN_IMAGE_LORA_TARGETS = (
    "to_q", "to_k", "to_v", "to_out.0",
    "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out",
    "img_mlp.net.0.proj", "img_mlp.net.2", "txt_mlp.net.0.proj", "txt_mlp.net.2",
)  # fmt: skip


def dynamic_shift_sigmas(scheduler_config: Any, num_steps: int, image_tokens: int) -> tuple[float, ...]:
    """The grid ``QwenImagePipeline`` samples on: its scheduler (a copy built from ``scheduler_config``) set
    with ``sigmas = linspace(1, 1/N, N)`` and ``mu = calculate_shift(image_tokens, ...)`` read from the same
    config, then the final 0. One step is ``(1, 0)``: the stretch to a terminal level divides by zero there
    (the pipeline's own one-step grid is NaN)."""
    import numpy as np
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.pipelines.qwenimage.pipeline_qwenimage import calculate_shift

    if num_steps == 1:
        return (1.0, 0.0)
    scheduler = FlowMatchEulerDiscreteScheduler.from_config(scheduler_config)
    mu = calculate_shift(
        image_tokens,
        scheduler_config.get("base_image_seq_len", 256),
        scheduler_config.get("max_image_seq_len", 4096),
        scheduler_config.get("base_shift", 0.5),
        scheduler_config.get("max_shift", 1.15),
    )
    scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / num_steps, num_steps), mu=mu)
    return tuple(float(s) for s in scheduler.sigmas)


class QwenImageAdapter(PipelineAdapter):
    """Shared Qwen-Image plumbing; subclasses say where the pipeline comes from (:meth:`load_pipeline`).

    The config must provide ``resolution``, ``true_cfg_scale``, ``negative_prompt``, ``max_sequence_length``,
    ``grid`` and ``dtype``.
    """

    lora_targets = QWEN_IMAGE_LORA_TARGETS

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        factor = self.pipe.vae_scale_factor * 2
        if config.resolution % factor:
            raise ValueError(f"resolution {config.resolution} must be a multiple of {factor} for this Qwen-Image model")
        warn_if_template_drop_is_off(self.pipe)

    # -- geometry --------------------------------------------------------------------------------
    def latent_grid(self) -> int:
        """Tokens per side (2x2 latent pixels per token)."""
        return int(self.config.resolution) // (self.pipe.vae_scale_factor * 2)

    @property
    def latent_shape(self) -> tuple[int, int]:
        return (self.latent_grid() ** 2, int(self.pipe.transformer.config.in_channels))

    @property
    def img_shape(self) -> tuple[int, int, int]:
        """One latent's ``img_shapes`` entry: (frames, token rows, token columns)."""
        return (1, self.latent_grid(), self.latent_grid())

    @property
    def guided(self) -> bool:
        """True classifier-free guidance is on (``true_cfg_scale > 1``, as in the pipeline)."""
        return float(self.config.true_cfg_scale) > 1.0

    def schedule_sigmas(self, num_steps: int, shift: float) -> tuple[float, ...]:
        """``grid = "diffusers"``: the pipeline's dynamically shifted grid (:func:`dynamic_shift_sigmas`;
        ``shift`` unused); ``"uniform"``: flowrl's shifted grid."""
        if self.config.grid == "uniform":
            return super().schedule_sigmas(num_steps, shift)
        return dynamic_shift_sigmas(self.pipe.scheduler.config, num_steps, self.latent_shape[0])

    # -- Backbone interface --------------------------------------------------------------------------
    def encode_rows(self, prompts: list[str]) -> list[Tensor]:
        """Each prompt's text states at its own length (template dropped, truncated), fp32."""
        with torch.no_grad():
            embeds, mask = self.pipe.encode_prompt(
                prompt=prompts, device=self.device, max_sequence_length=self.config.max_sequence_length
            )
        lengths = [embeds.shape[1]] * len(prompts) if mask is None else mask.sum(1).tolist()
        return [embeds[i, : int(n)].float() for i, n in enumerate(lengths)]

    def encode(self, prompts: list[str]) -> Conditioning:
        """``embeds`` ``(B, max_sequence_length, width)`` zero-padded and ``mask`` ``(B, max_sequence_length)``
        (1 on a prompt's tokens), each prompt encoded once."""
        rows = self.cached_rows(prompts)
        size, width = int(self.config.max_sequence_length), rows[0].shape[1]
        embeds = torch.zeros(len(rows), size, width, device=rows[0].device)
        mask = torch.zeros(len(rows), size, dtype=torch.long, device=rows[0].device)
        for i, row in enumerate(rows):
            embeds[i, : row.shape[0]] = row
            mask[i, : row.shape[0]] = 1
        return Conditioning({"embeds": embeds, "mask": mask})

    @staticmethod
    def trimmed(cond: Conditioning) -> tuple[Tensor, Tensor | None]:
        """The batch's text states cut to its longest prompt, and their mask (None when no row is padded)."""
        mask = cond.tensors["mask"]
        longest = max(int(mask.sum(1).max()), 1)
        mask = mask[:, :longest]
        return cond.tensors["embeds"][:, :longest], (None if bool(mask.all()) else mask)

    def image_input(self, x: Tensor, cond: Conditioning | None) -> tuple[Tensor, list[Any]]:
        """The transformer's image stream for latents ``x`` and its ``img_shapes`` (one entry per row): here the
        latents alone on one grid; an edit base appends its source images' tokens and grids."""
        return x, [self.img_shape] * int(x.shape[0])

    def negative_states(self, cond: Conditioning, n: int) -> tuple[Tensor, Tensor | None]:
        """The negative branch's text states for ``n`` rows and their mask: the negative prompt's, encoded once."""
        negative = self.unconditional()  # the negative prompt's text states (length, width)
        return negative.unsqueeze(0).expand(n, *negative.shape), None

    def _forward(self, x: Tensor, t: Tensor, embeds: Tensor, mask: Tensor | None, cond: Conditioning | None = None
                 ) -> Tensor:
        """One transformer call on latents ``x`` (with what :meth:`image_input` adds), cut back to ``x``'s tokens."""
        hidden, shapes = self.image_input(x, cond)
        out = self.forward(
            hidden_states=hidden.to(self.dtype),
            timestep=t,
            encoder_hidden_states=embeds.to(self.dtype),
            encoder_hidden_states_mask=mask,
            img_shapes=shapes,
        )
        return out[:, : x.shape[1]]

    def model_time(self, s: Tensor) -> Tensor:
        """The transformer's ``timestep``: the scheduler's ``sigma * 1000`` divided by 1000, as the pipeline
        computes it (fp32), so that a pipeline sigma reaches the model bit for bit."""
        steps = float(self.pipe.scheduler.config.get("num_train_timesteps", 1000))
        return (s.float() * steps) / 1000.0

    def velocity(self, x: Tensor, s: Tensor, cond: Conditioning) -> Tensor:
        return self.guided_velocity(x, s, cond, contextlib.nullcontext)

    def guided_velocity(
        self, x: Tensor, s: Tensor, cond: Conditioning, around_cond: Callable[[], AbstractContextManager[Any]]
    ) -> Tensor:
        """:meth:`velocity`, with the conditional forward run inside ``around_cond()`` (the attention probe
        watches that one, not the negative prompt's)."""
        n = int(x.shape[0])
        t = self.model_time(s)
        embeds, mask = self.trimmed(cond)
        with around_cond():
            v_cond = self._forward(x, t, embeds, mask, cond)
        if not self.guided:
            self.nfe += n
            return v_cond
        self.nfe += 2 * n  # two transformer rows per latent
        with torch.no_grad():  # the negative branch is frozen
            v_neg = self._forward(x, t, *self.negative_states(cond, n), cond)
        comb = v_neg + float(self.config.true_cfg_scale) * (v_cond - v_neg)
        return comb * (v_cond.norm(dim=-1, keepdim=True) / comb.norm(dim=-1, keepdim=True))

    def attention_entropy(self, x: Tensor, s: Tensor, cond: Conditioning, options: Any) -> Tensor:
        """Softmax entropy of the conditional forward's image-query attention rows ``(B,)``."""
        return self.velocity_and_entropy(x, s, cond, options)[1]

    def velocity_and_entropy(self, x: Tensor, s: Tensor, cond: Conditioning, options: Any) -> tuple[Tensor, Tensor]:
        """The guided velocity and the conditional forward's attention entropy (counted like velocity)."""
        from flowrl.backbones.qwen_image.probe import entropy_probe

        options = options or AttentionEntropyOptions()
        recorder = EntropyRecorder()
        with torch.no_grad():
            rows = self.probed_rows(x, cond)
            v = self.guided_velocity(x, s, cond, lambda: entropy_probe(self.module, options, recorder, rows))
        return v, recorder.entropy()

    def probed_rows(self, x: Tensor, cond: Conditioning) -> int | None:
        """How many image rows after the text the probe measures (None: all of them)."""
        return None

    def decode(self, x: Tensor) -> Tensor:
        vae = self.pipe.vae
        res = int(self.config.resolution)
        with torch.no_grad():
            latents = self.pipe._unpack_latents(x.float(), res, res, self.pipe.vae_scale_factor)  # (B, C, 1, h, w)
            shape = (1, vae.config.z_dim, 1, 1, 1)
            mean = torch.tensor(vae.config.latents_mean, device=latents.device).view(shape)
            std = torch.tensor(vae.config.latents_std, device=latents.device).view(shape)
            latents = latents * std + mean
            return unit_images(vae.decode(latents.to(vae.dtype), return_dict=False)[0][:, :, 0])


def warn_if_template_drop_is_off(pipe: Any) -> None:
    """Say on stderr when the tokenizer does not cut the pipeline's template prefix into exactly the tokens
    the pipeline drops (the prompt's first tokens would be lost, or template tokens kept)."""
    from flowrl.backbones.qwen_image.tokenizer import template_prefix_length

    count = template_prefix_length(pipe.tokenizer, pipe.prompt_template_encode)
    if count != pipe.prompt_template_encode_start_idx:
        print(
            f"warning: the tokenizer makes {count} tokens of QwenImagePipeline's template prefix, but the pipeline "
            f"drops {pipe.prompt_template_encode_start_idx}: the prompt embeddings are cut in the wrong place",
            file=sys.stderr,
        )


def config_problems(config: Any) -> Iterable[tuple[str, str]]:
    """Settings the pipeline refuses, found without loading it."""
    if config.max_sequence_length > MAX_TEXT_TOKENS:
        yield ("max_sequence_length", f"must be at most {MAX_TEXT_TOKENS} (QwenImagePipeline's limit), "
               f"got {config.max_sequence_length}")


def saved_vae_factor(path: str) -> int | None:
    """Pixels per latent cell of a saved pipeline's VAE (2 ** len(temperal_downsample)), when its config is in
    a local folder; None otherwise."""
    file = Path(path) / "vae" / "config.json"
    if not file.is_file():
        return None
    downsample = json.loads(file.read_text()).get("temperal_downsample", [False, True, True])
    return int(2 ** len(downsample))


@register("backbone", "qwen_image")
class QwenImageFromPretrained(QwenImageAdapter):
    """Qwen-Image (any saved QwenImagePipeline) from a local folder or a hub id (offline respected).

    True CFG with a frozen negative branch and the per-token norm rescale (``true_cfg_scale > 1``; NFE 2
    transformer rows per guided step); ``grid``: ``diffusers`` is the pipeline's dynamically shifted grid,
    ``uniform`` flowrl's; ``dtype``: the transformer's storage and autocast dtype.
    """

    @attrs.frozen
    class Config:
        path: str = attrs.field(validator=attrs.validators.min_len(1))  # folder of save_pretrained, or hub id
        resolution: int = attrs.field(default=512, validator=gt(0))  # image side in pixels (multiple of 16)
        true_cfg_scale: float = attrs.field(default=4.0, validator=ge(1.0))  # true CFG scale; 1 disables it
        negative_prompt: str = " "  # the negative branch's prompt (encoded once; the pipeline's docs: " ")
        max_sequence_length: int = attrs.field(default=512, validator=gt(0))  # prompt tokens after the template
        grid: SigmaGrid = attrs.field(default="diffusers", validator=one_of(SigmaGrid))
        dtype: DType = attrs.field(default="bfloat16", validator=one_of(DType))

    @staticmethod
    def check_config(config: Config) -> list[tuple[str, str]]:
        problems = list(config_problems(config))
        factor = saved_vae_factor(config.path)
        if factor is not None and config.resolution % (2 * factor):
            problems.append(("resolution", f"must be a multiple of {2 * factor} for the model in {config.path} "
                             f"(VAE factor {factor}, 2x2 packing), got {config.resolution}"))
        return problems

    @staticmethod
    def transformer_on_meta(config: Any) -> Any:
        """The saved transformer without weights (module_names); when its config is not on this machine (a hub
        id not yet downloaded), the class with its default config, which is Qwen-Image's (60 blocks): module
        names do not depend on the sizes, so validate still checks ``[lora] target_modules``."""
        from diffusers import QwenImageTransformer2DModel

        from flowrl.backbones.lora.targets import on_meta, saved_transformer

        return saved_transformer(config.path) or on_meta(QwenImageTransformer2DModel)

    def load_pipeline(self) -> Any:
        from diffusers import QwenImagePipeline

        return load_from_pretrained(QwenImagePipeline, self.config.path, DTYPES[self.config.dtype])
