"""``flowrl report RUN``: one self-contained HTML page about a run (every image inline, no network).

The page holds, top to bottom: the run's figures (iterations, NFE, wall time, first / best / last held-out
evaluation), its alerts with the iterations where each held, the curves (:mod:`flowrl.report.curves`) with a
switch of their x axis (iterations, rollout NFE, training seconds) and the list of flat figures, the held-out
samples written at each evaluation (``samples/step_*.png``: the first 8 held-out prompts, the same initial noise
every time) as a table with a row per evaluation and each prompt under its column
(:mod:`flowrl.report.samples`; a run whose prompts carry condition images shows each tile as source | result,
the instruction below), the suite tables, and the resolved recipe. Beside the page, ``<page>_figures/``
holds every drawn panel as PNG (300 dpi) and PDF, for a paper.

A small script at the end checks the page itself once it has loaded: it counts the images, those that failed to
decode, those shown (the curves of one x axis at a time) and the script errors, and writes the counts into
``<body data-check="...">``, so a headless browser can verify the page (``chromium --headless --dump-dom``).
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from flowrl.report import ReportError
from flowrl.report.curves import AXES, draw_panels, export_panels, panels, series
from flowrl.report.samples import EDIT_STYLE, conditioned, sample_table
from flowrl.report.suites import suite_section
from flowrl.trainer.runfolder import read_metrics
from flowrl.trainer.writes import refused_writes

CHECK_SCRIPT = """
window.__reportErrors = [];
window.addEventListener("error", function (event) {
  window.__reportErrors.push(String(event.message || (event.target && event.target.src) || "error"));
}, true);
window.addEventListener("load", function () {
  var images = Array.prototype.slice.call(document.images);
  var broken = images.filter(function (i) { return !i.complete || i.naturalWidth === 0; }).length;
  var shown = images.filter(function (i) { return i.offsetParent !== null; }).length;  // not under display: none
  document.body.setAttribute("data-check", JSON.stringify(
    {images: images.length, broken: broken, shown: shown, errors: window.__reportErrors}));
});
"""
STYLE = """
body { font-family: system-ui, sans-serif; margin: 24px auto; max-width: 1240px; color: #222; }
h1 { font-size: 22px; } h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 13px; } td, th { padding: 3px 10px; border-bottom: 1px solid #eee; }
th { text-align: left; } .panels img { width: 500px; margin: 4px; } img.suite { max-width: 100%; height: auto; }
.axis { display: none; } .switch { font-size: 13px; margin: 8px 0; } .switch label { margin-right: 14px; }
#x-step:checked ~ .panels .by-step, #x-nfe:checked ~ .panels .by-nfe, #x-wall_s:checked ~ .panels .by-wall_s
  { display: inline-block; }
#x-step:checked ~ .switch [for=x-step], #x-nfe:checked ~ .switch [for=x-nfe],
#x-wall_s:checked ~ .switch [for=x-wall_s] { font-weight: bold; text-decoration: underline; }
.switch label { cursor: pointer; }
.panels figure { margin: 0; vertical-align: top; } /* shown only under its x axis (display set above) */
.panels figcaption { font-size: 11px; text-align: right; margin-right: 8px; }
.flat { font-size: 13px; color: #555; }
table.samples td { vertical-align: top; padding: 2px; border: none; }
table.samples img { width: 96px; image-rendering: pixelated; display: block; }
table.samples th.prompt { font-size: 11px; font-weight: normal; width: 96px; vertical-align: bottom; }
.alert { color: #a00; } .ok { color: #060; } pre { background: #f6f6f6; padding: 10px; font-size: 12px; }
"""


def _png(data: bytes, alt: str, kind: str = "png") -> str:
    encoded = base64.b64encode(data).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/{kind};base64,{encoded}">'


def alert_steps(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[int]]:
    """Each ``alert/*`` flag and the iterations where it held."""
    out: dict[str, list[int]] = {}
    for row in rows:
        for key, value in row.items():
            if key.startswith("alert/") and value:
                out.setdefault(key, []).append(int(row["step"]))
    return out


def spans(steps: Sequence[int]) -> str:
    """``[3, 4, 5, 9]`` -> ``"3-5, 9"``."""
    parts: list[str] = []
    start = prev = None
    for step in [*sorted(steps), None]:
        if step is not None and prev is not None and step == prev + 1:
            prev = step
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = step
    return ", ".join(parts)


def evaluation_key(rows: Sequence[Mapping[str, Any]]) -> str | None:
    """The headline evaluation figure: eval/strict where logged (the embedded world), else eval/score."""
    for key in ("eval/strict", "eval/score"):
        if series(rows, key)[0]:
            return key
    return None


def summary_rows(rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    last = rows[-1]
    out = [
        ("iterations", str(last.get("step", "?"))),
        ("rollout NFE", f"{int(last.get('nfe', 0)):,}"),
        ("training wall time", f"{float(last.get('wall_s', 0.0)):.0f} s (evaluations excluded)"),
    ]
    key = evaluation_key(rows)
    if key is not None:
        points = list(zip(*series(rows, key), strict=True))
        best = max(points, key=lambda p: p[1])
        out += [
            (f"{key}: first", f"{points[0][1]:.4f} (iteration {points[0][0]})"),
            (f"{key}: best", f"{best[1]:.4f} (iteration {best[0]})"),
            (f"{key}: last", f"{points[-1][1]:.4f} (iteration {points[-1][0]})"),
        ]
    return out


def curves_section(rows: Sequence[Mapping[str, Any]], alerts: Mapping[str, Sequence[int]], figures: str) -> list[str]:
    """The curves with their x-axis switch (radio inputs and CSS: no script), each panel linking to its print
    files in the ``figures`` folder, and the flat figures listed."""
    drawn = draw_panels(rows, alerts)
    parts = ["<h2>Curves</h2>"]
    parts += [f'<input type="radio" name="x" class="axis" id="x-{x}"{" checked" if x == "step" else ""}>'
              for x, _ in AXES]
    parts.append('<div class="switch">x axis: ' + "".join(f'<label for="x-{x}">{html.escape(label)}</label>'
                                                          for x, label in AXES) + "</div>")
    parts.append('<div class="panels">')
    for panel, images in drawn:
        for x, _ in AXES:
            png = images.get(x, images["step"])  # a counter panel is drawn against iterations only
            links = " ".join(f'<a href="{html.escape(figures)}/{panel.slug}_{x if x in images else "step"}{suffix}">'
                             f"{suffix[1:].upper()}</a>" for suffix in (".png", ".pdf"))
            parts.append(f'<figure class="axis by-{x}">{_png(png, panel.spec.title)}'
                         f"<figcaption>print: {links}</figcaption></figure>")
    parts.append("</div>")
    flat = [p for p in panels(rows) if p.flat]
    if flat:
        parts.append('<p class="flat">Flat (not drawn: nothing moved): '
                     + "; ".join(f"<b>{html.escape(p.spec.title)}</b>: {html.escape(p.flat)}" for p in flat) + "</p>")
    return parts


def render(run_dir: Path, rows: Sequence[Mapping[str, Any]], figures: str = "report_figures",
           suites: Path | None = None) -> str:
    """The page's HTML for the run folder ``run_dir`` with metrics ``rows``; ``figures``: the folder of the print
    files, relative to the page; ``suites``: where the suite comparisons are (default ``RUN/suites``)."""
    recipe_file = run_dir / "recipe.toml"
    recipe = recipe_file.read_text(encoding="utf-8", errors="replace") if recipe_file.is_file() else ""
    name = next((line.split("=", 1)[1].strip().strip('"') for line in recipe.splitlines()
                 if line.startswith("name")), run_dir.name)
    alerts = alert_steps(rows)
    style = STYLE + (EDIT_STYLE if conditioned(run_dir) else "")  # a text-to-image page: STYLE alone, as it was
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>flowrl report: {html.escape(name)}</title><style>{style}</style>",
        f"<script>{CHECK_SCRIPT}</script></head><body>",
        f"<h1>flowrl run report: {html.escape(name)}</h1>",
        f"<p>Run folder <code>{html.escape(str(run_dir))}</code></p>",
        "<table>",
        *(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in summary_rows(rows)),
        "</table>",
        "<h2>Alerts</h2>",
    ]
    if alerts:
        parts.append("<ul>")
        parts += [f'<li class="alert"><b>{html.escape(k)}</b> at iterations {spans(v)}</li>' for k, v in alerts.items()]
        parts.append("</ul><p>Red bands on the curves mark the iterations with an alert. Look at the samples.</p>")
    else:
        parts.append('<p class="ok">No alert was raised (alert/diversity, alert/reward_vs_eval).</p>')
    parts += curves_section(rows, alerts, figures)
    parts += sample_table(run_dir, _png)
    parts += suite_section(suites if suites is not None else run_dir / "suites")
    parts += ["<h2>Resolved recipe</h2>", f"<pre>{html.escape(recipe) or '(no recipe.toml)'}</pre>", "</body></html>"]
    return "\n".join(parts)


def write_report(run_dir: Path, out: Path | None = None, suites: Path | None = None) -> Path:
    """Write the report of ``run_dir`` to ``out`` (default ``RUN/report.html``), with the suite comparisons under
    ``suites`` (default ``RUN/suites``); return its path."""
    run_dir = Path(run_dir)
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        raise ReportError(f"{run_dir}: not a run folder (no metrics.jsonl)")
    rows = [r for r in read_metrics(metrics) if isinstance(r, dict) and isinstance(r.get("step"), int)]
    if not rows:
        raise ReportError(f"{metrics}: no rows yet (the run has not finished an iteration)")
    out = run_dir / "report.html" if out is None else Path(out)
    if out.is_dir():
        raise ReportError(f"--out {out}: is a folder; give a file name such as {out / 'report.html'}")
    if not out.parent.is_dir():
        raise ReportError(f"--out {out}: folder {out.parent} does not exist")
    figures = out.with_name(out.stem + "_figures")
    page = render(run_dir, rows, figures.name, suites)
    tmp = out.with_name(out.name + ".tmp")
    with refused_writes(out, "free space or choose another --out"):
        try:
            tmp.write_text(page, encoding="utf-8")
            tmp.replace(out)
        finally:
            tmp.unlink(missing_ok=True)
    with refused_writes(figures, "free space or choose another --out"):
        export_panels(rows, alert_steps(rows), figures)
    return out


def check_result(dom: str) -> dict[str, Any]:
    """The ``data-check`` object a browser wrote into the page's body (see the module doc)."""
    marker = 'data-check="'
    start = dom.find(marker)
    if start < 0:
        raise ValueError("the page's check script did not run (no data-check attribute on <body>)")
    end = dom.index('"', start + len(marker))
    return dict(json.loads(html.unescape(dom[start + len(marker) : end])))
