"""Evaluation suites: GenEval's rules against the embedded world's ground truth, the noise rule, the resumable
stages, the paired comparison against SciPy's formulas, and the command line end to end on tiny parts."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT

import flowrl
from flowrl.cli.main import main
from flowrl.suites.data import fetch
from flowrl.suites.geneval import world_detector, world_metadata
from flowrl.suites.geneval_rules import Detected, geneval_score, judge, relative_position
from flowrl.suites.interface import Item
from flowrl.suites.protocol import Protocol, initial_noise
from flowrl.suites.stats import interval, paired, t_quantile
from flowrl.world.grammar import enumerate_scenes, parse
from flowrl.world.render import render

EGRPO = str(ROOT / "recipes" / "egrpo.toml")


def _image(text: str, seed: int = 0) -> torch.Tensor:
    rgb = render(parse(text), np.random.default_rng(seed))
    return torch.from_numpy(np.asarray(rgb, dtype=np.float32) / 255.0).permute(2, 0, 1)


def _correct(image: torch.Tensor, meta: dict) -> bool:
    found = world_detector(image[None], [Item("", meta["tag"], meta)])[0]
    return judge(found, meta)[0]


# One prompt per rule; the mismatch changes exactly what that rule checks.
RULES = [
    ("a red circle", "a blue circle"),  # colour of a single object
    ("two green squares", "three green squares"),  # counting: too few
    ("three green squares", "two green squares"),  # counting: too many (the exclude clause)
    ("a red circle and a blue square", "a red circle and a blue triangle"),  # two objects: one missing
    ("a red circle and a blue square", "a red circle and a yellow square"),  # colour attribution
    ("a cyan triangle left of a magenta square", "a cyan triangle right of a magenta square"),  # position
    ("a yellow square above a red circle", "a yellow square below a red circle"),
]


@pytest.mark.parametrize(("drawn", "asked"), RULES)
def test_geneval_rules_score_matching_prompts_1_and_mismatched_ones_0(drawn: str, asked: str) -> None:
    hits = [_correct(_image(drawn, seed), world_metadata(drawn)) for seed in range(4)]
    misses = [_correct(_image(drawn, seed), world_metadata(asked)) for seed in range(4)]
    assert all(hits), hits
    assert not any(misses), misses


def test_geneval_rules_on_every_world_test_scene_kind() -> None:
    """Rendered ground truth of 40 test scenes of each kind meets its own GenEval metadata. Two-object scenes
    name two shapes, as GenEval's prompts name two classes: its rules check only the most confident object of
    a class, so two circles of two colours are beyond what they can state."""
    scenes = [s for s in enumerate_scenes("test") if len({g.shape for g in s.groups}) == len(s.groups)]
    for kind in ("single", "count", "pair", "relation"):
        chosen = [s for s in scenes if s.kind == kind][:40]
        correct = [_correct(_image(s.text, i), world_metadata(s.text)) for i, s in enumerate(chosen)]
        assert np.mean(correct) >= 0.95, (kind, np.mean(correct))


def test_relative_position_and_thresholds() -> None:
    a, b = Detected("x", (0, 0, 10, 10)), Detected("y", (30, 0, 40, 10))
    assert relative_position(a, b) == {"left of"} and relative_position(b, a) == {"right of"}
    assert relative_position(a, Detected("y", (1, 1, 11, 11))) == set()  # overlapping: no relation
    assert relative_position(a, Detected("y", (30, 30, 40, 40))) == {"left of", "above"}  # a diagonal: both
    meta = {"tag": "counting", "include": [{"class": "x", "count": 2}], "exclude": [{"class": "x", "count": 3}]}
    two = [Detected("x", (0, 0, 5, 5), 0.95), Detected("x", (20, 0, 25, 5), 0.95)]
    assert judge(two, meta)[0]
    assert not judge([*two, Detected("x", (40, 0, 45, 5), 0.95)], meta)[0]
    assert judge([*two, Detected("x", (40, 0, 45, 5), 0.9)], meta)[0]  # counting keeps only scores above 0.9
    assert not judge([Detected("x", (0, 0, 5, 5), 0.3)], {"tag": "single_object", "include": [{"class": "x",
                                                                                               "count": 1}]})[0]
    assert geneval_score({"a": [1, 0], "b": [1, 1, 1, 1]}) == {"a": 0.5, "b": 1.0, "overall": 0.75}
    twins = [Detected("x", (0, 0, 5, 5), 0.95), Detected("x", (0, 0, 5, 5), 0.95)]  # suppression is off: both count
    assert judge(twins, meta)[0]


def test_noise_depends_on_the_prompt_and_index_only() -> None:
    backbone = flowrl.build("backbone", {"type": "tiny_flux", "resolution": 16})
    protocol = Protocol(steps=4, images=2, seed=7)
    whole = initial_noise(backbone, protocol, ["a", "a", "b", "b"], [0, 1, 0, 1], [0, 1, 2, 3])
    alone = initial_noise(backbone, protocol, ["b"], [1], [3])
    assert torch.equal(whole[3:], alone) and not torch.equal(whole[0], whole[1])
    stream = Protocol(steps=4, seed=3, noise="stream")
    rows = initial_noise(backbone, stream, ["x"] * 3, [0, 0, 0], [5, 70, 2])
    full = initial_noise(backbone, stream, ["x"] * 71, [0] * 71, list(range(71)))
    assert torch.equal(rows, full[[5, 70, 2]])
    with pytest.raises(ValueError, match="images = 1"):
        Protocol(steps=4, images=2, noise="stream")


def test_paired_test_and_intervals_agree_with_scipy_formulas() -> None:
    """SciPy's ttest_rel(b, a) and t.ppf(0.975, n - 1), as published values for these inputs."""
    scipy = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    a = rng.normal(0.5, 0.2, 30).tolist()
    b = (np.asarray(a) + rng.normal(0.05, 0.1, 30)).tolist()
    ours = paired(a, b)
    ref = scipy.ttest_rel(b, a)
    assert math.isclose(ours["t"], ref.statistic, rel_tol=1e-9)
    assert math.isclose(ours["p"], ref.pvalue, rel_tol=1e-7)
    assert math.isclose(t_quantile(0.05, 29), scipy.t.ppf(0.975, 29), rel_tol=1e-9)
    cell = interval(a, None, proportion=False, images=30)  # a figure that is not a proportion: the t interval
    half = cell["high"] - cell["mean"]
    assert math.isclose(half, scipy.t.ppf(0.975, 29) * statistics.stdev(a) / math.sqrt(30), rel_tol=1e-9)
    assert cell["mean"] == statistics.fmean(a) and math.isclose(cell["mean"] - cell["low"], half, rel_tol=1e-9)


