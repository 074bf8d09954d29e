"""Faults that used to lose data or crash the end of a run: a reward that changes its input, a non-finite
figure in the summary, the final checkpoint written twice, unwritable and full disks, a reward server lost in
the first iteration, a server that answers one byte at a time, a seed past torch's range."""

from __future__ import annotations

import errno
import http.server
import json
import threading
import time
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch
from conftest import tiny_recipe

from flowrl import RewardModel
from flowrl.config.recipe import RecipeError, recipe_from_dict
from flowrl.rewards.frames import eval_pictures, score_pictures
from flowrl.rewards.http import Endpoint, RewardServerUnavailable
from flowrl.trainer import Trainer
from flowrl.trainer.checkpoints import folder as checkpoint_module
from flowrl.trainer.checkpoints import saving
from flowrl.trainer.checkpoints.folder import find_checkpoint, list_checkpoints, save_checkpoint
from flowrl.trainer.runfolder import check_history
from flowrl.trainer.summary import run_summary
from flowrl.trainer.writes import WriteRefused


class Zeroes(RewardModel):
    """Scores the mean brightness, after setting its input to 0 in place (a user's bug)."""

    @attrs.frozen
    class Config:
        pass

    def score(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        images.mul_(0)
        prompts.clear()
        return images.mean(dim=(1, 2, 3))


class Brightness(RewardModel):
    """The mean brightness of each image."""

    @attrs.frozen
    class Config:
        pass

    def score(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        assert len(prompts) == len(images)
        return images.mean(dim=(1, 2, 3))


def test_a_reward_that_changes_its_input_changes_nothing_the_others_see() -> None:
    images = torch.rand(3, 3, 8, 8)
    prompts = ["a", "b", "c"]
    kept = images.clone()
    score_pictures(Zeroes(Zeroes.Config()), images, prompts)
    eval_pictures(Zeroes(Zeroes.Config()), images, prompts)
    clip = torch.rand(2, 5, 3, 8, 8)
    kept_clip = clip.clone()
    score_pictures(Zeroes(Zeroes.Config()), clip, prompts[:2])
    assert torch.equal(images, kept) and torch.equal(clip, kept_clip) and prompts == ["a", "b", "c"]
    torch.testing.assert_close(score_pictures(Brightness(Brightness.Config()), images, prompts), kept.mean((1, 2, 3)))


def _train(tmp_path: Path, name: str, rewards: list[dict[str, Any]], **trainer: Any) -> list[dict[str, Any]]:
    data = tiny_recipe(max_steps=1, eval_every=0, **trainer)
    data["reward"] = rewards
    Trainer(recipe_from_dict(data), tmp_path / name, quiet=True).run()
    return [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]


def test_the_trainer_scores_every_reward_on_the_rollout_images(tmp_path: Path) -> None:
    """Before, the second reward scored the first's zeroed images: all 0, zero advantages, no alert."""
    alone = _train(tmp_path, "alone", [{"type": "test_faults:Brightness"}])
    zeroes, brightness = {"type": "test_faults:Zeroes", "weight": 0.0}, {"type": "test_faults:Brightness"}
    after = _train(tmp_path, "after", [zeroes, brightness])
    key = next(k for k in alone[-1] if k.startswith("reward/") and "Brightness" in k)
    assert after[-1][key] == alone[-1][key] > 0.05, (after[-1], alone[-1])


def test_the_summary_reads_non_finite_figures(tmp_path: Path) -> None:
    """NaN figures are written as null; the summary said nothing and crashed on them (exit 1 on every resume)."""
    rows = [{"step": 0, "nfe": 0, "wall_s": 0.0, "eval/strict": None, "eval/strict_se": None},
            {"step": 1, "nfe": 8, "wall_s": 1.0, "loss": None, "reward/total": None, "skipped_steps": 1},
            {"step": 2, "nfe": 16, "wall_s": 2.0, "loss": 0.1, "reward/total": 0.5, "eval/strict": 0.25,
             "eval/strict_se": 0.01, "skipped_steps": 1}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = run_summary(tmp_path)
    assert "eval/strict: non-finite at step 0 -> 0.250 ± 0.010 at step 2 (± one standard error; held-out" in text
    assert "training reward: non-finite at step 1 -> 0.500 at step 2" in text


def _count_saves(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    written: list[str] = []

    def counting(folder: Path, *args: Any, **kwargs: Any) -> Path:
        written.append(Path(folder).name)
        return save_checkpoint(folder, *args, **kwargs)

    monkeypatch.setattr(saving, "save_checkpoint", counting)
    return written


def test_the_final_checkpoint_is_written_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The last step a multiple of checkpoint_every, then --resume of the finished run: one write of step 2.
    Before, each wrote it again, deleting the complete copy before the new one was in place."""
    written = _count_saves(monkeypatch)
    recipe = recipe_from_dict(tiny_recipe(max_steps=2, checkpoint_every=1, eval_every=0, keep_checkpoints=1))
    Trainer(recipe, tmp_path / "run", quiet=True).run()
    assert written == ["step_000001", "step_000002"]
    Trainer(recipe, tmp_path / "run", resume=tmp_path / "run", quiet=True).run()
    assert written == ["step_000001", "step_000002"]
    assert [p.name for p in list_checkpoints(tmp_path / "run" / "checkpoints")] == ["step_000002"]


def test_a_kill_while_a_checkpoint_is_replaced_keeps_a_complete_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``best`` is replaced at each better evaluation: a kill between the two renames leaves the older copy."""
    folder = tmp_path / "checkpoints" / "best"
    save_checkpoint(folder, {"w": torch.ones(2)}, {"step": 1}, {}, keep=None)
    renames = []
    real = Path.rename

    def killed_second(self: Path, target: Any) -> Any:
        renames.append(self.name)
        if len(renames) == 2:
            raise KeyboardInterrupt  # SIGINT between moving the old copy aside and moving the new one in
        return real(self, target)

    monkeypatch.setattr(Path, "rename", killed_second)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(folder, {"w": torch.zeros(2)}, {"step": 2}, {}, keep=None)
    monkeypatch.setattr(Path, "rename", real)
    assert find_checkpoint(tmp_path, "best") == folder
    assert json.loads((folder / "trainer_state.json").read_text()) == {"step": 1}
    assert not (tmp_path / "checkpoints" / "best.old").exists()


def test_a_full_disk_is_one_line_and_leaves_no_staging_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint_module, "save_file", full)
    folder = tmp_path / "checkpoints" / "step_000003"
    with pytest.raises(WriteRefused, match=r"cannot write .*step_000003: the disk is full; free space and continue"):
        save_checkpoint(folder, {"w": torch.ones(2)}, {"step": 3}, {}, keep=1)
    assert list((tmp_path / "checkpoints").iterdir()) == []


def test_an_unwritable_output_dir_is_refused_before_the_model_loads(tmp_path: Path) -> None:
    from test_bad_input import flowrl

    from flowrl.config.tomlwrite import dumps

    (tmp_path / "tiny.toml").write_text(dumps(tiny_recipe(max_steps=1)))
    out = flowrl(("train", "tiny.toml", "--output-dir", "/sys/flowrl-test/run"), tmp_path)  # EPERM even for root
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()  # refused by the option's write probe, while the command line is read
    assert len(lines) == 1 and lines[0].startswith("error: argument --output-dir: /sys/flowrl-test/run: cannot write"
                                                   " there ("), lines


def test_a_run_stopped_in_its_first_iteration_can_be_resumed(tmp_path: Path) -> None:
    """A reward server lost in iteration 1 leaves step_000000 and no metrics.jsonl: resuming loses nothing."""
    check_history(tmp_path, tmp_path / "checkpoints" / "step_000000", 0, 1)
    with pytest.raises(Exception, match="metrics.jsonl is missing"):
        check_history(tmp_path, tmp_path / "checkpoints" / "step_000002", 2, 1)


class Drip(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 (the standard library's name)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        for _ in range(40):  # 40 bytes, one every 0.1 s: every read returns well within the socket timeout
            try:
                self.wfile.write(b" ")
                self.wfile.flush()
            except OSError:
                return
            time.sleep(0.1)

    def log_message(self, *args: Any) -> None:
        pass


def test_timeout_s_bounds_an_attempt_against_a_server_that_drips() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Drip)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        endpoint = Endpoint(f"http://127.0.0.1:{server.server_address[1]}", 0.5, retries=0, backoff_s=0.0)
        start = time.monotonic()
        with pytest.raises(RewardServerUnavailable, match="no answer within timeout_s = 0.5"):
            endpoint.post("/score", {})
        assert time.monotonic() - start < 2.0  # the drip lasts 4 s; before, the attempt waited for all of it
    finally:
        server.shutdown()
        server.server_close()


def test_a_seed_past_torch_range_is_a_recipe_error() -> None:
    with pytest.raises(RecipeError, match=r"\[seed\] expected an integer in \[0, 2\*\*63\)"):
        recipe_from_dict({**tiny_recipe(), "seed": 99999999999999999999})
    with pytest.raises(RecipeError, match="eval_seed"):
        recipe_from_dict(tiny_recipe(eval_seed=2**64))


def test_a_reader_that_goes_away_is_no_error(tmp_path: Path) -> None:
    """`flowrl ls | head -1` printed a BrokenPipeError traceback."""
    import subprocess
    import sys

    command = f"{sys.executable} -m flowrl.cli.main ls | head -1"
    out = subprocess.run(command, shell=True, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert out.stdout.strip() == "selector:" and out.stderr == "", out.stderr
