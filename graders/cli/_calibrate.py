"""`gradekit calibrate`: how well a graded file's verdicts agree with human labels."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table

from gradekit._extras import require

from .._flags import in_flags
from ._common import fail, human_column_option, json_option, print_json

if TYPE_CHECKING:  # numpy, scipy and matplotlib load when the command runs, not for --help
    from ..calibration._agreement import FileCalibration, Interval


def _load(path: Path, what: str) -> list[dict]:
    from ..runs._io import InputError, read_rows

    rows = []
    for row in read_rows(path):
        if isinstance(row, Exception):
            raise InputError(f"{what} {row}")
        rows.append(row)
    if not rows:
        raise InputError(f"{path}: no rows")
    return rows


def calibrate(
    graded: Path = typer.Argument(..., help="A file written by `gradekit grade` (CSV or JSONL)."),
    labels: Path = typer.Option(None, "--labels", help="CSV/JSONL with the human labels; joined to GRADED on --on."),
    on: str = typer.Option(None, "--on", help="Column both files share, e.g. id (needed with --labels)."),
    human_column: str = human_column_option("Column holding the human label."),
    judge_column: str = typer.Option(None, "--judge-column", help="Column holding the judge's verdict [default: winner for pairwise files, else label]."),
    ordinal: bool = typer.Option(False, "--ordinal", help="Labels are ordered: weighted (quadratic) kappa."),
    order: str = typer.Option(None, "--label-order", help="Comma-separated label order for the confusion matrix and ordinal weights."),
    group: str = typer.Option(None, "--group", help="Column to average correlations within (G-Eval's per-document average)."),
    convention: str = typer.Option("llmbar", "--convention", help="Pairwise Acc/Agr: llmbar (a failed order counts wrong) or skip."),
    bootstrap: int = typer.Option(1000, "--bootstrap", help="Bootstrap resamples for the 95% intervals (0: none)."),
    plots: Path = typer.Option(None, "--plots", help="Write PNG plots into this folder."),
    disagreements: int = typer.Option(10, "--show", help="Disagreements to list (the JSON has all)."),
    json_output: bool = json_option("report"),
    ppi: bool = typer.Option(False, "--ppi", help="Estimate the mean human score over all GRADED rows by prediction-powered inference (needs --labels and --on)."),
    alpha: float = typer.Option(0.05, "--alpha", help="With --ppi: 1 - the confidence of the intervals."),
    rubric: str = typer.Option(None, "-r", "--rubric", help="With --ppi: the rubric whose label -> score map turns a human label into a score [default: a numeric 'score' column in LABELS, pairwise winners, or the graded rows' own labels]."),
    label_map: list[str] = typer.Option([], "--label-map", help="HUMAN=JUDGE pairs, comma-separated or repeated (e.g. yes=correct,no=incorrect): the human labels in the judge's vocabulary."),
    criteria_labels: str = typer.Option(None, "--criteria-labels", metavar="COLUMN", help="A checklist file: COLUMN holds each row's human labels per criterion ({criterion id: label}); reports agreement per criterion, pooled and for the whole row (docs/grading.md)."),
) -> None:
    """Accuracy, per-label precision/recall/F1, confusion, kappa, correlations and bootstrap intervals of a
    graded file against human labels; for pairwise files also LLMBar's Acc/Agr and position bias.

    With --ppi: the mean human score over every graded row, estimated from the judge's scores and the
    human labels of some rows (PPI, Angelopoulos et al. 2023), beside the human-only and judge-only means.
    Labels with a recorded draw probability `p` (from `gradekit view --annotate`) are weighted by it
    (IPW PPI, as in Zrnic and Candès 2024). A labels store (JSONL lines with labeller and time, as
    `view --annotate` writes them): the last line per key wins; a plain labels table (CSV, Parquet or
    JSONL of key and label) labelling a key twice with different labels is exit 2. Human labels sharing no value with the judge's are an error (see --label-map).
    Exit status: 0 done, 2 bad input or option."""
    require("calibration", "gradekit calibrate")
    from ..calibration._agreement import calibrate_rows
    from ..runs._io import InputError

    if convention not in ("llmbar", "skip"):
        raise fail(f"--convention must be llmbar or skip, not {convention!r}")
    if criteria_labels is not None:
        _calibrate_checklist(graded, labels, on, criteria_labels, rubric, bootstrap, json_output, disagreements)
        return
    if ppi and (labels is None or not on):
        raise fail("--ppi needs --labels FILE and --on KEY: the labelled rows are the GRADED rows whose KEY has a human label")
    from ..calibration._labels import mapped, parse_label_map

    try:
        pairs = parse_label_map(label_map)
        graded_rows = _load(graded, "graded file")
        label_rows = _labels(labels, on, human_column) if labels is not None else None
        if label_rows is not None:
            label_rows = mapped(label_rows, human_column, pairs)
        elif pairs:
            graded_rows = mapped(graded_rows, human_column if human_column != "label" else "input_label", pairs)
        _check_vocabulary(graded_rows, label_rows, on, human_column, judge_column, labels)
        # Numeric human scores alone (a 'score' column, no label column) feed PPI but no classification report.
        classify = not (ppi and label_rows is not None and any(human_column not in r for r in label_rows))
        result = None if not classify else calibrate_rows(
            graded_rows, label_rows, on=on, human_column=human_column, judge_column=judge_column,
            source=str(graded), labels_source=str(labels), ordinal=ordinal,
            labels=[x.strip() for x in order.split(",")] if order else None, group_column=group,
            convention=convention, bootstrap=bootstrap,  # type: ignore[arg-type]
        )
        estimate = _ppi(graded_rows, label_rows, on, human_column, rubric, alpha, graded, labels) if ppi else None
    except (InputError, ValueError) as e:
        raise fail(str(e)) from e
    written = _plots(result, plots) if plots is not None and result is not None else []
    if json_output:
        extra = {"ppi": estimate.model_dump()} if estimate is not None else {}
        print_json({"graded": str(graded), "labels": str(labels) if labels else None, "plots": written,
                    **(result.model_dump() if result is not None else {}), **extra})
        return
    if result is not None:
        _print(result, Console(), disagreements)
    if estimate is not None:
        _print_ppi(estimate, Console(highlight=False))
    for path in written:
        Console().print(f"plot: {path}", highlight=False)


def _calibrate_checklist(graded: Path, labels: Path | None, on: str | None, column: str, rubric: str | None, bootstrap: int,
                         json_output: bool, show: int) -> None:
    """``--criteria-labels``: a checklist's verdicts against per-criterion human labels (graders.calibration._checklist)."""
    from ..calibration._checklist import calibrate_checklist
    from ..runs._io import InputError

    try:
        rows = _load(graded, "graded file")
        if labels is not None:
            if not on:
                raise InputError("--labels with --criteria-labels needs --on KEY to join the two files")
            human = {str(r.get(on)): r.get(column) for r in _load(labels, "labels file") if r.get(on) is not None}
            rows = [{**r, column: human.get(str(r.get(on)))} for r in rows]
        fixed = None
        if rubric is not None:
            from gradekit.judge import RubricError, load_rubric

            try:
                spec = load_rubric(rubric)
            except RubricError as e:
                raise InputError(str(e)) from None
            fixed = {c.id: c.offered(spec.labels) for c in spec.criteria or []}
        result = calibrate_checklist(rows, column, source=str(graded), bootstrap=bootstrap, rubric_labels=fixed)
    except (InputError, ValueError) as e:
        raise fail(str(e)) from e
    if json_output:
        print_json(result.model_dump())
        return
    console = Console(highlight=False)
    table = Table(title=f"checklist agreement with {column!r}, per criterion", box=None)
    for heading in ("criterion", "n", "judged", "agreement", "kappa", "judge errors"):
        table.add_column(heading, justify="left" if heading == "criterion" else "right")

    def add(name: str, c: Any) -> None:
        table.add_row(name, str(c.n), str(c.judged), _pct(c.accuracy, c.accuracy_ci), _num(c.kappa), str(c.failures))

    for cid, c in result.criteria.items():
        add(cid, c)
    if result.pooled is not None:
        add("all criteria", result.pooled)
    console.print(table)
    r = result.row
    line = f"whole row: {r.n} rows, every labelled criterion agrees in {_pct(r.all_agree)}"
    if r.mean_abs_score_error is not None:
        line += f", mean |judge - human| row score {r.mean_abs_score_error:.3f}"
    if r.correlation is not None and r.correlation.spearman is not None:
        line += f", Spearman {_num(r.correlation.spearman)}"
    console.print(line + (f"; {r.judge_errors} labelled rows are judge errors" if r.judge_errors else ""))
    if result.unknown_criteria:
        console.print(f"note: {result.unknown_criteria} human labels name a criterion the row's checklist lacks")
    disagreements = [d for c in result.criteria.values() for d in c.disagreements][:show]
    for d in disagreements:
        console.print(f"  {d.id}: human {d.human!r}, judge {d.judge if d.judge is not None else '<' + (d.error_kind or 'error') + '>'!r}",
                      markup=False)


