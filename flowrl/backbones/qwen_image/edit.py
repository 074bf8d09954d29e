"""The Qwen-Image-Edit base: a diffusers ``QwenImageEditPipeline`` (Qwen-Image-Edit, one source image) or
``QwenImageEditPlusPipeline`` (Qwen-Image-Edit-2509 and -2511, one or several) behind flowrl's :class:`Backbone`,
as :class:`QwenImageEditAdapter`, a :class:`~flowrl.backbones.qwen_image.adapter.QwenImageAdapter` that also
reads each prompt's source images.

How the edit pipelines condition on the sources (diffusers 0.42):

- **Text encoder**: Qwen2.5-VL reads the instruction *and* the source images. The pipeline's chat template holds a
  vision placeholder per image (Edit-Plus writes ``Picture 1: ...``, ``Picture 2: ...`` before the instruction), the
  processor expands each placeholder into the image's vision tokens, and the hidden states are kept from the 64th
  token on (the template's system message dropped): the kept states carry the image tokens and then the words.
- **VAE**: each source is VAE-encoded (the posterior's mode), normalised with the VAE's ``latents_mean`` and
  ``latents_std``, packed into 2 x 2 latent-pixel tokens as a latent is, and appended after the noisy target tokens.
  ``img_shapes`` lists the target's grid and then each source's: source *k* is RoPE frame *k*. The transformer's
  output is cut back to the target's tokens. A transformer with ``zero_cond_t`` (Qwen-Image-Edit-2511) modulates
  the source tokens at t = 0; it does so itself from ``img_shapes``.
- **True CFG**: as for Qwen-Image (the per-token norm rescale, a frozen negative branch), but the negative prompt
  is encoded *with the same source images*, so it is one row per prompt, cached with it.

The sources are clean and the same at every step: everything above is computed once per prompt in ``encode`` and
kept in the prompt's ``Conditioning`` rows (``embeds``, ``neg_embeds``, their masks, ``source``). The probe (AEGPO)
measures the target's query rows only.

Preparation rule (flowrl's, not the pipeline's): every source must be RGB; it is scaled so its short side is the
base's ``resolution`` (bicubic) and centre-cropped (:func:`~flowrl.core.conditions.fit_square`), and that square
is what the VAE encodes; the vision encoder reads it resized to ``vision_resolution`` by the pipeline's own image
processor (by default the resolution for Edit, 384 for Edit-Plus, the sides the pipelines use for a square source).
The pipelines instead size the VAE's copy to about 1024 x 1024 pixels at the source's aspect ratio (and the output
with it), and Edit-Plus the vision copy to about 384 x 384: for a square source and ``resolution = 1024`` they
compute what flowrl does (tests/test_qwen_image_edit.py sets their areas to the base's and holds them equal).

The text rows are padded to a fixed ``max_sequence_length`` + the tokens the template and the source images take
(measured once, on blank sources), so that rows of different batches join; an instruction longer than
``max_sequence_length`` tokens is cut there, as Qwen-Image cuts a prompt.
"""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np
import torch
from attrs.validators import ge, gt
from torch import Tensor

from flowrl.backbones.common.checks import saved_json
from flowrl.backbones.common.pipeline import DTYPES, load_from_pretrained
from flowrl.backbones.common.settings import DType, SigmaGrid
from flowrl.backbones.qwen_image.adapter import QwenImageAdapter, config_problems, saved_vae_factor
from flowrl.core.choices import one_of
from flowrl.core.conditions import ConditionSpec, conditions_of, fit_square
from flowrl.core.registry import register
from flowrl.core.types import Conditioning

PIPELINES = {"edit": "QwenImageEditPipeline", "edit_plus": "QwenImageEditPlusPipeline"}
PLUS_VISION_SIDE = 384  # QwenImageEditPlusPipeline's vision copy: about 384 x 384 pixels


def edit_problems(config: Any) -> list[tuple[str, str]]:
    """Settings of an edit base (registered or twin) that no model can take, found without loading one."""
    problems = list(config_problems(config))
    if config.pipeline == "edit" and config.images != 1:
        problems.append(("images", f"QwenImageEditPipeline takes one source image, got {config.images}; "
                         'pipeline = "edit_plus" takes several'))
    return problems


