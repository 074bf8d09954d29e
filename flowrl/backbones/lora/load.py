"""An existing LoRA as the start of training (``[lora] init``): a diffusers or peft folder, or one ``.safetensors``
file in diffusers / peft key naming or in the kohya key naming ComfyUI and kohya-style tools read.

The key namings, per adapted layer (``MODULE`` is the layer's name in the diffusers transformer, such as
``transformer_blocks.0.attn.to_q``)::

    diffusers   transformer.MODULE.lora_A.weight / .lora_B.weight        (metadata: the adapter's r, lora_alpha)
    peft        base_model.model.MODULE.lora_A.weight / .lora_B.weight   (adapter_config.json: r, lora_alpha)
    kohya       lora_transformer_MODULE_WITH_UNDERSCORES.lora_down.weight / .lora_up.weight / .alpha

(``diffusion_model.`` and ``lora_unet_`` are read as prefixes too.) The kohya names replace every ``.`` of the
module's name with ``_``, so they are read back against the base transformer's own layer names. ``lora_down``
is peft's ``A`` and ``lora_up`` its ``B``; both scale the product by ``alpha / rank``, so the tensors carry over
unchanged. The rank is the A matrices' first dimension; alpha comes from the metadata, the config or the
``.alpha`` tensors, and is the rank (scale 1) where the file gives none, as the other tools assume.

Reading the names, ranks and alphas needs no torch (the safetensors header is JSON), so ``flowrl validate``
checks a file against the base's layer names without loading a model library (:func:`init_problems`).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import attrs

from flowrl.core.errors import UserError

DIFFUSERS_FILE = "pytorch_lora_weights.safetensors"  # diffusers' save_lora_weights / save_lora_adapter
PEFT_FILE, PEFT_CONFIG = "adapter_model.safetensors", "adapter_config.json"  # peft's save_pretrained
KOHYA_PREFIX = "lora_transformer_"  # what the export writes: ComfyUI reads it for FLUX and SD3 transformers
DOTTED_PREFIXES = ("transformer.", "base_model.model.", "diffusion_model.")  # before MODULE in the dotted namings
FLAT_PREFIXES = (KOHYA_PREFIX, "lora_unet_")  # before MODULE_WITH_UNDERSCORES in the kohya naming
DOTTED = {".lora_A.weight": "A", ".lora_B.weight": "B"}
FLAT = {".lora_down.weight": "A", ".lora_up.weight": "B", ".alpha": "alpha"}
_SCALARS = {"F32": "<f", "F64": "<d", "F16": "<e"}  # .alpha dtypes read without torch (BF16 below)


class LoraInitError(UserError, ValueError):
    """``[lora] init`` names a file that cannot start training (one line naming the file and the key)."""


@attrs.frozen
class Layer:
    """One adapted layer as the file names it: its A and B tensor keys, the rank, and its own alpha if any."""

    name: str  # the module name as written: dotted, or with underscores (kohya)
    dotted: bool
    a_key: str
    b_key: str
    rank: int
    alpha: float | None


@attrs.frozen
class LoraFile:
    """A LoRA on disk, read from its header: where its tensors are, its layers, rank and alpha."""

    path: Path  # what the recipe named
    weights: Path  # the .safetensors file holding the tensors
    layers: tuple[Layer, ...]
    rank: int
    alpha: float

    def modules(self, names: Iterable[str]) -> dict[str, str]:
        """The base's module name of each layer (file name -> module name), given the base's module names;
        raises :class:`LoraInitError` naming the first tensor key that names no module of the base."""
        names = list(names)
        dotted = {n: n for n in names}
        flat = {n.replace(".", "_"): n for n in names}
        found = {}
        for layer in self.layers:
            module = (dotted if layer.dotted else flat).get(layer.name)
            if module is None:
                raise LoraInitError(
                    f"lora.init {self.path}: key '{layer.a_key}' names no layer of the base's transformer"
                    f" ('{layer.name}'); the LoRA was trained for another model or names layers another way"
                )
            found[layer.name] = module
        return found


def _fail(path: Path, why: str) -> LoraInitError:
    return LoraInitError(f"lora.init {path}: {why}")


def _header(file: Path, path: Path) -> tuple[dict[str, Any], int]:
    """The safetensors header (tensor entries and ``__metadata__``) and where the data starts."""
    try:
        with file.open("rb") as handle:
            size = struct.unpack("<Q", handle.read(8))[0]
            header = json.loads(handle.read(size))
    except (OSError, struct.error, ValueError) as error:
        raise _fail(path, f"not a readable .safetensors file ({type(error).__name__}: {error})") from None
    if not isinstance(header, dict):
        raise _fail(path, "not a .safetensors file (its header is not a table)")
    return header, 8 + size


def _scalar(file: Path, entry: dict[str, Any], start: int) -> float:
    """A one-element tensor's value, read from the file's bytes."""
    begin, end = entry["data_offsets"]
    with file.open("rb") as handle:
        handle.seek(start + begin)
        raw = handle.read(end - begin)
    dtype = entry["dtype"]
    if dtype == "BF16":
        return float(struct.unpack("<f", b"\x00\x00" + raw[:2])[0])
    return float(struct.unpack(_SCALARS[dtype], raw[: struct.calcsize(_SCALARS[dtype])])[0])


def _weights_file(path: Path) -> tuple[Path, dict[str, Any]]:
    """The tensor file of a folder or file, and the peft config when a peft folder holds one."""
    if not path.exists():
        raise _fail(path, "no such file or folder; check the path")
    if path.is_file():
        if path.suffix != ".safetensors":
            raise _fail(path, "expected a .safetensors file or a diffusers / peft LoRA folder")
        return path, {}
    if (path / PEFT_FILE).is_file():
        config_file = path / PEFT_CONFIG
        try:
            config = json.loads(config_file.read_text()) if config_file.is_file() else {}
        except ValueError as error:
            raise _fail(config_file, f"not JSON ({error})") from None
        return path / PEFT_FILE, config
    if (path / DIFFUSERS_FILE).is_file():
        return path / DIFFUSERS_FILE, {}
    raise _fail(path, f"the folder holds neither {DIFFUSERS_FILE} (diffusers) nor {PEFT_FILE} (peft)")


def _adapter_settings(metadata: dict[str, Any], config: dict[str, Any], path: Path) -> dict[str, Any]:
    """The adapter's peft settings: the peft folder's config, or the diffusers file's metadata (whose keys carry
    a ``transformer.`` prefix)."""
    if config:
        return config
    text = metadata.get("lora_adapter_metadata")
    if not text:
        return {}
    try:
        packed = json.loads(text)
    except ValueError:
        raise _fail(path, "its lora_adapter_metadata is not JSON") from None
    return {k.removeprefix("transformer."): v for k, v in packed.items()}


def _split(key: str) -> tuple[str, bool, str] | None:
    """(module name as written, dotted naming, role A / B / alpha) of a tensor key; None for other keys."""
    for suffix, role in DOTTED.items():
        if key.endswith(suffix):
            name = key[: -len(suffix)]
            return next((name[len(p):] for p in DOTTED_PREFIXES if name.startswith(p)), name), True, role
    for suffix, role in FLAT.items():
        if key.endswith(suffix):
            name = key[: -len(suffix)]
            prefix = next((p for p in FLAT_PREFIXES if name.startswith(p)), None)
            if prefix is not None:
                return name[len(prefix):], False, role
            if role != "alpha" and name.startswith(DOTTED_PREFIXES):  # ComfyUI: dotted names, kohya roles
                return next(name[len(p):] for p in DOTTED_PREFIXES if name.startswith(p)), True, role
    return None


def read_lora(path: str | Path) -> LoraFile:
    """Read a LoRA's layers, rank and alpha from its header (no torch); :class:`LoraInitError` when it cannot
    start training: an unreadable file, a tensor that is not a LoRA matrix, ranks or alphas that differ."""
    path = Path(path)
    file, config = _weights_file(path)
    header, start = _header(file, path)
    metadata = header.pop("__metadata__", None) or {}
    settings = _adapter_settings(metadata, config, path)
    for pattern in ("rank_pattern", "alpha_pattern"):
        if settings.get(pattern):
            raise _fail(path, f"its adapter sets {pattern} (a rank or alpha per layer); flowrl reads one of each")
    parts: dict[tuple[str, bool], dict[str, str]] = {}
    for key in sorted(header):
        split = _split(key)
        if split is None:
            raise _fail(path, f"key '{key}' is not a LoRA matrix flowrl reads (lora_A / lora_B, lora_down / lora_up,"
                              " alpha); text-encoder layers and LoRA variants (LoHa, DoRA) are not")
        name, dotted, role = split
        parts.setdefault((name, dotted), {})[role] = key
    layers = []
    for (name, dotted), roles in parts.items():
        if "A" not in roles or "B" not in roles:
            have = next(iter(roles.values()))
            raise _fail(path, f"key '{have}' has no {'up / B' if 'B' not in roles else 'down / A'} matrix beside it")
        shape_a, shape_b = header[roles["A"]]["shape"], header[roles["B"]]["shape"]
        if len(shape_a) != 2 or len(shape_b) != 2 or shape_a[0] != shape_b[1]:
            raise _fail(path, f"key '{roles['A']}': shapes {shape_a} and {shape_b} are not a linear layer's LoRA pair")
        alpha = _scalar(file, header[roles["alpha"]], start) if "alpha" in roles else None
        layers.append(Layer(name, dotted, roles["A"], roles["B"], int(shape_a[0]), alpha))
    if not layers:
        raise _fail(path, "it holds no LoRA layer")
    ranks = {layer.rank for layer in layers}
    if len(ranks) > 1:
        odd = next(layer for layer in layers if layer.rank != layers[0].rank)
        raise _fail(path, f"key '{odd.a_key}' has rank {odd.rank}, others {layers[0].rank}; flowrl reads one rank")
    rank = ranks.pop()
    if "r" in settings and int(settings["r"]) != rank:
        raise _fail(path, f"its config says r = {settings['r']} but key '{layers[0].a_key}' has rank {rank}")
    alphas = {layer.alpha for layer in layers if layer.alpha is not None}
    if len(alphas) > 1:
        raise _fail(path, f"its .alpha tensors differ ({sorted(alphas)[:3]}); flowrl reads one alpha")
    alpha = float(settings.get("lora_alpha", alphas.pop() if alphas else rank))
    return LoraFile(path, file, tuple(layers), rank, alpha)


def init_problems(path: str, module_names: Iterable[str] | None) -> Iterator[tuple[str, str]]:
    """(key, why) problems of ``[lora] init`` for ``flowrl validate``: the file, and, when the base's module
    names are known without weights, that every layer of the file is a layer of the base."""
    try:
        lora = read_lora(path)
        if module_names is not None:
            lora.modules(module_names)
    except LoraInitError as error:
        yield ("lora.init", str(error).removeprefix("lora.init "))


def attach_lora_file(transformer: Any, path: str, dropout: float = 0.0) -> LoraFile:
    """Freeze ``transformer`` and attach the LoRA of ``path`` as its trainable adapter: the file's rank, alpha
    and layers, its tensors loaded exactly. Raises :class:`LoraInitError` naming the file and the key."""
    from peft import LoraConfig as PeftLoraConfig
    from peft.utils import set_peft_model_state_dict
    from safetensors.torch import load_file
    from torch import nn

    lora = read_lora(path)
    linear = {n for n, m in transformer.named_modules() if isinstance(m, nn.Linear)}
    modules = lora.modules(name for name, _ in transformer.named_modules())
    for layer in lora.layers:
        if modules[layer.name] not in linear:
            raise _fail(lora.path, f"key '{layer.a_key}': '{modules[layer.name]}' of the base is not a linear layer")
    transformer.requires_grad_(False)
    transformer.add_adapter(
        PeftLoraConfig(
            r=lora.rank, lora_alpha=lora.alpha, lora_dropout=dropout, target_modules=sorted(modules.values())
        )
    )
    tensors = load_file(str(lora.weights))
    state = {}
    for layer in lora.layers:
        state[f"{modules[layer.name]}.lora_A.weight"] = tensors[layer.a_key]
        state[f"{modules[layer.name]}.lora_B.weight"] = tensors[layer.b_key]
    for layer in lora.layers:
        base = transformer.get_submodule(modules[layer.name]).base_layer
        maps = (int(tensors[layer.a_key].shape[1]), int(tensors[layer.b_key].shape[0]))
        if maps != (base.in_features, base.out_features):
            raise _fail(lora.path, f"key '{layer.a_key}': the pair maps {maps[0]} to {maps[1]} features, the base's"
                                   f" layer {base.in_features} to {base.out_features}")
    result = set_peft_model_state_dict(transformer, state, adapter_name="default")
    unexpected = list(getattr(result, "unexpected_keys", []) or [])
    if unexpected:
        raise _fail(lora.path, f"key '{unexpected[0]}' was not taken by the base's adapters")
    return lora
