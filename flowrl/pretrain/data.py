"""The pre-training data: rendered scenes, optionally miscaptioned, rendered over several processes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np

from flowrl.world.grammar import COLOUR_NAMES, TRAIN_PAIRS, Scene
from flowrl.world.render import Lattice, render_batch


def miscaptioned(scenes: Sequence[Scene], rate: float, seed: int) -> list[Scene]:
    """The scenes to draw for ``scenes``' captions: each, with probability ``rate``, has one group recoloured
    (to a colour whose pair with the shape is a train pair and differs from the other group's)."""
    rng = np.random.default_rng((seed, 0x6E6F))
    drawn = list(scenes)
    for k, scene in enumerate(scenes):
        if rate == 0 or rng.random() >= rate:
            continue
        i = int(rng.integers(len(scene.groups)))
        group = scene.groups[i]
        taken = {g.pair for j, g in enumerate(scene.groups) if j != i}
        colours = [
            c
            for c in COLOUR_NAMES
            if c != group.colour and (c, group.shape) in TRAIN_PAIRS and (c, group.shape) not in taken
        ]
        groups = list(scene.groups)
        groups[i] = attrs.evolve(group, colour=colours[int(rng.integers(len(colours)))])
        drawn[k] = attrs.evolve(scene, groups=tuple(groups))
    return drawn


def render_parallel(
    scenes: Sequence[Any],
    seed: int,
    size: int,
    workers: int,
    lattice: Lattice | None = None,
    flat: Sequence[float] = (),
) -> np.ndarray:
    """:func:`~flowrl.world.render.render_batch` split over ``workers`` processes: the same images (image ``i``
    depends only on ``seed, i, scenes[i]``), in a fraction of the time."""
    if workers <= 1 or len(scenes) < 2 * workers:
        return render_batch(scenes, seed, size, lattice=lattice, flat=flat)
    import concurrent.futures
    import multiprocessing

    bounds = np.linspace(0, len(scenes), workers + 1).astype(int)
    jobs = [
        (list(scenes[a:b]), seed, size, int(a), lattice, tuple(flat))
        for a, b in zip(bounds[:-1], bounds[1:], strict=True)
    ]
    methods = multiprocessing.get_all_start_methods()  # fork: workers need only numpy and PIL, no re-import
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        parts = list(pool.map(_render_part, jobs))
    return np.concatenate(parts)


def _render_part(job: tuple[list[Any], int, int, int, Lattice | None, tuple[float, ...]]) -> np.ndarray:
    scenes, seed, size, start, lattice, flat = job
    return render_batch(scenes, seed, size, start, lattice, flat)
