"""The summary of an opened graded file: counts, score histograms, tokens, pairwise orders, agreement with human labels,
an Evals-API run's result_counts and per_testing_criteria_results.

Every figure is one SQL aggregate over the viewer's columnar copy; nothing iterates rows in Python.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..runs._io import file_format
from ._results import DISAGREEMENTS_LISTED, HISTOGRAM_BINS, HUMAN, TABLE, ResultsFile, _literal, _plain, _quote


def _counts(r: ResultsFile, column: str) -> dict[str, int]:
    if column not in r._types:
        return {}
    found = r._db.cursor().execute(
        f"SELECT CAST({_quote(column)} AS VARCHAR) AS v, count(*) AS n FROM {TABLE} WHERE {_quote(column)} IS NOT NULL "
        "GROUP BY v ORDER BY n DESC, v").fetchall()
    return {str(v): int(n) for v, n in found}


def _scores(r: ResultsFile, column: str, value: str | None = None) -> dict[str, Any] | None:
    """Count, mean, range and histogram of a score column (or of the SQL expression ``value``)."""
    if value is None and column not in r._types:
        return None
    db = r._db.cursor()
    value = value or f"TRY_CAST({_quote(column)} AS DOUBLE)"
    n, mean, low, high = db.execute(f"SELECT count({value}), avg({value}), min({value}), max({value}) FROM {TABLE} "
                                    f"WHERE isfinite({value})").fetchone()
    # The reward range [-1, 1] is the histogram's range; a file outside it widens it.
    lo, hi = min(-1.0, low if low is not None else -1.0), max(1.0, high if high is not None else 1.0)
    width = (hi - lo) / HISTOGRAM_BINS
    bins = [0] * HISTOGRAM_BINS
    for b, count in db.execute(f"SELECT least({HISTOGRAM_BINS - 1}, CAST(floor(({value} - ?) / ?) AS INTEGER)) AS b, count(*) "
                               f"FROM {TABLE} WHERE isfinite({value}) GROUP BY b", [lo, width]).fetchall():
        bins[int(b)] = int(count)
    return {"count": int(n), "mean": _plain(mean), "min": _plain(low), "max": _plain(high),
            "histogram": [{"low": round(lo + i * width, 9), "high": round(lo + (i + 1) * width, 9), "count": c}
                          for i, c in enumerate(bins)]}


def _agreement(r: ResultsFile) -> dict[str, Any] | None:
    """Confusion matrix (rows: human, columns: judge), accuracy and Cohen's kappa over judged, labelled rows."""
    if not r.has_human_labels or r.judge_column is None:
        return None
    db = r._db.cursor()
    judge = f"CAST({_quote(r.judge_column)} AS VARCHAR)"
    ok = "CAST(status AS VARCHAR) = 'ok'" if "status" in r._types else "TRUE"
    labelled, failures = db.execute(f"SELECT count(*), count(*) FILTER (WHERE NOT ({ok}) OR {judge} IS NULL) FROM {TABLE} "
                                    f"WHERE {HUMAN} IS NOT NULL").fetchone()
    cells = db.execute(f"SELECT {HUMAN}, {judge}, count(*) FROM {TABLE} WHERE {HUMAN} IS NOT NULL AND {ok} AND {judge} IS NOT NULL "
                       "GROUP BY ALL").fetchall()
    labels = sorted({h for h, _, _ in cells} | {j for _, j, _ in cells})
    at = {label: i for i, label in enumerate(labels)}
    matrix = [[0] * len(labels) for _ in labels]
    for h, j, n in cells:
        matrix[at[h]][at[j]] = int(n)
    judged = sum(map(sum, matrix))
    agreed = sum(matrix[i][i] for i in range(len(labels)))
    accuracy = agreed / judged if judged else None
    kappa = None
    if judged:
        expected = sum(sum(matrix[i]) * sum(row[i] for row in matrix) for i in range(len(labels))) / judged ** 2
        kappa = (accuracy - expected) / (1 - expected) if expected < 1 else None  # type: ignore[operator]
    # With --labels each disagreement carries its --on key, so the page can name the row as the user knows it.
    key = f", CAST({_quote(r.labels.on)} AS VARCHAR) AS \"key\"" if r.labels else ""
    disagreements = r._fetch(
        f"SELECT rowid AS \"index\", {HUMAN}, {judge} AS judge_label{key} FROM {TABLE} WHERE {r._disagrees()} "
        f"ORDER BY rowid LIMIT {DISAGREEMENTS_LISTED}")
    return {"labelled": int(labelled), "judged": judged, "failures": int(failures), "agreed": agreed,
            "disagreed": judged - agreed, "accuracy": accuracy, "kappa": kappa,
            "confusion": {"labels": labels, "matrix": matrix}, "disagreements": disagreements, "on": r.labels.on if r.labels else None,
            "human_source": f"{r.labels.path} ({r.labels.column} on {r.labels.on})" if r.labels
            else ("label" if r.kind == "pairwise" else "input_label")}


