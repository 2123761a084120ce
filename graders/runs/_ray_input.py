"""`grade --ray`: the input is read by Ray Data's read tasks, parsed by gradekit's own row reader.

Ray Data's built-in readers do not read rows the way a local run does: ``read_json`` fails a
whole file on one malformed line and fills keys a row lacks with nulls, ``read_csv`` types the
cells (``"007"`` becomes 7) and fails a file on one ragged row, ``read_text`` splits lines on
U+2028 and fails a file on one byte that does not decode. An output that must equal a local
run's, error rows included, needs the local parser. So the read is a Ray Data
``FileBasedDatasource`` whose read tasks open the files through Ray Data's filesystem layer and
run :func:`gradekit.graders.runs._io.rows_of` on them; the rows reach the driver pickled (a Parquet row
keeps its Arrow-derived values, a bad row stays a RowError with its message), in input order
(``DataContext.execution_options.preserve_order``), and the driver drops the rows a resumed
run already has. A folder is listed on the driver (:class:`RunInput`), so the files, their
order and the checkpoint's fingerprint are a local run's.
"""

from __future__ import annotations

import inspect
import io
import logging
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ray.data.datasource import FileBasedDatasource

from ._io import InputError, RowError, RunInput, rows_of

CHUNK_ROWS = 1024  # rows pickled together: one Arrow cell each, so a block is a few cells, not a row per cell


class RowsDatasource(FileBasedDatasource):
    """CSV, JSONL or Parquet files read by Ray Data's tasks, each row as gradekit reads it."""

    def __init__(self, paths: list[str], *, kind: str, labels: dict[str, str], skips: dict[str, int], encoding: str | None,
                 **kwargs: Any) -> None:
        super().__init__(paths, **kwargs)
        self.kind, self.labels, self.skips, self.encoding = kind, labels, skips, encoding

    def _open_input_source(self, filesystem: Any, path: str, **open_args: Any) -> Any:
        if self.kind == "parquet":  # row groups are read by offset: a random-access file, not a stream
            return filesystem.open_input_file(path)
        return super()._open_input_source(filesystem, path, **open_args)

    def _read_stream(self, f: Any, path: str) -> Iterator[Any]:
        import pyarrow as pa

        label = self.labels.get(path, path)
        handle = f if self.kind == "parquet" else io.BufferedReader(f)  # line iteration over Arrow's stream
        chunk: list[dict[str, Any] | RowError | InputError] = []
        try:
            for row in rows_of(handle, label, self.kind, self.skips.get(path, 0), self.encoding):
                chunk.append(row)
                if len(chunk) >= CHUNK_ROWS:
                    yield pa.table({"rows": pa.array([pickle.dumps(chunk, protocol=5)], pa.large_binary())})
                    chunk = []
        except InputError as e:  # a file that cannot be read at all: the driver raises it, as a local read would
            chunk.append(e)
        if chunk:
            yield pa.table({"rows": pa.array([pickle.dumps(chunk, protocol=5)], pa.large_binary())})


def ray_rows(source: RunInput | Path, skip: int = 0, encoding: str | None = None) -> Iterator[dict[str, Any] | RowError]:
    """The rows of ``source`` (a file or folder), read by Ray Data, in order: :func:`read_rows`'s stream.

    A resumed run's leading files that are wholly written are not read at all (counted on the
    driver, as a local run does); the rest of the first one is skipped by its read task.
    """
    import ray

    source = RunInput.resolve(source, encoding)  # a run passes its RunInput; a caller holding a path has it resolved here
    files, kind, encoding = list(source.files), source.format, source.encoding
    start = 0
    while skip and start < len(files):
        rows = source.rows_in(files[start])
        if rows > skip:
            break
        skip -= rows
        start += 1
    files = files[start:]
    if not files:
        return
    paths = [str(file.resolve()) for file in files]
    datasource = RowsDatasource(paths, kind=kind, labels={p: str(f) for p, f in zip(paths, files)}, skips={paths[0]: skip},
                                encoding=encoding, partitioning=None)  # no hive columns from k=v folder names: a local run has none
    # The dataset keeps a copy of the context it was made under: these settings are this read's
    # alone, and the caller's own pipelines keep theirs.
    context = ray.data.DataContext.get_current()
    saved = (context.execution_options.preserve_order, context.enable_progress_bars, context.print_on_execution_start)
    context.execution_options.preserve_order = True  # blocks leave in the order of the files and of their rows
    context.enable_progress_bars = False  # stderr is the command's: its progress lines and summary
    context.print_on_execution_start = False
    try:
        # No CPU of its own: the judge actors hold the cluster's CPUs, and a read task waiting for one would wait for the run.
        # Newer Ray takes num_cpus by name and deprecates ray_remote_args; the extra allows older Ray too.
        named = "num_cpus" in inspect.signature(ray.data.read_datasource).parameters
        dataset = ray.data.read_datasource(datasource, **({"num_cpus": 0} if named else {"ray_remote_args": {"num_cpus": 0}}))
    finally:
        context.execution_options.preserve_order, context.enable_progress_bars, context.print_on_execution_start = saved
    # Ray Data logs each execution's start and end (and that progress bars are off) to stderr, which is the command's.
    log = logging.getLogger("ray.data")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        for batch in dataset.iter_batches(batch_format="pyarrow", batch_size=None):
            for blob in batch.column("rows").to_pylist():
                for row in pickle.loads(blob):
                    if isinstance(row, InputError):
                        raise row
                    yield row
    finally:
        log.setLevel(level)
