"""``flowrl report``: the page of a real short run, checked in a headless browser when one is installed."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import tiny_recipe

from flowrl.cli.main import main
from flowrl.recipe import recipe_from_dict
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
                 "<li>a dog</li>"):
        assert part in page, part
    assert "http://" not in page and "https://" not in page  # self-contained: nothing to fetch
    assert page.count("<img ") == 11 + 3  # 11 curve panels with data (no strict categories here), 3 grids


@needs_browser
def test_the_report_renders_in_a_browser_without_errors(run: Path, tmp_path: Path) -> None:
    out = write_report(run, tmp_path / "page.html")
    result = browser_check(out)
    assert result == {"images": out.read_text().count("<img "), "broken": 0, "errors": []}


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
    assert "<th>strict/single</th>" in page and "(+0.0000, p = 1)" in page  # the same weights twice: no difference
    assert 'alt="world comparison"' in page