def _parts(r: ResultsFile) -> dict[str, Any]:
    """Per-part scores of a composite grader: a --grader run's ``parts`` object, or ``score_<part>`` columns (frames).

    A pairwise file's score_ab/score_ba are its two orders, not parts.
    """
    if r.kind == "pairwise":
        return {}
    parts = {c[len("score_"):]: _scores(r, c) for c in r._types if c.startswith("score_")}
    if "parts" in r._types:
        as_json = "TRY_CAST(parts AS JSON)"
        names = r._db.cursor().execute(
            f"SELECT DISTINCT unnest(json_keys({as_json})) AS k FROM {TABLE} WHERE json_type({as_json}) = 'OBJECT' ORDER BY k LIMIT 100"
        ).fetchall()
        for (name,) in names:
            path = _literal("$." + json.dumps(name))
            parts[name] = _scores(r, name, f"TRY_CAST(json_extract_string({as_json}, {path}) AS DOUBLE)")
    return parts


def _checklist(r: ResultsFile) -> list[dict[str, Any]] | None:
    """Per criterion of a checklist file (its ``checklist`` JSON column): rows, verdicts read, errors, mean score, labels.

    A criterion in error counts as an error, never as a 0 in its mean. None for a file without checklists.
    """
    if "checklist" not in r._types:
        return None
    as_json = "TRY_CAST(checklist AS JSON)"
    items = (f"(SELECT rowid AS r, unnest(CAST({as_json} AS JSON[])) AS c FROM {TABLE} "
             f"WHERE json_type({as_json}) = 'ARRAY')")
    found = r._db.cursor().execute(
        f"SELECT json_extract_string(c, '$.id') AS id, count(*), count(*) FILTER (WHERE json_extract_string(c, '$.status') = 'ok'), "
        f"avg(TRY_CAST(json_extract_string(c, '$.score') AS DOUBLE)), min(r), "
        f"histogram(json_extract_string(c, '$.label')) FROM {items} GROUP BY id ORDER BY min(r), id LIMIT 200").fetchall()
    return [{"id": cid, "rows": int(n), "read": int(ok), "errors": int(n) - int(ok), "mean_score": _plain(mean),
             "labels": {str(k): int(v) for k, v in (labels or {}).items() if k is not None}}
            for cid, n, ok, mean, _, labels in found] or None


# An Evals-API criterion's name, as OpenAI writes it and graders._evals gives it: "<name>-<uuid>".
_CRITERION = r"^.+-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\.passed$"


