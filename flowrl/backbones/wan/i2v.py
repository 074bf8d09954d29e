"""The Wan image-to-video base: a diffusers ``WanImageToVideoPipeline`` behind flowrl's :class:`Backbone`, as
:class:`WanI2VAdapter`, the text-to-video :class:`~flowrl.backbones.wan.adapter.WanAdapter` that also reads one
first frame per prompt. The layout is read from the saved pipeline, as ``WanImageToVideoPipeline.__call__`` of
diffusers 0.42 reads it:

- **Wan 2.1 I2V** (an ``image_encoder`` and a transformer with ``image_dim``): the frame's CLIP penultimate hidden
  states are the transformer's image context (its added K/V in every cross-attention), and the transformer's input
  is the noisy latent concatenated on channels with a condition ``[mask; image latent]``: the VAE's posterior mode of
  the clip ``[frame, black frames...]``, normalised as a latent, and a 4-channel mask that is 1 on the first latent
  frame (the VAE's 4 pixel frames per latent frame) and 0 after (``in_channels = 2 z + 4``). The text is padded to
  512 tokens: the transformer splits the image context off its cross-attention input by assuming 512 text tokens.
- **Wan 2.2 I2V-A14B** (``transformer_2`` and ``boundary_ratio``): the same concatenation without CLIP, and two
  experts: ``transformer`` at timesteps ``t >= boundary_ratio * 1000`` (the high-noise steps), ``transformer_2``
  below, each row of a batch sent to its own. Training adapts **one** expert (``expert``: ``"high"`` or
  ``"low"``), the other stays the base model: a recipe's trained steps belong on that expert's side (a transition
  on the other side has a gradient of zero). Why one: the trainer adapts one transformer (LoRA, the reference policy
  with LoRA switched off, checkpoints, the export), and the published two-expert GRPO recipe (Flow-Factory's) puts
  its LoRA on the high-noise expert alone, its SDE step on that side; adapting both experts in one run is not
  supported. ``guidance_scale_2`` is the low-noise expert's guidance (0: the same).
- **Wan 2.2 TI2V-5B** (``expand_timesteps``): no concatenation; the first latent frame *is* the image's latent
  (normalised), written over the noisy one in every forward, its tokens at timestep 0 and every other token at the
  step's. Its velocity is not the model's: flowrl gives that frame the velocity of the straight path to the image's
  latent, ``(x - z_image) / s``, so the ODE lands on it exactly (the pipeline writes it over the result instead) and
  the SDE kernels stay on the path. Its dimensions still count in the log-density average (a share of
  ``1 / latent frames``, where the policy has no say): flowrl's kernels average over the whole latent.

Everything the condition needs is computed once per prompt in ``encode`` (the frame's CLIP states and its VAE
pass over all ``num_frames`` frames, the costly part) and kept in the prompt's ``Conditioning`` row: ``"frame"``
(the ``[mask; latent]`` condition, or the first latent frame for TI2V) and, for 2.1, ``"image_embeds"``. The
negative branch of classifier-free guidance keeps the image (only the text is negative), as the pipeline does.

Preparation rule (flowrl's): the first frame must be RGB; an image of the frame size is taken as it is, any other
is scaled by the smallest factor that covers ``width x height`` (bicubic) and centre-cropped
(:func:`~flowrl.core.conditions.fit_frame`); the pipeline's own processors then see that image (its video processor
resizes it to the same size, an identity, and CLIP's processor resizes and crops it to CLIP's size).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, Literal

import attrs
import torch
from attrs.validators import ge, gt
from torch import Tensor, nn

from flowrl.backbones.common.checks import saved_json
from flowrl.backbones.common.pipeline import DTYPES, load_from_pretrained
from flowrl.backbones.common.probe_options import AttentionEntropyOptions
from flowrl.backbones.common.settings import DType, SigmaGrid
from flowrl.backbones.wan.adapter import WanAdapter, frame_problems
from flowrl.core.choices import one_of
from flowrl.core.conditions import ConditionSpec, conditions_of, fit_frame
from flowrl.core.registry import register
from flowrl.core.types import Conditioning

FIRST_FRAME = ConditionSpec(count=(1, 1), modes=("RGB",), meaning=("the first frame",))
WAN21_TEXT_TOKENS = 512  # the text length Wan 2.1 I2V's transformer assumes when it splits its context
Variant = Literal["2.1", "2.2-a14b", "2.2-ti2v"]
VARIANTS = Variant
Expert = Literal["high", "low"]  # Wan 2.2 A14B: the trained expert, transformer (high noise) or transformer_2


def i2v_frame_problems(config: Any, clip: bool, two_experts: bool) -> list[tuple[str, str]]:
    """``check_config`` rules shared by ``wan_i2v`` and ``tiny_wan_i2v``: the frame count, Wan 2.1's text length
    (``clip``: an image encoder is there) and the trained expert (``two_experts``: a second one is there)."""
    problems = frame_problems(config)
    if clip and config.max_sequence_length != WAN21_TEXT_TOKENS:
        problems.append(("max_sequence_length", f"must be {WAN21_TEXT_TOKENS} for Wan 2.1 I2V, got "
                         f"{config.max_sequence_length}: its transformer splits the image context off the text by "
                         f"assuming {WAN21_TEXT_TOKENS} text tokens"))
    if config.expert == "low" and not two_experts:
        problems.append(("expert", "'low' needs a two-expert Wan 2.2 pipeline (transformer_2); this one has one "
                         "transformer: leave expert = 'high'"))
    return problems


class WanI2VAdapter(WanAdapter):
    """Wan image-to-video: the Wan adapter reading a first frame per prompt (see the module). The config adds to
    the Wan adapter's ``guidance_scale_2`` and ``expert``."""

    frozen = ("text_encoder", "vae", "image_encoder")
    takes_experts = True

    @classmethod
    def accepts(cls, config: Any) -> ConditionSpec:
        return FIRST_FRAME

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        pipe = self.pipe
        self.expand = bool(pipe.config.get("expand_timesteps", False))
        self.clip = pipe.transformer.config.image_dim is not None
        second = getattr(pipe, "transformer_2", None)
        ratio = pipe.config.get("boundary_ratio")
        self.boundary = None if second is None or ratio is None else float(ratio) * self.num_train_timesteps
        if config.expert == "low" and self.boundary is None:
            raise ValueError("expert 'low' needs a two-expert Wan 2.2 pipeline (transformer_2 and boundary_ratio)")
        if self.clip and config.max_sequence_length != WAN21_TEXT_TOKENS:
            raise ValueError(f"max_sequence_length must be {WAN21_TEXT_TOKENS} for Wan 2.1 I2V")
        low = config.expert == "low"
        self._trained: nn.Module = pipe.transformer_2 if low else pipe.transformer
        self._other: nn.Module | None = pipe.transformer if low else second
        for module in (self._trained, self._other):
            if module is not None and module.dtype != self.dtype:
                module.to(self.dtype)
        if self._other is not None:
            self._other.requires_grad_(False).eval()
        self.module = self._trained
        self._warned = False  # the frozen-side warning, printed once

    @property
    def transformer(self) -> nn.Module:
        """The trained transformer (Wan 2.2 A14B: the ``expert`` chosen)."""
        return self._trained

    @property
    def frozen_modules(self) -> tuple[nn.Module, ...]:
        """The transformers called besides :attr:`module` (Wan 2.2 A14B: the expert not trained)."""
        return () if self._other is None else (self._other,)

    @property
    def latent_shape(self) -> tuple[int, int, int, int]:
        s = self.pipe.vae_scale_factor_spatial
        return (self.pipe.vae.config.z_dim, self.latent_frames, self.height // s, self.width // s)

    @property
    def condition_bytes(self) -> int:
        """Float32 bytes one prompt's cached condition holds (the memory pre-check counts them per prompt)."""
        z, f, h, w = self.latent_shape
        frame = z * h * w if self.expand else (z + self.pipe.vae_scale_factor_temporal) * f * h * w
        clip = 0
        if self.clip:
            vision = self.pipe.image_encoder.config
            clip = ((vision.image_size // vision.patch_size) ** 2 + 1) * vision.hidden_size
        return 4 * (frame + clip)

    # -- the condition -----------------------------------------------------------------------------
    def frame_condition(self, condition: Any) -> tuple[Tensor, Tensor | None]:
        """One first frame's cached tensors: the ``"frame"`` condition (float32, see the module) and Wan 2.1's CLIP
        states (None otherwise), through the pipeline's own processors and ``prepare_latents``."""
        from PIL import Image

        pipe, h, w = self.pipe, self.height, self.width
        pixels = (fit_frame(condition, w, h) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
        image = Image.fromarray(pixels, "RGB")
        with torch.no_grad():
            embeds = pipe.encode_image(image, self.device)[0].float() if self.clip else None
            video = pipe.video_processor.preprocess(image, height=h, width=w).to(self.device, torch.float32)
            zeros = torch.zeros((1, *self.latent_shape), device=self.device)
            out = pipe.prepare_latents(video, 1, self.latent_shape[0], h, w, int(self.config.num_frames),
                                       torch.float32, self.device, None, zeros)
        return out[1][0].float(), embeds

    def text_rows(self, prompts: list[str]) -> Tensor:
        """UMT5 states as the text-to-video adapter reads them, through ``WanPipeline``'s text encoding (the same
        code as ``WanImageToVideoPipeline``'s, except that diffusers 0.42's image-to-video copy calls ``ftfy``
        without checking that it is installed)."""
        from diffusers.pipelines.wan.pipeline_wan import WanPipeline

        with torch.no_grad():
            embeds = WanPipeline._get_t5_prompt_embeds(
                self.pipe, prompt=prompts, max_sequence_length=self.config.max_sequence_length, device=self.device
            )
        return embeds.float()  # type: ignore[no-any-return]

    def encode_rows(self, prompts: list[str]) -> Any:
        """Each prompt's text states, with its first frame's tensors when it has one (a tuple); a list."""
        out: list[Any] = []
        for prompt, row in zip(prompts, self.text_rows([str(p) for p in prompts]), strict=True):
            conditions = conditions_of(prompt)
            out.append((row, *self.frame_condition(conditions[0])) if conditions else row)
        return out

    def encode(self, prompts: list[str]) -> Conditioning:
        rows = self.cached_rows(prompts)
        missing = [str(p) for p, r in zip(prompts, rows, strict=True) if not isinstance(r, tuple)]
        if missing:
            raise ValueError(f"{type(self).__name__} needs a first frame with every prompt; {missing[0]!r} has none")
        tensors = {"embeds": torch.stack([r[0] for r in rows]), "frame": torch.stack([r[1] for r in rows])}
        if self.clip:
            tensors["image_embeds"] = torch.stack([r[2] for r in rows])
        return Conditioning(tensors)

    # -- the transformer ---------------------------------------------------------------------------
    def _first_frame_tokens(self, x: Tensor) -> int:
        _, ph, pw = self.pipe.transformer.config.patch_size
        return (x.shape[3] // ph) * (x.shape[4] // pw)

    def _run(self, x: Tensor, t: Tensor, embeds: Tensor, frame: Tensor, *image: Tensor) -> Tensor:
        """One call of ``self.module`` on latents ``x`` with the prompt's condition, as the pipeline builds it."""
        if self.expand:  # TI2V: the first latent frame replaced, its tokens at t = 0
            x = torch.cat([frame.to(x.dtype), x[:, :, 1:]], dim=2)
            first = self._first_frame_tokens(x)
            timestep = t[:, None].expand(-1, x.shape[2] * first).clone()
            timestep[:, :first] = 0
        else:
            x = torch.cat([x, frame.to(x.dtype)], dim=1)
            timestep = t
        return self.forward(
            hidden_states=x.to(self.dtype),
            timestep=timestep,
            encoder_hidden_states=embeds.to(self.dtype),
            encoder_hidden_states_image=image[0].to(self.dtype) if image else None,
        )

    def _side(self, x: Tensor, s: Tensor, cond: Conditioning, high: bool) -> Tensor:
        """The guided velocity of rows that all belong to one expert (``high``: ``transformer``'s steps)."""
        n, t = int(x.shape[0]), s.float() * float(self.num_train_timesteps)
        frame = cond.tensors["frame"]
        image = (cond.tensors["image_embeds"],) if self.clip else ()
        scale = float(self.config.guidance_scale)
        if not high and self.config.guidance_scale_2:
            scale = float(self.config.guidance_scale_2)
        trained = self.boundary is None or high == (self.config.expert == "high")
        with self._expert(trained):
            if not self.guided:
                self.nfe += n
                v = self._run(x, t, cond.tensors["embeds"], frame, *image)
            else:
                u_embeds = self.unconditional().unsqueeze(0).expand(n, -1, -1)
                v = self.classifier_free(self._run, x, (t, cond.tensors["embeds"], frame, *image),
                                         (t, u_embeds, frame, *image), scale)
        if self.expand:  # the first latent frame: the straight path to the image's latent
            pull = (x[:, :, :1].float() - frame.float()) / s.float().view(-1, 1, 1, 1, 1)
            v = torch.cat([pull, v[:, :, 1:]], dim=2)
        return v

    def _expert(self, trained: bool) -> Any:
        """Inside: :meth:`forward` calls the trained module (``self.module``, maybe wrapped) or the frozen expert."""
        import contextlib

        return contextlib.nullcontext() if trained else self.module_swapped(self._other)  # type: ignore[arg-type]

    def _by_expert(self, x: Tensor, s: Tensor, cond: Conditioning, run: Callable[..., Tensor]) -> Tensor:
        """``run(x, s, cond, high)`` on each expert's rows, put back in order (one call without two experts)."""
        if self.boundary is None:
            return run(x, s, cond, True)
        high = s.float() * float(self.num_train_timesteps) >= self.boundary
        out: Tensor | None = None
        for side in (True, False):
            index = torch.nonzero(high == side).flatten()
            if index.numel() == 0:
                continue
            part = run(x[index], s[index], cond.take(index), side)
            if out is None:
                out = part.new_zeros((x.shape[0], *part.shape[1:]))
            out = out.index_put((index,), part)
        assert out is not None
        if torch.is_grad_enabled() and not out.requires_grad:  # every row on the frozen expert's side
            if not self._warned:
                self._warned = True
                where = "t < " if self.config.expert == "high" else "t >= "
                print(f"warning: {type(self).__name__}: trained transitions at {where}{self.boundary:g} run on the "
                      f"frozen expert (expert = {self.config.expert!r}) and give no gradient; put the recipe's "
                      "trained steps on the trained expert's side", file=sys.stderr)
            out = out.detach().requires_grad_(True)  # the true gradient with respect to the policy: zero
        return out

    def velocity(self, x: Tensor, s: Tensor, cond: Conditioning) -> Tensor:
        return self._by_expert(x, s, cond, self._side)

    def velocity_and_entropy(self, x: Tensor, s: Tensor, cond: Conditioning, options: Any) -> tuple[Tensor, Tensor]:
        """AEGPO's probe (:mod:`flowrl.backbones.wan.probe`) on the video tokens being generated: every video query
        row (TI2V: those after the first latent frame, which is the image), over the video keys (``keys = "all"``)
        or the text tokens of cross-attention (``"text"``; Wan 2.1's image context is not measured); each row's
        expert probed."""
        from flowrl.backbones.wan.probe import entropy_probe

        options = options or AttentionEntropyOptions()
        skip = self._first_frame_tokens(x) if self.expand else 0
        entropies: dict[bool, Tensor] = {}

        def probed(x: Tensor, s: Tensor, cond: Conditioning, high: bool) -> Tensor:
            module = self.module if self.boundary is None or high == (self.config.expert == "high") else self._other
            with entropy_probe(module, options, skip_rows=skip) as recorder:  # type: ignore[arg-type]
                v = self._side(x, s, cond, high)
            entropies[high] = recorder.entropy()[-int(x.shape[0]) :]  # guided: [uncond; cond], the conditional half
            return v

        with torch.no_grad():
            v = self._by_expert(x, s, cond, probed)
        entropy = torch.zeros(x.shape[0], device=v.device)
        high = (torch.ones_like(s, dtype=torch.bool) if self.boundary is None
                else s.float() * float(self.num_train_timesteps) >= self.boundary)
        for side, values in entropies.items():
            entropy = entropy.index_put((torch.nonzero(high == side).flatten(),), values.to(entropy.device))
        return v, entropy


@register("backbone", "wan_i2v")
class WanI2VFromPretrained(WanI2VAdapter):
    """Wan 2.1 I2V, Wan 2.2 I2V-A14B or Wan 2.2 TI2V-5B (any saved WanImageToVideoPipeline), from a local folder or
    a hub id (offline respected); one RGB first frame per prompt, fitted to the frame size (docs/editing.md)."""

    @attrs.frozen
    class Config:
        path: str = attrs.field(validator=attrs.validators.min_len(1))  # folder of save_pretrained, or hub id
        resolution: int = attrs.field(default=480, validator=gt(0))  # frame side in pixels (square)
        height: int = attrs.field(default=0, validator=ge(0))  # frame height (0: resolution)
        width: int = attrs.field(default=0, validator=ge(0))  # frame width (0: resolution)
        num_frames: int = attrs.field(default=33, validator=ge(1))  # pixel frames; num_frames - 1 divisible by 4
        guidance_scale: float = attrs.field(default=5.0, validator=ge(1.0))  # CFG scale (A14B: high-noise expert)
        guidance_scale_2: float = attrs.field(default=0.0, validator=ge(0.0))  # A14B low-noise expert's; 0: same
        expert: Expert = attrs.field(default="high", validator=one_of(Expert))  # A14B: the expert trained
        negative_prompt: str = ""  # the unconditional branch's prompt (encoded once)
        max_sequence_length: int = attrs.field(default=512, validator=gt(0))  # UMT5 tokens (2.1 I2V: 512)
        grid: SigmaGrid = attrs.field(default="uniform", validator=one_of(SigmaGrid))  # sigma grid
        dtype: DType = attrs.field(default="bfloat16", validator=one_of(DType))

    @staticmethod
    def check_config(config: Config) -> list[tuple[str, str]]:
        """The frame rules, and what the saved model's files on this machine (if any) already refute: the frame
        sides' multiple (the VAE's spatial factor x the patch), Wan 2.1's text length, the expert."""
        index = saved_json(config.path, "model_index.json") or {}
        second = index.get("transformer_2")
        two = isinstance(second, list) and second[0] is not None
        clip_saved = isinstance(index.get("image_encoder"), list) and index["image_encoder"][0] is not None
        problems = i2v_frame_problems(config, clip=clip_saved, two_experts=two or not index)
        vae = saved_json(config.path, "vae/config.json")
        transformer = saved_json(config.path, "transformer/config.json") or {}
        if vae is not None:
            multiple = int(vae.get("scale_factor_spatial", 8)) * int(transformer.get("patch_size", (1, 2, 2))[1])
            multiple = max(multiple, 16)  # WanImageToVideoPipeline.check_inputs
            for name in ("height", "width"):
                side = getattr(config, name) or config.resolution
                if side % multiple:
                    problems.append((name if getattr(config, name) else "resolution",
                                     f"{name} {side} must be a multiple of {multiple} for the model in {config.path}"
                                     " (the VAE's spatial factor x the patch size)"))
        return problems

    @staticmethod
    def transformer_on_meta(config: Any) -> Any:
        """The saved transformer without weights, when its config is on this machine (module_names)."""
        from flowrl.backbones.lora.targets import saved_transformer

        return saved_transformer(config.path)

    def load_pipeline(self) -> Any:
        from diffusers import WanImageToVideoPipeline

        return load_from_pretrained(WanImageToVideoPipeline, self.config.path, DTYPES[self.config.dtype])
