"""A graded file as a queryable table: DuckDB pages, filters, sorts and searches it off the heap.

The file is copied once into a DuckDB database in a temporary folder (columnar, compressed,
spilled to disk past ``memory_limit``), so a million-row output never sits whole in Python's
memory and every filter is a SQL scan. The copy runs in the background: until it is done, the
unfiltered pages come straight from the file (DuckDB reads the first rows and stops), so the
first page shows in well under a second; filters, sorts, searches and the summary wait for it.

A row's ``index`` is its 0-based position in the file: the table's ``rowid``, which follows the
file because the copy keeps insertion order.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

from ..runs._io import InputError, file_format

TABLE = "results"
TEXT = "_text"  # the lowercased text columns of a row, joined: what ?q= searches
HUMAN = "human_label"  # the human label beside each row: from --labels, or the input's own gold label
HISTOGRAM_BINS = 20
MAX_LIMIT = 1000
T = TypeVar("T")
DISAGREEMENTS_LISTED = 200


class ViewError(ValueError):
    """The file cannot be viewed (unreadable, unsupported, a bad --labels join); the message says why."""


class RowFilter(BaseModel):
    """What ``/api/rows`` narrows the rows by; every field optional, all of them combine with AND."""

    status: str | None = None  # one status, or several comma-separated
    label: str | None = None  # the judge's label (``winner`` for pairwise files)
    error_kind: str | None = None
    score_min: float | None = None
    score_max: float | None = None
    q: str | None = None  # case-insensitive text search over every text column
    disagree: bool = False  # the judge's label differs from the human label
    flipped: bool = False  # pairwise: the two orders disagree
    served_model: str | None = None  # the model the provider says answered the row
    system_fingerprint: str | None = None  # the reply's system_fingerprint
    drift: bool = False  # rows a canary flagged as judged after the judge changed (grade --on-drift flag)
    sort: str | None = None  # a column, "-column" for descending; default: file order


class Page(BaseModel):
    total: int
    offset: int
    limit: int
    rows: list[dict[str, Any]]
    ready: bool = True  # False: the file is still being indexed (only unfiltered pages are answered)


class Labels(BaseModel):
    """Human labels from a second file, joined on a key column."""

    path: Path
    on: str
    column: str = "label"


FOLDER_PREFIX = "gradekit-view-"
VOCABULARY_LIMIT = 20  # distinct judge labels a file may hold for `view --annotate` to offer them as the label values
_NOT_TEXT = {"BOOLEAN", "TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT",
             "UHUGEINT", "FLOAT", "DOUBLE", "DATE", "TIME", "INTERVAL"}


def _sweep() -> None:
    """Remove the databases of viewers that were killed (SIGKILL skips close()): their pid is gone."""
    for folder in Path(tempfile.gettempdir()).glob(f"{FOLDER_PREFIX}*-*"):
        pid = folder.name[len(FOLDER_PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except OSError:
            pass  # alive, someone else's


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _reader(path: Path, careful: bool = False, lenient: bool = False, types: Mapping[str, str] | None = None) -> str:
    """The DuckDB table function reading ``path``.

    ``careful`` samples every row for the column types (slower; for a value that does not fit the
    type the first rows suggested); ``lenient`` reads past broken lines (a JSONL line a killed
    writer cut short becomes a row of nulls, so indexes still match the file; a broken CSV row is
    skipped); ``types`` fixes column types (JSONL: all columns; CSV: those named).
    """
    kind = file_format(path)
    name = _literal(str(path))
    options = (", sample_size=-1" if careful else "") + (", ignore_errors=true" if lenient else "")
    if types:
        spec = "{" + ", ".join(f"{_literal(k)}: {_literal(v)}" for k, v in types.items()) + "}"
        options += f", columns={spec}" if kind == "jsonl" else f", types={spec}"
    if kind == "jsonl":
        return f"read_json({name}, format='newline_delimited'{options})"
    if kind == "csv":
        return f"read_csv({name}, header=true{options})"
    return f"read_parquet({name})"


def _plain(value: Any) -> Any:
    """A DuckDB value as JSON: NaN/inf become None (JSON has neither), decimals floats, the rest as is."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    try:
        return float(value)  # Decimal
    except (TypeError, ValueError):
        return str(value)  # dates, UUIDs, blobs


