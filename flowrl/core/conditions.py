"""Conditions: a prompt is its text plus zero or more condition images (an edit's source image, a video's first
frame).

A prompt travels through flowrl as a ``str`` wherever it goes: prompt sources return strings, samplers hand them
to the backbone's ``encode``, rewards receive them with the images. A prompt with conditions is a :class:`Prompt`,
a ``str`` whose value is its text and which carries its :class:`Condition` images; a prompt without any is a plain
``str`` (``Prompt(text)`` *is* ``text``), so text-to-image behaves exactly as before. Only the parts that must see
the images read them, with :func:`conditions_of`: the backbone's encode step (it encodes them with the text, once
per prompt, and keeps them in the prompt's ``Conditioning`` row) and rewards that score an edit against its
source. No selector, sampler, estimator, loss or kernel knows about conditions: they pass prompts along and
index the ``Conditioning`` rows, as for text.

Two prompts are equal when their texts and their conditions' contents are (a :class:`Condition` is compared by a
digest of its pixels), so the backbone's per-prompt cache and every dictionary keyed by prompt tell apart the
same instruction on two different source images. :class:`ConditionSpec` is what a base accepts (how many images,
which modes); :func:`check_conditions` holds a prompt's images to it before any model loads.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

import attrs
import numpy as np
import torch
from torch import Tensor

from flowrl.core.errors import UserError

MODES: dict[str, int] = {"RGB": 3, "RGBA": 4, "L": 1}  # the image modes a condition may have, and their channels


class ConditionError(UserError, ValueError):
    """A condition image that cannot be used: missing, unreadable, of a mode or number the base does not take."""


def _digest(mode: str, pixels: np.ndarray) -> str:
    h = hashlib.blake2b(digest_size=12)
    h.update(f"{mode}:{pixels.shape}".encode())
    h.update(np.ascontiguousarray(pixels).tobytes())
    return h.hexdigest()


class Condition:
    """One condition image: uint8 pixels ``(H, W, C)`` in ``mode`` (``RGB``, ``RGBA`` or ``L``) and where it came
    from (``origin``: a file, or empty for an image made in memory). Equal and hashed by content: ``key`` is a
    digest of its mode and pixels.

    An image made in memory keeps its pixels; one read from a file (:meth:`from_file`) is decoded once to check
    and digest it, then read again whenever its pixels are asked for (a prompt file of many large images is not
    held in memory), and a file that changed since is an error."""

    __slots__ = ("_pixels", "key", "mode", "origin", "size")

    def __init__(self, pixels: Any, mode: str = "RGB", origin: str = "") -> None:
        array = np.asarray(pixels)
        if array.ndim == 2:
            array = array[:, :, None]
        if mode not in MODES or array.dtype != np.uint8 or array.ndim != 3 or array.shape[2] != MODES[mode]:
            raise ValueError(
                f"a condition is uint8 (H, W, {MODES.get(mode, '?')}) in mode {mode}, got {array.dtype} {array.shape}"
            )
        array = array.copy()
        array.flags.writeable = False
        self._pixels: np.ndarray | None = array
        self.mode, self.origin = mode, origin
        self.size = (int(array.shape[1]), int(array.shape[0]))  # (width, height)
        self.key = _digest(mode, array)

    @classmethod
    def from_file(cls, path: Any, where: str, relative_to: str = "the prompt file") -> Condition:
        """The image file at ``path``, checked now (a :class:`ConditionError` starting with ``where`` when it is
        missing, unreadable or of a mode flowrl does not take; a missing file's message says image paths are
        relative to ``relative_to``) and read again when its pixels are needed. The one reader of condition image
        files: the JSONL prompt source and ``flowrl sample --image`` both check through it."""
        pixels, mode = _read(path, where, relative_to)
        condition = cls(pixels, mode, str(path))
        condition._pixels = None
        return condition

    @property
    def pixels(self) -> np.ndarray:
        """The pixels ``(H, W, C)``, read-only (a file-backed image is read again and must not have changed)."""
        if self._pixels is not None:
            return self._pixels
        pixels, mode = _read(self.origin, f"condition image {self.origin}")
        if mode != self.mode or _digest(mode, pixels) != self.key:
            raise ConditionError(
                f"condition image {self.origin}: the file changed since it was checked; "
                "keep condition images unchanged while a run uses them"
            )
        pixels.flags.writeable = False
        return pixels

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Condition) and other.key == self.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __getstate__(self) -> tuple[Any, ...]:
        return (self._pixels, self.key, self.mode, self.origin, self.size)

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        self._pixels, self.key, self.mode, self.origin, self.size = state

    def tensor(self) -> Tensor:
        """The image as float32 ``(C, H, W)`` in [0, 1]."""
        return torch.from_numpy(self.pixels.astype(np.float32) / 255.0).permute(2, 0, 1).contiguous()

    def __repr__(self) -> str:
        where = f", {self.origin!r}" if self.origin else ""
        return f"Condition({self.mode} {self.size[0]}x{self.size[1]}{where}, key={self.key[:8]})"


def _sort_key(text: str) -> tuple[str, tuple[str, ...]]:
    return (str.__str__(text), tuple(c.key for c in conditions_of(text)))


class Prompt(str):
    """A prompt's text (the string itself) with its condition images, in the order the base defines (an edit
    base: the source image first). ``Prompt(text)`` without conditions returns ``text`` itself, a plain ``str``.

    Equal, hashed and ordered by text and conditions (a plain string sorts as the same text without any); every
    ``str`` operation works on the text and returns plain strings. Pickles with its conditions."""

    conditions: tuple[Condition, ...]

    def __new__(cls, text: str, conditions: Iterable[Condition] = ()) -> Any:
        conditions = tuple(conditions)
        if not conditions:
            return str(text)
        if not all(isinstance(c, Condition) for c in conditions):
            raise TypeError(f"conditions must be Condition objects, got {[type(c).__name__ for c in conditions]}")
        prompt = super().__new__(cls, text)
        prompt.conditions = conditions
        return prompt

    def __reduce__(self) -> tuple[Any, ...]:
        return (Prompt, (str(self), self.conditions))

    @property
    def text(self) -> str:
        """The text alone, a plain ``str``."""
        return str.__str__(self)

    def __str__(self) -> str:
        return str.__str__(self)

    def __repr__(self) -> str:
        return (
            f"Prompt({str.__repr__(self)}, {len(self.conditions)} condition{'s' if len(self.conditions) != 1 else ''})"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, str):
            return NotImplemented
        return _sort_key(self) == _sort_key(other)

    def __ne__(self, other: object) -> bool:
        if not isinstance(other, str):
            return NotImplemented
        return _sort_key(self) != _sort_key(other)

    def __hash__(self) -> int:
        return hash(_sort_key(self))

    def __lt__(self, other: str) -> bool:
        return _sort_key(self) < _sort_key(other)

    def __le__(self, other: str) -> bool:
        return _sort_key(self) <= _sort_key(other)

    def __gt__(self, other: str) -> bool:
        return _sort_key(self) > _sort_key(other)

    def __ge__(self, other: str) -> bool:
        return _sort_key(self) >= _sort_key(other)


def conditions_of(prompt: str) -> tuple[Condition, ...]:
    """A prompt's condition images (none for a plain string)."""
    return getattr(prompt, "conditions", ()) if isinstance(prompt, Prompt) else ()


