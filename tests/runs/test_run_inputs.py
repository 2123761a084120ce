"""One bad row is an error row, never a dead run; a file that cannot be read right stops before any request.

Each case drives `gradekit grade` in-process against the fake provider, with real files.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from gradekit.graders.cli import app
from gradekit.judge.testing import FakeProvider

from ..conftest import reference_judge

HEADER = ["question", "references", "prediction", "id"]


def _row(i: int) -> list[str]:
    return [f"question {i}?", f"answer {i}", f"answer {i}", str(i)]


def _csv_bytes(rows: list[list[str]], encoding: str = "utf-8") -> bytes:
    lines = [",".join(HEADER)] + [",".join(f'"{cell}"' for cell in row) for row in rows]
    return ("\n".join(lines) + "\n").encode(encoding)


def _grade(fake: FakeProvider, tmp_path: Path, source: Path, output: Path, *extra: str):
    env = {"OPENAI_BASE_URL": fake.base_url, "OPENAI_API_KEY": "k", "GRADEKIT_CACHE": str(tmp_path / "cache.sqlite3")}
    return CliRunner().invoke(app, ["grade", str(source), "-r", "semantic_equivalence_en", "-o", str(output), "--concurrency", "4",
                                    "--json", *extra], env=env)


def _graded(tmp_path: Path, source: Path, output: Path, *extra: str) -> tuple[Any, int]:
    """``_grade`` against a fresh reference judge: the CLI's result and the requests the judge received."""
    with FakeProvider(responder=reference_judge) as fake:
        result = _grade(fake, tmp_path, source, output, *extra)
        return result, len(fake.chat_requests())


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _only_bad_rows_fail(tmp_path: Path, source: Path, total: int, bad: dict[int, str]) -> None:
    """Grade ``source`` (``total`` rows): exit 1, the bad rows are their own errors and sent nothing, every other row judged."""
    output = tmp_path / "out.jsonl"
    result, sent = _graded(tmp_path, source, output)
    assert sent == total - len(bad) and result.exit_code == 1, result.output
    _check_error_rows(output, total, bad)


def _check_error_rows(output: Path, total: int, bad: dict[int, str]) -> None:
    """One output row per input row; the bad ones (1-based row -> a word of the cause) are errors naming the row."""
    rows = _jsonl(output)
    assert len(rows) == total
    for number, row in enumerate(rows, start=1):
        if number in bad:
            assert row["status"] == "error" and row["error_kind"] == "input", row
            assert f"row {number}" in row["error"] and bad[number] in row["error"], row["error"]
        else:
            assert row["status"] == "ok", row


def test_a_csv_cell_over_128_kib_is_that_rows_error(tmp_path) -> None:
    rows = [_row(i) for i in range(6)]
    rows[2][2] = "x" * (128 * 1024 + 1)
    source = tmp_path / "in.csv"
    source.write_bytes(_csv_bytes(rows))
    _only_bad_rows_fail(tmp_path, source, 6, {3: "131,072"})


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_a_stray_byte_that_is_not_utf8_in_a_later_row_is_that_rows_error(tmp_path, suffix) -> None:
    rows = [_row(i) for i in range(12)]
    source = tmp_path / f"in{suffix}"
    if suffix == ".csv":
        data = _csv_bytes(rows)
    else:
        data = "".join(json.dumps(dict(zip(HEADER, row))) + "\n" for row in rows).encode()
    data = data.replace(b"answer 9", b"answ\xe9r 9", 1)  # row 10: a Latin-1 byte in an otherwise UTF-8 file
    source.write_bytes(data)
    _only_bad_rows_fail(tmp_path, source, 12, {10: "0xe9"})


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_a_file_in_another_encoding_stops_before_any_request_and_encoding_reads_it(tmp_path, suffix) -> None:
    rows = [[f"où est le café {i}?", f"réponse {i}", f"réponse {i}", str(i)] for i in range(4)]
    source, output = tmp_path / f"in{suffix}", tmp_path / "out.jsonl"
    if suffix == ".csv":
        source.write_bytes(_csv_bytes(rows, "latin-1"))
        offset = len(",".join(HEADER).encode()) + 1 + len('"où'.encode("latin-1")) - 1
    else:
        source.write_bytes("".join(json.dumps(dict(zip(HEADER, row)), ensure_ascii=False) + "\n" for row in rows).encode("latin-1"))
        offset = len('{"question": "o')
    with FakeProvider(responder=reference_judge) as fake:
        stopped = _grade(fake, tmp_path, source, output)
        assert stopped.exit_code == 2 and len(fake.chat_requests()) == 0
        assert str(source) in stopped.output and f"byte {offset}" in stopped.output and "--encoding" in stopped.output
        assert "Traceback" not in stopped.output and not output.exists()
        read = _grade(fake, tmp_path, source, output, "--encoding", "latin-1")
        assert read.exit_code == 0, read.output
        assert any("où est le café 0?" in r.body["messages"][-1]["content"] for r in fake.chat_requests())
    assert [r["question"] for r in _jsonl(output)] == [r[0] for r in rows]


