"""The training process itself, set up before any part is built: accelerate's state (device, mixed precision),
the launch check, the seeds, torch's thread count and the CUDA attention kernels."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import numpy as np
import torch

from flowrl.config.recipe import Recipe
from flowrl.trainer.sharding import check_launch

if TYPE_CHECKING:
    from accelerate import Accelerator


def start_process(recipe: Recipe) -> Accelerator:
    """This process's accelerator, with the launch checked (:func:`flowrl.trainer.sharding.check_launch`), every
    random generator seeded with ``recipe.seed`` plus the process index, ``trainer.torch_threads`` and
    ``trainer.attention_kernels`` applied and the GPU's peak-memory counter reset."""
    from accelerate import Accelerator

    cfg = recipe.trainer
    accelerator = Accelerator(cpu=not torch.cuda.is_available(), mixed_precision=cfg.mixed_precision)
    check_launch(str(accelerator.distributed_type.value))
    seed_everything(recipe.seed + accelerator.process_index)
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
        allow_attention_kernels(cfg.attention_kernels)
    return accelerator


def allow_attention_kernels(which: str) -> None:
    """Restrict torch's CUDA scaled-dot-product-attention kernels (``trainer.attention_kernels``)."""
    if which == "auto":
        return
    cuda = torch.backends.cuda
    cuda.enable_cudnn_sdp(False)
    if which != "no-cudnn":
        cuda.enable_flash_sdp(which == "flash")
        cuda.enable_mem_efficient_sdp(which == "efficient")
        cuda.enable_math_sdp(which == "math")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