@attrs.frozen
class ConditionSpec:
    """What a base takes besides the text: ``count`` images (at least, at most; ``(0, 0)``: a text-to-image base)
    of one of ``modes``, each meaning what ``meaning`` says (one word per position, for messages: ``source``,
    ``first frame``). A base prepares accepted images by its own rule (its docstring says how: resize, crop)."""

    count: tuple[int, int] = (0, 0)
    modes: tuple[str, ...] = ("RGB",)
    meaning: tuple[str, ...] = ()

    def describe(self) -> str:
        """``"none (a text-to-image base)"``, ``"exactly 1 (the source image)"``, ``"1 to 3"``."""
        low, high = self.count
        if high == 0:
            return "none (a text-to-image base)"
        what = f" ({', '.join(self.meaning)})" if self.meaning else ""
        return (f"exactly {low}" if low == high else f"{low} to {high}") + f" image{'s' if high > 1 else ''}{what}"

    def problem(self, conditions: Sequence[Condition]) -> str | None:
        """Why these images do not suit the base (one clause), or None when they do."""
        low, high = self.count
        if not low <= len(conditions) <= high:
            images = f"{len(conditions)} image{'s' if len(conditions) > 1 else ''}" if conditions else "no image"
            return f"has {images}; the base takes {self.describe()}"
        for i, c in enumerate(conditions):
            if c.mode not in self.modes:
                name = c.origin or f"image {i + 1}"
                fix = "drop the alpha channel" if c.mode == "RGBA" else "convert it"
                return f"image {name} is {c.mode}; the base takes {' or '.join(self.modes)} images ({fix})"
        return None


