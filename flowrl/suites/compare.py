"""Several checkpoints on one suite: tables with 95% intervals, and paired tests against the first column.

A table holds either the results comparable with published figures or those that are not
(:mod:`flowrl.suites.comparability` decides, and each column of the second says why). Its first row is the suite's
headline as its source defines it (GenEval: the mean over tags), then the headline per category, then the other
figures. A later column is paired with the first only on the prompts both made from the same initial noise
(:func:`flowrl.suites.comparability.pairing`); otherwise its cell says why there is no test. The statistics are
:mod:`flowrl.suites.stats`'.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flowrl.suites.comparability import pairing
from flowrl.suites.stages import SUMMARY, SuiteError
from flowrl.suites.stats import interval, paired

LEGEND = ("Each cell: the figure over the column's prompts, and its 95% interval [low, high] (Wilson's for a "
          "proportion, with the effective n of images clustered in prompts; Student's t otherwise). Later columns "
          "also give Δ, the paired difference from the first column on the prompts both made from the same initial "
          "noise, with its 95% t interval, the paired t-test's two-sided p and the n of shared prompts. Column "
          "heads: n = prompts × images per prompt.")
REQUIRED = {"suite": str, "tag": str, "protocol": dict, "figures": dict, "prompts": list, "per_prompt": list,
            "categories": list}


def load_summary(folder: Path) -> dict[str, Any]:
    """A result folder's ``summary.json``, checked enough to build a table from (one line naming it if not)."""
    path = Path(folder) / SUMMARY
    if not path.exists():
        raise SuiteError(f"{path} is missing: score {folder} first (flowrl suite run --stage score)")
    try:
        summary = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError):
        raise SuiteError(f"{path} is not valid JSON; score {folder} again (--stage score)") from None
    if not isinstance(summary, dict):
        raise SuiteError(f"{path} is not a JSON object; score {folder} again (--stage score)")
    for key, kind in REQUIRED.items():
        if not isinstance(summary.get(key), kind):
            raise SuiteError(f"{path}: '{key}' is missing or not a {kind.__name__}; score {folder} again "
                             "(--stage score)")
    lengths = {k: len(summary[k]) for k in ("prompts", "per_prompt", "categories", "item_hashes") if k in summary}
    if len(set(lengths.values())) > 1:
        raise SuiteError(f"{path}: the per-prompt lists differ in length ({lengths}); score {folder} again")
    if not all(isinstance(f, dict) and all(isinstance(v, int | float) for v in f.values())
               for f in summary["per_prompt"]):
        raise SuiteError(f"{path}: 'per_prompt' holds a row that is not figures; score {folder} again")
    return dict(summary)


def comparable(summary: dict[str, Any]) -> bool:
    return bool(summary.get("comparable", False))


def reasons(summary: dict[str, Any]) -> list[str]:
    if "comparable" not in summary:
        return ["scored by an older flowrl that did not check the prompts (score it again)"]
    return [str(r) for r in summary.get("differs", [])]


def compare(folders: Sequence[Path]) -> dict[str, Any]:
    """The comparison of result folders of one suite (the first is the baseline of each table)."""
    summaries = [load_summary(f) for f in folders]
    suites = {s["suite"] for s in summaries}
    if len(suites) != 1:
        raise SuiteError(f"results of different suites ({', '.join(sorted(suites))}) cannot share a table")
    tables = []
    for group in (True, False):
        chosen = [(f, s) for f, s in zip(folders, summaries, strict=True) if comparable(s) == group]
        if chosen:
            tables.append(_table([f for f, _ in chosen], [s for _, s in chosen], group))
    return {"suite": summaries[0]["suite"], "tables": tables, "legend": LEGEND}


