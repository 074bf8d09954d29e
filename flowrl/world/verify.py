"""The verifier: a reward in [0, 1] for how well an image meets a prompt's constraints.

Detection: a pixel's chroma is its RGB minus its grey level (the mean of its channels), less the
background's chroma (the median over non-object pixels), so blending an object with the background
scales the object's chroma. A pixel belongs to the colour whose chroma direction is nearest (within
:data:`MAX_ANGLE` degrees) if its chroma along it is at least :data:`COVERAGE` of the colour's own, so
anti-aliased or blurred edges split near 50% coverage on any background. Same-colour pixels form
8-connected components; those under :data:`MIN_AREA` pixels (scaled with image area) are specks and are
ignored, those over :data:`MAX_EXTENT` pixels across have no shape, and the others' shapes come from
moments of their soft coverage (see :func:`classify_shape`).

Constraints, per object group: ``COLOUR SHAPE present`` and ``COLOUR SHAPE count == n``; then
``relation`` if the prompt has one (some subject/object pair has centroids apart by more than
:data:`RELATION_MARGIN` px along the relation's axis, and more along it than across it). Every detected
object beyond those the prompt asks for is *extra*: one of an unnamed colour or shape, a blob with no
shape, or a named object past its group's count. ``strict`` is 1 when every constraint is met and nothing
is extra. The ``score`` is ``max(0, met - extra) / constraints``: partial credit counts only correctly
drawn objects (a colour alone earns nothing), and each extra object cancels one met constraint, so
clutter and colour floods never pay (an extra object can meet at most the relation, and costs as much).
A blank image scores 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np

from flowrl.world.grammar import COLOUR_NAMES, COLOURS, RELATION_AXES, Scene

COVERAGE = 0.5  # fraction of a colour's chroma a pixel needs to belong to it
MAX_ANGLE = 30.0  # degrees between a pixel's chroma and its colour's
MIN_AREA = 12.0  # pixels at 32 x 32
MAX_EXTENT = 18.0  # pixels at 32 x 32: a wider or taller blob (a flooded image) has no shape
SOFT_FLOOR = 0.15  # coverage below this counts as none (background noise)
TRIANGLE_SKEW = 0.2  # |skewness| along x or y above which a blob is a triangle
SQUARE_RATIO = 0.86  # separability ratio above which a non-tapering blob is a square
RELATION_MARGIN = 2.0  # pixels at 32 x 32
_PROTOTYPES = np.asarray([COLOURS[c] for c in COLOUR_NAMES], dtype=np.float32)
_CHROMA_VECTORS = _PROTOTYPES - _PROTOTYPES.mean(-1, keepdims=True)
_CHROMA = np.linalg.norm(_CHROMA_VECTORS, axis=-1)
_UNITS = _CHROMA_VECTORS / _CHROMA[:, None]
_MAX_COS = float(np.cos(np.radians(MAX_ANGLE)))
_SHIFTS = [(dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1) if (dy, dx) != (0, 0)]


@attrs.frozen
class Detection:
    """One detected object: colour, shape (``None``: unknown), area and centroid ``(x, y)`` in pixels."""

    colour: str
    shape: str | None
    area: int
    centroid: tuple[float, float]
    box: tuple[int, int, int, int]  # x0, y0, x1, y1 (inclusive)

    @property
    def pair(self) -> tuple[str, str | None]:
        """``(colour, shape)``."""
        return (self.colour, self.shape)


@attrs.frozen
class Verdict:
    """The verifier's answer: ``score`` in [0, 1], ``strict`` in {0, 1}, each named constraint and the
    number of extra objects."""

    score: float
    strict: int
    constraints: tuple[tuple[str, bool], ...]
    detections: tuple[Detection, ...]
    extra: int = 0  # detected objects beyond those the prompt asks for


def _as_rgb255(image: Any) -> np.ndarray:
    """One image (HxWx3 uint8, or float in [0, 1], or 3xHxW float) as float32 HxWx3 in [0, 255]."""
    if hasattr(image, "detach"):  # a torch tensor
        image = image.detach().float().cpu().numpy()
    arr = np.asarray(image)
    if arr.ndim != 3:
        raise ValueError(f"expected one image of 3 dims, got shape {arr.shape}")
    if arr.shape[-1] != 3 and arr.shape[0] == 3:
        arr = np.moveaxis(arr, 0, -1)
    if arr.shape[-1] != 3:
        raise ValueError(f"expected 3 colour channels, got shape {arr.shape}")
    if arr.dtype == np.uint8:
        return arr.astype(np.float32)
    return np.clip(arr.astype(np.float32), 0.0, 1.0) * 255.0


def _member(chroma: np.ndarray, base: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Colour maps ``(B, H, W)`` and coverage ``(B, C, H, W)`` of a batch of pixels' ``chroma`` ``(B, H, W, 3)``
    over each image's background chroma ``base`` ``(B, 3)``."""
    b, h, w, _ = chroma.shape
    rel = (chroma - base[:, None, None, :]).reshape(-1, 3)
    proj = _UNITS @ rel.T  # (C, B*H*W): each colour's plane contiguous, so the reductions run over planes
    denom = np.maximum(_CHROMA[None, :] - base @ _UNITS.T, 1.0)  # (B, C)
    best = proj.argmax(0)
    along = proj.max(0)
    best_cover = along / denom[np.repeat(np.arange(b), h * w), best]  # the best colour's cover
    member = (best_cover >= COVERAGE) & (along >= _MAX_COS * np.sqrt((rel * rel).sum(-1)))
    cover = proj.reshape(-1, b, h, w) / denom.T[:, :, None, None]  # blend fraction of each colour
    cmaps = np.where(member, best, -1).astype(np.int8).reshape(b, h, w)
    return cmaps, np.clip(cover, 0.0, 1.0, out=cover).transpose(1, 0, 2, 3)


