"""What a suite result may claim: a torn file appended to loses nothing; comparable only when the prompts generated are
the published set and the scorers the suite's own; paired only on shared prompts with the same noise; GenEval's
headline is its overall; intervals stay inside [0, 1]; damaged or non-finite results are one line and the folder
stays usable; a second run adds to the comparison. Each test fails on flowrl before these checks."""

from __future__ import annotations

import errno
import json
import math
from pathlib import Path

import attrs
import pytest
import torch
from conftest import ROOT

from flowrl import RewardModel
from flowrl.cli.main import main
from flowrl.suites.compare import compare, markdown
from flowrl.suites.geneval import world_metadata
from flowrl.suites.stats import estimate, interval, paired, wilson

EGRPO = str(ROOT / "recipes" / "egrpo.toml")
FAST = ("--quiet", "--protocol", "steps=4", "--batch", "8")


def _run(*args: str) -> int:
    return main(["suite", *args])


def _summary(folder: Path) -> dict:
    return json.loads((folder / "summary.json").read_text())


def test_a_torn_manifest_and_scores_file_lose_no_row(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ("run", "world", EGRPO, "--out", str(out), "--prompts", "6", *FAST, "--tag", "t")
    assert _run(*args, "--stage", "generate") == 0
    folder = out / "t" / "world"
    manifest = next(folder.glob("manifest-*.jsonl"))
    manifest.write_text(manifest.read_text()[:-9])  # a kill in the last row's write
    assert _run(*args) == 0  # makes the torn row's image again, then scores
    rows = [json.loads(line) for line in manifest.read_text().splitlines()]
    assert sorted(r["key"] for r in rows) == [f"{p:05d}_00" for p in range(6)]
    scores = folder / "scores.jsonl"
    scores.write_text(scores.read_text()[:-5])
    (folder / "summary.json").unlink()
    assert _run(*args, "--stage", "score") == 0
    assert _run(*args, "--stage", "score") == 0  # the file is whole: a later run reads it
    assert sorted(json.loads(line)["key"] for line in scores.read_text().splitlines()) == sorted(r["key"] for r in rows)


def test_other_prompts_or_other_noise_are_never_paired(tmp_path: Path) -> None:
    out = tmp_path / "out"
    common = ("--out", str(out), "--prompts", "8", *FAST)
    assert _run("run", "world", EGRPO, *common, "--tag", "test") == 0
    assert _run("run", "world", EGRPO, *common, "--tag", "novel", "--set", "split='novel'") == 0
    assert _run("run", "world", EGRPO, *common, "--tag", "seed1", "--protocol", "seed=1") == 0
    result = compare([out / t / "world" for t in ("test", "novel", "seed1")])
    (table,) = result["tables"]
    first = table["rows"][0]["columns"]
    assert "vs_first" not in first[1] and "no prompt in common" in first[1]["unpaired"]
    assert "vs_first" not in first[2] and "other initial noise" in first[2]["unpaired"] and "seed 1 vs 0" in \
        first[2]["unpaired"]
    text = markdown(result)
    assert "NOT comparable" in text and "p = " not in text


def test_a_subset_or_a_prompt_file_of_ones_own_is_not_comparable(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert _run("run", "world", EGRPO, "--out", str(out), "--set", "count=8", *FAST, "--tag", "count") == 0
    summary = _summary(out / "count" / "world")
    assert not summary["comparable"]
    assert any("a subset: 8 of the 256 published prompts" in r for r in summary["differs"])
    prompts = tmp_path / "mine.txt"
    prompts.write_text("\ufeffa red circle\ntwo blue squares\n")  # with a byte-order mark, as some editors save
    assert _run("run", "drawbench", EGRPO, "--out", str(out), *FAST, "--set", f"prompts={str(prompts)!r}",
                "--set", 'scorers=[{type="jpeg_compressibility"}]', "--protocol", "resolution=32",
                "--protocol", "guidance=3.5") == 0
    summary = _summary(out / "egrpo-initial" / "drawbench")
    run = json.loads((out / "egrpo-initial" / "drawbench" / "run.json").read_text())
    assert run["source"] == f"the prompt file {prompts}"  # never the published sheet it did not read
    assert not summary["comparable"]
    assert any("published prompt set was not read" in r for r in summary["differs"])
    assert any("not the suite's own scorers" in r for r in summary["differs"])
    assert (out / "egrpo-initial" / "drawbench" / "samples.txt").read_text().splitlines()[0] == "a red circle"


def test_the_full_published_set_is_comparable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check can say yes: a fetched set (here a tiny one in place of the download) generated whole with the
    pinned protocol and the suite's own detector is comparable."""
    texts = ["a red circle", "two blue squares", "a red circle and a blue square"]
    data = tmp_path / "data" / "geneval"
    data.mkdir(parents=True)
    (data / "prompts.jsonl").write_text("".join(json.dumps({"prompt": t, **world_metadata(t)}) + "\n" for t in texts))
    monkeypatch.setenv("FLOWRL_DATA", str(tmp_path / "data"))
    from flowrl.suites import geneval

    monkeypatch.setattr(geneval, "served_detector", lambda url: geneval.world_detector)
    out = tmp_path / "out"
    monkeypatch.setattr(geneval.GenEvalSuite, "protocol",
                        lambda self: geneval.Protocol(steps=4, images=2, seed=0, guidance=3.5, resolution=32))
    assert _run("run", "geneval", EGRPO, "--out", str(out), "--quiet", "--set", "detector='http://127.0.0.1:9'") == 0
    summary = _summary(out / "egrpo-initial" / "geneval")
    assert summary["comparable"] and summary["differs"] == [], summary["differs"]


def test_geneval_s_table_leads_with_its_overall_over_unbalanced_tags(tmp_path: Path) -> None:
    """16 colour prompts and 4 position prompts: the headline is the mean over the two tags, not over prompts."""
    colours = ["red", "green", "blue", "yellow"]
    texts = [f"a {c} {s}" for c in colours for s in ("circle", "square", "triangle", "circle")]
    texts += [f"a {a} triangle {r} a {b} square" for a, b in (("red", "blue"), ("green", "yellow"))
              for r in ("left of", "above")]
    prompts = tmp_path / "g.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": t, **world_metadata(t)}) + "\n" for t in texts))
    out = tmp_path / "out"
    assert _run("run", "geneval", EGRPO, "--out", str(out), *FAST, "--set", f"prompts={str(prompts)!r}",
                "--set", "detector='world'", "--protocol", "resolution=32", "--protocol", "guidance=3.5") == 0
    summary = _summary(out / "egrpo-initial" / "geneval")
    result = compare([out / "egrpo-initial" / "geneval"])
    head = result["tables"][0]["rows"][0]
    assert head["figure"] == "overall" and head["headline"]
    assert head["columns"][0]["mean"] == pytest.approx(summary["figures"]["overall"], rel=1e-12)
    by_prompt = [f["correct"] for f in summary["per_prompt"]]
    assert summary["figures"]["overall"] == pytest.approx((summary["figures"]["colors"] +
                                                           summary["figures"]["position"]) / 2)
    if summary["figures"]["colors"] != summary["figures"]["position"]:
        assert head["columns"][0]["mean"] != pytest.approx(sum(by_prompt) / len(by_prompt))
    assert 0.0 <= head["columns"][0]["low"] <= head["columns"][0]["high"] <= 1.0
    assert (out / "comparison-geneval" / "comparison.pdf").stat().st_size > 1000