def _labels(path: Path, on: str | None, column: str = "label") -> list[dict]:
    """The labels file's rows, read as every command reads one (graders/calibration/_labels.py: a labels store's last
    line per key wins; a table's key labelled twice with different labels is an error naming it)."""
    from ..calibration._labels import LabelsError, read_label_file
    from ..runs._io import InputError

    if not on:
        return _load(path, "labels file")
    if not path.is_file():
        raise InputError(f"{path}: no such labels file")
    try:
        state = read_label_file(path, on, column)
    except LabelsError as e:
        raise InputError(str(e)) from None
    if state.keyless and not state.records:
        return _load(path, "labels file")  # no row has --on's key: read as a table, whose errors name the columns
    for warning in state.warnings:
        typer.echo(f"warning: {in_flags(warning)}", err=True)
    if not state.records:
        raise InputError(f"{path}: no labels (no line with {on!r} and a label)")
    return state.records


def _check_vocabulary(graded_rows, label_rows, on, human_column, judge_column, labels) -> None:
    """Human labels that share no value with the judge's: every row would disagree (accuracy 0) silently."""
    from ..calibration._agreement import as_label
    from ..calibration._labels import check_vocabularies

    pairwise = bool(graded_rows) and "winner_ab" in graded_rows[0]
    judge = judge_column or ("winner" if pairwise else "label")
    if label_rows is not None:
        if any("score" in r and human_column not in r for r in label_rows):
            return  # numeric human scores, no labels to compare
        human = [as_label(r.get(human_column)) for r in label_rows]
        source = f"human labels in {labels}"
    else:
        column = f"input_{human_column}" if human_column == judge and f"input_{human_column}" in graded_rows[0] else human_column
        human = [as_label(r.get(column)) for r in graded_rows]
        source = f"human labels ({column})"
    verdicts = [as_label(r.get(judge)) for r in graded_rows if r.get("status") in (None, "", "ok")]
    check_vocabularies(human, verdicts, source, f"the judge ({judge})")


