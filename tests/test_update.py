"""The update's contracts for trust-region and forward-process losses: the rollout-time means kept across inner
epochs (``needs_old_mean``), and micro-batches that never split a prompt's rollouts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import ROOT

from flowrl.config.recipe import load_recipe
from flowrl.trainer import Trainer
from flowrl.trainer.micro_batches import prompt_chunks

SMALL = ["trainer.prompts_per_step=2", "trainer.eval_every=0", "trainer.eval_every_nfe=0", "trainer.max_minutes=0",
         "trainer.checkpoint_every=0", "trainer.image_every=0", "trainer.train_batch_size=4"]


@pytest.mark.parametrize(
    ("prompt", "batch", "chunks"),
    [
        ([0] * 8 + [1] * 8, 8, [(0, 8), (8, 16)]),
        ([0] * 8 + [1] * 8, 16, [(0, 16)]),
        ([0] * 3 + [1] * 5 + [2] * 2, 4, [(0, 3), (3, 8), (8, 10)]),  # a run longer than the batch stays whole
        ([0, 0, 1, 1, 2, 2], 5, [(0, 4), (4, 6)]),
    ],
)
def test_prompt_chunks(prompt: list[int], batch: int, chunks: list[tuple[int, int]]) -> None:
    got = [(int(c[0]), int(c[-1]) + 1) for c in prompt_chunks(torch.tensor(prompt), batch)]
    assert got == chunks
    assert torch.equal(torch.cat(list(prompt_chunks(torch.tensor(prompt), batch))), torch.arange(len(prompt)))


def test_old_means_are_the_first_epochs(tmp_path: Path) -> None:
    """With two inner epochs the loss sees, in the second, the first epoch's means as old means (computed before
    any optimizer step: the rollout-time policy's), while its own means have moved."""
    recipe = load_recipe(ROOT / "recipes" / "grpo_guard.toml", [*SMALL, "trainer.max_steps=1"])
    trainer = Trainer(recipe, tmp_path / "run", quiet=True)
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    class Recording(type(trainer.loss_fn)):  # type: ignore[misc]
        def __call__(self, batch):  # type: ignore[no-untyped-def]
            seen.append((batch.mean.detach().clone(), batch.old_mean.clone()))
            return super().__call__(batch)

    trainer.updater.loss_fn = Recording(trainer.loss_fn.config)
    try:
        trainer.iteration()
    finally:
        trainer.release()
    half = len(seen) // 2
    assert half > 0 and len(seen) == 2 * half
    for (mean1, old1), (mean2, old2) in zip(seen[:half], seen[half:], strict=True):
        assert torch.equal(old1, mean1)  # the first epoch: its own means
        assert torch.equal(old2, mean1)  # the second: the first's, kept
        assert not torch.equal(mean2, mean1)  # while the policy moved
