"""`gradekit report`: one self-contained HTML file with the summary, the charts and the worst rows.

The page is the browser's own page and script in report mode, with the styles, the script and
the data inlined, so the file opens offline (nothing is fetched) and can be attached to a ticket.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ._results import ResultsFile
from ._summary import summarise
from ._server import static_text

DEFAULT_ROWS = 5000


def _script_json(payload: Any) -> str:
    """JSON safe inside <script>: no "</script>" or "<!--" can close or confuse the element early."""
    text = json.dumps(payload, ensure_ascii=False, allow_nan=False, default=str)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def report_html(results: ResultsFile, rows: int = DEFAULT_ROWS) -> str:
    """The report page for ``results`` with up to ``rows`` rows, the worst first (errors, then disagreements)."""
    summary = summarise(results)
    chosen = results.worst(rows)
    note = (f"report: {len(chosen):,} of {results.total_rows:,} rows, the worst first (errors, then disagreements)"
            if len(chosen) < results.total_rows else f"report: all {results.total_rows:,} rows")
    data = {"summary": summary, "rows": chosen, "note": note}
    page = static_text("index.html").replace("{{mode}}", "report")
    script = static_text("view.js").replace("</script", "<\\/script")
    replacements = {
        '<link rel="stylesheet" href="/static/view.css">': f"<style>\n{static_text('view.css')}</style>",
        '<script id="gradekit-data" type="application/json">null</script>':
            f'<script id="gradekit-data" type="application/json">{_script_json(data)}</script>',
        '<script src="/static/view.js"></script>': f"<script>\n{script}</script>",
    }
    for old, new in replacements.items():
        if old not in page:
            raise RuntimeError(f"the page template lacks {old!r}")  # a template edit broke the report
        page = page.replace(old, new)
    return page


def write_report(results: ResultsFile, destination: str | Path, rows: int = DEFAULT_ROWS) -> Path:
    """Write the report; a temporary file renamed into place, so a killed run leaves no half page."""
    destination = Path(destination)
    temporary = destination.with_name(destination.name + ".tmp")
    temporary.write_text(report_html(results, rows), encoding="utf-8")
    temporary.replace(destination)
    return destination