def _ppi(graded_rows, label_rows, on, human_column, rubric, alpha, graded, labels):
    from gradekit.judge import load_rubric

    from ..calibration._ppi import ppi_rows

    label_scores = dict(load_rubric(rubric).labels) if rubric else None
    return ppi_rows(graded_rows, label_rows, on=on, human_column=human_column, label_scores=label_scores, alpha=alpha,
                    source=str(graded), labels_source=str(labels))


def _print_ppi(p, console: Console) -> None:
    confidence = f"{(1 - p.alpha) * 100:g}%"
    table = Table(title=f"mean human score over all {p.n_labeled + p.n_unlabeled} rows, {confidence} intervals", box=None)
    for heading in ("estimator", "estimate", "interval", "width"):
        table.add_column(heading, justify="left" if heading == "estimator" else "right")
    h = p.human_only
    table.add_row(f"PPI ({p.n_labeled} labelled + {p.n_unlabeled} judged)", f"{p.estimate:.4f}",
                  f"[{p.ci_low:.4f}, {p.ci_high:.4f}]", f"{p.ci_high - p.ci_low:.4f}")
    table.add_row(f"human labels only ({p.n_labeled})", f"{h.estimate:.4f}", f"[{h.ci_low:.4f}, {h.ci_high:.4f}]",
                  f"{h.ci_high - h.ci_low:.4f}")
    table.add_row("judge only (no interval: its bias is unknown)", f"{p.judge_only.estimate:.4f}", "-", "-")
    console.print(table)
    if p.width_ratio is not None:
        console.print(f"the PPI interval is {p.width_ratio:.2f}x the human-only width"
                      + (" : the judge's scores bought precision" if p.width_ratio < 1 else ": the judge bought nothing here"))
    if p.rows_without_judge_score:
        console.print(f"{p.rows_without_judge_score} graded rows have no judge score (errors) and are left out")
    if p.method == "ipw-ppi":
        console.print("labels drawn with recorded probabilities: inverse-probability weighted (Des Raj's sequential form)")
    if p.score_range is not None:
        console.print(f"intervals are clipped to the score's range [{p.score_range[0]:g}, {p.score_range[1]:g}]")
    for warning in p.warnings:
        console.print(f"note: {warning}")