def count_lines(path: Path, stop: threading.Event | None = None, *, tools: bool = True) -> int | None:
    """Rows of a JSONL file as DuckDB reads it (one per non-blank line), from a line count; None when unsure.

    The first page needs the total, and DuckDB's ``count(*)`` parses every line (a second or more
    for a million rows). DuckDB skips blank and whitespace-only lines and, reading leniently, makes
    every other line a row (a broken one a row of nulls). So when every line starts with a
    non-space byte the rows are the lines; when one does not (it may be blank), None: the caller
    asks DuckDB. ``wc`` and ``grep`` count in other processes at several GB/s, leaving this one's
    CPU and GIL to the server starting up; without them (or ``tools=False``), Python counts.
    ``stop`` set: give up (the viewer is closing).
    """
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            if size:
                f.seek(size - 1)
            unterminated = 1 if size and f.read(1) != b"\n" else 0  # a last line without its newline is a row too
    except OSError:
        return None
    counted = _count_with_tools(path, stop) if tools else None
    if counted is None:
        counted = _count_in_python(path, stop)
    if counted is None:
        return None
    lines, starting_with_text = counted
    lines += unterminated
    return lines if starting_with_text == lines else None


def _count_with_tools(path: Path, stop: threading.Event | None) -> tuple[int, int] | None:
    """(newlines, lines that start with a non-space byte) from ``wc -l`` and ``grep -c``, run side by side."""
    import subprocess

    env = {**os.environ, "LC_ALL": "C"}  # bytes, not characters: no UTF-8 decoding, [[:space:]] is ASCII
    commands = (["wc", "-l"], ["grep", "-a", "-c", "^[^[:space:]]"])
    procs: list[subprocess.Popen] = []
    try:
        for argv in commands:
            with path.open("rb") as source:
                procs.append(subprocess.Popen(argv, stdin=source, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env))
        found = []
        for proc in procs:
            while True:
                try:
                    out, _ = proc.communicate(timeout=0.1)
                    break
                except subprocess.TimeoutExpired:
                    if stop is not None and stop.is_set():
                        return None
            if proc.returncode not in (0, 1):  # grep: 1 is "no line matched", its count 0 printed all the same
                return None
            found.append(int(out.split()[0]))
        return found[0], found[1]
    except (OSError, ValueError, IndexError):
        return None
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _count_in_python(path: Path, stop: threading.Event | None) -> tuple[int, int] | None:
    """The same two counts with ``bytes.count`` (a regex finds a line that starts with a space byte)."""
    lines, last = 0, b"\n"
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            if stop is not None and stop.is_set():
                return None
            if last == b"\n" and chunk[:1].isspace() or _LINE_STARTS_BLANK.search(chunk):
                return lines, -1
            lines += chunk.count(b"\n")
            last = chunk[-1:]
    return lines, lines + (1 if last not in (b"\n", b"") else 0)


# A newline followed by whitespace: the next line may be blank (DuckDB skips it) or indented.
_LINE_STARTS_BLANK = re.compile(rb"\n\s")