def test_an_unknown_encoding_is_exit_2(tmp_path) -> None:
    source = tmp_path / "in.csv"
    source.write_bytes(_csv_bytes([_row(0)]))
    with FakeProvider(responder=reference_judge) as fake:
        result = _grade(fake, tmp_path, source, tmp_path / "out.jsonl", "--encoding", "no-such-codec")
        assert result.exit_code == 2 and "unknown encoding 'no-such-codec'" in result.output
        assert len(fake.chat_requests()) == 0


def _jsonl_input(tmp_path: Path, lines: list[str]) -> Path:
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return source


def test_json_nested_deeper_than_the_recursion_limit_is_that_rows_error(tmp_path) -> None:
    rows = [dict(zip(HEADER, _row(i))) for i in range(4)]
    lines = [json.dumps(r) for r in rows]
    lines[1] = '{"question": "q", "references": "a", "prediction": ' + "[" * 100_000 + "]" * 100_000 + "}"
    _only_bad_rows_fail(tmp_path, _jsonl_input(tmp_path, lines), 4, {2: "nested deeper"})


def test_a_lone_surrogate_escape_in_a_jsonl_row_is_that_rows_error(tmp_path) -> None:
    """"\\ud800" is valid JSON but no text: that row is an error (it crashed the run at the output's write); a pair is graded."""
    rows = [dict(zip(HEADER, _row(i))) for i in range(3)]
    lines = [json.dumps(r) for r in rows]
    lines[1] = lines[1].replace('"answer 1"}', '"answer \\ud800"}', 1).replace('"prediction": "answer 1"', '"prediction": "x\\ud800"')
    lines[2] = lines[2].replace('"question 2?"', '"question \\ud83d\\ude00?"')
    _only_bad_rows_fail(tmp_path, _jsonl_input(tmp_path, lines), 3, {2: "surrogate"})


def test_a_corrupt_parquet_data_page_fails_only_its_row_groups_rows(tmp_path) -> None:
    source = tmp_path / "in.parquet"
    table = pa.Table.from_pylist([dict(zip(HEADER, _row(i))) for i in range(30)])
    pq.write_table(table, source, row_group_size=10, compression="snappy")
    column = pq.ParquetFile(source).metadata.row_group(1).column(2)  # prediction, rows 11-20
    data = bytearray(source.read_bytes())
    start = column.data_page_offset
    data[start:start + 16] = b"\xff" * 16  # the data page's header: the page cannot be read
    source.write_bytes(bytes(data))
    _only_bad_rows_fail(tmp_path, source, 30, {n: "row group 1" for n in range(11, 21)})


def test_a_utf8_bom_is_not_part_of_the_first_column(tmp_path) -> None:
    source, output = tmp_path / "in.csv", tmp_path / "out.csv"
    source.write_bytes(b"\xef\xbb\xbf" + _csv_bytes([_row(i) for i in range(3)]))
    with FakeProvider(responder=reference_judge) as fake:
        result = _grade(fake, tmp_path, source, output)
    assert result.exit_code == 0, result.output
    with output.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0])[0] == "question" and [r["question"] for r in rows] == [f"question {i}?" for i in range(3)]


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_duplicate_column_names_stop_before_any_request(tmp_path, suffix) -> None:
    source = tmp_path / f"in{suffix}"
    if suffix == ".csv":
        source.write_text("question,references,prediction,id,id\nq,a,a,1,2\n", encoding="utf-8")
    else:
        pq.write_table(pa.table([["q"], ["a"], ["a"], ["b"]], names=["question", "references", "prediction", "prediction"]), source)
    result, sent = _graded(tmp_path, source, tmp_path / "out.jsonl")
    assert sent == 0
    assert result.exit_code == 2 and "duplicate column names" in result.output
    assert ("'id'" if suffix == ".csv" else "'prediction'") in result.output


