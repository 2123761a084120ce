"""See the judgements: a local results browser (`gradekit view`) and a one-file HTML report (`gradekit report`).

``_results`` opens a graded file with DuckDB (paging, filters, sorting and search run as SQL
over a columnar copy, never over the whole file in memory); ``_summary`` aggregates it (counts,
histograms, agreement with human labels); ``_server`` serves the
page and its JSON API; ``_annotate`` its labelling mode (`--annotate`, `--blind`); ``_report`` inlines the same page, script and the worst rows into one
HTML file; ``_prompt`` renders a row's judge prompt again from its rubric. The page's assets
live in ``static/`` and ship in the wheel.
"""

from gradekit.judge._lazy import lazy_names

__all__, __getattr__, __dir__ = lazy_names(__name__, {
    "._report": ["report_html", "write_report"],
    "._results": ["Labels", "Page", "ResultsFile", "RowFilter", "ViewError"],
    "._server": ["view_app"],
    "._summary": ["summarise"],
})
