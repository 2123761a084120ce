"""The viewer's labelling mode (`gradekit view --annotate`): label rows, blind, in the order that helps PPI most.

Routes (besides the browser's own):
  POST /api/rows/{index}/label   {"label": "correct" | null (undo), "note": "..."} -> {"record": what was stored, ...}
                                 answered after the line is fsynced; 400 a label outside the vocabulary, 404 no such row
  GET  /api/next?strategy=active|random  -> {"index", "p"}: an unlabelled row and the probability it was drawn with
  GET  /api/labels               -> the vocabulary, progress and the PPI interval so far

``--blind`` takes every judge-derived column out of an unlabelled row in every JSON answer (rows,
one row, search, the summary), and refuses the filters and sorts that would reveal them.

Writes are guarded against other web pages: the Host check (see ``_server``), a JSON body only
(a cross-site form or ``text/plain`` POST is refused with 415; a JSON one needs a CORS preflight,
which is never granted), an ``Origin`` or ``Sec-Fetch-Site`` naming another site is 403 (for
``/api/next`` too: a draw records the offer whose p is stored with the label), and a browser's
write (one that sends ``Origin``) must carry the page's per-process token.
"""

from __future__ import annotations

import hmac
import json
import math
import os
import random
import secrets
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .._flags import in_flags
from ..calibration._labels import LabelStore, _key, as_number, draw_probabilities, uncertainty
from ._results import HUMAN, ResultsFile, RowFilter, ViewError

API_VERSION = 1
MAX_BODY = 64 * 1024
MAX_NOTE = 10_000
TOKEN_HEADER = "x-gradekit-token"

# Every column a judge wrote (or that follows from what it wrote): --blind hides them until the row is labelled.
JUDGE_COLUMNS = frozenset({
    "score", "label", "error", "rationale", "reasoning", "raw_reply", "raw_reply_ab", "raw_reply_ba", "attempts",
    "winner", "decided_by", "agree", "orders_read", "winner_ab", "winner_ba", "label_ab", "label_ba", "score_ab", "score_ba",
    "rationale_ab", "rationale_ba", "reasoning_ab", "reasoning_ba", "jurors", "agreement", "confidence", "parts", "verdicts",
    "stage", "stages", "escalated", "metrics",  # a --grader row's metrics: each part's score, an eval's "<criterion>.passed"
    "checklist", "criteria_read",  # a checklist row's verdicts (and criteria.<id>.label / .score, below)
})
UNCERTAINTY_COLUMNS = ("score", "status", "agree", "agreement", "confidence")


def hidden_columns(columns: Sequence[str], kind: str) -> frozenset[str]:
    """The judge-derived columns of a file (``label`` is the input's gold label in a pairwise file, not the judge's)."""
    hidden = {c for c in columns if c in JUDGE_COLUMNS or c.startswith(("score_", "metric_", "juror_", "judge_"))
              or (c.startswith("criteria.") and c.endswith((".label", ".score")))}
    if kind == "pairwise":
        hidden.discard("label")
    return frozenset(hidden)


def _json(payload: Any, status: int = 200) -> JSONResponse:
    return JSONResponse({"version": API_VERSION, **payload}, status_code=status, headers={"Cache-Control": "no-store"})


def _error(message: str, status: int) -> JSONResponse:
    return _json({"error": message}, status)


