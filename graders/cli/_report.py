"""`gradekit report`: one self-contained HTML file over a graded file."""

from __future__ import annotations

from pathlib import Path

import typer

from ._common import fail, human_column_option
from ._view import HUMAN_COLUMN_HELP, LABELS_HELP, ON_HELP, open_results


def report(
    output: Path = typer.Argument(..., help="A graded file (JSONL, CSV or Parquet) from `gradekit grade`, pairwise or --grader."),
    destination: Path = typer.Option(..., "-o", "--output", help="The HTML file to write, e.g. report.html."),
    labels: Path = typer.Option(None, "--labels", help=LABELS_HELP),
    on: str = typer.Option(None, "--on", help=ON_HELP),
    human_column: str = human_column_option(HUMAN_COLUMN_HELP),
    rows: int = typer.Option(5000, "--rows", min=0, help="Rows to include, the worst first: errors, then disagreements, then file order."),
) -> None:
    """Write one HTML file (styles, script and data inlined; opens offline) with the summary, charts and up to --rows rows.

    Exit status 2: OUTPUT or --labels cannot be used, or -o cannot be written (the message says why).
    """
    from ..view import ViewError, write_report

    results = open_results(output, labels, on, human_column, background=False)
    try:
        written = write_report(results, destination, rows)
    except ViewError as e:
        raise fail(str(e)) from e
    except OSError as e:
        raise fail(f"{destination}: {e.strerror or e}") from e
    finally:
        results.close()
    typer.echo(str(written))