def test_intervals_of_proportions_stay_in_0_1_and_are_never_empty() -> None:
    every = interval([1.0] * 40, None, proportion=True, images=40)
    assert every["high"] == 1.0 and 0.9 < every["low"] < 1.0  # Wilson: 1 - low ~ 1.96^2 / n
    none = interval([0.0] * 40, None, proportion=True, images=40)
    assert none["low"] == 0.0 and 0.0 < none["high"] < 0.1
    low, high = wilson(0.5, 100)  # the textbook value: 0.5 +- 0.0966 (z = 1.96, n = 100)
    assert low == pytest.approx(0.4038, abs=1e-4) and high == pytest.approx(0.5962, abs=1e-4)
    mean, se, df = estimate([1, 0, 1, 1, 0, 0], ["a", "a", "b", "b", "c", "c"])
    assert mean == pytest.approx(0.5)  # (0.5 + 1 + 0) / 3
    assert se == pytest.approx(math.sqrt(0.5 / (9 * 2)))  # only stratum a varies: s^2 = 0.5, n = 2, K = 3
    test = paired([0, 0, 0, 0], [1, 1, 1, 0])
    assert test["low"] < test["diff"] < test["high"] and test["n"] == 4


def test_a_non_finite_score_is_one_line_and_the_folder_stays_usable(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture) -> None:
    prompts = tmp_path / "p.txt"
    prompts.write_text("a red circle\ntwo blue squares\n")
    out = tmp_path / "out"
    common = ("--out", str(out), *FAST, "--set", f"prompts={str(prompts)!r}", "--protocol", "resolution=32",
              "--protocol", "guidance=3.5")
    assert _run("run", "drawbench", EGRPO, *common, "--set", 'scorers=[{type="test_suite_claims:NaNReward"}]') == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "a score must be a finite number" in err[-1] and "'a red circle'" in err[-1] and "Traceback" not in err[-1]
    folder = out / "egrpo-initial" / "drawbench"
    assert not (folder / "scores.jsonl").exists() or not (folder / "scores.jsonl").read_text()
    assert _run("run", "drawbench", EGRPO, *common, "--set", 'scorers=[{type="jpeg_compressibility"}]') == 0
    assert math.isfinite(_summary(folder)["figures"]["jpeg_compressibility"])