def headline_of(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary's headline definition (an older summary: its primary figure, the mean over prompts)."""
    keys = [k for k in summary["per_prompt"][0] if not k.startswith("_")] if summary["per_prompt"] else []
    primary = summary.get("primary") or (keys[0] if keys else "")
    found = summary.get("headline") or {"figure": primary, "of": primary, "by": "", "scale": 1.0}
    if found["of"] not in keys and keys:
        found = {"figure": keys[0], "of": keys[0], "by": "", "scale": found.get("scale", 1.0)}
    return dict(found)


def _table(folders: Sequence[Path], summaries: Sequence[dict[str, Any]], comparable_: bool) -> dict[str, Any]:
    base = summaries[0]
    head = headline_of(base)
    keys = [k for k in base["per_prompt"][0] if not k.startswith("_")] if base["per_prompt"] else []
    categories = sorted(set(base["categories"]) - {""})
    pairs = [pairing(base, s) for s in summaries]
    specs: list[tuple[str, str, str, str]] = []  # (row name, per-prompt key, category, how it is made)
    if head["of"] in keys:  # the headline first, then each figure over prompts and per category
        specs.append((head["figure"], head["of"], "", "by category" if head["by"] == "category" else ""))
    for key in ([head["of"]] if head["of"] in keys else []) + [k for k in keys if k != head["of"]]:
        if key != head["of"] or head["by"]:
            specs.append((key, key, "", ""))
        specs += [(f"{key}/{c}", key, c, "") for c in categories]
    rows = []
    for number, (name, key, category, how) in enumerate(_unique(specs)):
        row: dict[str, Any] = {"figure": name, "headline": number == 0 and head["of"] in keys,
                               "definition": _definition(head, key, how), "columns": []}
        for i, summary in enumerate(summaries):
            row["columns"].append(_cell(summary, key, category, how, base, pairs[i], head["scale"], i))
        rows.append(row)
    return {"comparable": comparable_, "pinned": comparable_, "tags": [s["tag"] for s in summaries],
            "folders": [str(f) for f in folders], "protocols": [s["protocol"] for s in summaries],
            "n": [[len(s["prompts"]), int(s.get("images_per_prompt", 1))] for s in summaries],
            "differs": [reasons(s) for s in summaries], "pairing": [p[1] for p in pairs], "rows": rows,
            "aggregate": [dict(s["figures"]) for s in summaries], "primary": head["figure"], "headline": head}


def _unique(specs: list[tuple[str, str, str, str]]) -> list[tuple[str, str, str, str]]:
    seen, out = set(), []
    for spec in specs:
        if spec[0] not in seen:
            seen.add(spec[0])
            out.append(spec)
    return out


def _definition(head: dict[str, Any], key: str, how: str) -> str:
    unit = " x 100" if head.get("scale", 1.0) == 100 else ""
    if how:
        return f"the mean over categories of each category's mean {key}{unit} (the source's headline)"
    return f"the mean over prompts{unit}"


def _values(summary: dict[str, Any], key: str, category: str) -> dict[int, tuple[float, str]]:
    return {int(p): (float(f[key]), c) for p, f, c in zip(summary["prompts"], summary["per_prompt"],
                                                           summary["categories"], strict=True)
            if key in f and (not category or c == category)}


def _cell(summary: dict[str, Any], key: str, category: str, how: str, base: dict[str, Any],
          pair: tuple[list[int], str], scale: float, column: int) -> dict[str, Any]:
    found = _values(summary, key, category)
    values = [v * scale for v, _ in found.values()]
    strata = [c for _, c in found.values()] if how else None
    images = len(found) * int(summary.get("images_per_prompt", 1))
    proportion = key in summary.get("proportions", []) and scale == 1.0
    cell: dict[str, Any] = {**interval(values, strata, proportion, images), "prompts": len(found), "images": images}
    if column:
        shared, why = pair
        first = _values(base, key, category)
        chosen = [p for p in shared if p in found and p in first]
        if why or not chosen:
            cell["unpaired"] = why or "not paired: no shared prompt in this row"
        else:
            cell["vs_first"] = paired([first[p][0] * scale for p in chosen], [found[p][0] * scale for p in chosen],
                                      [found[p][1] for p in chosen] if how else None)
    return cell


def _number(x: float) -> str:
    return f"{x:.4f}" if math.isfinite(x) else "n/a"


def cell_text(cell: dict[str, Any]) -> str:
    """A table cell: the figure with its 95% interval; for later columns the paired difference, its interval, p
    and n (or why there is no test)."""
    text = _number(cell["mean"])
    if "low" in cell and math.isfinite(cell["low"]):
        text += f" [{_number(cell['low'])}, {_number(cell['high'])}]"
    elif "half_width" in cell and math.isfinite(cell["half_width"]):  # a table written by an older flowrl
        text += f" ± {_number(cell['half_width'])} (95%)"
    test = cell.get("vs_first")
    if test:
        p = f"p = {test['p']:.2g}" if math.isfinite(test["p"]) else "p n/a"
        span = f" [{test['low']:+.4f}, {test['high']:+.4f}]" if math.isfinite(test.get("low", math.nan)) else ""
        text += f"; Δ {test['diff']:+.4f}{span}, {p}, n = {test['n']}"
    elif cell.get("unpaired"):
        text += f"; {cell['unpaired']}"
    return text


def markdown(result: dict[str, Any]) -> str:
    """The comparison as markdown: one table per comparability group, with why a column is not comparable."""
    lines = [f"# Suite {result['suite']}", ""]
    for table in result["tables"]:
        comparable_ = table.get("comparable", table.get("pinned"))
        lines += ["## comparable with published figures" if comparable_ else
                  "## NOT comparable with published figures", ""]
        for tag, why in zip(table["tags"], table.get("differs", [[]] * len(table["tags"])), strict=True):
            if why:
                lines.append(f"- {tag}: " + "; ".join(why))
        lines += ["", result.get("legend", LEGEND), ""]
        heads = [f"{t} (n = {n[0]} × {n[1]})" for t, n in zip(table["tags"], table.get("n", []), strict=False)] \
            or table["tags"]
        lines.append("| figure | " + " | ".join(heads) + " |")
        lines.append("| --- |" + " --- |" * len(table["tags"]))
        for row in table["rows"]:
            name = f"**{row['figure']}**" if row.get("headline") else row["figure"]
            lines.append(f"| {name} | " + " | ".join(cell_text(c) for c in row["columns"]) + " |")
        definition = next((r.get("definition") for r in table["rows"] if r.get("headline")), "")
        lines += ["", f"Headline ({table.get('primary', '')}): {definition}." if definition else "",
                  "Protocols: " + "; ".join(f"{t}: {json.dumps(p)}" for t, p in
                                            zip(table["tags"], table["protocols"], strict=True)), ""]
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> list[Path]:
    """The headline per category and column with its interval (left), and each later column's paired
    difference from the first with its interval (right), per table; PNG at 300 dpi and PDF. Returns the files."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tables = result["tables"]
    fig, axes = plt.subplots(len(tables), 2, figsize=(9, 3.4 * len(tables)), squeeze=False)
    for (left, right), table in zip(axes, tables, strict=True):
        head = table.get("primary", "")
        rows = [r for r in table["rows"] if r.get("headline") or r["figure"].startswith(head + "/")
                or (r["figure"].split("/")[0] == table.get("headline", {}).get("of") and "/" in r["figure"])][:12]
        labels = [r["figure"] if "/" not in r["figure"] else r["figure"].split("/", 1)[1] for r in rows]
        count = len(table["tags"])
        width = 0.8 / count
        for i, tag in enumerate(table["tags"]):
            cells = [r["columns"][i] for r in rows]
            xs = [k + (i - (count - 1) / 2) * width for k in range(len(rows))]
            left.errorbar(xs, [c["mean"] for c in cells], yerr=_spans(cells, "mean", "low", "high"), fmt="o",
                          capsize=3, label=tag)
            if i:
                tests = [c.get("vs_first") or {} for c in cells]
                step = 0.8 / max(count - 1, 1)
                spots = [k + (i - 1 - (count - 2) / 2) * step for k in range(len(rows))]
                diffs = [t.get("diff", math.nan) for t in tests]
                right.errorbar(spots, diffs, yerr=_spans(tests, "diff", "low", "high"), fmt="o", capsize=3,
                               label=f"{tag} − {table['tags'][0]}", color=f"C{i}")
        for ax in (left, right) if len(table["tags"]) > 1 else (left,):
            ax.set_xticks(range(len(rows)))
            ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
            ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=2, frameon=False)
        right.axhline(0.0, color="0.5", lw=0.8)
        if len(table["tags"]) < 2:
            right.set_axis_off()
            right.text(0.5, 0.5, "one column: no difference to draw", ha="center", va="center", fontsize=8)
        group = "comparable" if table.get("comparable", table.get("pinned")) else "not comparable"
        left.set_title(f"{result['suite']} ({group}): {head}, 95% intervals", fontsize=9)
        of = table.get("headline", {}).get("of", head)
        left.set_ylabel(head if of == head else f"{head}; per category: {of}")
        right.set_title("paired difference from the first column, 95% t interval", fontsize=9)
        right.set_ylabel(f"Δ {head}")
    fig.tight_layout()
    written = []
    for suffix, dpi in ((".png", 300), (".pdf", None)):
        target = Path(path).with_suffix(suffix)
        fig.savefig(target, dpi=dpi)
        written.append(target)
    plt.close(fig)
    return written


def _spans(cells: Sequence[dict[str, Any]], mid: str, low: str, high: str) -> list[list[float]]:
    """Error-bar lengths below and above each point (0 where there is no interval)."""
    below = [c.get(mid, math.nan) - c.get(low, math.nan) for c in cells]
    above = [c.get(high, math.nan) - c.get(mid, math.nan) for c in cells]
    return [[max(b, 0.0) if math.isfinite(b) else 0.0 for b in below],  # max: rounding at a bound of [0, 1]
            [max(a, 0.0) if math.isfinite(a) else 0.0 for a in above]]
