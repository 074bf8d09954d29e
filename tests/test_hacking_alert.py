"""The diversity alert, end to end on the embedded world's base model: a reward that pays for one flat colour
is hacked within 40 iterations, the samples lose their diversity and the run says so; the same run with the
world's verifier raises nothing. Slow (about 3 minutes on one thread): `nox -s slow`."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest
import torch
from conftest import ROOT

from flowrl import RewardModel
from flowrl.config.recipe import load_recipe, recipe_from_dict
from flowrl.trainer import train

pytestmark = pytest.mark.slow


class FlatRed(RewardModel):
    """Pays for one flat colour: minus the mean squared distance of the pixels to pure red. Its optimum is the
    same red square for every prompt, so a policy that hacks it loses its diversity within each group."""

    @attrs.frozen
    class Config:
        pass

    def score(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        red = torch.tensor([1.0, 0.0, 0.0]).reshape(1, 3, 1, 1)
        return -(images - red).square().flatten(1).mean(dim=1)


def world_run(tmp_path: Path, reward: dict, lr: float, steps: int) -> list[dict]:
    """recipes/flow_grpo.toml, 2 prompts per iteration, the alert at its defaults (the mean diversity of the last
    5 iterations below 0.7 x the mean of the first 5).

    Measured (one thread): the hacked run's first 5 diversities average 0.187 (the first alone 0.145, a noisy
    figure of 2 groups that an alert against the first value took as its reference and so never fired); its
    5-iteration mean is below 0.7 x that from about iteration 18 on and 0.58 x at its lowest. The verifier's
    run, measured over 40 iterations, stays at 0.92 x or more."""
    settings = [f"trainer.max_steps={steps}", "trainer.prompts_per_step=2", "trainer.eval_every=0",
                "trainer.image_every=0", "trainer.checkpoint_every=0", "trainer.max_minutes=0", "trainer.kl_every=0",
                f"optim.lr={lr}"]
    data = load_recipe(ROOT / "recipes" / "flow_grpo.toml", settings).to_dict()
    data["reward"] = [reward]
    folder = train(recipe_from_dict(data), tmp_path / "run", quiet=True)
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def test_a_flat_colour_reward_is_hacked_and_flagged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = world_run(tmp_path, {"type": "test_hacking_alert:FlatRed"}, lr=1e-3, steps=40)
    rewards = [r["reward/total"] for r in rows]
    diversity = [r["health/diversity"] for r in rows]
    assert sum(rewards[-5:]) / 5 > 0.5 * rewards[0]  # measured: -0.25 -> -0.02, the images turned red
    assert min(diversity[-10:]) < 0.7 * sum(diversity[:5]) / 5, diversity  # measured: 0.187 -> 0.11-0.12
    flagged = [r["step"] for r in rows if r.get("alert/diversity")]
    assert flagged, diversity
    err = capsys.readouterr().err
    assert f"warning at step {flagged[0]}: within-group diversity" in err


def test_the_verifier_reward_raises_no_alert(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = world_run(tmp_path, {"type": "world_verifier"}, lr=1e-4, steps=20)
    assert not any(k.startswith("alert/") for r in rows for k in r)
    assert "warning" not in capsys.readouterr().err