TEXT_ONLY = ConditionSpec()


def check_conditions(prompts: Iterable[tuple[str, str]], spec: ConditionSpec, base: str) -> None:
    """Hold every ``(where, prompt)`` to ``spec``: the first prompt whose images do not suit the base raises a
    :class:`ConditionError` naming where it came from (a file and record) and the backbone ``base``."""
    for where, prompt in prompts:
        problem = spec.problem(conditions_of(prompt))
        if problem is not None:
            raise ConditionError(f"{where} {problem.replace('the base', f'the backbone {base!r}', 1)}")


def _read(path: Any, where: str, relative_to: str = "the prompt file") -> tuple[np.ndarray, str]:
    """An image file's pixels ``(H, W, C)`` and mode; a :class:`ConditionError` starting with ``where`` when it is
    missing, unreadable or of a mode flowrl does not take."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            mode = image.mode
            if mode not in MODES:
                raise ConditionError(f"{where}: mode {mode}, which flowrl does not take; save it as RGB")
            image.load()
            pixels = np.asarray(image, dtype=np.uint8)
    except FileNotFoundError:
        raise ConditionError(f"{where}: no such file (image paths are relative to {relative_to})") from None
    except IsADirectoryError:
        raise ConditionError(f"{where}: a folder, not an image file") from None
    except UnidentifiedImageError:
        raise ConditionError(f"{where}: not an image PIL can read (PNG, JPEG, WebP, ...)") from None
    except ConditionError:
        raise
    except (OSError, SyntaxError, ValueError) as error:  # truncated or corrupt data
        raise ConditionError(f"{where}: cannot read it ({error})") from None
    return (pixels if pixels.ndim == 3 else pixels[:, :, None]), mode


def fit_square(condition: Condition, side: int) -> Tensor:
    """An RGB condition as float32 ``(3, side, side)`` in [0, 1]: scaled (bicubic) so its short side is ``side``,
    then centre-cropped; taken as it is when it is already ``side x side``. The preparation rule of the world's
    edit base, and a shared helper for others."""
    return fit_frame(condition, side, side)


def fit_frame(condition: Condition, width: int, height: int) -> Tensor:
    """A condition as float32 ``(C, height, width)`` in [0, 1]: scaled (bicubic) by the smallest factor that covers
    ``width x height``, then centre-cropped to it; taken as it is when it is already that size (:func:`fit_square`
    for a square; a video base's first frame at its frame size)."""
    if condition.size == (width, height):
        return condition.tensor()
    from PIL import Image

    image = Image.fromarray(np.asarray(condition.pixels), condition.mode)
    w, h = image.size
    scale = max(width / w, height / h)
    image = image.resize((max(width, round(w * scale)), max(height, round(h * scale))), Image.Resampling.BICUBIC)
    left, top = (image.size[0] - width) // 2, (image.size[1] - height) // 2
    cropped = image.crop((left, top, left + width, top + height))
    return Condition(np.asarray(cropped, dtype=np.uint8), condition.mode).tensor()


def check_source(source: Any, backbone: Any) -> None:
    """Hold a built prompt source's condition images (its ``condition_records``) to what the recipe's backbone
    part (a :class:`~flowrl.config.recipe.Part`, not yet built) takes: before the model loads."""
    check_conditions(source.condition_records(), backbone.cls.accepts(backbone.config), backbone.type)