def _analyse(rgbs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The colour maps ``(B, H, W)`` of a batch of images ``(B, H, W, 3)`` and each colour's soft coverage
    ``(B, C, H, W)`` in [0, 1].

    Each image's background chroma (the median over its non-object pixels, so a tinted background) is
    subtracted.
    """
    chroma = rgbs - rgbs.mean(-1, keepdims=True)  # drop the grey component: blends with grey are linear here
    cmaps, _ = _member(chroma, np.zeros((len(rgbs), 3), dtype=np.float32))
    return _member(chroma, _background_medians(chroma, cmaps))


def _background_medians(chroma: np.ndarray, cmaps: np.ndarray) -> np.ndarray:
    """Each image's median chroma ``(B, 3)`` over its background pixels (``cmaps < 0``), zero where it has
    none: one sort of the batch, object pixels sorted last, then the middle value (or the mean of the two)."""
    b = len(chroma)
    background = (cmaps < 0).reshape(b, -1)
    flat = np.where(background[:, :, None], chroma.reshape(b, -1, 3), np.inf)
    flat.sort(axis=1)
    n = background.sum(1)
    lo, hi = np.maximum(n - 1, 0) // 2, n // 2
    rows = np.arange(b)
    medians = (flat[rows, lo] + flat[rows, hi]) / np.float32(2)
    return np.where((n > 0)[:, None], medians, np.float32(0)).astype(np.float32)


def label_components(cmap: np.ndarray) -> np.ndarray:
    """8-connected same-colour components of a colour map ``(H, W)``, or of a batch of them ``(B, H, W)``
    (each image on its own): labels (int), ``-1`` for background. A component's label is the smallest flat
    pixel index in it; the minimum spreads between linked neighbours until nothing changes.

    Only object pixels take part: each is numbered in raster order over the batch (so within a component the
    smallest number is its smallest flat index) and carries the numbers of its same-colour neighbours."""
    single = cmap.ndim == 2
    maps = cmap[None] if single else cmap
    b, h, w = maps.shape
    out = np.full((b, h, w), -1, dtype=np.int64)
    where = np.flatnonzero(maps >= 0)  # object pixels, raster order over the batch
    if not len(where):
        return out[0] if single else out
    inner = np.full(b * h * w, -1, dtype=np.int64)
    inner[where] = np.arange(len(where))
    number = np.full((b, h + 2, w + 2), -1, dtype=np.int64)  # framed: outside the image is no pixel
    number[:, 1:-1, 1:-1] = inner.reshape(b, h, w)
    framed = np.full((b, h + 2, w + 2), -1, dtype=maps.dtype)
    framed[:, 1:-1, 1:-1] = maps
    own = np.arange(len(where))
    colours = maps.reshape(-1)[where]
    neighbours = [own]
    for dy, dx in _SHIFTS:
        there = number[:, 1 + dy : 1 + dy + h, 1 + dx : 1 + dx + w].reshape(-1)[where]
        same = framed[:, 1 + dy : 1 + dy + h, 1 + dx : 1 + dx + w].reshape(-1)[where] == colours
        if same.any():
            neighbours.append(np.where(same, there, own))
    links = np.stack(neighbours, 1)  # (pixels, 1 + directions): a pixel's own number where no link
    labels = own
    while True:
        new = labels[links].min(1)
        # shortcut: a label is the number of a pixel of the same component whose own label is no larger, so
        # taking that pixel's label never leaves the component and needs far fewer sweeps (both steps only
        # lower labels, so the fixed point is the same: each component's smallest number)
        new = new[new]
        if np.array_equal(new, labels):
            break
        labels = new
    out.reshape(-1)[where] = where[labels] % (h * w)
    return out[0] if single else out


def classify_shape(mask: np.ndarray, soft: np.ndarray) -> str | None:
    """Shape of one component from its bool ``mask`` (cropped to its bounding box) and its soft coverage
    ``soft`` (float, the box grown by 1 px each side); ``None`` when no shape fits.

    Moments of the soft coverage survive blur: a triangle's mass is skewed towards its base (skewness
    -0.57 along its axis, about -0.45 after pixelisation and mild blur; circles and squares have 0). An
    axis-aligned square is separable, ``E[x^2 y^2] = E[x^2] E[y^2]`` (ratio 1, kept by any blur), while a
    disc has ratio 2/3 (about 0.7 after pixelisation and mild blur).
    """
    h, w = mask.shape
    mass = float(soft.sum())
    if min(h, w) < 3 or not 1 / 1.7 <= w / h <= 1.7 or mass <= 0:
        return None
    fill = mass / (h * w)
    ys, xs = np.indices(soft.shape, dtype=np.float64)
    dx = xs - (xs * soft).sum() / mass
    dy = ys - (ys * soft).sum() / mass
    vx, vy = (dx**2 * soft).sum() / mass, (dy**2 * soft).sum() / mass
    skew = max(abs((dx**3 * soft).sum() / mass) / vx**1.5, abs((dy**3 * soft).sum() / mass) / vy**1.5)
    if skew >= TRIANGLE_SKEW:
        return "triangle" if 0.3 <= fill <= 0.9 else None
    if fill < 0.55:
        return None
    ratio = (dx**2 * dy**2 * soft).sum() / mass / (vx * vy)
    return "square" if ratio >= SQUARE_RATIO else "circle"


def detect(image: Any) -> list[Detection]:
    """Every object (component of at least the minimum area) in one image."""
    return _detect(_as_rgb255(image))


def _detect(rgb: np.ndarray) -> list[Detection]:
    cmaps, covers = _analyse(rgb[None])
    return _objects(cmaps[0], covers[0], label_components(cmaps[0]))


def _objects(cmap: np.ndarray, cover: np.ndarray, labels: np.ndarray) -> list[Detection]:
    """The detections of one image from its colour map, coverage and component labels."""
    h, w = cmap.shape
    min_area = MIN_AREA * h * w / 1024.0
    ids, counts = np.unique(labels[labels >= 0], return_counts=True)
    # grown by 1 px each side: outside the image a pixel is neither this component nor background (-2)
    # and has no coverage
    framed_labels = np.full((h + 2, w + 2), -2, dtype=labels.dtype)
    framed_labels[1:-1, 1:-1] = labels
    framed_cover = np.zeros((cover.shape[0], h + 2, w + 2), dtype=cover.dtype)
    framed_cover[:, 1:-1, 1:-1] = cover
    out: list[Detection] = []
    for lab, area in zip(ids.tolist(), counts.tolist(), strict=True):
        if area < min_area:
            continue
        ys, xs = np.nonzero(labels == lab)
        y0, y1, x0, x1 = int(ys.min()), int(ys.max()), int(xs.min()), int(xs.max())
        k = int(cmap[ys[0], xs[0]])
        # soft coverage of this colour around the component, without other components' pixels
        window = framed_labels[y0 : y1 + 3, x0 : x1 + 3]
        near = framed_cover[k, y0 : y1 + 3, x0 : x1 + 3]
        soft = np.where(((window == lab) | (window == -1)) & (near >= SOFT_FLOOR), near, 0.0)
        shape = classify_shape(labels[y0 : y1 + 1, x0 : x1 + 1] == lab, soft)
        if max(y1 - y0, x1 - x0) + 1 > MAX_EXTENT * w / 32.0:
            shape = None
        centroid = (float(xs.mean()) + 0.5, float(ys.mean()) + 0.5)
        out.append(Detection(COLOUR_NAMES[k], shape, int(area), centroid, (x0, y0, x1, y1)))
    return out


def _relation_met(relation: str, subjects: list[Detection], objects: list[Detection], margin: float) -> bool:
    axis, sign = RELATION_AXES[relation]
    for s in subjects:
        for o in objects:
            d_axis = sign * (o.centroid[axis] - s.centroid[axis])
            if d_axis > margin and d_axis > abs(o.centroid[1 - axis] - s.centroid[1 - axis]):
                return True
    return False


def check(detections: Sequence[Detection], scene: Scene, size: int = 32) -> Verdict:
    """Score detected objects against the scene's constraints (see the module docstring)."""
    constraints: list[tuple[str, bool]] = []
    matched = 0
    for g in scene.groups:
        matching = [d for d in detections if (d.colour, d.shape) == g.pair]
        matched += min(len(matching), g.count)
        constraints.append((f"{g.colour} {g.shape} present", bool(matching)))
        constraints.append((f"{g.colour} {g.shape} count == {g.count}", len(matching) == g.count))
    if scene.relation is not None:
        rel = scene.relation
        subj, obj = scene.groups[rel.subject], scene.groups[rel.object]
        met = _relation_met(
            rel.relation,
            [d for d in detections if (d.colour, d.shape) == subj.pair],
            [d for d in detections if (d.colour, d.shape) == obj.pair],
            RELATION_MARGIN * size / 32.0,
        )
        constraints.append(("relation", met))
    extra = len(detections) - matched
    met_count = sum(ok for _, ok in constraints)
    strict = int(met_count == len(constraints) and extra == 0)
    score = max(0, met_count - extra) / len(constraints)
    return Verdict(score, strict, tuple(constraints), tuple(detections), extra)


