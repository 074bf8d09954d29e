"""trainer.overlap_chunks: chunks of an iteration's prompts rolled out one after another, each scored in a background
thread while the next is generated; the joined rollout is the unchunked one, the scores are not computed twice,
samplers that cannot be chunked run unchanged, and a served reward going down still leaves its checkpoint."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import attrs
import pytest
import torch
from conftest import tiny_recipe
from safetensors.torch import load_file
from served import Brightness, free_port, reward_in_thread

import flowrl
from flowrl.config.recipe import recipe_from_dict
from flowrl.core.interfaces import RewardError
from flowrl.core.rng import RolloutRNG
from flowrl.core.schedule import shifted_sigmas
from flowrl.core.types import Plan, Schedule, Unit
from flowrl.rewards.built import BuiltReward
from flowrl.trainer import Trainer, train
from flowrl.trainer.overlap import OverlappedSampler, chunkable, overlapped

PROMPTS = ["a red circle", "two blue squares", "a cat", "a dog", "a tree"]


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_the_joined_chunks_are_the_unchunked_rollout() -> None:
    backbone = flowrl.build("backbone", {"type": "tiny_flux", "resolution": 16, "num_layers": 1,
                                         "num_single_layers": 1})
    sampler = flowrl.build("sampler", {"type": "independent", "group_size": 3})
    schedule = Schedule(tuple(float(s) for s in shifted_sigmas(4, 3.0)), flowrl.build("kernel", {"type": "cps"}))
    plan = Plan(units=(Unit(0), Unit(2)), trained=(0, 1))
    with torch.no_grad():
        whole = sampler.rollout(backbone, PROMPTS, plan, schedule, RolloutRNG(0, 0, range(5)))
        chunked = OverlappedSampler(sampler, [], 3).rollout(backbone, PROMPTS, plan, schedule,
                                                            RolloutRNG(0, 0, range(5)))
    assert chunked.prompts == whole.prompts and chunked.nfe == whole.nfe
    for field in ("rollout_prompt", "group"):
        assert torch.equal(getattr(chunked, field), getattr(whole, field)), field
    a, b = chunked.transitions, whole.transitions
    # the same transitions, in chunk order rather than step order: compare them sorted by (unit, rollout)
    order = [torch.argsort(t.unit_index * 1000 + t.rollout_index) for t in (a, b)]
    for field in ("input_cond", "rollout_index", "unit_index", "s_next", "weight"):
        assert torch.equal(getattr(a, field)[order[0]], getattr(b, field)[order[1]]), field
    assert torch.equal(a.input_s[a.input_index][order[0]], b.input_s[b.input_index][order[1]])
    assert torch.equal(a.input_cond[a.input_index][order[0]], b.input_cond[b.input_index][order[1]])
    # the same noise per prompt; smaller transformer batches move float32 values by ~1e-7 (measured 6e-8 on
    # the images): 1e-5 leaves a wide margin and still fails if a chunk took another prompt's noise (~1e-1)
    pairs = ((chunked.images, whole.images), (chunked.final_latents, whole.final_latents),
             (a.x_next[order[0]], b.x_next[order[1]]), (a.log_prob[order[0]], b.log_prob[order[1]]),
             (a.inputs[a.input_index][order[0]], b.inputs[b.input_index][order[1]]))
    for x, y in pairs:
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)


def test_samplers_that_cannot_be_chunked_and_overlap_off_run_as_before() -> None:
    rewards = [BuiltReward("r", 1.0, flowrl.build("reward", {"type": "jpeg_compressibility"}))]
    before = list(rewards)
    independent = flowrl.build("sampler", {"type": "independent"})
    assert overlapped(independent, rewards, 1) is independent and overlapped(independent, rewards, 0) is independent
    branch = flowrl.build("sampler", {"type": "anchor_branch", "group_size": 4})
    assert not chunkable(branch) and overlapped(branch, rewards, 4) is branch
    assert rewards == before and all(a.model is b.model for a, b in zip(rewards, before, strict=True))  # untouched


class ThreadNoting(Brightness):
    """Brightness that notes the thread and batch size of every call."""

    def score(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        self.seen.append((threading.current_thread().name, images.shape[0]))
        return super().score(images, prompts)


def test_chunks_are_scored_in_the_background_once_and_train_as_without(tmp_path: Path) -> None:
    data = tiny_recipe(max_steps=2, eval_every=0, prompts_per_step=3, overlap_chunks=3, update="recompute")
    data["reward"] = [{"name": "brightness", "type": "served:Brightness"}]
    trainer = Trainer(recipe_from_dict(data), tmp_path / "over", quiet=True)
    noting = ThreadNoting(Brightness.Config())
    noting.seen = []  # type: ignore[attr-defined]
    trainer.rewards[0] = attrs.evolve(trainer.rewards[0], model=noting)
    trainer.sampler.rewards = trainer.rewards  # type: ignore[attr-defined]
    over = trainer.run()
    seen = noting.seen  # type: ignore[attr-defined]
    assert [n for n, _ in seen] == ["flowrl-score_0"] * 6 and [b for _, b in seen] == [4] * 6  # 3 chunks, 2 steps
    data.update(trainer={**data["trainer"], "overlap_chunks": 0})
    plain = train(recipe_from_dict(data), tmp_path / "plain", quiet=True)
    a, b = metrics(over), metrics(plain)
    # smaller transformer batches: rewards (means of pixels) within 1e-6 of the unchunked run's (measured 2e-8)
    assert [r["reward/total"] for r in a] == pytest.approx([r["reward/total"] for r in b], rel=1e-6)
    wa, wb = (load_file(str(run / "checkpoints" / "step_000002" / "weights.safetensors")) for run in (over, plain))
    assert all(torch.allclose(wa[k], wb[k], rtol=1e-5, atol=1e-6) for k in wa)  # measured 4.5e-8 apart


def test_a_served_reward_going_down_during_an_overlapped_step_still_leaves_its_checkpoint(tmp_path: Path) -> None:
    reward = Brightness(Brightness.Config(stop_after=4))  # two steps of two chunks, then down
    with reward_in_thread(reward, port=free_port()) as server:
        reward.on_stop = lambda: server.server.__setattr__("should_exit", True)
        data = tiny_recipe(max_steps=3, eval_every=0, overlap_chunks=2)
        data["reward"] = [{"name": "brightness", "type": "remote", "url": server.url, "retries": 0}]
        with pytest.raises(RewardError, match="holds step 2"):
            train(recipe_from_dict(data), tmp_path / "run", quiet=True)
    assert (tmp_path / "run" / "checkpoints" / "step_000002").is_dir()
    assert [r["step"] for r in metrics(tmp_path / "run")] == [1, 2]
