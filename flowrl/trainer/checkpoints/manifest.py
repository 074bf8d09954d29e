"""What marks a folder written by ``flowrl export`` and lets flowrl load it again: ``flowrl_export.json``.

It names the step of the exported checkpoint, which weights the folder holds (``lora``: the diffusers LoRA folder
``lora/``; ``transformer``: the trained transformer as a diffusers model folder ``transformer/``) and the folder
of the base pipeline shipped in the export (``base/``, when the base was a local folder), so that
:func:`flowrl.export.loading.load_policy`, and through it ``flowrl sample``, ``flowrl eval`` and ``flowrl suite run``,
take an exported folder as they take a checkpoint. Light: no model library is imported here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs

from flowrl.core.errors import UserError

MANIFEST = "flowrl_export.json"
FORMAT = 1
BASE_FOLDER = "base"  # the shipped base pipeline, when the run's base was a local folder
WEIGHTS_KINDS = ("lora", "transformer")


class ExportedFolderError(UserError):
    """An exported folder flowrl cannot read back (a damaged or hand-edited ``flowrl_export.json``)."""


@attrs.frozen
class Manifest:
    """The contents of ``flowrl_export.json``."""

    step: int  # the exported checkpoint's iteration (0: the initial weights)
    checkpoint: str  # the checkpoint folder's name in the run (step_000123, best)
    weights: str  # "lora" (lora/) or "transformer" (transformer/): what flowrl loads
    base: str = ""  # the shipped base pipeline's folder inside the export (BASE_FOLDER), or "" when not shipped

    def to_json(self) -> str:
        return json.dumps({"flowrl_export": FORMAT, **attrs.asdict(self)}, indent=2) + "\n"


def is_exported(folder: Path) -> bool:
    """``folder`` was written by ``flowrl export`` (it holds ``flowrl_export.json``)."""
    return (Path(folder) / MANIFEST).is_file()


def read_manifest(folder: Path) -> Manifest | None:
    """The manifest of an exported folder, None for any other folder; :class:`ExportedFolderError` when unreadable."""
    file = Path(folder) / MANIFEST
    if not file.is_file():
        return None
    try:
        data: Any = json.loads(file.read_text(encoding="utf-8"))
        manifest = Manifest(step=int(data["step"]), checkpoint=str(data["checkpoint"]), weights=str(data["weights"]),
                            base=str(data.get("base", "")))
    except (OSError, UnicodeDecodeError, ValueError, TypeError, KeyError) as error:
        why = f"{type(error).__name__}: {error}"
        raise ExportedFolderError(f"{file}: unreadable ({why}); export the run again") from None
    if manifest.weights not in WEIGHTS_KINDS:
        raise ExportedFolderError(f"{file}: weights = {manifest.weights!r}, expected one of {', '.join(WEIGHTS_KINDS)}")
    if not (Path(folder) / manifest.weights).is_dir():
        raise ExportedFolderError(f"{file}: names {manifest.weights}/, which is not in {folder}; export the run again")
    return manifest


def exported_overrides(folder: Path, manifest: Manifest) -> list[str]:
    """Recipe overrides that make an exported folder's ``recipe.toml`` load its own files: the shipped base
    (``backbone.path``) and, for a LoRA, the trained adapter as ``lora.init`` (its layers, rank, alpha, tensors)."""
    folder = Path(folder).resolve()
    overrides = []
    if manifest.base:
        overrides.append(f"backbone.path={json.dumps(str(folder / manifest.base))}")
    if manifest.weights == "lora":
        overrides.append(f"lora.init={json.dumps(str(folder / 'lora'))}")
    return overrides


def transformer_weights(folder: Path) -> dict[str, Any]:
    """The tensors of an exported ``transformer/`` folder (one safetensors file, or the shards of one)."""
    from safetensors.torch import load_file

    files = sorted((Path(folder) / "transformer").glob("*.safetensors"))
    if not files:
        raise ExportedFolderError(f"{Path(folder) / 'transformer'}: no .safetensors weights; export the run again")
    weights: dict[str, Any] = {}
    for file in files:
        try:
            weights.update(load_file(str(file)))
        except Exception as error:  # truncated or corrupt files raise many types
            raise ExportedFolderError(f"{file}: truncated or corrupt ({type(error).__name__}: {error})") from None
    return weights


def weight_files(folder: Path) -> list[Path]:
    """The files holding a checkpoint's trained weights: ``weights.safetensors`` of a checkpoint folder, the
    ``.safetensors`` files of an exported folder's ``lora/`` or ``transformer/`` (what a hash of the weights reads)."""
    manifest = read_manifest(folder)
    if manifest is None:
        return [Path(folder) / "weights.safetensors"]
    return sorted((Path(folder) / manifest.weights).rglob("*.safetensors"))