def verify(image: Any, scene: Scene) -> Verdict:
    """Verify one image (HxWx3 uint8 or float in [0, 1], or 3xHxW float) against ``scene``."""
    rgb = _as_rgb255(image)
    return check(_detect(rgb), scene, size=rgb.shape[0])


def verify_batch(images: Any, scenes: Sequence[Scene]) -> list[Verdict]:
    """One :class:`Verdict` per image of a batch.

    ``images`` is a torch tensor or numpy array, ``(B, 3, H, W)`` float in [0, 1] (clipped; model outputs)
    or ``(B, H, W, 3)`` uint8 (or float in [0, 1]).
    """
    found, size = _detect_batch(images, len(scenes))
    return [check(detections, scene, size=size) for detections, scene in zip(found, scenes, strict=True)]


def detect_batch(images: Any) -> list[list[Detection]]:
    """Every object in each image of a batch (as :func:`verify_batch` takes it), in batched passes."""
    return _detect_batch(images, None)[0]


def _detect_batch(images: Any, expected: int | None) -> tuple[list[list[Detection]], int]:
    """Each image's detections and the images' side; ``expected``: the batch size the caller needs."""
    found, size, _ = analyse_batch(images, expected)
    return found, size


def analyse_batch(images: Any, expected: int | None) -> tuple[list[list[Detection]], int, tuple[Any, Any]]:
    """Each image's detections, the images' side and their colour maps ``(B, H, W)`` (-1: no colour's member)
    with each colour's coverage ``(B, C, H, W)``; ``expected``: the batch size the caller needs."""
    if hasattr(images, "detach"):
        images = images.detach().float().cpu().numpy()
    arr = np.asarray(images)
    if arr.ndim != 4 or (expected is not None and len(arr) != expected):
        wanted = "" if expected is None else f" of {expected} images"
        raise ValueError(f"expected a (B, ...) batch{wanted}, got shape {arr.shape}")
    if not len(arr):
        return [], 0, (np.zeros((0, 0, 0), np.int8), np.zeros((0, len(COLOUR_NAMES), 0, 0), np.float32))
    rgbs = np.stack([_as_rgb255(image) for image in arr])
    cmaps, covers = _analyse(rgbs)  # batched passes over the whole batch
    labels = label_components(cmaps)
    found = [_objects(cmap, cover, lab) for cmap, cover, lab in zip(cmaps, covers, labels, strict=True)]
    return found, int(rgbs.shape[1]), (cmaps, covers)


def score_batch(images: Any, scenes: Sequence[Scene]) -> tuple[np.ndarray, np.ndarray]:
    """Scores and strict flags (both float32 ``(B,)``) for a batch (as :func:`verify_batch` takes it)."""
    verdicts = verify_batch(images, scenes)
    scores = np.asarray([v.score for v in verdicts], dtype=np.float32)
    strict = np.asarray([v.strict for v in verdicts], dtype=np.float32)
    return scores, strict