def test_a_header_only_csv_is_exit_2_no_rows_to_grade(tmp_path) -> None:
    # Issue 35: a 0-row "success" (exit 0, an empty output) hid a wrong file; it is now exit 2 saying so.
    source, output = tmp_path / "in.csv", tmp_path / "out.jsonl"
    source.write_text(",".join(HEADER) + "\n", encoding="utf-8")
    with FakeProvider(responder=reference_judge) as fake:
        result = _grade(fake, tmp_path, source, output)
    assert result.exit_code == 2 and "no rows to grade" in result.output, result.output
    assert not output.exists()


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
@pytest.mark.parametrize("encoding, bom", [("utf-16", b""), ("utf-16-le", "\ufeff"), ("utf-16-be", ""), ("utf-32", b""),
                                           ("utf-32-le", "\ufeff")],
                         ids=["utf-16", "utf-16-le-bom", "utf-16-be", "utf-32", "utf-32-le-bom"])
def test_utf16_and_utf32_input_is_read_with_encoding(tmp_path, suffix, encoding, bom) -> None:
    """A newline is not the byte 0x0a in these encodings: lines are found after decoding (before: nothing could be read)."""
    rows = [_row(i) for i in range(6)]
    if suffix == ".csv":
        text = _csv_bytes(rows).decode("utf-8")
    else:
        text = "".join(json.dumps(dict(zip(HEADER, row)), ensure_ascii=False) + "\n" for row in rows)
    source, output = tmp_path / f"in{suffix}", tmp_path / "out.jsonl"
    source.write_bytes((bom if isinstance(bom, bytes) else bom.encode(encoding)) + text.replace("question 3", "question 3 — 问").encode(encoding))
    with FakeProvider(responder=reference_judge) as fake:
        result = _grade(fake, tmp_path, source, output, "--encoding", encoding)
    assert result.exit_code == 0, result.output
    graded = _jsonl(output)
    assert [str(r["id"]) for r in graded] == [str(i) for i in range(6)] and {r["status"] for r in graded} == {"ok"}
    assert graded[3]["question"] == "question 3 — 问?" and "question" in graded[0]  # no BOM in the first column's name


@pytest.mark.parametrize("line, key", [
    ('{"question": "q?", "references": "a", "prediction": "a", "id": "1", "prediction": "planted"}', "prediction"),
    ('{"question":"q?","references":"a","prediction":"a","id":"1","question":"other?"}', "question"),
    ('{"question": "q?", "references": {"x": 1, "x": 2}, "prediction": "a", "id": "1"}', "x"),
    ('{"question" : "q?", "references" : "a", "prediction" : "a", "prediction" : "b", "id": "1"}', "prediction"),
], ids=["spaced", "compact", "nested", "space-before-colon"])
def test_a_jsonl_row_with_a_repeated_key_is_that_rows_error_naming_the_key(tmp_path, line, key) -> None:
    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    good = [json.dumps(dict(zip(HEADER, _row(i)))) for i in range(3)]
    tricky = json.dumps({"question": 'say "a": here', "references": "a", "prediction": "a", "id": "9"})  # '":' inside a string
    source.write_text("\n".join([good[0], line, good[1], tricky, good[2]]) + "\n", encoding="utf-8")
    result, sent = _graded(tmp_path, source, output)
    assert sent == 4  # before: the row was graded with the last value
    assert result.exit_code == 1, result.output
    rows = _jsonl(output)
    assert [r["status"] for r in rows] == ["ok", "error", "ok", "ok", "ok"]
    assert rows[1]["error_kind"] == "input" and f"the key {key!r} appears more than once" in rows[1]["error"]
    assert "row 2" in rows[1]["error"]