class Annotator:
    """The labelling state over an opened file: row keys, the judge's uncertainty per row, the store, the offers."""

    def __init__(self, results: ResultsFile, store: LabelStore, values: Sequence[str], *, blind: bool = False,
                 label_scores: Mapping[str, float] | None = None) -> None:
        self.results, self.store, self.on, self.blind = results, store, store.on, blind
        self.values = list(values)
        self.token = secrets.token_urlsafe(24)
        self.hidden = hidden_columns(results.columns, results.kind) if blind else frozenset()
        self._lock = threading.Lock()
        self._random = random.SystemRandom()
        table = results.column_values([self.on, *UNCERTAINTY_COLUMNS, "label", "winner_ab"])
        self.keys: list[str | None] = []  # as the store reads them back (text)
        self.written: list[Any] = []  # as the file holds them: an int key is written as an int, so the store joins as typed
        self.index_of: dict[str, int] = {}
        for row in table:
            raw = row.get(self.on)
            key = _key(raw)
            number = isinstance(raw, (int, float)) and not isinstance(raw, bool) and key is not None
            self.written.append((int(raw) if isinstance(raw, float) and raw.is_integer() else raw) if number else key)
            if key is not None and key in self.index_of:
                raise ViewError(f"{results.path}: key {self.on}={key!r} appears in rows {self.index_of[key]} and {row['index']}; "
                                "--on must name a column whose values are unique")
            if key is not None:
                self.index_of[key] = len(self.keys)
            self.keys.append(key)
        self.f = [_score(row) for row in table]
        found = [v for v in self.f if v is not None]
        scores = dict(label_scores or {}) or _label_scores(table, results.kind)
        self.label_scores = scores
        known = found + list(scores.values())
        self.range = (min(known), max(known)) if known and min(known) < max(known) else None
        self.u = [uncertainty(row, self.range) for row in table]
        state = store.read()
        self.warnings = list(state.warnings)
        self.labelled: dict[str, dict[str, Any]] = {}  # key -> effective record, entry order
        for record in state.records:
            if usable_label(record):
                self.labelled[str(record[self.on])] = record
            else:  # e.g. a line with the key only, or a label that is an object: the row stays to be labelled
                self.warnings.append(f"{store.path}: {self.on}={record[self.on]}: label {record.get('label')!r} is neither "
                                     "a text nor a number, ignored (the row counts as unlabelled)")
        self.offered: dict[int, float] = {}
        self._seen_size = _size(store.path)  # the store as read: another viewer's appends change it (see _sync)
        if scores and not set(self.values) & set(scores):
            self.warnings.append(f"no label value ({', '.join(self.values)}) is one of the judge's ({', '.join(scores)}): "
                                 "the PPI card stays empty and the active order cannot learn; calibrate will need --label-map")

    # -- state ----------------------------------------------------------------------------------

    def _sync(self) -> None:
        """Take in what other writers appended to the store (another viewer on the same file, a second labeller), so
        a row someone else labelled is not offered again. Called under the lock; a read only when the file changed."""
        size = _size(self.store.path)
        if size == self._seen_size:
            return
        state = self.store.read()
        self.labelled = {str(r[self.on]): r for r in state.records if usable_label(r)}
        self._seen_size = size

    def is_labelled(self, index: int) -> bool:
        key = self.keys[index] if 0 <= index < len(self.keys) else None
        return key is not None and key in self.labelled

    def present(self, row: dict[str, Any]) -> dict[str, Any]:
        """A row as the API shows it in labelling mode: the person's label and note beside it; blind: judge columns
        gone until it is labelled."""
        index = row.get("index")
        key = self.keys[index] if isinstance(index, int) and 0 <= index < len(self.keys) else None
        record = self.labelled.get(key) if key is not None else None
        out = {k: v for k, v in row.items() if not (self.blind and record is None and k in self.hidden)}
        out[HUMAN] = record.get("label") if record else None
        out["human_note"] = record.get("note") if record else None
        out["labelled"] = record is not None
        if self.blind and record is None:
            out["hidden"] = sorted(self.hidden & set(row))
        return out

    def _y(self, label: Any) -> float | None:
        return self.label_scores.get(str(label)) if label is not None else None

    def _seen(self) -> list[tuple[float | None, float]]:
        """(uncertainty, squared correction in range units) of each labelled row with a judge score and a scored label."""
        width = (self.range[1] - self.range[0]) if self.range else 1.0
        out = []
        for key, record in self.labelled.items():
            i = self.index_of.get(key)
            y = self._y(record.get("label"))
            if i is not None and self.f[i] is not None and y is not None:
                out.append((self.u[i], ((y - self.f[i]) / width) ** 2))  # type: ignore[operator]
        return out

    def next(self, strategy: str) -> tuple[int, float] | None:
        """Draw an unlabelled row; its probability is remembered and stored with its label (the IPW weight)."""
        with self._lock:
            self._sync()
            left = [i for i, k in enumerate(self.keys) if k is not None and k not in self.labelled]
            if not left:
                return None
            q = draw_probabilities([self.u[i] for i in left], strategy, self._seen())
            pick = self._random.choices(range(len(left)), weights=q)[0]
            index, p = left[pick], q[pick]
            self.offered[index] = p  # stored with the row's label if it is labelled before it is drawn again
            return index, p

    def label(self, index: int, label: str | None, note: str | None) -> dict[str, Any]:
        key = self.keys[index]
        if key is None:
            raise ViewError(f"row {index} has no {self.on!r}: it cannot be labelled")
        with self._lock:
            self._sync()
            entering = label is not None and key not in self.labelled
            p = self.offered.pop(index, None) if entering else None
            record = self.store.append(self.written[index], label, note, p)
            if label is None:
                self.labelled.pop(key, None)
            elif entering:
                self.labelled[key] = dict(record)
            else:
                self.labelled[key] = {**record, "p": self.labelled[key].get("p")}
            return record

    def labelled_count(self) -> int:
        with self._lock:
            self._sync()
            return sum(1 for k in self.labelled if k in self.index_of)

    def progress(self) -> dict[str, Any]:
        total = sum(1 for k in self.keys if k is not None)
        with self._lock:  # a snapshot: a label posted meanwhile (another thread) must not change the dict mid-iteration
            self._sync()
            snapshot = dict(self.labelled)
        labelled = sum(1 for k in snapshot if k in self.index_of)
        out: dict[str, Any] = {"labelled": labelled, "total": total, "values": self.values, "on": self.on,
                               "blind": self.blind, "labeller": self.store.labeller, "file": str(self.store.path),
                               "warnings": self.warnings, "ppi": None, "ppi_error": None}
        graded = [{self.on: k, "score": f, "status": "ok" if f is not None else "error"}
                  for k, f in zip(self.keys, self.f) if k is not None]
        records = [r for r in snapshot.values() if str(r[self.on]) in self.index_of]
        if len(records) >= 2:
            from ..calibration._ppi import PPIError, ppi_rows

            try:
                report = ppi_rows(graded, records, on=self.on, label_scores=self.label_scores)
                out["ppi"] = {"estimate": report.estimate, "ci_low": report.ci_low, "ci_high": report.ci_high,
                              "method": report.method, "n_labeled": report.n_labeled}
            except PPIError as e:
                out["ppi_error"] = in_flags(str(e))  # the viewer is the command line's: a field is said as its flag
        return out


