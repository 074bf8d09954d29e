"""A suite's pinned generation protocol, and the initial noise of every image it asks for.

The noise of an image depends on the protocol's seed and on the image alone, never on the batch, the shard or
the machine: ``noise = "prompt"`` draws it from a generator keyed by the prompt's text and the image's index
(so a prompt's images are the same in every suite and every subset); ``noise = "stream"`` draws the suite's
images in order from one generator seeded by ``seed``, chunk by chunk as ``flowrl eval`` and training's
evaluation do (the embedded world's suite, so that its figures are ``flowrl eval``'s own). A shard draws the
whole stream and keeps its rows, which costs nothing next to sampling.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import attrs
import torch
from attrs.validators import ge, gt, lt, optional
from torch import Tensor

from flowrl.core.choices import one_of
from flowrl.core.interfaces import Backbone
from flowrl.core.rng import generator
from flowrl.evaluation.evaluate import STREAM_CHUNK

NoiseRule = Literal["prompt", "stream"]


@attrs.frozen
class Protocol:
    """How a suite's images are made: ODE steps on the base's grid with ``shift`` (None: the recipe's), classifier-
    free ``guidance`` and ``resolution`` (None: the base's own setting), ``images`` per prompt, and the noise rule."""

    steps: int = attrs.field(validator=gt(0))
    images: int = attrs.field(default=1, validator=gt(0))
    seed: int = attrs.field(default=0, validator=[ge(0), lt(2**63)])
    shift: float | None = attrs.field(default=None, validator=optional(gt(0)))
    guidance: float | None = None
    resolution: int | None = attrs.field(default=None, validator=optional(gt(0)))
    noise: NoiseRule = attrs.field(default="prompt", validator=one_of(NoiseRule))

    def __attrs_post_init__(self) -> None:
        if self.noise == "stream" and self.images != 1:
            raise ValueError("noise = \"stream\" draws one image per prompt (images = 1)")

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)

    def evolve(self, changes: dict[str, Any]) -> Protocol:
        """This protocol with ``changes`` (``--protocol key=value``), checked as a new one."""
        unknown = sorted(set(changes) - set(attrs.fields_dict(Protocol)))
        if unknown:
            raise KeyError(f"unknown protocol key '{unknown[0]}' (keys: {', '.join(attrs.fields_dict(Protocol))})")
        return attrs.evolve(self, **changes)


def initial_noise(backbone: Backbone, protocol: Protocol, prompts: Sequence[str], indices: Sequence[int],
                  order: Sequence[int]) -> Tensor:
    """The initial noise of the images ``(prompts[i], image indices[i])``; ``order[i]`` is the image's position in
    the whole suite (the stream rule's row)."""
    if protocol.noise == "prompt":
        rows = [backbone.noise(1, generator(protocol.seed, "suite noise", text, int(k)))
                for text, k in zip(prompts, indices, strict=True)]
        return torch.cat(rows) if rows else torch.empty(0, *backbone.latent_shape)
    total = max(order, default=-1) + 1
    stream = torch.Generator().manual_seed(protocol.seed)
    drawn = [backbone.noise(min(STREAM_CHUNK, total - start), stream) for start in range(0, total, STREAM_CHUNK)]
    whole = torch.cat(drawn) if drawn else torch.empty(0, *backbone.latent_shape)
    return whole[list(order)]