def test_a_hand_edited_summary_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    assert _run("run", "world", EGRPO, "--out", str(out), "--prompts", "4", *FAST, "--tag", "t") == 0
    path = out / "t" / "world" / "summary.json"
    good = json.loads(path.read_text())
    for edit in (lambda s: s.pop("per_prompt"), lambda s: s["prompts"].pop(), lambda s: s.update(figures=[])):
        summary = json.loads(json.dumps(good))
        edit(summary)
        path.write_text(json.dumps(summary))
        capsys.readouterr()
        assert _run("compare", str(out / "t" / "world")) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and str(path) in err[0], err


def test_an_empty_prompt_file_is_refused_before_the_model_loads(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    assert _run("run", "drawbench", EGRPO, "--out", str(tmp_path / "o"), "--set", f"prompts={str(empty)!r}") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {empty}: no prompts in the file"]  # nothing else: no model was described as loaded


def test_a_full_disk_during_a_suite_run_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture) -> None:
    from flowrl.suites import stages

    def full(image: object, path: Path, lossless: bool) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(stages, "save_image", full)
    assert _run("run", "world", EGRPO, "--out", str(tmp_path / "o"), "--prompts", "2", *FAST) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: cannot write ") and "00000_00.npy: the disk is full" in err[-1]


def test_a_second_run_adds_to_the_comparison(tmp_path: Path) -> None:
    out = tmp_path / "out"
    common = ("--out", str(out), "--prompts", "4", *FAST)
    assert _run("run", "world", EGRPO, *common, "--tag", "base") == 0
    assert _run("run", "world", EGRPO, *common, "--tag", "again") == 0
    result = json.loads((out / "comparison-world" / "comparison.json").read_text())
    assert result["tables"][0]["tags"] == ["base", "again"]  # the earlier column kept, and still the baseline


class NaNReward(RewardModel):
    """A scorer that gives the first image of each batch NaN."""

    @attrs.frozen
    class Config:
        pass

    def score(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        out = torch.ones(len(images))
        out[0] = float("nan")
        return out


@pytest.mark.parametrize(("env", "named"), [({"WORLD_SIZE": "abc", "RANK": "0"}, "WORLD_SIZE='abc'"),
                                            ({"WORLD_SIZE": "0", "RANK": "0"}, "WORLD_SIZE='0'"),
                                            ({"WORLD_SIZE": "2", "RANK": "5"}, "RANK='5'")])
def test_shards_from_a_bad_environment_are_one_line(env: dict, named: str, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert _run("run", "world", EGRPO, "--out", str(tmp_path / "o"), "--prompts", "2", *FAST) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and named in err[0], err


def test_the_world_edit_suite_reproduces_flowrl_eval_on_the_edit_world(tmp_path: Path) -> None:
    """Conditions through a suite: each item carries its source image into generation and scoring, and the figures
    are flowrl eval's on the same held-out edits, exactly; the prompt hashes see the source images."""
    from flowrl.export.loading import load_policy
    from flowrl.suites.comparability import item_hash
    from flowrl.suites.interface import Item

    recipe = str(ROOT / "recipes" / "edit" / "egrpo.toml")
    out = tmp_path / "out"
    assert _run("run", "world_edit", recipe, "--out", str(out), "--prompts", "10", "--quiet", "--batch", "4") == 0
    summary = _summary(out / "egrpo-initial" / "world_edit")
    expected = load_policy(Path(recipe)).evaluate(limit=10)
    for key in ("strict", "score", "follow", "preserve"):
        assert summary["figures"][key] == pytest.approx(expected[key], rel=1e-12, abs=1e-12), key
    assert summary["per_prompt"][0]["strict"] in (0.0, 1.0) and not summary["comparable"]  # a subset of 10
    from flowrl.suites.world_edit import WorldEditSuite

    first, second = WorldEditSuite(WorldEditSuite.Config(count=10)).items()[:2]
    swapped = Item(type(first.prompt)(str(first.prompt), second.prompt.conditions), first.category)
    assert item_hash(swapped) != item_hash(first)  # the same instruction on another source is another prompt