def _size(path: Any) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return -1


def usable_label(record: Mapping[str, Any]) -> bool:
    """A store record the viewer counts as labelled: a label that is text or a number, or a numeric human score."""
    label = record.get("label")
    if isinstance(label, (str, int, float)) and not isinstance(label, bool) and str(label).strip():
        return True
    score = record.get("score")
    return label is None and isinstance(score, (int, float)) and not isinstance(score, bool) and math.isfinite(score)


def _score(row: Mapping[str, Any]) -> float | None:
    return as_number(row.get("score")) if row.get("status") in (None, "", "ok") else None


def _label_scores(table: Sequence[Mapping[str, Any]], kind: str) -> dict[str, float]:
    if kind == "pairwise":
        return {"1": 1.0, "2": -1.0, "tie": 0.0}
    found: dict[str, float] = {}
    for row in table:
        score = _score(row)
        if row.get("label") is not None and score is not None:
            found.setdefault(str(row["label"]), score)
    return found


# -- the API --------------------------------------------------------------------------------------

def check_blind_filter(annotator: Annotator | None, f: RowFilter) -> None:
    """--blind: a filter or sort on a hidden column would tell what the judge said; refuse it (400). In labelling
    mode ``disagree`` is refused too: it compares with labels fixed when the file was opened, not the live store."""
    if annotator is None:
        return
    if f.disagree:
        raise ViewError("disagree: not in --annotate mode (labels change as you label); "
                        "`gradekit report OUTPUT --labels FILE --on KEY` lists the disagreements")
    if not annotator.blind:
        return
    used = [name for name, on in (("label", f.label), ("score_min", f.score_min is not None),
                                  ("score_max", f.score_max is not None), ("disagree", f.disagree), ("flipped", f.flipped)) if on]
    if f.sort and f.sort.lstrip("-") in annotator.hidden:
        used.append(f"sort={f.sort}")
    if used:
        raise ViewError(f"{used[0]}: hidden in --blind mode (it would show the judge's verdict before you label)")


