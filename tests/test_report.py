"""``flowrl report``: the page of a real short run, checked in a headless browser when one is installed."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import tiny_recipe

from flowrl.cli.main import main
from flowrl.config.recipe import recipe_from_dict
from flowrl.report.page import CHECK_SCRIPT, alert_steps, check_result, spans, write_report
from flowrl.trainer import train

BROWSERS = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome")
BROWSER = next((b for b in map(shutil.which, BROWSERS) if b), None)
NO_BROWSER = "no headless Chromium (apt-get install chromium-headless-shell)"
needs_browser = pytest.mark.skipif(BROWSER is None, reason=NO_BROWSER)


def browser_check(page: Path) -> dict:
    """Load ``page`` in headless Chromium and return what its check script wrote into <body data-check>."""
    assert BROWSER is not None
    command = [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000", "--dump-dom",
               page.resolve().as_uri()]
    dom = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True).stdout
    return check_result(dom)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tiny_recipe(max_steps=4, eval_every=2, eval_prompts=2, image_every=2, kl_every=2)
    return train(recipe_from_dict(data), tmp_path_factory.mktemp("report") / "run", quiet=True)


def test_the_report_of_a_short_run_holds_every_part(run: Path) -> None:
    grids = [f"step_{s:06d}.png" for s in (0, 2, 4)]
    assert sorted(p.name for p in (run / "samples").iterdir()) == ["prompts.txt", *grids]
    assert (run / "samples" / "prompts.txt").read_text() == "a dog\n"  # the held-out prompts of the grids
    assert main(["report", str(run)]) == 0
    page = (run / "report.html").read_text()
    for part in ("Alerts", "Curves", "Held-out samples over the run", "Resolved recipe", 'name = &quot;tiny&quot;',
                 "training reward", "KL to the initial policy", "within-group diversity", "iteration 4",
                 '<th class="prompt">a dog</th>', 'alt="a dog at iteration 4"', "x axis: ", "Flat (not drawn"):
        assert part in page, part
    assert "http://" not in page and "https://" not in page  # self-contained: nothing to fetch
    from flowrl.report.curves import panels
    from flowrl.trainer.runfolder import read_metrics

    drawn = [q for q in panels(read_metrics(run / "metrics.jsonl")) if not q.flat]
    assert 6 <= len(drawn) <= 11
    assert page.count("<img ") == 3 * len(drawn) + 3  # each panel on three x axes; 3 evaluations x 1 prompt
    figures = run / "report_figures"
    for panel in drawn:
        assert (figures / f"{panel.slug}_step.png").stat().st_size > 10_000
        assert (figures / f"{panel.slug}_step.pdf").read_bytes().startswith(b"%PDF")
        assert f'href="report_figures/{panel.slug}_step.pdf"' in page


@needs_browser
def test_the_report_renders_in_a_browser_without_errors(run: Path, tmp_path: Path) -> None:
    out = write_report(run, tmp_path / "page.html")
    result = browser_check(out)
    images = out.read_text().count("<img ")
    assert result == {"images": images, "broken": 0, "shown": images - 2 * (images - 3) // 3, "errors": []}
    # of each panel's three x axes one is shown (iterations, checked first); the 3 sample tiles are shown


@needs_browser
def test_the_browser_check_sees_a_broken_image_and_a_script_error(tmp_path: Path) -> None:
    """The check can fail: an image that does not decode and a throwing script are both reported."""
    good = base64.b64encode((Path(__file__).parent / "data" / "rewards" / "image.png").read_bytes()).decode()
    junk = base64.b64encode(b"not a PNG").decode()
    page = tmp_path / "broken.html"
    page.write_text(
        f"<!DOCTYPE html><html><head><script>{CHECK_SCRIPT}</script></head><body>"
        f'<img src="data:image/png;base64,{good}"><img src="data:image/png;base64,{junk}">'
        "<script>undefinedFunction();</script></body></html>"
    )
    result = browser_check(page)
    assert result["images"] == 2 and result["broken"] == 1
    assert len(result["errors"]) >= 1 and any("undefinedFunction" in e for e in result["errors"])


def test_alerts_are_listed_with_their_iterations(tmp_path: Path) -> None:
    rows = [{"step": s, "nfe": 10 * s, "wall_s": float(s), "reward/total": 0.1 * s} for s in range(1, 8)]
    for row in rows[2:5]:
        row["alert/diversity"] = 1
    rows[6]["alert/reward_vs_eval"] = 1
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert alert_steps(rows) == {"alert/diversity": [3, 4, 5], "alert/reward_vs_eval": [7]}
    assert spans([3, 4, 5, 9, 11, 12]) == "3-5, 9, 11-12" and spans([]) == ""
    page = write_report(run).read_text()
    assert "<b>alert/diversity</b> at iterations 3-5" in page and "<b>alert/reward_vs_eval</b> at iterations 7" in page
    assert "no recipe.toml" in page and "None written" in page


def test_bad_paths_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == f"error: {tmp_path}: not a run folder (no metrics.jsonl)"
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "nfe": 1, "wall_s": 0.1}) + "\n")
    assert main(["report", str(run), "--out", str(tmp_path / "missing" / "r.html")]) == 2
    assert "folder" in capsys.readouterr().err and not (tmp_path / "missing").exists()


def test_the_report_shows_the_runs_suite_tables(run: Path, tmp_path: Path) -> None:
    """`flowrl suite run SUITE RUN` keeps its results in RUN/suites; the report shows their table and figure."""
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    assert main(["suite", "run", "world", str(copy), str(copy / "checkpoints" / "step_000004"), "--tag", "last",
                 "--tag", "again", "--prompts", "4", "--protocol", "steps=2", "--quiet"]) == 0
    page = write_report(copy).read_text()
    assert "<h2>Evaluation suites</h2>" in page and "world (NOT comparable" in page
    assert "<th>strict/single</th>" in page and "Δ +0.0000 [+0.0000, +0.0000], p = 1" in page  # the same weights
    assert 'alt="world comparison"' in page and "a subset: 4 of the 256 published prompts" in page
    elsewhere = tmp_path / "results"  # results kept elsewhere: --suites DIR shows them
    assert main(["suite", "run", "world", str(copy), "--out", str(elsewhere), "--prompts", "4", "--protocol",
                 "steps=2", "--quiet", "--tag", "other"]) == 0
    assert main(["report", str(copy), "--suites", str(elsewhere), "--out", str(tmp_path / "r.html")]) == 0
    page = (tmp_path / "r.html").read_text()
    assert "<th>other (n = 4 × 1)</th>" in page and "<th>last (n = 4 × 1)</th>" not in page


def _rows(n: int, **columns: Any) -> list[dict[str, Any]]:
    rows = [{"step": s, "nfe": 100 * s, "wall_s": 1.5 * s} for s in range(1, n + 1)]
    for key, values in columns.items():
        for row, value in zip(rows, values, strict=True):
            row[key] = value
    return rows


def test_flat_panels_are_listed_not_drawn() -> None:
    """A clip fraction of 0 throughout and a loss that is float noise carry nothing: listed with what they held;
    a loss that moves is drawn."""
    from flowrl.report.curves import panels

    rows = _rows(6, clip_frac=[0.0] * 6, loss=[1e-8, -2e-8, 3e-9, 0.0, 5e-9, -1e-8], grad_norm=[1, 2, 3, 2, 1, 2])
    found = {q.spec.title: q.flat for q in panels(rows)}
    assert found["clip fraction"] == "clip_frac: 0 at every logged iteration"
    assert found["loss"] == "loss: |value| < 1e-06 throughout (float noise)"
    assert found["gradient norm"] == ""
    moving = {q.spec.title: q.flat for q in panels(_rows(3, loss=[0.1, 0.2, 0.15]))}
    assert moving["loss"] == ""


def test_one_reward_is_one_line_and_two_are_three() -> None:
    from flowrl.report.curves import panels

    one = _rows(3, **{"reward/total": [0.1, 0.2, 0.3], "reward/jpeg": [0.1, 0.2, 0.3]})
    assert next(q for q in panels(one) if q.spec.title == "training reward").keys == ("reward/total",)
    two = _rows(3, **{"reward/total": [0.3, 0.5, 0.7], "reward/a": [0.1, 0.2, 0.3], "reward/b": [0.2, 0.3, 0.4]})
    assert set(next(q for q in panels(two) if q.spec.title == "training reward").keys) == {
        "reward/total", "reward/a", "reward/b"}


def test_axes_are_labelled_integer_and_no_narrower_than_the_noise() -> None:
    """The y axis names its quantity; iteration ticks are whole numbers; a +-0.001 wobble with a standard error of
    0.03 spans at least four standard errors (it used to fill the panel); few points are not joined by lines."""
    from flowrl.report.curves import figure, panels

    rows = _rows(3, **{"eval/strict": [0.500, 0.501, 0.499], "eval/strict_se": [0.03, 0.03, 0.03]})
    panel = next(q for q in panels(rows) if q.spec.title == "held-out evaluation")
    for x, label in (("step", "iteration"), ("nfe", "rollout NFE"), ("wall_s", "training seconds")):
        ax = figure(rows, panel, x, []).axes[0]
        assert ax.get_xlabel() == label and ax.get_ylabel() == "held-out figure (mean ± se)"
        low, high = ax.get_ylim()
        assert high - low >= 4 * 0.03 - 1e-12
        line = ax.get_lines()[0]
        assert line.get_linestyle() == "None" and line.get_marker() == "o"  # 3 points: markers only
    ticks = figure(rows, panel, "step", []).axes[0].get_xticks()
    assert all(float(t).is_integer() for t in ticks)
    long = _rows(8, **{"eval/strict": [0.1 * k for k in range(8)]})
    ax = figure(long, next(q for q in panels(long) if q.spec.title == "held-out evaluation"), "step", []).axes[0]
    assert ax.get_lines()[0].get_linestyle() == "-"


def test_sample_strips_are_cut_into_captioned_tiles_and_clips(tmp_path: Path) -> None:
    """The strip of three prompts is cut at its gutters (each tile exactly one image); a video run's animated strip
    is cut frame by frame into one animated clip per prompt."""
    import io

    import torch
    from PIL import Image

    from flowrl.report.samples import sample_table
    from flowrl.trainer.logger import write_grid

    images = torch.stack([torch.full((3, 8, 8), v) for v in (0.0, 0.5, 1.0)])
    write_grid((images, ["red", "grey", "white"]), tmp_path / "run" / "samples" / "step_000002.png")
    found: list[tuple[bytes, str]] = []

    def keep(data: bytes, alt: str, kind: str = "png") -> str:
        found.append((data, kind))
        return f"<img alt={alt!r}>"

    html = "\n".join(sample_table(tmp_path / "run", keep))
    assert [f'<th class="prompt">{p}</th>' in html for p in ("red", "grey", "white")] == [True] * 3
    assert "'white at iteration 2'" in html
    for (data, kind), value in zip(found, (0, 128, 255), strict=True):
        tile = Image.open(io.BytesIO(data)).convert("RGB")
        assert kind == "png" and tile.size == (32, 32) and set(tile.getdata()) == {(value,) * 3}
    frames = [(0.0, 0.2), (0.8, 1.0)]  # 2 clips of 2 frames, each frame its own shade
    clips = torch.stack([torch.stack([torch.full((3, 8, 8), v) for v in clip]) for clip in frames])
    write_grid((clips, ["dark", "light"]), tmp_path / "video" / "samples" / "step_000000.png")
    found.clear()
    sample_table(tmp_path / "video", keep)
    assert [kind for _, kind in found] == ["webp", "webp"]
    with Image.open(io.BytesIO(found[1][0])) as clip:
        assert clip.n_frames == 2 and clip.size == (32, 32)
        shades = []
        for k in range(2):
            clip.seek(k)
            shades.append(set(clip.convert("RGB").getdata()))
        assert shades == [{(204,) * 3}, {(255,) * 3}]


def test_legends_name_figures_the_reward_has_a_running_mean_and_categories_have_bands() -> None:
    from flowrl.report.curves import figure, panels, running_mean

    assert running_mean([1.0, 3.0, 5.0, 7.0], window=2) == [1.0, 2.0, 4.0, 6.0]
    rows = _rows(12, **{"reward/total": [0.1 * i for i in range(12)], "eval/strict": [0.5] * 11 + [0.6],
                        "eval/strict/single": [0.2 + 0.01 * i for i in range(12)],
                        "eval/strict/single_se": [0.05] * 12})
    drawn = {p.spec.title: p for p in panels(rows)}
    reward = figure(rows, drawn["training reward"], "step", [])
    labels = [line.get_label() for line in reward.axes[0].get_lines()]
    assert labels == ["total reward", "total reward, running mean of 10"]
    strict = figure(rows, drawn["held-out evaluation"], "step", [])
    assert [line.get_label() for line in strict.axes[0].get_lines()] == ["strict accuracy"]
    category = figure(rows, drawn["held-out strict accuracy by category"], "step", [])
    assert [line.get_label() for line in category.axes[0].get_lines()] == ["single"]
    assert category.axes[0].collections  # the standard-error band