def test_paired_test_by_hand() -> None:
    """Without SciPy: the t statistic of known differences, and the p of t = 2.262 at 9 df (a table's 0.05)."""
    out = paired([0.0] * 4, [1.0, 2.0, 3.0, 4.0])
    assert math.isclose(out["t"], 2.5 / (statistics.stdev([1, 2, 3, 4]) / 2), rel_tol=1e-12)
    assert math.isclose(t_quantile(0.05, 9), 2.2621571627, rel_tol=1e-8)
    assert paired([1.0, 1.0], [1.0, 1.0])["p"] == 1.0


def _run(*args: str) -> int:
    return main(["suite", *args])


def test_world_suite_reproduces_flowrl_eval_and_compares(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The world suite's figures are flowrl eval's on the same prompts; a second column with other weights gets
    a paired test; a second run does no work; a subset is marked not comparable."""
    from flowrl.export.loading import load_policy

    out = tmp_path / "out"
    assert _run("run", "world", EGRPO, "--out", str(out), "--prompts", "24", "--quiet", "--batch", "10") == 0
    summary = json.loads((out / "egrpo-initial" / "world" / "summary.json").read_text())
    policy = load_policy(Path(EGRPO))
    expected = policy.evaluate(limit=24)
    for key in ("strict", "score", "strict/single", "strict/count", "strict/pair", "strict/relation"):
        assert summary["figures"][key] == pytest.approx(expected[key], rel=1e-12, abs=1e-12), key
    assert summary["complete"] and summary["pinned"] is True and summary["limit"] == 24  # a subset: not comparable
    scores = (out / "egrpo-initial" / "world" / "scores.jsonl").read_text()
    assert _run("run", "world", EGRPO, "--out", str(out), "--prompts", "24", "--quiet") == 0
    assert (out / "egrpo-initial" / "world" / "scores.jsonl").read_text() == scores  # nothing redone
    text = capsys.readouterr().out
    assert "NOT comparable" in text and "| **strict** |" in text and "a subset: 24 of the 256 published" in text


def test_stages_resume_and_refuse_damage(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    args = ("run", "world", EGRPO, "--out", str(out), "--prompts", "6", "--quiet", "--tag", "base")
    assert _run(*args, "--shard", "0/2") == 0 and _run(*args, "--shard", "1/2") == 0
    folder = out / "base" / "world"
    assert len(list((folder / "images").iterdir())) == 6 and not (folder / "scores.jsonl").exists()
    (folder / "images" / "00003_00.npy").unlink()
    assert _run(*args, "--stage", "score") == 2
    assert "00003_00.npy: the image is missing" in capsys.readouterr().err
    assert _run(*args, "--stage", "generate") == 0  # makes only what is missing
    assert _run(*args, "--stage", "score") == 0
    rows = [json.loads(line) for line in (folder / "scores.jsonl").read_text().splitlines()]
    assert sorted(r["key"] for r in rows) == [f"{p:05d}_00" for p in range(6)]
    assert _run(*args, "--protocol", "steps=8") == 2  # another protocol into the same folder: refused
    assert "made with another protocol" in capsys.readouterr().err


def test_a_column_with_other_weights_gets_a_paired_test(tmp_path: Path) -> None:
    from flowrl.suites.compare import compare

    out = tmp_path / "out"
    assert _run("run", "world", EGRPO, EGRPO, "--out", str(out), "--prompts", "8", "--quiet",
                "--tag", "a", "--tag", "b", "--protocol", "steps=6") == 0
    result = compare([out / "a" / "world", out / "b" / "world"])
    row = result["tables"][0]["rows"][0]
    assert row["columns"][1]["vs_first"]["diff"] == 0.0 and row["columns"][1]["vs_first"]["p"] == 1.0
    assert (out / "comparison-world" / "comparison.png").stat().st_size > 1000


def test_geneval_suite_end_to_end_on_the_world_detector(tmp_path: Path) -> None:
    prompts = tmp_path / "geneval.jsonl"
    texts = ["a red circle", "two blue squares", "a red circle and a blue square", "a cyan triangle above a red circle"]
    prompts.write_text("".join(json.dumps({"prompt": t, **world_metadata(t)}) + "\n" for t in texts))
    out = tmp_path / "out"
    assert _run("run", "geneval", EGRPO, "--out", str(out), "--quiet", "--set", f"prompts={str(prompts)!r}",
                "--set", "detector='world'", "--protocol", "resolution=32", "--protocol", "guidance=3.5",
                "--protocol", "steps=8") == 0
    summary = json.loads((out / "egrpo-initial" / "geneval" / "summary.json").read_text())
    assert summary["images"] == 16 and set(summary["figures"]) == {"overall", "colors", "counting", "color_attr",
                                                                    "position"}
    values = [summary["figures"][t] for t in ("colors", "counting", "color_attr", "position")]
    assert summary["figures"]["overall"] == pytest.approx(np.mean(values))


def test_missing_prompt_set_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setenv("FLOWRL_DATA", str(tmp_path / "data"))
    assert _run("run", "drawbench", EGRPO, "--out", str(tmp_path / "o")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "flowrl data fetch drawbench" in err[0]
    assert _run("run", "ocr", EGRPO, "--out", str(tmp_path / "o")) == 2  # no public source: never "fetch it"
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: the ocr suite has no prompt set to fetch: give a prompt file with --set prompts=FILE (one"
                   " prompt a line)"]


def test_fetch_checks_the_pinned_checksum(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flowrl.suites.data import FetchError

    monkeypatch.setenv("FLOWRL_DATA", str(tmp_path))
    with pytest.raises(FetchError, match="is not the pinned"):
        fetch("geneval", download=lambda url: b'{"tag": "x"}\n')
    assert not (tmp_path / "geneval").exists()
    fetch("drawbench", download=lambda url: b"Prompts,Category\nA red apple.,Colors\n")
    rows = (tmp_path / "drawbench" / "prompts.jsonl").read_text().splitlines()
    assert json.loads(rows[0]) == {"prompt": "A red apple.", "category": "Colors"}


# -- GenEval 2: Soft-TIFA -----------------------------------------------------------------------------------
GENEVAL2 = [
    {"prompt": "a red circle", "atom_count": 3, "vqa_list": [["Is there a circle?", "Yes"], ["Is the circle red?",
     "Yes"], ["How many circles are in the image?", "one"]], "skills": ["object", "attribute", "count"]},
    {"prompt": "two blue squares", "atom_count": 3, "vqa_list": [["Is there a square?", "Yes"],
     ["How many squares are in the image?", "two"]], "skills": ["object", "count"]},
]


def fixed_judge(image: torch.Tensor, question: str, forms: list[str]) -> float:
    """A judge whose probability is known: 0.8 for yes/no questions, 0.25 for counts."""
    return 0.25 if question.startswith("How many") else 0.8


def test_soft_tifa_spellings_and_aggregation(tmp_path: Path) -> None:
    from flowrl.suites.geneval2 import spellings

    assert spellings("Is it red?", "Yes") == ["Yes", "yes", " yes", " Yes"]
    assert spellings("How many cats are in the image?", "two") == ["two", "Two", " two", " Two", "2", " 2"]
    assert spellings("How many cats are in the image?", "eleven")[-2:] == ["other", " other"]
    prompts = tmp_path / "g2.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in GENEVAL2))
    suite = flowrl.build("suite", {"type": "geneval2", "prompts": str(prompts), "judge": "test_suites:fixed_judge"})
    items = suite.items()
    rows = suite.score(torch.rand(2, 3, 8, 8), items)
    am0, gm0 = (0.8 + 0.8 + 0.25) / 3, (0.8 * 0.8 * 0.25) ** (1 / 3)
    assert rows[0]["soft_tifa_am"] == pytest.approx(am0) and rows[0]["soft_tifa_gm"] == pytest.approx(gm0)
    figures = suite.aggregate(rows, items)
    gm1 = (0.8 * 0.25) ** 0.5
    assert figures["soft_tifa_gm"] == pytest.approx(100 * (gm0 + gm1) / 2)
    assert figures["skill/count"] == pytest.approx(25.0) and figures["skill/object"] == pytest.approx(80.0)
    assert figures["soft_tifa_gm/atoms_3"] == pytest.approx(100 * (gm0 + gm1) / 2) and "skill/verb" not in figures


def test_soft_tifa_with_a_local_vision_language_model(tmp_path: Path) -> None:
    """The in-process judge on a tiny LLaVA built here: probabilities in (0, 1], the same on a second load."""
    from tiny_vlm import save_tiny_vlm

    from flowrl.suites.geneval2 import spellings, transformers_judge

    folder = save_tiny_vlm(tmp_path / "vlm")
    judge, again = transformers_judge(str(folder)), transformers_judge(str(folder))
    image = torch.rand(3, 32, 32)
    for question, answer in (["Is there a red circle?", "Yes"], ["How many circles are in the image?", "two"]):
        p = judge(image, question, spellings(question, answer))
        assert 0.0 < p <= 1.0 + 1e-6 and p == again(image, question, spellings(question, answer))


def test_geneval2_suite_end_to_end(tmp_path: Path) -> None:
    from tiny_vlm import save_tiny_vlm

    prompts = tmp_path / "g2.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in GENEVAL2))
    folder = save_tiny_vlm(tmp_path / "vlm")
    out = tmp_path / "out"
    assert _run("run", "geneval2", EGRPO, "--out", str(out), "--quiet", "--set", f"prompts={str(prompts)!r}",
                "--set", f"judge='transformers:{folder}'", "--protocol", "resolution=32", "--protocol",
                "guidance=3.5", "--protocol", "steps=4") == 0
    summary = json.loads((out / "egrpo-initial" / "geneval2" / "summary.json").read_text())
    assert 0 < summary["figures"]["soft_tifa_am"] <= 100 and summary["figures"]["soft_tifa_gm"] <= \
        summary["figures"]["soft_tifa_am"] + 1e-9
    assert not summary["pinned"]


# -- the served GenEval detector's contract ----------------------------------------------------------------------
def test_the_served_detector_gives_what_the_detector_gives_in_process(tmp_path: Path) -> None:
    """scripts/geneval_detector_server.py serving the world's detector on 127.0.0.1: the suite's figures over
    HTTP equal those of the same detector in process (the official Mask2Former serves the same contract)."""
    import importlib.util
    import threading

    spec = importlib.util.spec_from_file_location("detector_server", ROOT / "scripts" / "geneval_detector_server.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def detect(images: list) -> list:
        tensors = torch.stack([torch.from_numpy(i.astype(np.float32) / 255).permute(2, 0, 1) for i in images])
        return [[{"label": d.label, "box": list(d.box), "score": d.score, "color": d.color} for d in found]
                for found in world_detector(tensors, [Item("")] * len(images))]

    server = module.serve(detect, "world", port=0, quiet=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    prompts = tmp_path / "geneval.jsonl"
    texts = ["a blue square", "two green squares", "a yellow triangle above a blue square", "three cyan circles"]
    prompts.write_text("".join(json.dumps({"prompt": t, **world_metadata(t)}) + "\n" for t in texts))
    common = ("--quiet", "--set", f"prompts={str(prompts)!r}", "--protocol", "resolution=32", "--protocol",
              "guidance=3.5", "--protocol", "steps=8")
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert _run("run", "geneval", EGRPO, "--out", str(tmp_path / "a"), "--set", f"detector={url!r}", *common) == 0
    finally:
        server.shutdown()
        server.server_close()
    assert _run("run", "geneval", EGRPO, "--out", str(tmp_path / "b"), "--set", "detector='world'", *common) == 0
    served, local = (json.loads((tmp_path / x / "egrpo-initial" / "geneval" / "summary.json").read_text())
                     for x in ("a", "b"))
    assert served["per_prompt"] == local["per_prompt"] and served["figures"] == local["figures"]
    assert served["figures"]["overall"] > 0  # the base draws some of these: the check can see a difference


# -- the reward-scored suites, on a tiny twin with tiny scorers --------------------------------------------------
CLIP_DIR = ROOT / "tests" / "data" / "rewards" / "clip"
TINY_SCORERS = (f'[{{type="pickscore", model="{CLIP_DIR}", processor="{CLIP_DIR}", device="cpu"}}, '
                f'{{type="clipscore", model="{CLIP_DIR}", device="cpu", name="clip"}}]')
PROMPT_FILES = {
    "hpsv2": ("styles.json", json.dumps(["a red circle", "two blue squares", "a cat"])),
    "drawbench": ("db.jsonl", "".join(json.dumps({"prompt": p, "category": c}) + "\n"
                                      for p, c in (("a red circle", "Colors"), ("two blue squares", "Counting")))),
    "partiprompts": ("parti.tsv", "Prompt\tCategory\tChallenge\tNote\n\"a red\" circle\tArts\tBasic\t\n"
                                  "two blue squares\tAbstract\tQuantity\t\n"),
    "ocr": ("ocr.txt", 'a sign that says "OPEN"\na sign that says "SHOP"\n'),
}


@pytest.mark.parametrize("name", list(PROMPT_FILES))
def test_reward_suites_end_to_end(name: str, tmp_path: Path) -> None:
    file, text = PROMPT_FILES[name]
    (tmp_path / file).write_text(text)
    scorers = TINY_SCORERS if name != "ocr" else '[{type="jpeg_compressibility", name="ocr"}]'  # RapidOCR: extras
    out = tmp_path / "out"
    assert _run("run", name, EGRPO, "--out", str(out), "--quiet", "--set", f"prompts={str(tmp_path / file)!r}",
                "--set", f"scorers={scorers}", "--protocol", "resolution=32", "--protocol", "guidance=3.5",
                "--protocol", "steps=4") == 0
    summary = json.loads((out / "egrpo-initial" / name / "summary.json").read_text())
    keys = {"pickscore", "clip"} if name != "ocr" else {"ocr"}
    assert keys <= set(summary["figures"]) and all(math.isfinite(summary["figures"][k]) for k in keys)
    assert summary["primary"] == ("pickscore" if name != "ocr" else "ocr")
    if name == "partiprompts":  # split on tabs, no quoting: the quote stays in the prompt
        assert (out / "egrpo-initial" / name / "samples.txt").read_text().splitlines()[0] == '"a red" circle'
        assert set(summary["categories"]) == {"Arts", "Abstract"}


def test_a_video_base_scores_frame_averaged(tmp_path: Path) -> None:
    """Wan's tiny twin: clips kept whole as arrays, an image scorer averaged over each clip's frames."""
    prompts = tmp_path / "p.txt"
    prompts.write_text("a red circle\ntwo blue squares\n")
    out = tmp_path / "out"
    assert _run("run", "drawbench", str(ROOT / "recipes" / "smoke" / "wan.toml"), "--out", str(out), "--quiet",
                "--set", f"prompts={str(prompts)!r}", "--set", 'scorers=[{type="jpeg_compressibility"}]',
                "--protocol", "steps=2") == 0
    folder = out / "wan-initial" / "drawbench"
    clip = np.load(folder / "images" / "00000_00.npy")
    assert clip.ndim == 4 and clip.shape[1] == 3  # (F, 3, H, W)
    from flowrl.rewards.frames import score_pictures

    scorer = flowrl.build("reward", {"type": "jpeg_compressibility"})
    expected = float(score_pictures(scorer, torch.from_numpy(clip)[None], ["a red circle"])[0])
    row = json.loads((folder / "scores.jsonl").read_text().splitlines()[0])
    assert row["jpeg_compressibility"] == pytest.approx(expected, rel=1e-12)


# -- damage and failures: one line, exit 2, nothing written lost ---------------------------------------------
def test_a_damaged_manifest_or_a_failing_scorer_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    args = ("run", "world", EGRPO, "--out", str(out), "--prompts", "4", "--quiet", "--tag", "t")
    assert _run(*args, "--stage", "generate") == 0
    manifest = next((out / "t" / "world").glob("manifest-*.jsonl"))
    rows = manifest.read_text().splitlines()
    manifest.write_text("\n".join([rows[0], "{not json", *rows[1:]]) + "\n")
    capsys.readouterr()
    assert _run(*args, "--stage", "score") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{manifest}: line 2 is not a JSON object" in err[0]
    manifest.write_text("\n".join(rows) + "\n")
    prompts = tmp_path / "g.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": t, **world_metadata(t)}) + "\n"
                               for t in ("a blue square", "two green squares")))
    common = ("--out", str(out), "--quiet", "--set", f"prompts={str(prompts)!r}", "--protocol", "resolution=32",
              "--protocol", "guidance=3.5", "--protocol", "steps=4", "--batch", "4")
    assert _run("run", "geneval", EGRPO, *common, "--set", "detector='test_suites:failing_detector'") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: suite 'geneval' failed to score")
    assert "RuntimeError: the detector broke" in err[-1]
    assert not any("Traceback" in line for line in err)  # generation's notes above it, then the one line
    scored = out / "egrpo-initial" / "geneval" / "scores.jsonl"
    assert len(scored.read_text().splitlines()) == 4  # the first batch's scores were kept
    assert _run("run", "geneval", EGRPO, *common, "--set", "detector='world'") == 2  # another scorer: not mixed
    assert "was scored with other scorer settings" in capsys.readouterr().err
    assert _run("run", "geneval", EGRPO, *common, "--set", "detector='test_suites:failing_detector'") == 0
    assert len(scored.read_text().splitlines()) == 8  # only the missing ones scored, once the detector is back


CALLS = {"n": 0}


def failing_detector(images: torch.Tensor, items: list) -> list:
    """The world's detector, but its second call fails (a served detector that went down and came back)."""
    CALLS["n"] += 1
    if CALLS["n"] == 2:
        raise RuntimeError("the detector broke")
    return world_detector(images, items)


def test_data_fetch_refuses_an_unknown_set(capsys: pytest.CaptureFixture) -> None:
    assert main(["data", "fetch", "imagenet"]) == 2
    assert ("expected one of geneval, geneval2, partiprompts, hpsv2, drawbench, dpgbench, t2icompbench, unigenbench,"
            " unigenbench-judge, got 'imagenet'") in capsys.readouterr().err


def test_a_lora_trained_elsewhere_is_a_column(tmp_path: Path) -> None:
    """``RECIPE@LORA``: the recipe's base with a diffusers LoRA folder; its images differ from the base's on the
    same noise, and its weights hash names the LoRA."""
    from flowrl.backbones.lora.export import export_lora
    from flowrl.config.settings import LoraConfig
    from flowrl.trainer.lora import add_lora

    backbone = flowrl.build("backbone", {"type": "world_tiny"})
    add_lora(backbone.transformer, LoraConfig(rank=4, alpha=4.0), type(backbone).lora_targets)
    generator = torch.Generator().manual_seed(0)
    for name, param in backbone.transformer.named_parameters():
        if "lora_B" in name:
            param.data = 0.5 * torch.randn(param.shape, generator=generator)
    assert export_lora(backbone, tmp_path / "lora") is not None
    out = tmp_path / "out"
    assert _run("run", "world", EGRPO, f"{EGRPO}@{tmp_path / 'lora'}", "--out", str(out), "--prompts", "6",
                "--quiet") == 0
    base, lora = out / "egrpo-initial" / "world", out / "egrpo+lora" / "world"
    assert not np.array_equal(np.load(base / "images" / "00000_00.npy"), np.load(lora / "images" / "00000_00.npy"))
    facts = [json.loads((f / "run.json").read_text()) for f in (base, lora)]
    assert facts[0]["weights_sha256"] != facts[1]["weights_sha256"]
    assert _run("run", "world", f"{EGRPO}@{tmp_path / 'missing'}", "--out", str(out)) == 2