def blind_summary(annotator: Annotator, summary: dict[str, Any]) -> dict[str, Any]:
    """The summary with every judge-derived figure taken out."""
    return {**summary, "labels": {}, "score": None, "parts": {}, "pairwise": None, "agreement": None,
            "result_counts": None, "per_testing_criteria_results": None,
            "columns": [c for c in summary.get("columns", []) if c not in annotator.hidden], "blind": True}


def _same_origin(request: Request) -> str | None:
    """Why a write request may come from another site, or None when it is this page's (or no browser's) own."""
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return f"Sec-Fetch-Site {site!r}"
    origin = request.headers.get("origin")
    if origin is not None:
        host = request.headers.get("host", "")
        if origin.rstrip("/").lower() not in (f"http://{host}".lower(), f"https://{host}".lower()):
            return f"Origin {origin!r} is not this viewer's"
    return None


def annotate_routes(annotator: Annotator, row_of: Any) -> list[Route]:
    """The labelling routes; ``row_of(request)`` is the server's own row lookup (a dict, or an error Response)."""

    async def post_label(request: Request) -> Response:
        why = _same_origin(request)
        if why is not None:
            return _error(f"refused: {why} (labels are written only from the viewer's own page)", 403)
        if request.headers.get("origin") is not None and not hmac.compare_digest(
                request.headers.get(TOKEN_HEADER, ""), annotator.token):
            return _error(f"refused: a browser's write needs the page's {TOKEN_HEADER} header", 403)
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind != "application/json":
            return _error("the body must be JSON (Content-Type: application/json)", 415)
        body = await request.body()
        if len(body) > MAX_BODY:
            return _error(f"the body is over {MAX_BODY} bytes", 413)
        try:
            payload = json.loads(body)
        except ValueError:
            return _error("the body is not JSON", 400)
        if not isinstance(payload, dict) or "label" not in payload:
            return _error('the body must be an object with "label" (null to undo) and optionally "note"', 400)
        unknown = sorted(set(payload) - {"label", "note"})
        if unknown:
            return _error(f"{unknown[0]}: not a field of a label (it takes label, note)", 400)
        label, note = payload["label"], payload.get("note")
        if label is not None:
            label = str(label).strip() if isinstance(label, (str, int, float)) and not isinstance(label, bool) else label
            if label not in annotator.values:
                return _error(f"label {payload['label']!r} is not one of {', '.join(annotator.values)}", 400)
        if note is not None and (not isinstance(note, str) or len(note) > MAX_NOTE):
            return _error(f"note must be text of at most {MAX_NOTE} characters", 400)
        try:  # a lone surrogate ("\ud800") is valid JSON but no UTF-8: it could not be stored
            (note or "").encode("utf-8")
        except UnicodeEncodeError as e:
            return _error(f"note: character {e.start} is a lone surrogate, not text that UTF-8 can store", 400)
        found = row_of(request)
        if isinstance(found, Response):
            return found
        import anyio.to_thread

        try:  # the append waits for fsync: off the event loop
            record = await anyio.to_thread.run_sync(annotator.label, found["index"], label, note)
        except ViewError as e:
            return _error(str(e), 400)
        except OSError as e:
            return _error(f"could not write {annotator.store.path}: {e.strerror or e}", 500)
        return _json({"index": found["index"], "record": record, "labelled": annotator.labelled_count()})

    def next_row(request: Request) -> Response:
        why = _same_origin(request)  # a draw records an offer (its p goes into the store): no other site may make one
        if why is not None:
            return _error(f"refused: {why}", 403)
        strategy = request.query_params.get("strategy") or "active"
        unknown = sorted(set(request.query_params) - {"strategy"})
        if unknown:
            return _error(f"{unknown[0]}: not a parameter of /api/next (it takes strategy)", 400)
        if strategy not in ("active", "random"):
            return _error(f"strategy: {strategy!r} is not active or random", 400)
        drawn = annotator.next(strategy)
        if drawn is None:
            return _error("every row is labelled", 404)
        return _json({"index": drawn[0], "p": drawn[1], "strategy": strategy})

    def labels(request: Request) -> Response:
        return _json(annotator.progress())

    return [
        Route("/api/rows/{index}/label", post_label, methods=["POST"]),
        Route("/api/next", next_row),
        Route("/api/labels", labels),
    ]
