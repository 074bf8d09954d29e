"""What every diffusers pipeline adapter shares: the dtype names, autocast for reduced precision, loading a saved
pipeline (a local folder, or a hub id respecting offline mode) with one clear error, and preparing it for training
(quiet, frozen encoders and VAE, the transformer in its dtype), and :class:`PipelineAdapter`, the plumbing every
base's adapter shares. No model library is imported at module level."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

import torch
from torch import Tensor, nn

from flowrl.backbones.common.prompt_cache import cached_encodings
from flowrl.backbones.common.vocabulary import UnknownWords
from flowrl.core.interfaces import Backbone

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def autocast(device: torch.device, dtype: torch.dtype) -> contextlib.AbstractContextManager[Any]:
    """``torch.autocast`` in ``dtype`` on ``device`` for a reduced-precision backbone; nothing for float32."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype)


def load_from_pretrained(pipeline_cls: Any, path: str, dtype: torch.dtype, **kwargs: Any) -> Any:
    """``pipeline_cls.from_pretrained`` from a local folder (never the hub) or a hub id (the local cache only
    when ``HF_HUB_OFFLINE=1``), every component in ``dtype``; one clear error when it cannot be found."""
    local = Path(path).exists()
    try:
        return pipeline_cls.from_pretrained(path, local_files_only=local, dtype=dtype, **kwargs)
    except OSError as error:
        offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0", "false", "False")
        where = "local folder" if local else "hub id" + (" (HF_HUB_OFFLINE=1: the local cache only)" if offline else "")
        raise OSError(
            f"cannot load {pipeline_cls.__name__} from {where} '{path}': {error}. Point the backbone's `path` at a "
            "folder written by save_pretrained, or download the model into the Hugging Face cache first"
        ) from error


def prepare_pipeline(load: Any, frozen: tuple[str, ...], dtype: torch.dtype) -> Any:
    """Load a pipeline quietly (no progress bars), freeze the modules named in ``frozen`` (text encoders,
    VAE; absent ones are skipped) and put the transformer in ``dtype``. Shared by the FLUX and SD3 adapters."""
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    diffusers_logging.disable_progress_bar()
    transformers_logging.disable_progress_bar()
    pipe = load()
    pipe.set_progress_bar_config(disable=True)
    for name in frozen:
        module = getattr(pipe, name, None)
        if module is not None:
            module.requires_grad_(False).eval()
    if pipe.transformer.dtype != dtype:
        pipe.transformer.to(dtype)
    return pipe


class PipelineAdapter(Backbone):
    """What every diffusers-pipeline adapter does the same way; a base's adapter subclasses it and says where the
    pipeline comes from (:meth:`load_pipeline`), what its transformer takes (:meth:`forward`'s keywords) and how its
    text encoder's states are read (:meth:`encode_rows`).

    It loads and prepares the pipeline (:attr:`frozen` modules frozen, the transformer in the config's ``dtype``),
    keeps the transformer as :attr:`module` (the trainer may wrap it), counts ``nfe`` (transformer rows) and
    ``forward_s`` (seconds inside the transformer's forward), caches each prompt's encoding (cleared on :meth:`to`),
    encodes the negative prompt once (:meth:`unconditional`) and applies classifier-free guidance with a frozen
    unconditional branch (:meth:`classifier_free`).
    """

    frozen: tuple[str, ...] = ("text_encoder", "vae")  # the pipeline's modules frozen at load (absent ones skipped)

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.dtype = DTYPES[config.dtype]
        self.pipe = prepare_pipeline(self.load_pipeline, self.frozen, self.dtype)
        self.module: nn.Module = self.pipe.transformer  # what velocity() calls; the trainer may wrap it (DDP)
        self.device = torch.device("cpu")
        self.nfe = 0
        self.forward_s = 0.0  # wall time inside the transformer's forward
        self._cache: dict[str, Any] = {}  # prompt -> its encoding (one row)
        self._uncond: Any = None
        self._unknown = UnknownWords(self.vocabulary())

    def load_pipeline(self) -> Any:
        raise NotImplementedError

    def vocabulary(self) -> Any:
        """The tokenizer whose vocabulary decides which prompt words the model knows (None: not checked)."""
        return getattr(self.pipe, "tokenizer", None)

    @property
    def transformer(self) -> nn.Module:
        return self.pipe.transformer  # type: ignore[no-any-return]

    def to(self, device: torch.device) -> Self:
        self.device = torch.device(device)
        self.pipe.to(self.device)
        self._cache.clear()
        self._uncond = None
        return self

    # -- prompts -----------------------------------------------------------------------------------
    def encode_rows(self, prompts: list[str]) -> Any:
        """One encoding per prompt (indexable, one row each), computed without gradient: the text encoder's states."""
        raise NotImplementedError

    def cached_rows(self, prompts: list[str]) -> list[Any]:
        """:meth:`encode_rows` for each prompt, each encoded once (unknown words reported once)."""
        return cached_encodings(self._cache, self._unknown, prompts, self.encode_rows)

    def unconditional(self) -> Any:
        """The negative prompt's encoding (one row, as :meth:`encode_rows` gives it), encoded once."""
        if self._uncond is None:
            self._uncond = self.encode_rows([self.config.negative_prompt])[0]
        return self._uncond

    # -- the transformer ---------------------------------------------------------------------------
    def forward(self, **inputs: Any) -> Tensor:
        """One transformer call under autocast in the backbone's dtype (timed in ``forward_s``), its output in fp32.
        ``nfe`` is the caller's to count (guidance decides how many rows a latent costs)."""
        start = time.perf_counter()
        with autocast(self.device, self.dtype):
            out = self.module(**inputs, return_dict=False)[0]
        self.forward_s += time.perf_counter() - start
        return out.float()  # type: ignore[no-any-return]

    def classifier_free(
        self, run: Callable[..., Tensor], x: Tensor, cond: tuple[Tensor, ...], uncond: tuple[Tensor, ...], scale: float
    ) -> Tensor:
        """Classifier-free guidance ``v_u + scale (v_c - v_u)`` from ``run(x, *inputs)``, counted as 2 rows a latent.
        The unconditional branch is frozen: with gradients on it runs apart, without gradient; in a no-grad rollout
        both branches share one batched forward ``[uncond; cond]``, as the diffusers pipelines do."""
        self.nfe += 2 * int(x.shape[0])
        if torch.is_grad_enabled():
            with torch.no_grad():
                v_uncond = run(x, *uncond)
            v_cond = run(x, *cond)
        else:
            both = run(torch.cat([x, x]), *(torch.cat([u, c]) for u, c in zip(uncond, cond, strict=True)))
            v_uncond, v_cond = both.chunk(2)
        return v_uncond + scale * (v_cond - v_uncond)


def unit_images(decoded: Tensor) -> Tensor:
    """A VAE's output in [-1, 1] as images (or clips) in [0, 1], fp32."""
    return ((decoded.float() + 1) / 2).clamp(0, 1)