def _plots(result: FileCalibration, folder: Path) -> list[str]:
    from ..calibration._agreement import plot_confusion, plot_position_bias, plot_scores

    folder.mkdir(parents=True, exist_ok=True)
    written = [folder / "confusion.png"]
    plot_confusion(result.classification, written[0])
    pairs = [(h, j) for h, j in zip(result.human_scores, result.judge_scores) if h is not None and j is not None]
    if pairs:
        written.append(folder / "scores.png")
        plot_scores([h for h, _ in pairs], [j for _, j in pairs], written[-1])
    if result.pairwise is not None and result.pairwise.orders == 2:
        written.append(folder / "position_bias.png")
        plot_position_bias({"judge": result.pairwise}, written[-1])
    return [str(p) for p in written]


def _fmt(value: float | None, ci: Interval | None, spec: str) -> str:
    if value is None:
        return "n/a"
    text = format(value, spec)
    if ci is not None and ci.low is not None and ci.high is not None:
        text += f"  [{format(ci.low, spec)}, {format(ci.high, spec)}]"
    return text


def _pct(value: float | None, ci: Interval | None = None) -> str:
    return _fmt(value, ci, ".1%")


def _num(value: float | None, ci: Interval | None = None) -> str:
    return _fmt(value, ci, ".3f")


def _print(result: FileCalibration, console: Console, show: int) -> None:
    c = result.classification
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_row("items", f"{c.n} labelled ({c.unlabelled} without a human label), {c.judged} judged, {c.failures} judge failures")
    if result.labels_without_graded_row:
        table.add_row("", f"{result.labels_without_graded_row} human labels have no graded row")
    table.add_row("accuracy", _pct(c.accuracy, c.accuracy_ci))
    table.add_row("kappa" + (f" ({c.kappa_weights})" if c.kappa_weights else ""), _num(c.kappa, c.kappa_ci))
    table.add_row("macro F1", _num(c.macro_f1))
    table.add_row("failures", f"{c.failure_rate:.1%} (parse failures {c.parse_failure_rate:.1%})"
                  + (f": {', '.join(f'{k} {v}' for k, v in c.failures_by_kind.items())}" if c.failures_by_kind else ""))
    table.add_row("base rates", "human " + ", ".join(f"{k} {v:.0%}" for k, v in c.base_rates.get("human", {}).items())
                  + " | judge " + ", ".join(f"{k} {v:.0%}" for k, v in c.base_rates.get("judge", {}).items()))
    if c.correlation is not None and c.correlation.spearman is not None:
        r = c.correlation
        line = f"Spearman {_num(r.spearman, r.spearman_ci)}, Kendall {_num(r.kendall, r.kendall_ci)}"
        if r.groups:
            line += f"; per-group mean Spearman {_num(r.spearman_group_mean)}, Kendall {_num(r.kendall_group_mean)} ({r.groups} groups)"
        table.add_row("correlation", line)
    p = result.pairwise
    if p is not None and p.orders == 1:
        table.add_row("pairwise", f"Acc {_pct(p.acc, p.acc_ci)} (one order: the input order only, graded with --no-swap); "
                                  "no Agr, conflicts or position bias without the swapped order")
    elif p is not None:
        table.add_row("pairwise", f"Acc {_pct(p.acc, p.acc_ci)} (order ab {_pct(p.acc_ab)}, ba {_pct(p.acc_ba)}), "
                                  f"Agr {_pct(p.agr)} [{p.convention}]")
        table.add_row("position bias", f"first-shown output wins {_pct(p.first_position_win_rate)} of "
                                       f"{p.decisive_verdicts} verdicts (p={p.position_bias_p:.3g})" if p.position_bias_p is not None
                      else "n/a")
        table.add_row("conflicts", f"{p.conflicts} of {p.both_judged} pairs ({_pct(p.conflict_rate)})")
    console.print(table)

    labels = Table(title="per label; confusion: rows human, columns j:<judge label>")
    labels.add_column("label")
    for heading in ("prec", "recall", "F1", "n", *[f"j:{x}" for x in c.labels]):
        labels.add_column(heading, justify="right")
    for k, lab in enumerate(c.labels):
        stats = c.per_label.get(lab)
        cells = [f"{stats.precision:.3f}", f"{stats.recall:.3f}", f"{stats.f1:.3f}", str(stats.support)] if stats else ["-"] * 4
        row = c.confusion[k] if k < len(c.confusion) else [0] * len(c.labels)
        labels.add_row(lab, *cells, *[str(x) for x in row])
    console.print(labels)
    if c.disagreements and show > 0:
        console.print(f"disagreements ({len(c.disagreements)}; first {min(show, len(c.disagreements))}):")
        for d in c.disagreements[:show]:
            judge = d.judge if d.judge is not None else f"<{d.error_kind or 'error'}>"
            console.print(f"  {result.key or 'row'}={d.id}: human {d.human!r}, judge {judge!r}", highlight=False, markup=False)
