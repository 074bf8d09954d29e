"""What the model-based rewards share: start-up checks, lazy loading, device placement, score rescaling.

A reward with weights checks at start-up (``check()``: paths exist, extras are installed; no model loads,
no heavy import) and loads its model on the first ``score()`` call, on the device its config names:
``device = "auto"`` takes the images' device when it is an accelerator, else CUDA when available, else the
CPU. Scores come back as float32 on the CPU.
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor

from flowrl.core.convert import ConfigError
from flowrl.core.interfaces import RewardModel

DType = Literal["float32", "bfloat16", "float16"]  # a reward model's `dtype` setting (each module's DTYPES maps it)
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class RewardConfigError(ConfigError):
    """A reward that cannot run as configured (missing weights, a missing extra); one line, exit status 2."""

    def __init__(self, message: str) -> None:
        ValueError.__init__(self, message)
        self.problems = [("reward", message)]


def resolve_device(setting: str, images: Tensor | None = None) -> torch.device:
    """``auto``: the images' device if it is not the CPU, else CUDA when available, else the CPU."""
    if setting != "auto":
        return torch.device(setting)
    if images is not None and images.device.type != "cpu":
        return images.device
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on") or os.environ.get(
        "TRANSFORMERS_OFFLINE", "0"
    ).lower() in ("1", "true", "yes", "on")


def has_module(name: str) -> bool:
    """Whether ``name`` is importable, without importing it (a missing parent counts as missing)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


class ModelReward(RewardModel):
    """A reward backed by a model loaded lazily on first use. Subclasses define :meth:`load` and :meth:`raw`."""

    extra: str = ""  # the pyproject extra that brings the packages in ``modules``
    modules: tuple[str, ...] = ()  # importable modules the reward needs
    install_hint: str = ""  # replaces the default ``pip install -e '.[extra]'`` advice

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self._model: Any = None
        self._device: torch.device | None = None

    # -- start-up checks ------------------------------------------------------------------------------
    @property
    def label(self) -> str:
        return f"reward '{getattr(self, 'registered_name', type(self).__name__)}'"

    def check(self) -> None:
        missing = [m for m in self.modules if not has_module(m)]
        if missing:
            hint = self.install_hint or f"pip install -e '.[{self.extra}]' in a flowrl checkout"
            raise RewardConfigError(
                f"{self.label} needs the '{self.extra}' extra (no module {missing[0]}): {hint} (docs/rewards.md)"
            )
        self.check_paths()

    def check_paths(self) -> None:
        """Raise :class:`RewardConfigError` naming the first missing file or folder."""

    def require_file(self, path: str, key: str, what: str = "weights") -> None:
        if not path:
            raise RewardConfigError(f"{self.label}: no {what} configured (set reward.{key} to a local file)")
        if not Path(path).expanduser().is_file():
            raise RewardConfigError(f"{self.label}: {what} not found at {path} (set reward.{key})")

    def require_model(self, name: str, key: str) -> None:
        """A local folder, or a hub id when the hub is reachable (or the id is already in the local cache)."""
        if not name:
            raise RewardConfigError(f"{self.label}: no model configured (set reward.{key})")
        path = Path(name).expanduser()
        if path.exists():
            if not (path / "config.json").is_file() and key != "processor":
                raise RewardConfigError(f"{self.label}: {path} has no config.json (set reward.{key} to a model folder)")
            return
        if not HUB_ID.match(name) or name.startswith((".", "~")):
            raise RewardConfigError(f"{self.label}: weights not found at {name} (set reward.{key})")
        if hub_offline() and not _in_hub_cache(name):
            raise RewardConfigError(
                f"{self.label}: '{name}' is not a local folder and the hub is offline (HF_HUB_OFFLINE); "
                f"set reward.{key} to a local copy"
            )

    # -- lazy model -----------------------------------------------------------------------------------
    def load(self, device: torch.device) -> Any:
        """Build the model on ``device`` (called once, on the first score)."""
        raise NotImplementedError

    def model(self, images: Tensor | None = None) -> Any:
        device = resolve_device(self.config.device, images)
        if self._model is None:
            self.check()
            self._model = self.load(device)
            self._device = device
        elif self._device != device and isinstance(self._model, torch.nn.Module):
            self._model.to(device)
            self._device = device
        return self._model

    @property
    def device(self) -> torch.device:
        return self._device or torch.device("cpu")

    def check_prompts(self, images: Tensor, prompts: list[str]) -> None:
        """One prompt per image, or ``ValueError``."""
        if len(prompts) != images.shape[0]:
            raise ValueError(f"{images.shape[0]} images but {len(prompts)} prompts")

    def batches(self, images: Tensor, prompts: list[str], size: int) -> list[slice]:
        """After :meth:`check_prompts`, slices of at most ``size`` rows covering the batch."""
        self.check_prompts(images, prompts)
        n = images.shape[0]
        return [slice(i, min(i + size, n)) for i in range(0, n, size)]

    def rescale(self, raw: Tensor) -> Tensor:
        """``(raw - offset) * scale`` (the papers' conventions; identity by default)."""
        return ((raw.float() - self.config.offset) * self.config.scale).cpu()


def _in_hub_cache(repo_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return False
    found = try_to_load_from_cache(repo_id, "config.json")
    return isinstance(found, str)


def load_torch_file(path: str) -> Any:
    """A tensor file: ``.safetensors`` or a torch pickle of tensors (loaded with ``weights_only=True``)."""
    if str(path).endswith(".safetensors"):
        from safetensors.torch import load_file

        return load_file(str(Path(path).expanduser()))
    return torch.load(str(Path(path).expanduser()), map_location="cpu", weights_only=True)
