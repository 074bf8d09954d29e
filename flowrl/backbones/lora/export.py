"""LoRA weights in the diffusers format, loadable with ``pipeline.load_lora_weights(folder)``.

The trainer attaches LoRA with peft (``transformer.add_adapter``, :mod:`flowrl.trainer.lora`). Export takes
peft's state dict of the adapter (``get_peft_model_state_dict``) and writes it with the pipeline class's
``save_lora_weights`` classmethod (``FluxPipeline``, ``StableDiffusion3Pipeline``, ...), together with the
adapter's peft config as metadata, so the loader restores ``lora_alpha`` (the scale ``alpha / rank``)
and not just the rank. The result is ``<folder>/pytorch_lora_weights.safetensors``::

    pipe = FluxPipeline.from_pretrained(base_folder_or_hub_id)
    pipe.load_lora_weights("runs/x/checkpoints/step_000100/lora")

Beside the folder, ``<folder>_kohya.safetensors`` holds the same tensors in the kohya key naming
(``lora_transformer_<layer with underscores>.lora_down.weight`` / ``.lora_up.weight`` / ``.alpha``, the rank and
alpha also as ``ss_network_dim`` / ``ss_network_alpha`` metadata): one file to drop into ComfyUI's ``models/loras``,
which reads these names for the FLUX.1 and SD3 transformers. ``[lora] init`` reads both back
(:mod:`flowrl.backbones.lora.load`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

LORA_FOLDER = "lora"  # next to each checkpoint's weights
KOHYA_SUFFIX = "_kohya.safetensors"  # the one-file copy beside the folder: lora_kohya.safetensors
ADAPTER = "default"  # the adapter name peft gives ``add_adapter`` without one


def has_lora(transformer: nn.Module) -> bool:
    """The transformer carries a peft adapter."""
    return bool(getattr(transformer, "peft_config", None))


def lora_state_dict(transformer: nn.Module, adapter: str = ADAPTER) -> dict[str, Any]:
    """The adapter's LoRA tensors under diffusers-style module keys (``...to_q.lora_A.weight``), on CPU.

    Sharded (FSDP2) parameters are gathered to full tensors: every process must then call this."""
    from peft.utils import get_peft_model_state_dict

    state = get_peft_model_state_dict(transformer, adapter_name=adapter)
    whole = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in state.items()}
    return {k: v.detach().contiguous().cpu() for k, v in whole.items()}


def kohya_state(layers: dict[str, Any], alpha: float) -> dict[str, Any]:
    """The adapter's tensors (peft keys, :func:`lora_state_dict`) under kohya keys, with each layer's ``.alpha``."""
    import torch

    from flowrl.backbones.lora.load import KOHYA_PREFIX

    roles = {".lora_A.weight": ".lora_down.weight", ".lora_B.weight": ".lora_up.weight"}
    out: dict[str, Any] = {}
    for key, tensor in layers.items():
        suffix = next((s for s in roles if key.endswith(s)), None)
        if suffix is None:
            raise ValueError(f"not a LoRA matrix key: {key!r}")
        flat = KOHYA_PREFIX + key[: -len(suffix)].replace(".", "_")
        out[flat + roles[suffix]] = tensor
        out[flat + ".alpha"] = torch.tensor(float(alpha))
    return out


def write_kohya(layers: dict[str, Any], rank: int, alpha: float, file: str | Path) -> Path:
    """Write the adapter's tensors to one ``.safetensors`` file in the kohya key naming; returns ``file``."""
    from safetensors.torch import save_file

    metadata = {"format": "pt", "ss_network_dim": str(rank), "ss_network_alpha": str(float(alpha))}
    save_file(kohya_state(layers, alpha), str(file), metadata=metadata)
    return Path(file)


def export_lora(
    backbone: Any, folder: str | Path, adapter: str = ADAPTER, layers: dict[str, Any] | None = None
) -> Path | None:
    """Write the backbone's transformer LoRA into ``folder`` in the diffusers format, and beside it
    ``<folder>_kohya.safetensors`` in the kohya naming; returns ``folder``.
    ``layers``: the adapter's tensors when already gathered (:func:`lora_state_dict`).

    Returns None (and writes nothing) when the backbone has no diffusers pipeline with ``save_lora_weights``
    or its transformer has no LoRA adapter.
    """
    pipe = getattr(backbone, "pipe", None)
    transformer = getattr(backbone, "transformer", None)
    if pipe is None or transformer is None or not hasattr(type(pipe), "save_lora_weights") or not has_lora(transformer):
        return None
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = transformer.peft_config[adapter]
    layers = lora_state_dict(transformer, adapter) if layers is None else layers
    type(pipe).save_lora_weights(
        folder,
        transformer_lora_layers=layers,
        transformer_lora_adapter_metadata=config.to_dict(),
        safe_serialization=True,
    )
    write_kohya(layers, config.r, config.lora_alpha, folder.parent / f"{folder.name}{KOHYA_SUFFIX}")
    return folder