class QwenImageEditAdapter(QwenImageAdapter):
    """Qwen-Image-Edit (and Edit-Plus): the Qwen-Image adapter reading the sources in its text encoder and its
    image sequence (see the module). The config adds ``pipeline``, ``images`` and ``vision_resolution``."""

    @classmethod
    def accepts(cls, config: Any) -> ConditionSpec:
        n = int(config.images)
        meaning = ("the source image",) if n == 1 else tuple(f"source {i + 1}" for i in range(n))
        return ConditionSpec(count=(n, n), modes=("RGB",), meaning=meaning)

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        if type(self.pipe).__name__ != PIPELINES[config.pipeline]:
            raise ValueError(f"pipeline = {config.pipeline!r} needs a {PIPELINES[config.pipeline]}, "
                             f"got a {type(self.pipe).__name__}")
        self._capacity: int | None = None

    @property
    def vision_side(self) -> int:
        """The side of the square the vision encoder reads each source at."""
        if self.config.vision_resolution:
            return int(self.config.vision_resolution)
        return PLUS_VISION_SIDE if self.config.pipeline == "edit_plus" else int(self.config.resolution)

    @property
    def source_shapes(self) -> list[tuple[int, int, int]]:
        """The ``img_shapes`` entries of the sources: each on the target's grid."""
        return [self.img_shape] * int(self.config.images)

    # -- the sources -------------------------------------------------------------------------------
    def squares(self, prompt: str) -> list[Any]:
        """A prompt's sources as PIL images of the base's resolution (flowrl's rule); a ValueError naming the
        base when it has not exactly ``images`` of them."""
        from PIL import Image

        conditions = conditions_of(prompt)
        if len(conditions) != self.config.images:
            raise ValueError(f"{type(self).__name__} takes exactly {self.config.images} source image(s) per prompt; "
                             f"{str(prompt)!r} has {len(conditions)}")
        res = int(self.config.resolution)
        arrays = [(fit_square(c, res) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy() for c in conditions]
        return [Image.fromarray(np.ascontiguousarray(a)) for a in arrays]

    def text_states(self, text: str, squares: list[Any]) -> Tensor:
        """``text``'s Qwen2.5-VL states with the sources (the pipeline's template and processor), fp32."""
        side = self.vision_side
        vision = [self.pipe.image_processor.resize(s, side, side) for s in squares]
        with torch.no_grad():
            embeds, _ = self.pipe.encode_prompt(prompt=[text], image=vision, device=self.device)
        return embeds[0].float()  # one prompt: no padding

    def source_tokens(self, squares: list[Any]) -> Tensor:
        """The sources' packed, normalised VAE tokens ``(images * tokens, channels)``, fp32, as the pipeline
        makes them (its image processor, its ``_encode_vae_image``: the posterior's mode)."""
        pipe, res = self.pipe, int(self.config.resolution)
        tokens = []
        with torch.no_grad():
            for square in squares:
                pixels = pipe.image_processor.preprocess(square, res, res).unsqueeze(2)
                z = pipe._encode_vae_image(pixels.to(self.device, pipe.vae.dtype), generator=None)[:, :, 0]
                b, c, h, w = z.shape
                tokens.append(pipe._pack_latents(z, b, c, h, w)[0].float())
        return torch.cat(tokens)

    def encode_rows(self, prompts: list[str]) -> list[Any]:
        """Each prompt's text states, its negative prompt's (both read with its sources) and its source tokens."""
        rows = []
        for prompt in prompts:
            squares = self.squares(prompt)
            text = self.text_states(str(prompt), squares)
            negative = self.text_states(self.config.negative_prompt, squares) if self.guided else text  # unused
            rows.append((text, negative, self.source_tokens(squares)))
        return rows

    def text_capacity(self) -> int:
        """Rows per prompt in ``embeds``: ``max_sequence_length`` plus what the template and the sources take
        (the states of an empty instruction on blank sources; measured once)."""
        if self._capacity is None:
            from PIL import Image

            res = int(self.config.resolution)
            blank = [Image.new("RGB", (res, res))] * int(self.config.images)
            self._capacity = int(self.text_states("", blank).shape[0]) + int(self.config.max_sequence_length)
        return self._capacity

    def to(self, device: torch.device) -> Any:
        super().to(device)
        self._capacity = None
        return self

    def encode(self, prompts: list[str]) -> Conditioning:
        """``embeds``/``mask`` and ``neg_embeds``/``neg_mask`` ``(B, capacity, width)`` zero-padded (1 on a
        row's states; cut at the capacity), and ``source`` ``(B, images * tokens, channels)``."""
        rows = self.cached_rows(prompts)
        size, width, device = self.text_capacity(), rows[0][0].shape[1], rows[0][0].device
        tensors: dict[str, Tensor] = {}
        for name, i in (("", 0), ("neg_", 1)):
            embeds = torch.zeros(len(rows), size, width, device=device)
            mask = torch.zeros(len(rows), size, dtype=torch.long, device=device)
            for b, row in enumerate(rows):
                n = min(int(row[i].shape[0]), size)
                embeds[b, :n], mask[b, :n] = row[i][:n], 1
            tensors[f"{name}embeds"], tensors[f"{name}mask"] = embeds, mask
        tensors["source"] = torch.stack([row[2] for row in rows])
        return Conditioning(tensors)

    # -- the transformer ---------------------------------------------------------------------------
    def image_input(self, x: Tensor, cond: Conditioning | None) -> tuple[Tensor, list[Any]]:
        """The target's tokens, then every source's; ``img_shapes`` lists the target's grid and the sources'."""
        if cond is None:
            raise ValueError(f"{type(self).__name__} needs the prompts' Conditioning (their source tokens)")
        source = cond.tensors["source"].to(x.device, x.dtype)
        shapes = [[self.img_shape, *self.source_shapes]] * int(x.shape[0])
        return torch.cat([x, source], dim=1), shapes

    def negative_states(self, cond: Conditioning, n: int) -> tuple[Tensor, Tensor | None]:
        """The negative prompt's states read with each prompt's own sources (one row per prompt)."""
        return self.trimmed(Conditioning({"embeds": cond.tensors["neg_embeds"], "mask": cond.tensors["neg_mask"]}))

    def probed_rows(self, x: Tensor, cond: Conditioning) -> int | None:
        """AEGPO's probe measures the target's query rows only (the sources' tokens still serve as keys): they are
        the tokens generated, whose transitions are trained; the sources' rows are clean, the same at every step
        and outside the log-density."""
        return int(x.shape[1])


@register("backbone", "qwen_image_edit")
class QwenImageEditFromPretrained(QwenImageEditAdapter):
    """Qwen-Image-Edit (``pipeline = "edit"``, one source) or Qwen-Image-Edit-2509/-2511 (``"edit_plus"``, ``images``
    sources) from a local folder or a hub id (offline respected); each source RGB, resized and centre-cropped to
    ``resolution`` (docs/editing.md). True CFG with the negative prompt read with the same sources."""

    @attrs.frozen
    class Config:
        path: str = attrs.field(validator=attrs.validators.min_len(1))  # folder of save_pretrained, or hub id
        pipeline: str = attrs.field(default="edit", validator=attrs.validators.in_(tuple(PIPELINES)))  # or edit_plus
        images: int = attrs.field(default=1, validator=gt(0))  # source images per prompt (edit: 1)
        resolution: int = attrs.field(default=512, validator=gt(0))  # image side in pixels (target and sources)
        vision_resolution: int = attrs.field(default=0, validator=ge(0))  # vision encoder's side; 0: the pipeline's
        true_cfg_scale: float = attrs.field(default=4.0, validator=ge(1.0))  # true CFG scale; 1 disables it
        negative_prompt: str = " "  # the negative branch's prompt (read with the prompt's sources)
        max_sequence_length: int = attrs.field(default=512, validator=gt(0))  # instruction tokens kept
        grid: SigmaGrid = attrs.field(default="diffusers", validator=one_of(SigmaGrid))
        dtype: DType = attrs.field(default="bfloat16", validator=one_of(DType))

    @staticmethod
    def check_config(config: Config) -> list[tuple[str, str]]:
        """The settings' own rules, then what the saved model's files on this machine (if any) refute: its
        pipeline class and the resolution's multiple."""
        problems = edit_problems(config)
        index = saved_json(config.path, "model_index.json")
        saved = index.get("_class_name") if index else None
        if saved in PIPELINES.values() and saved != PIPELINES[config.pipeline]:
            other = next(k for k, v in PIPELINES.items() if v == saved)
            problems.append(("pipeline", f"{config.pipeline!r} does not fit the model in {config.path}, a {saved}: "
                             f"set pipeline = {other!r}"))
        factor = saved_vae_factor(config.path)
        if factor is not None and config.resolution % (2 * factor):
            problems.append(("resolution", f"{config.resolution} must be a multiple of {2 * factor} for the model in "
                             f"{config.path} (the VAE's pixels per latent cell, 2 x 2 cells a token)"))
        return problems

    @staticmethod
    def transformer_on_meta(config: Any) -> Any:
        """The saved transformer without weights; Qwen-Image's default class when its config is not here."""
        from diffusers import QwenImageTransformer2DModel

        from flowrl.backbones.lora.targets import on_meta, saved_transformer

        return saved_transformer(config.path) or on_meta(QwenImageTransformer2DModel)

    def load_pipeline(self) -> Any:
        import diffusers

        from flowrl.backbones.qwen_image.processor import load_processor

        cls = getattr(diffusers, PIPELINES[self.config.pipeline])
        processor = load_processor(self.config.path)  # its image half: no torchvision needed
        return load_from_pretrained(cls, self.config.path, DTYPES[self.config.dtype], processor=processor)
