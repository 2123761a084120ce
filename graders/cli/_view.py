"""`gradekit view`: a local results browser over a graded file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from gradekit._extras import MissingExtra, require

from .._flags import in_flags
from ._common import fail, human_column_option, map_option
from ._serve import _is_loopback

# The labels joined to a graded file, as `view` and `report` both take them.
LABELS_HELP = "CSV/JSONL/Parquet with human labels, joined to OUTPUT on --on: adds agreement and a 'disagrees' filter."
ON_HELP = "Column both files share, e.g. id (with --labels)."
HUMAN_COLUMN_HELP = "Column of the labels file holding the human label."


def open_results(output: Path, labels: Path | None, on: str | None, human_column: str, *, background: bool,
                 deferred: bool = False) -> Any:
    """Open OUTPUT for viewing (the CLI's errors are exit status 2 with the reason)."""
    try:
        require("view", "gradekit view (and report)")
    except MissingExtra as e:
        raise fail(str(e)) from None
    from ..view import Labels, ResultsFile, ViewError

    if (labels is None) != (on is None):
        raise fail("--labels and --on go together: the labels file and the column both files share")
    if labels is not None and not labels.is_file():
        raise fail(f"{labels}: no such labels file")
    try:
        return ResultsFile(output, labels=Labels(path=labels, on=on, column=human_column) if labels else None,
                           background=background, deferred=deferred)
    except ViewError as e:
        raise fail(str(e)) from e


def view(
    output: Path = typer.Argument(..., help="A graded file (JSONL, CSV or Parquet) from `gradekit grade`, pairwise or --grader."),
    labels: Path = typer.Option(None, "--labels", help=LABELS_HELP),
    on: str = typer.Option(None, "--on", help=ON_HELP),
    human_column: str = human_column_option(HUMAN_COLUMN_HELP),
    rubric: str = typer.Option(None, "-r", "--rubric", help="The rubric the file was graded with: the row view shows the judge prompt rendered again."),
    mapping: list[str] = map_option("VAR=COLUMN, as given to `gradekit grade` (with --rubric)."),
    host: str = typer.Option("127.0.0.1", "--host", envvar="GRADEKIT_VIEW_HOST", help="Bind address; only this machine can see the page unless told otherwise."),
    port: int = typer.Option(8520, "--port", envvar="GRADEKIT_VIEW_PORT", help="Port; 0 picks a free one."),
    no_browser: bool = typer.Option(False, "--no-browser", help="Do not open a browser."),
    annotate: bool = typer.Option(False, "--annotate", help="Labelling mode: label rows in the page into --labels FILE (a JSONL labels store, created if missing), keyed by --on."),
    blind: bool = typer.Option(False, "--blind", help="With --annotate: hide the judge's verdict, score, rationale and raw reply of a row until it is labelled (page and API)."),
    label_values: str = typer.Option(None, "--label-values", help="With --annotate: the labels to choose from, comma-separated [default: --rubric's labels, else those already in FILE and in OUTPUT's label column]."),
    labeller: str = typer.Option(None, "--labeller", help="With --annotate: the name stored with each label [default: the OS user]."),
) -> None:
    """Serve a page over OUTPUT: rows table with paging, sorting, filters and search, a row view, a summary.

    JSON API: GET /api/summary, GET /api/rows?offset=&limit=&status=&label=&error_kind=&score_min=&score_max=&q=&disagree=&flipped=&sort=,
    GET /api/rows/{index}, GET /api/rows/{index}/prompt (see docs/view.md); with --annotate also
    POST /api/rows/{index}/label, GET /api/next?strategy=active|random, GET /api/labels.

    The first line on stdout is the page's URL. Runs until Ctrl-C/SIGTERM.
    Exit status 2: OUTPUT, --labels, --on, --rubric or the label values cannot be used (the message says why); 1: the server could not start (e.g. the port is taken).
    """
    import threading
    import webbrowser

    if not _is_loopback(host):
        typer.echo(f"warning: serving on {host}: anyone who can reach the port can read {output}", err=True)
    pairs = {}
    for pair in mapping:
        var, sep, column = pair.partition("=")
        if not sep or not var or not column:
            raise fail(f"--map {pair!r}: expected VAR=COLUMN")
        pairs[var] = column
    if (blind or label_values or labeller) and not annotate:
        raise fail("--blind, --label-values and --labeller go with --annotate")
    if annotate and (labels is None or not on):
        raise fail("--annotate needs --labels FILE (where the labels are written; created if missing) and --on KEY")
    # Open the file first: its row count starts on a thread and runs while the server stack imports.
    # The copy for filters starts once the first page is answered (or a filter or the summary asks):
    # started at once, it would take the CPU the first page needs.
    results = open_results(output, None if annotate else labels, None if annotate else on, human_column,
                           background=True, deferred=True)
    try:
        judge_rubric = None
        if rubric is not None:
            from gradekit.judge import RubricError, load_rubric

            try:
                judge_rubric = load_rubric(rubric)
            except (RubricError, OSError, ValueError) as e:
                raise fail(f"--rubric {rubric}: {e}") from e

        from ..server._run import RewardServer
        from ..view import ViewError, view_app

        annotator = _annotator(results, labels, on, blind, label_values, labeller, judge_rubric, human_column) if annotate else None
        app = view_app(results, rubric=judge_rubric, mapping=pairs, host=host, annotator=annotator)

        def indexed() -> None:
            try:
                results.wait(start=False)
                typer.echo(f"{output}: {results.total_rows:,} rows; filters, search and the summary are ready", err=True)
            except ViewError as e:
                if not results.closed:  # stopped mid-copy: nothing went wrong
                    typer.echo(f"error: {in_flags(str(e))}", err=True)

        def announce(server: RewardServer) -> None:  # on the server's event loop: nothing here may wait
            typer.echo(server.url)  # first line of stdout: what tests and scripts read
            typer.echo(f"viewing {output}; Ctrl-C stops", err=True)
            if annotator is not None:
                typer.echo(f"labelling into {labels} as {annotator.store.labeller} ({', '.join(annotator.values)})"
                           + (", blind" if blind else "") + f"; {len(annotator.labelled)} labelled already", err=True)
                for warning in annotator.warnings:
                    typer.echo(f"warning: {in_flags(warning)}", err=True)
            threading.Thread(target=indexed, name="gradekit-view-announce", daemon=True).start()
            if not no_browser:
                webbrowser.open(server.url)

        server = RewardServer(app, host=host, port=port, graceful_timeout=2.0, log_level="warning", on_started=announce)
        try:
            server.serve()
        except RuntimeError as e:
            raise fail(f"could not serve on {host}:{port}: {e}", code=1) from e
        except SystemExit as e:  # uvicorn's own exit when it cannot bind (its reason is logged above)
            raise fail(f"could not serve on {host}:{port} (is the port taken? --port 0 picks a free one)", code=1) from e
    finally:
        results.close()


def _annotator(results: Any, labels: Path, on: str, blind: bool, label_values: str | None, labeller: str | None,
               rubric: Any, human_column: str) -> Any:
    """The labelling mode's state: the store (refused if a symlink), the vocabulary, the judge columns to hide."""
    from ..calibration._labels import LabelsError, LabelStore, read_labels
    from ..view import ViewError
    from ..view._annotate import Annotator, hidden_columns

    if on not in results.columns:
        raise fail(f"--on {on!r}: {results.path} has no such column (it has: {', '.join(results.columns)})")
    if human_column != "label":
        raise fail("--human-column does not go with --annotate: the labels store's column is 'label'")
    try:
        existing = read_labels(labels, on)
        store = LabelStore(labels, on, labeller)
    except LabelsError as e:
        raise fail(str(e)) from e
    if label_values:
        values = [v.strip() for v in label_values.split(",") if v.strip()]
    elif rubric is not None:
        values = ["1", "2", "tie"] if results.kind == "pairwise" else list(rubric.labels)
    else:
        from ..view._annotate import usable_label

        values = list(dict.fromkeys(str(r["label"]).strip() for r in existing.records
                                    if usable_label(r) and r.get("label") is not None))
        try:  # then the labels the judge gave in the graded file (its own `label` column): the rubric's vocabulary in use
            values += results.label_vocabulary()
        except Exception as e:  # noqa: BLE001  (a file DuckDB cannot read is reported when it is copied)
            typer.echo(f"warning: could not read the labels of {results.path}: {str(e).splitlines()[0]}", err=True)
    values = list(dict.fromkeys(values))
    if not values:
        store.close()
        raise fail(f"no label values: pass --label-values a,b,c (or --rubric NAME for its labels); {labels} holds no labels "
                   f"yet and {results.path} no judge label column to take them from")
    scores = None
    if rubric is not None and results.kind != "pairwise":
        scores = dict(rubric.labels)
    if blind:
        results.unsearched = hidden_columns(results.columns, results.kind)  # before the copy builds the search text
    try:
        return Annotator(results, store, values, blind=blind, label_scores=scores)
    except ViewError as e:
        store.close()
        raise fail(str(e)) from e
