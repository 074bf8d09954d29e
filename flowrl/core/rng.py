"""Randomness keyed by (seed, iteration, global prompt slot).

Every prompt slot of an iteration owns a generator derived from the run's seed, the iteration and the
slot's index in the *global* batch, so a run gives the same prompts, initial noise and SDE noise whatever
the number of processes, and a resumed run needs no generator state to continue exactly.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch
from torch import Tensor

SEED_LIMIT = 2**63  # torch.Generator.manual_seed takes seeds in [0, 2**63): every seed a recipe or a command takes


def derive_seed(*parts: int | str) -> int:
    """A 63-bit seed from any tuple of ints and strings (stable across runs and platforms)."""
    digest = hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def generator(*parts: int | str) -> torch.Generator:
    """A CPU generator seeded by :func:`derive_seed`."""
    return torch.Generator().manual_seed(derive_seed(*parts))


class RolloutRNG:
    """One generator per local prompt, keyed by its global slot; draws are grouped by prompt.

    ``randn(rows_prompt, shape)`` draws, for each prompt in index order, one ``shape`` sample per row of that
    prompt from the prompt's own generator, so the values do not depend on how prompts are split across
    processes or batched together.
    """

    def __init__(self, seed: int, iteration: int, slots: Sequence[int]) -> None:
        self.generators = [generator(seed, iteration, "slot", int(slot)) for slot in slots]

    def randn(self, rows_prompt: Tensor, shape: Sequence[int], device: torch.device | str = "cpu") -> Tensor:
        rows_prompt = rows_prompt.cpu()
        out = torch.empty((len(rows_prompt), *shape))
        for p in torch.unique(rows_prompt).tolist():
            index = (rows_prompt == p).nonzero().flatten()
            out[index] = torch.randn((len(index), *shape), generator=self.generators[p])
        return out.to(device)