class ResultsFile:
    """A graded file (JSONL, CSV or Parquet; a rubric, pairwise or ``--grader`` output) opened for viewing.

    Opening reads only the column names and types (DuckDB samples the first rows), so a server can
    listen at once. The row count runs on a thread straight away (a newline count for JSONL); the
    columnar copy that filters, sorts, search and the summary run on follows it in the background
    (``background=True``), only when first needed (``deferred=True``: a filter, the summary,
    ``index()``), or before the constructor returns (``background=False``). Unfiltered pages and
    single rows are answered from the file until the copy is done (``Page.ready`` is False).

    Thread-safe: each query runs on its own DuckDB cursor, so a web server may call it from a pool.
    ``close()`` stops the background work and removes the temporary database.
    """

    def __init__(self, path: str | Path, *, labels: Labels | None = None, memory_limit: str = "256MB",
                 background: bool = True, deferred: bool = False, unsearched: frozenset[str] = frozenset()) -> None:
        import duckdb  # the view extra; imported here so that `gradekit --help` never loads it

        self.unsearched = unsearched  # columns ?q= must not search (--blind: a hit would reveal the hidden verdict)
        self.path = Path(path)
        if not self.path.is_file():
            raise ViewError(f"{self.path}: no such file")
        try:
            self._format = file_format(self.path)
        except InputError as e:
            raise ViewError(str(e)) from None
        self.labels = labels
        self.warnings: list[str] = []
        _sweep()
        self._folder = Path(tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{os.getpid()}-"))
        self._db = duckdb.connect(str(self._folder / "view.duckdb"))
        self._db.execute(f"SET memory_limit={_literal(memory_limit)}")
        self._db.execute(f"SET temp_directory={_literal(str(self._folder / 'spill'))}")
        self._db.execute("SET preserve_insertion_order=true")
        self._closing = threading.Event()
        self._counted = threading.Event()
        self._ready = threading.Event()
        self._start = threading.Lock()
        self._busy: list[Any] = []  # cursors of running background queries: close() interrupts them
        self._total = 0
        self._modes = (False, False)  # (careful, lenient) the whole file needs, as the count found
        self._broken: str | None = None  # the count's first unreadable line, when it had to read leniently
        self._sample_broken: str | None = None  # the same among the rows DuckDB sampled for the types
        self._count_failure: ViewError | None = None
        self._failure: ViewError | None = None
        self._types: dict[str, str] = {}
        self._human: dict[str, str] = {}  # key -> human label from --labels, read once when the file is opened
        self._loader: threading.Thread | None = None
        self._counter: threading.Thread | None = None
        if background:  # the count reads the file while the caller goes on (DuckDB and file reads release the GIL)
            self._counter = threading.Thread(target=self._count, name="gradekit-view-count", daemon=True)
            self._counter.start()
        try:
            self._reader, self.columns = self._describe()
            self._check_labels()
            if not background:
                self._count()
                self._index()
                self.wait()
        except ViewError:
            self.close()
            raise
        if background and not deferred:
            self.index()

    # -- loading -------------------------------------------------------------------------------

    def _error(self, exc: Exception) -> ViewError:
        return ViewError(f"{self.path}: {str(exc).splitlines()[0]}")

    def _query(self, sql: str) -> list[tuple]:
        """A background query that close() can interrupt."""
        cursor = self._db.cursor()
        self._busy.append(cursor)
        try:
            return cursor.execute(sql).fetchall()
        finally:
            self._busy.remove(cursor)

    def _describe(self) -> tuple[str, list[str]]:
        """The reader with every column's type fixed from DuckDB's sample, and the column names.

        Fixed types let each later read skip the sampling (the first page reads 50 rows, not 20,000).
        A broken line among the sampled ones: read leniently (the copy will say which lines).
        """
        import duckdb

        first: duckdb.Error | None = None
        for lenient in (False, True) if self._format != "parquet" else (False,):
            try:
                found = self._typed(False, lenient)
            except duckdb.Error as e:
                first = first or e
                continue
            if lenient:  # the copy must read leniently too, typing from every row as the sample was not clean
                self._sample_broken = str(first).splitlines()[0]
            return found
        raise self._error(first)  # type: ignore[arg-type]

    def _typed(self, careful: bool, lenient: bool) -> tuple[str, list[str]]:
        """The reader with fixed column types, and the column names.

        Text type for columns that are empty in every sampled row: DuckDB types such a column
        NULL and then drops its later values silently; a graded file has many (``error``,
        ``raw_reply``: empty until the first failure). JSON: every column fixed (mixed types, such
        as ids that are numbers and strings, read as text: a string shows without its quotes).
        CSV: only the empty ones (its own sniffing of the rest is fast); Parquet carries its types.
        """
        described = self._db.cursor().execute(f"DESCRIBE SELECT * FROM {_reader(self.path, careful, lenient)}").fetchall()
        names = [name for name, *_ in described]
        if self._format == "parquet":
            return _reader(self.path), names
        empty = {name for name, kind, *_ in described if kind.strip('"') in ("NULL", "JSON")}
        if self._format == "csv":
            types = {name: "VARCHAR" for name in empty}
        else:
            types = {name: ("VARCHAR" if name in empty else kind) for name, kind, *_ in described}
        return _reader(self.path, careful, lenient, types or None), names

    def _count(self) -> None:
        """The file's row count; for CSV and Parquet also how carefully the whole file must be read."""
        import duckdb

        try:
            counted = count_lines(self.path, self._closing) if self._format == "jsonl" else None
            if counted is None:
                first: duckdb.Error | None = None
                attempts = [(False, False), (True, False)] + ([(True, True)] if self._format != "parquet" else [])
                for careful, lenient in attempts:
                    try:
                        counted = int(self._query(f"SELECT count(*) FROM {_reader(self.path, careful, lenient)}")[0][0])
                    except duckdb.Error as e:
                        first = first or e
                        continue
                    if self._format != "jsonl":  # a JSONL line count is the same however carefully it is read
                        self._modes = (careful, lenient)
                        self._broken = str(first).splitlines()[0] if lenient and first is not None else None
                    break
                else:
                    raise self._error(first)  # type: ignore[arg-type]
            self._total = counted
        except ViewError as e:
            self._count_failure = e
        except OSError as e:
            self._count_failure = ViewError(f"{self.path}: {e.strerror or e}")
        finally:
            self._counted.set()

    @property
    def total_rows(self) -> int:
        """Rows in the file (waits for the count, which starts when the file is opened)."""
        self._counted.wait()
        if self._count_failure is not None:
            raise self._count_failure
        return self._total

    def index(self) -> None:
        """Start the columnar copy on a background thread (once; later calls do nothing)."""
        with self._start:
            if self._loader is None and not self._ready.is_set():
                self._loader = threading.Thread(target=self._index, name="gradekit-view-load", daemon=True)
                self._loader.start()

    def _index(self) -> None:
        import duckdb

        try:
            self.total_rows  # noqa: B018  (raises the count's failure)
            db = self._db.cursor()
            careful, lenient = max(self._modes, (True, True) if self._sample_broken else (False, False))
            attempts = [(c, le) for c, le in ((False, False), (True, False), (True, True)) if (c, le) >= (careful, lenient)]
            if self._format == "parquet":
                attempts = attempts[:1]
            first: duckdb.Error | None = None
            for careful, lenient in attempts:
                if self._closing.is_set():
                    return
                try:
                    reader = self._reader if (careful, lenient) == (False, False) else self._typed(careful, lenient)[0]
                    self._copy(reader)
                except (duckdb.ConversionException, duckdb.InvalidInputException) as e:
                    # A later value does not fit the type the first rows suggested (type from every
                    # row, slower), or a line is broken (read past it).
                    first = first or e
                    continue
                break
            else:
                raise self._error(first)  # type: ignore[arg-type]
            if lenient:
                shown = "show as empty rows" if self._format == "jsonl" else "are left out"
                reason = str(first).splitlines()[0] if first is not None else self._broken or self._sample_broken
                self.warnings.append(f"some lines could not be read and {shown}" + (f"; the first: {reason}" if reason else ""))
            self._types = {name: kind for name, kind, *_ in db.execute(f"DESCRIBE {TABLE}").fetchall() if name != TEXT}
            self.columns = list(self._types)
            copied = int(db.execute(f"SELECT count(*) FROM {TABLE}").fetchone()[0])
            if copied != self._total:  # the copy is the truth the filters count in; say so when the count differed
                self.warnings.append(f"the file has {copied:,} rows; {self._total:,} were counted before it was read whole")
                self._total = copied
            self._attach_human_labels(db)
        except duckdb.Error as e:  # interrupted by close(): not the file's fault, but no copy either
            self._failure = ViewError(f"{self.path}: the viewer closed before the copy was done") if self.closed else self._error(e)
        except ViewError as e:
            self._failure = e
        finally:
            self._ready.set()

    def _copy(self, reader: str) -> None:
        """The columnar copy, with a lowercase text column for search."""
        described = self._db.cursor().execute(f"DESCRIBE SELECT * FROM {reader}").fetchall()
        # Every column but numbers, booleans and times is searchable text (nested JSON as its JSON text).
        text = [f"CAST({_quote(name)} AS VARCHAR)" for name, kind, *_ in described if name != TEXT and kind not in _NOT_TEXT
                and name not in self.unsearched
                and not kind.startswith(("DECIMAL", "TIMESTAMP"))]
        searched = f"lower(concat_ws(chr(10), {', '.join(text)}))" if text else "''"
        self._query(f"CREATE OR REPLACE TABLE {TABLE} AS SELECT *, {searched} AS {TEXT} FROM {reader}")

    def _check_labels(self) -> None:
        """Fail now, not in the background, when --labels cannot be joined: a wrong key or column, a key labelled
        twice, is a mistake to fix (exit 2), not a viewer answering errors."""
        if self.labels is None:
            return
        if self.labels.on not in self.columns:
            raise ViewError(f"{self.path}: no column {self.labels.on!r} to join the labels on (--on)")
        self._human = self._read_human_labels()

    def _read_human_labels(self) -> dict[str, str]:
        """key -> human label, read as calibrate reads the file (graders/calibration/_labels.py: a labels store's
        last line per key wins; a table is read as text, so a CSV's yes/no are not booleans)."""
        from ..calibration._labels import LabelsError, read_label_file

        assert self.labels is not None
        path, on, column = self.labels.path, self.labels.on, self.labels.column
        try:
            state = read_label_file(path, on, column)
        except LabelsError as e:
            message = str(e)
            raise ViewError(message if message.startswith("labels file") else f"labels file {message}") from None
        if state.keyless and not state.records:
            raise ViewError(f"labels file {path}: no row has the key {on!r} (--on)")
        if state.records and not any(column in r for r in state.records):
            raise ViewError(f"labels file {path}: no column {column!r} (it has: {', '.join(state.records[0])})")
        for warning in state.warnings:
            if warning not in self.warnings:
                self.warnings.append(warning)
        return {str(r[on]): str(r[column]).strip() for r in state.records
                if r.get(column) is not None and str(r[column]).strip()}

    def _attach_human_labels(self, db: Any) -> None:
        """Add ``human_label``: from the --labels file joined on its key, else the input's own gold label."""
        import duckdb

        source: str | None = None
        if self.labels is not None:
            labels, on, column = self.labels.path, self.labels.on, self.labels.column
            if on not in self._types:
                raise ViewError(f"{self.path}: no column {on!r} to join the labels on (--on)")
            import pyarrow as pa

            human_labels = pa.table({"k": pa.array(list(self._human), pa.string()),  # noqa: F841  (DuckDB reads it by name)
                                     "v": pa.array(list(self._human.values()), pa.string())})
            try:
                db.execute("CREATE TABLE human AS SELECT k, v FROM human_labels")
            except duckdb.Error as e:
                raise ViewError(f"labels file {labels}: {str(e).splitlines()[0]}") from None
            source = f"(SELECT h.v FROM human h WHERE h.k = CAST({TABLE}.{_quote(on)} AS VARCHAR))"
        else:
            gold = "label" if self.kind == "pairwise" else "input_label"
            if gold in self._types:
                source = f"NULLIF(trim(CAST({_quote(gold)} AS VARCHAR)), '')"
        if source is None:
            return
        db.execute(f"ALTER TABLE {TABLE} ADD COLUMN {HUMAN} VARCHAR")
        db.execute(f"UPDATE {TABLE} SET {HUMAN} = {source}")
        self._types[HUMAN] = "VARCHAR"
        self.columns.append(HUMAN)

    def wait(self, timeout: float | None = None, *, start: bool = True) -> bool:
        """Block until the file is indexed (``start``: starting a deferred copy); raise its ViewError if it could not be."""
        if start:
            self.index()
        done = self._ready.wait(timeout)
        if self._failure is not None:
            raise self._failure
        return done

    @property
    def ready(self) -> bool:
        """The copy is done: filters, sorts, search and the summary answer without waiting."""
        return self._ready.is_set() and self._failure is None

    @property
    def closed(self) -> bool:
        """close() has been called (background work stops)."""
        return self._closing.is_set()

    @property
    def indexing(self) -> bool:
        """The copy has started (it may be done)."""
        return self._loader is not None or self._ready.is_set()

    def close(self) -> None:
        self._closing.set()
        with self._start:
            loader, self._loader = self._loader, threading.Thread()  # a later index() starts nothing
        for thread in (self._counter, loader):
            while thread is not None and thread.ident is not None and thread.is_alive():
                for cursor in list(self._busy):  # a copy or count still running: stop it rather than wait it out
                    try:
                        cursor.interrupt()
                    except Exception:  # noqa: BLE001  (it finished meanwhile)
                        pass
                thread.join(0.1)  # it still writes into the folder
        self._db.close()
        shutil.rmtree(self._folder, ignore_errors=True)

    # -- what kind of output ---------------------------------------------------------------------

    @property
    def kind(self) -> str:
        """``pairwise`` (two orders), ``grader`` (a --grader run: score_<part> columns), or ``rubric``."""
        if "winner_ab" in self.columns:
            return "pairwise"
        if "label" not in self.columns and ("parts" in self.columns or any(c.startswith(("score_", "metric_")) for c in self.columns)):
            return "grader"
        return "rubric"

    @property
    def judge_column(self) -> str | None:
        column = "winner" if self.kind == "pairwise" else "label"
        return column if column in self.columns else None

    def label_vocabulary(self, limit: int = VOCABULARY_LIMIT) -> list[str]:
        """The judge's labels this file holds (``winner``'s 1/2/tie for a pairwise file), sorted; [] when there are
        none or more than ``limit`` (free text, not a vocabulary). Read off the file itself, so it works before the copy."""
        if self.kind == "pairwise":
            return ["1", "2", "tie"]
        column = self.judge_column
        if column is None:
            return []
        found = self._fetch(f"SELECT DISTINCT NULLIF(trim(CAST({_quote(column)} AS VARCHAR)), '') AS v FROM {self._reader} "
                            f"WHERE {_quote(column)} IS NOT NULL LIMIT {limit + 1}")
        values = sorted(r["v"] for r in found if r["v"] is not None)
        return values if len(values) <= limit else []

    @property
    def has_human_labels(self) -> bool:
        return HUMAN in self._types

    # -- queries ---------------------------------------------------------------------------------

    def _where(self, f: RowFilter) -> tuple[str, list[Any]]:
        clauses: list[str] = []
        params: list[Any] = []

        def column(name: str, flag: str) -> str:
            if name not in self._types:
                raise ViewError(f"{flag}: this file has no {name!r} column")
            return _quote(name)

        if f.status:
            wanted = [s.strip() for s in f.status.split(",") if s.strip()]
            clauses.append(f"CAST({column('status', 'status')} AS VARCHAR) IN ({', '.join('?' * len(wanted))})")
            params += wanted
        if f.label:
            judge = self.judge_column
            if judge is None:
                raise ViewError("label: this file has no judge label column")
            clauses.append(f"CAST({_quote(judge)} AS VARCHAR) = ?")
            params.append(f.label)
        if f.error_kind:
            clauses.append(f"CAST({column('error_kind', 'error_kind')} AS VARCHAR) = ?")
            params.append(f.error_kind)
        if f.score_min is not None:
            clauses.append(f"TRY_CAST({column('score', 'score_min')} AS DOUBLE) >= ?")
            params.append(f.score_min)
        if f.score_max is not None:
            clauses.append(f"TRY_CAST({column('score', 'score_max')} AS DOUBLE) <= ?")
            params.append(f.score_max)
        if f.q:
            clauses.append(f"contains({TEXT}, ?)")
            params.append(f.q.lower())
        if f.disagree:
            clauses.append(self._disagrees())
        if f.flipped:
            clauses.append(f"CAST({column('agree', 'flipped')} AS VARCHAR) IN ('false', 'False', '0')")
        for name in ("served_model", "system_fingerprint"):
            if getattr(f, name):
                clauses.append(f"CAST({column(name, name)} AS VARCHAR) = ?")
                params.append(getattr(f, name))
        if f.drift:
            clauses.append(f"CAST({column('drift', 'drift')} AS VARCHAR) IN ('true', 'True', '1')")
        return (" WHERE " + " AND ".join(clauses)) if clauses else "", params

    def _disagrees(self) -> str:
        if not self.has_human_labels or self.judge_column is None:
            raise ViewError("disagree: no human labels (give --labels FILE --on KEY)")
        ok = "CAST(status AS VARCHAR) = 'ok' AND " if "status" in self._types else ""
        return f"({ok}{HUMAN} IS NOT NULL AND CAST({_quote(self.judge_column)} AS VARCHAR) IS DISTINCT FROM {HUMAN})"

    def _order(self, sort: str | None) -> str:
        if not sort:
            return "rowid"
        name, descending = (sort[1:], True) if sort.startswith("-") else (sort, False)
        if name == "index":
            return "rowid DESC" if descending else "rowid"
        if name not in self._types:
            raise ViewError(f"sort: no column {name!r}")
        return f"{_quote(name)} {'DESC' if descending else 'ASC'} NULLS LAST, rowid"

    def _fetch(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        cursor = self._db.cursor().execute(sql, list(params))
        names = [d[0] for d in cursor.description]
        return [{name: _plain(value) for name, value in zip(names, row)} for row in cursor.fetchall()]

    def _early(self, window: str) -> list[dict[str, Any]] | None:
        """Rows straight from the file while the copy is made, with the human label the copy adds; None when that
        fails (the copy will say why)."""
        import duckdb

        key = "__gradekit_key"
        try:
            if self.labels is not None:  # look up only this page's keys in the labels file
                rows = self._fetch(f"SELECT *, CAST({_quote(self.labels.on)} AS VARCHAR) AS {key} FROM {self._reader} {window}")
                keys = sorted({row[key] for row in rows if row[key] is not None})
                found = {k: self._human[k] for k in keys if k in self._human}
                return [{**{k: v for k, v in row.items() if k != key}, HUMAN: found.get(row[key])} for row in rows]
            gold = "label" if self.kind == "pairwise" else "input_label"
            human = f", NULLIF(trim(CAST({_quote(gold)} AS VARCHAR)), '') AS {HUMAN}" if gold in self.columns else ""
            return self._fetch(f"SELECT *{human} FROM {self._reader} {window}")
        except duckdb.Error:
            return None

    def rows(self, f: RowFilter | None = None, offset: int = 0, limit: int = 50) -> Page:
        """One page of rows matching ``f``, each with its 0-based ``index`` in the file."""
        f = f or RowFilter()
        offset, limit = max(0, offset), max(0, min(limit, MAX_LIMIT))
        unfiltered = f.model_dump(exclude_defaults=True) in ({}, {"sort": "index"})
        if unfiltered and not self._ready.is_set():
            early = self._early(f"LIMIT {limit} OFFSET {offset}")
            if early is not None:
                return Page(total=self.total_rows, offset=offset, limit=limit, ready=False,
                            rows=[{"index": offset + i, **row} for i, row in enumerate(early)])
        self.wait()
        where, params = self._where(f)
        total = self._db.cursor().execute(f"SELECT count(*) FROM {TABLE}{where}", params).fetchone()[0]
        listed = ", ".join(_quote(c) for c in self._types)
        rows = self._fetch(f"SELECT rowid AS \"index\", {listed} FROM {TABLE}{where} ORDER BY {self._order(f.sort)} "
                           f"LIMIT {limit} OFFSET {offset}", params)
        return Page(total=int(total), offset=offset, limit=limit, rows=rows)

    def row(self, index: int) -> dict[str, Any] | None:
        """The row at 0-based ``index``, whole; None past the end."""
        if index < 0 or index >= self.total_rows:
            return None
        if not self._ready.is_set():
            early = self._early(f"LIMIT 1 OFFSET {int(index)}")
            if early is not None:
                return {"index": index, **early[0]} if early else None
        self.wait()
        listed = ", ".join(_quote(c) for c in self._types)
        found = self._fetch(f"SELECT rowid AS \"index\", {listed} FROM {TABLE} WHERE rowid = ?", [index])
        return found[0] if found else None

    def column_values(self, names: Sequence[str]) -> list[dict[str, Any]]:
        """Every row's values of ``names`` (those the file has), in file order: what the labelling mode keys and ranks by."""
        self.wait()
        present = [n for n in names if n in self._types]
        listed = ", ".join(["rowid AS \"index\"", *(_quote(n) for n in present)])
        return self._fetch(f"SELECT {listed} FROM {TABLE} ORDER BY rowid")

    def worst(self, limit: int) -> list[dict[str, Any]]:
        """Up to ``limit`` rows, the worst first: errors, disagreements with the human label, pairs whose orders
        disagree, the other labelled rows, then the rest."""
        self.wait()
        rank = []
        if "status" in self._types:
            rank.append("CASE WHEN CAST(status AS VARCHAR) NOT IN ('ok') THEN 0 ELSE 1 END")
        if self.has_human_labels and self.judge_column is not None:
            rank.append(f"CASE WHEN {self._disagrees()} THEN 0 ELSE 1 END")
        if "agree" in self._types:
            rank.append("CASE WHEN CAST(agree AS VARCHAR) IN ('false', 'False', '0') THEN 0 ELSE 1 END")
        if self.has_human_labels:  # then the rows a person labelled: what the agreement figures rest on
            rank.append(f"CASE WHEN {HUMAN} IS NOT NULL THEN 0 ELSE 1 END")
        listed = ", ".join(_quote(c) for c in self._types)
        order = ", ".join([*rank, "rowid"])
        return self._fetch(f"SELECT rowid AS \"index\", {listed} FROM {TABLE} ORDER BY {order} LIMIT {max(0, int(limit))}")


def _query_value(query: Mapping[str, str], name: str, parse: Callable[[str], T], what: str) -> T | None:
    """Query parameter ``name`` read by ``parse`` (None when empty or absent); a ViewError saying it is not ``what``."""
    text = (query.get(name) or "").strip()
    if not text:
        return None
    try:
        return parse(text)
    except ValueError:
        raise ViewError(f"{name}: {text!r} is not {what}") from None


ROW_PARAMS = ("offset", "limit", "status", "label", "error_kind", "score_min", "score_max", "q", "disagree", "flipped",
              "served_model", "system_fingerprint", "drift", "sort")
_YES, _NO = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


def as_filter(query: Mapping[str, str]) -> RowFilter:
    """``/api/rows`` query parameters -> RowFilter; empty values mean no filter. A parameter that is not
    one of ``ROW_PARAMS``, a flag that is not true/false, or a score bound that is not a finite number
    is a ViewError naming it (never a silent "no filter")."""
    unknown = sorted(set(query) - set(ROW_PARAMS))
    if unknown:
        raise ViewError(f"{unknown[0]}: not a parameter of /api/rows (it takes {', '.join(ROW_PARAMS)})")

    def flag(name: str) -> bool:
        text = (query.get(name) or "").strip().lower()
        if text not in _YES + _NO:
            raise ViewError(f"{name}: {text!r} is not true or false")
        return text in _YES

    def number(name: str) -> float | None:
        value = _query_value(query, name, float, "a number")
        if value is not None and not math.isfinite(value):
            raise ViewError(f"{name}: {query[name].strip()!r} is not a finite number")
        return value

    return RowFilter(status=query.get("status") or None, label=query.get("label") or None,
                     error_kind=query.get("error_kind") or None, score_min=number("score_min"), score_max=number("score_max"),
                     q=query.get("q") or None, disagree=flag("disagree"), flipped=flag("flipped"),
                     served_model=query.get("served_model") or None, system_fingerprint=query.get("system_fingerprint") or None,
                     drift=flag("drift"), sort=query.get("sort") or None)


MAX_OFFSET = 2**62  # DuckDB's OFFSET is a BIGINT: past it a query fails instead of returning an empty page


def page_window(query: Mapping[str, str]) -> tuple[int, int]:
    """``offset`` (0 up to 2^62; past the last row is an empty page) and ``limit`` (0 to MAX_LIMIT, default 50)
    from ``/api/rows``' query; a ViewError naming the parameter otherwise."""
    def integer(name: str, default: int, top: int) -> int:
        value = _query_value(query, name, int, "an integer")
        if value is None:
            return default
        if not 0 <= value <= top:
            raise ViewError(f"{name}: {query[name].strip()} is out of range (0 to {top:,})")
        return value

    return integer("offset", 0, MAX_OFFSET), integer("limit", 50, MAX_LIMIT)
