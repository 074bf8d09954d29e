"""The run report's section of suite results: each ``RUN/suites/comparison-SUITE/`` that ``flowrl suite run``
wrote (its default ``--out`` for a run folder), as tables with intervals and paired tests, and the figure."""

from __future__ import annotations

import html
import json
from pathlib import Path

from flowrl.suites.compare import cell_text


def suite_section(run_dir: Path) -> list[str]:
    """HTML lines of the suite tables under ``run_dir/suites`` (nothing when there are none)."""
    found = sorted((Path(run_dir) / "suites").glob("comparison-*/comparison.json"))
    if not found:
        return []
    import base64

    parts = ["<h2>Evaluation suites</h2>", "<p>Means over prompts with 95% t intervals; later columns: the paired "
             "difference from the first column on the same prompts and noise, and its two-sided p-value.</p>"]
    for path in found:
        try:
            result = json.loads(path.read_text())
        except (OSError, ValueError):
            parts.append(f"<p>{html.escape(str(path))}: unreadable (run flowrl suite compare again)</p>")
            continue
        for table in result["tables"]:
            note = "pinned protocol" if table["pinned"] else "NOT comparable: another protocol or a subset"
            parts.append(f"<h3>{html.escape(result['suite'])} ({note})</h3><table><tr><th>figure</th>"
                         + "".join(f"<th>{html.escape(t)}</th>" for t in table["tags"]) + "</tr>")
            for row in table["rows"]:
                parts.append(f"<tr><th>{html.escape(row['figure'])}</th>"
                             + "".join(f"<td>{html.escape(cell_text(c))}</td>" for c in row["columns"]) + "</tr>")
            parts.append("</table>")
        figure = path.with_name("comparison.png")
        if figure.is_file():
            data = base64.b64encode(figure.read_bytes()).decode()
            parts.append(f'<img alt="{html.escape(result["suite"])} comparison" src="data:image/png;base64,{data}">')
    return parts
