"""The run report's section of suite results: each ``comparison-SUITE/`` that ``flowrl suite run`` wrote into a
results folder (``RUN/suites`` by default, its default ``--out`` for a run folder; ``flowrl report --suites DIR``
for another), as tables with intervals and paired tests, and the comparison figure."""

from __future__ import annotations

import html
import json
from pathlib import Path

from flowrl.suites.compare import LEGEND, cell_text


def suite_section(folder: Path) -> list[str]:
    """HTML lines of the suite comparisons under ``folder`` (nothing when there are none)."""
    found = sorted(Path(folder).glob("comparison-*/comparison.json"))
    if not found:
        return []
    import base64

    parts = ["<h2>Evaluation suites</h2>",
             f"<p>From <code>{html.escape(str(folder))}</code>. {html.escape(LEGEND)}</p>"]
    for path in found:
        try:
            result = json.loads(path.read_text())
            tables = list(result["tables"])
        except (OSError, ValueError, KeyError, TypeError):
            parts.append(f"<p>{html.escape(str(path))}: unreadable (run flowrl suite compare again)</p>")
            continue
        for table in tables:
            comparable = table.get("comparable", table.get("pinned"))
            note = "comparable with published figures" if comparable else "NOT comparable with published figures"
            parts.append(f"<h3>{html.escape(result['suite'])} ({note})</h3>")
            why = [f"<li>{html.escape(t)}: {html.escape('; '.join(r))}</li>"
                   for t, r in zip(table["tags"], table.get("differs", []), strict=False) if r]
            if why:
                parts.append("<ul>" + "".join(why) + "</ul>")
            heads = [f"{t} (n = {n[0]} × {n[1]})" for t, n in zip(table["tags"], table.get("n", []), strict=False)]
            parts.append("<table><tr><th>figure</th>" + "".join(f"<th>{html.escape(h)}</th>"
                                                                 for h in heads or table["tags"]) + "</tr>")
            for row in table["rows"]:
                name = html.escape(row["figure"])
                parts.append(f"<tr><th>{f'<b>{name}</b>' if row.get('headline') else name}</th>"
                             + "".join(f"<td>{html.escape(cell_text(c))}</td>" for c in row["columns"]) + "</tr>")
            parts.append("</table>")
        figure = path.with_name("comparison.png")
        if figure.is_file():
            data = base64.b64encode(figure.read_bytes()).decode()
            parts.append(f'<img class="suite" alt="{html.escape(result["suite"])} comparison" '
                         f'src="data:image/png;base64,{data}">')
    return parts