def _eval_run(r: ResultsFile) -> dict[str, Any] | None:
    """An eval run's figures for a file graded with an Evals-API definition (``--grader eval.json``):
    ``result_counts`` and ``per_testing_criteria_results`` as ``gradekit grade`` reports them
    (graders._evals.run_figures), counted in SQL from the rows' ``metrics`` (``<criterion>.passed``
    and the row's ``passed``). None for any other file."""
    if "metrics" not in r._types or "status" not in r._types:
        return None
    db = r._db.cursor()
    as_json = "TRY_CAST(metrics AS JSON)"
    parts = "TRY_CAST(parts AS JSON)" if "parts" in r._types else "NULL::JSON"
    names: list[str] = []
    # A criterion is "<name>-<uuid>" (OpenAI's names and gradekit's), or any other id a retrieved eval gave it: then
    # known by the eval row's shape, its own "passed" beside "<criterion>.passed" for a criterion among its parts.
    for keys, part_keys in db.execute(f"SELECT json_keys({as_json}), CASE WHEN json_type({parts}) = 'OBJECT' "
                                      f"THEN json_keys({parts}) END FROM {TABLE} WHERE json_type({as_json}) = 'OBJECT' "
                                      "ORDER BY rowid LIMIT 1000").fetchall():
        keys, part_keys = keys or [], set(part_keys or [])
        for key in keys:
            name = key[: -len(".passed")]
            if name not in names and (re.fullmatch(_CRITERION, key) or (
                    key.endswith(".passed") and "passed" in keys and name in part_keys)):
                names.append(name)
    if not names:
        return None

    def number(key: str) -> str:
        return f"TRY_CAST(json_extract_string({as_json}, {_literal('$.' + json.dumps(key))}) AS DOUBLE)"

    ok = "CAST(status AS VARCHAR) = 'ok'"
    columns = [f"count(*) FILTER (WHERE status IS NULL OR NOT ({ok}))", f"count(*) FILTER (WHERE {ok} AND {number('passed')} = 1)"]
    for name in names:
        value = number(name + ".passed")
        columns += [f"count(*) FILTER (WHERE {value} = 1)", f"count(*) FILTER (WHERE {value} IS NOT NULL AND {value} <> 1)"]
    figures = [int(v) for v in db.execute(f"SELECT count(*), {', '.join(columns)} FROM {TABLE}").fetchone()]
    total, errored, passed = figures[:3]
    per = [{"testing_criteria": name, "passed": figures[3 + 2 * i], "failed": figures[4 + 2 * i]} for i, name in enumerate(names)]
    return {"result_counts": {"total": total, "passed": passed, "failed": total - errored - passed, "errored": errored},
            "per_testing_criteria_results": per}


def summarise(r: ResultsFile) -> dict[str, Any]:
    """Counts by status, label and error kind, the score histogram, tokens, pairwise and human-label agreement."""
    r.wait()  # the figures are over the whole file, so the copy must be done
    db = r._db.cursor()
    tokens = None
    if {"prompt_tokens", "completion_tokens"} <= set(r._types):
        p, c = db.execute(f"SELECT sum(TRY_CAST(prompt_tokens AS BIGINT)), sum(TRY_CAST(completion_tokens AS BIGINT)) "
                          f"FROM {TABLE}").fetchone()
        tokens = {"prompt": int(p or 0), "completion": int(c or 0), "total": int(p or 0) + int(c or 0)}
    cost = None
    for name in ("cost_usd", "cost"):
        if name in r._types:
            cost = _plain(db.execute(f"SELECT sum(TRY_CAST({_quote(name)} AS DOUBLE)) FROM {TABLE}").fetchone()[0])
            break
    pairwise = None
    if r.kind == "pairwise":
        pairwise = {"agree": _counts(r, "agree"), "decided_by": _counts(r, "decided_by"),
                    "winner_ab": _counts(r, "winner_ab"), "winner_ba": _counts(r, "winner_ba")}
    parts = _parts(r)
    return {
        "file": str(r.path), "format": file_format(r.path), "kind": r.kind, "rows": r.total_rows,
        "columns": r.columns, "judge_column": r.judge_column,
        "status": _counts(r, "status"), "labels": _counts(r, r.judge_column) if r.judge_column else {},
        "error_kinds": _counts(r, "error_kind"), "score": _scores(r, "score"), "parts": parts,
        # Who answered the rows, as the provider said (docs/align.md#drift-seen), and the rows a canary flagged.
        "served_models": _counts(r, "served_model"), "system_fingerprints": _counts(r, "system_fingerprint"),
        "drift": _counts(r, "drift"),
        "tokens": tokens, "cost_usd": cost, "pairwise": pairwise, "agreement": _agreement(r), "checklist": _checklist(r),
        **(_eval_run(r) or {"result_counts": None, "per_testing_criteria_results": None}),
        "warnings": r.warnings,
    }
