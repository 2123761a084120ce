"""`gradekit view` and `gradekit report` over real graded files: the JSON API over plain HTTP, the CLI, the report file.

The graded files come from real `gradekit grade` runs against the fake provider (a stand-in judge
that reads the rendered prompt; some replies unreadable on purpose), in JSONL, CSV and Parquet,
plus a pairwise run. Every expectation is computed from the file itself, independently of DuckDB.
"""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gradekit.graders.cli import app
from gradekit.judge.testing import FakeProvider, Reply

from ..cases import cases
from ..conftest import need, reference_judge

need("duckdb", "pip install 'gradekit[view]'")

ROWS = 120
GARBLED = "GARBLED"  # predictions carrying this get an unreadable judge reply: a parse failure with its raw reply
UNREADABLE = "Hmm, hard to say. Maybe?"
runner = CliRunner()


def judge_reply(body: dict) -> Reply:
    if GARBLED in body["messages"][-1]["content"]:
        return Reply(content=UNREADABLE)
    return reference_judge(body)


def pair_reply(body: dict) -> Reply:
    """Prefers the output holding "good" when the instruction says so; otherwise always the first shown (orders flip)."""
    user = body["messages"][-1]["content"]
    if "steady" in user:
        shown_first = user[user.index("<output_a>"):user.index("</output_a>")]
        return Reply(content="Output (a)" if "good" in shown_first else "Output (b)")
    return Reply(content="Output (a)")


def input_rows() -> list[dict[str, Any]]:
    rows = []
    for i in range(ROWS):
        right = i % 3 != 0
        prediction = "The capital is Paris." if right else "It is Lyon, I believe."
        if i % 25 == 7:
            prediction = f"{GARBLED} Paris"
        gold = "correct" if right else "incorrect"
        if i % 10 == 4:
            gold = "incorrect" if right else "correct"  # the judge and the human disagree here
        rows.append({"id": f"q{i:03d}", "question": f"What is the capital of France? (variant {i})", "references": ["Paris"],
                     "prediction": prediction, "label": gold})
    rows[42]["question"] = "Which city hosts the Zanzibar-Quokka summit?"  # a needle for the text search
    return rows


def read(path: Path) -> list[dict[str, Any]]:
    if path.suffix == ".csv":
        with path.open(encoding="utf-8", newline="") as f:
            return list(csv.DictReader(f))
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def grade(*args: str) -> None:
    result = runner.invoke(app, ["grade", *args, "--no-cache", "--api-key", "k"])
    assert result.exit_code in (0, 1), result.output  # 1: some rows are judge errors, which the fixture wants


_GRADED: dict[Path, dict[str, Path]] = {}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The graded files, made once per session (the browser tests import this fixture too)."""
    base = tmp_path_factory.getbasetemp()
    if base not in _GRADED:
        _GRADED[base] = _grade_all(tmp_path_factory.mktemp("view"))
    return _GRADED[base]


def _grade_all(folder: Path) -> dict[str, Path]:
    source = folder / "in.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in input_rows()), encoding="utf-8")
    with FakeProvider(responder=judge_reply) as fake:
        for suffix in ("jsonl", "csv", "parquet"):
            grade(str(source), "-r", "semantic_equivalence_en", "-o", str(folder / f"out.{suffix}"), "--base-url", fake.base_url)
    labels = folder / "labels.csv"
    with labels.open("w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "label"])
        for row in input_rows()[:100]:  # the last 20 rows have no human label
            writer.writerow([row["id"], row["label"]])
    pairs = folder / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"id": f"p{i}", "instruction": f"Say something {'steady' if i % 2 else 'else'} #{i}",
                                         "output_1": "a good answer" if i % 3 else "a poor answer",
                                         "output_2": "a poor answer" if i % 3 else "a good answer"}) + "\n" for i in range(12)),
                     encoding="utf-8")
    with FakeProvider(responder=pair_reply) as fake:
        grade(str(pairs), "-r", "llmbar_pairwise", "-o", str(folder / "pairs_out.jsonl"), "--base-url", fake.base_url)
    for name in ("out.jsonl", "out.csv", "out.parquet", "pairs_out.jsonl"):
        assert (folder / name).is_file(), name
    return {"jsonl": folder / "out.jsonl", "csv": folder / "out.csv", "parquet": folder / "out.parquet",
            "labels": labels, "pairs": folder / "pairs_out.jsonl", "folder": folder}


def start_view(*args: str, cwd: Path | None = None) -> tuple[subprocess.Popen, str]:
    """`gradekit view` as a real subprocess on a free port (in ``cwd``); returns it and its URL (its first stdout line)."""
    proc = subprocess.Popen([sys.executable, "-m", "gradekit", "view", *args, "--port", "0", "--no-browser"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd)
    url = proc.stdout.readline().strip()  # type: ignore[union-attr]
    if not url.startswith("http://"):
        proc.kill()
        raise AssertionError(f"gradekit view did not start: {url!r} {proc.communicate()[1]}")
    return proc, url


def stop_view(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, proc.stderr.read()  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def view(files: dict[str, Path]) -> Iterator[str]:
    proc, url = start_view(str(files["jsonl"]), "--labels", str(files["labels"]), "--on", "id", "--rubric", "semantic_equivalence_en")
    yield url
    stop_view(proc)
    assert not list(Path(tempfile.gettempdir()).glob(f"gradekit-view-{proc.pid}-*")), "the viewer left its database behind"


def get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def api(url: str) -> Any:
    status, body = get(url)
    assert status == 200, body
    return body


# --------------------------------------------------------------------------------------------
# The JSON API
# --------------------------------------------------------------------------------------------


def test_first_page_has_the_total_and_each_row_its_index_in_the_file(view: str, files: dict[str, Path]) -> None:
    rows = read(files["jsonl"])
    page = api(f"{view}/api/rows?offset=0&limit=10")
    assert page["total"] == len(rows) == ROWS
    assert [r["index"] for r in page["rows"]] == list(range(10))
    assert [r["id"] for r in page["rows"]] == [r["id"] for r in rows[:10]]
    following = api(f"{view}/api/rows?offset=10&limit=10")
    assert [r["index"] for r in following["rows"]] == list(range(10, 20))
    past = api(f"{view}/api/rows?offset=500&limit=10")
    assert past["total"] == ROWS and past["rows"] == []


def test_status_filter_returns_exactly_the_error_rows(view: str, files: dict[str, Path]) -> None:
    rows = read(files["jsonl"])
    errors = [i for i, r in enumerate(rows) if r["status"] == "error"]
    assert errors, "the fixture must produce judge failures"
    page = api(f"{view}/api/rows?status=error&limit=1000")
    assert page["total"] == len(errors)
    assert [r["index"] for r in page["rows"]] == errors
    assert all(r["error_kind"] == "parse_failure" and r["raw_reply"] == UNREADABLE for r in page["rows"])
    both = api(f"{view}/api/rows?status=ok,error&limit=1")
    assert both["total"] == ROWS


@pytest.mark.parametrize("query, keep", [
    pytest.param("label=correct", lambda r: r["label"] == "correct", id="label"),
    pytest.param("error_kind=parse_failure", lambda r: r["error_kind"] == "parse_failure", id="error_kind"),
    pytest.param("score_min=0.5", lambda r: r["score"] is not None and r["score"] >= 0.5, id="score_min"),
    pytest.param("score_max=0.5", lambda r: r["score"] is not None and r["score"] <= 0.5, id="score_max"),
    pytest.param("q=zanzibar-QUOKKA", lambda r: "Zanzibar-Quokka" in r["question"], id="text_search_any_case"),
    pytest.param("q=hard%20to%20say", lambda r: r["raw_reply"] == UNREADABLE, id="text_search_finds_raw_replies"),
    pytest.param("status=ok&label=incorrect", lambda r: r["status"] == "ok" and r["label"] == "incorrect", id="combined"),
])
def test_filters_match_the_file(view: str, files: dict[str, Path], query: str, keep: Any) -> None:
    rows = read(files["jsonl"])
    expected = [i for i, r in enumerate(rows) if keep(r)]
    assert expected
    page = api(f"{view}/api/rows?{query}&limit=1000")
    assert page["total"] == len(expected)
    assert [r["index"] for r in page["rows"]] == expected


def test_disagrees_with_the_human_label(view: str, files: dict[str, Path]) -> None:
    rows = read(files["jsonl"])
    human = {r["id"]: r["label"] for r in read(files["labels"])}
    expected = [i for i, r in enumerate(rows) if r["status"] == "ok" and r["id"] in human and human[r["id"]] != r["label"]]
    assert expected
    page = api(f"{view}/api/rows?disagree=true&limit=1000")
    assert [r["index"] for r in page["rows"]] == expected
    assert all(r["human_label"] == human[r["id"]] for r in page["rows"])


def test_sort_and_page_through_a_sorted_filter(view: str, files: dict[str, Path]) -> None:
    rows = read(files["jsonl"])
    by_id = sorted(range(len(rows)), key=lambda i: rows[i]["id"], reverse=True)
    first = api(f"{view}/api/rows?sort=-id&limit=7")
    second = api(f"{view}/api/rows?sort=-id&offset=7&limit=7")
    assert [r["index"] for r in first["rows"] + second["rows"]] == by_id[:14]
    scored = api(f"{view}/api/rows?sort=score&status=ok&limit=1000")["rows"]
    assert [r["score"] for r in scored] == sorted(r["score"] for r in rows if r["status"] == "ok")


def test_one_row_whole_and_its_judge_prompt(view: str, files: dict[str, Path]) -> None:
    rows = read(files["jsonl"])
    row = api(f"{view}/api/rows/7")
    assert row == {"index": 7, **rows[7], "human_label": "correct"}
    assert row["raw_reply"] == UNREADABLE and row["status"] == "error"
    prompt = api(f"{view}/api/rows/7/prompt")
    assert prompt["rubric"] == "semantic_equivalence_en" and prompt["version"] == 1  # docs/view.md
    assert any(rows[7]["prediction"] in m["content"] for m in prompt["messages"])


@pytest.mark.parametrize("path, status", cases("view_bad_requests"))
def test_bad_requests_get_a_named_error(view: str, path: str, status: int) -> None:
    code, body = get(view + path)
    assert code == status and body["error"]


@pytest.mark.parametrize("query, name", cases("view_bad_parameters"))
def test_every_out_of_range_or_malformed_parameter_is_400_naming_it(view: str, query: str, name: str) -> None:
    code, body = get(f"{view}/api/rows?{query}")
    assert code == 400 and body["error"].startswith(f"{name}:"), body


def test_the_largest_page_and_the_last_offset_are_answered(view: str) -> None:
    assert len(api(f"{view}/api/rows?limit=1000")["rows"]) == ROWS
    assert api(f"{view}/api/rows?offset={2**62}&limit=1000")["rows"] == []
    assert api(f"{view}/api/rows?disagree=false&flipped=0")["total"] == ROWS


def raw_request(url: str, method: str, path: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    """One request with exactly these headers (``Host`` included), through http.client."""
    import http.client

    host, port = url.removeprefix("http://").rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=120)
    try:
        connection.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for key, value in headers.items():
            connection.putheader(key, value)
        connection.endheaders()
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


@pytest.mark.parametrize("host", ["evil.example", "evil.example:{port}", "127.0.0.1.evil.example:{port}", "localhost:1",
                                  "localhost:{port}@evil.example", "", "[::1", "127.0.0.1:{port}x"])
def test_a_host_that_does_not_name_the_viewer_is_403(view: str, host: str) -> None:
    """DNS rebinding: a page on evil.example re-points its name at 127.0.0.1; its requests carry its own Host."""
    port = view.rsplit(":", 1)[1]
    for path in ("/", "/api/rows", "/api/rows/0", "/api/summary", "/static/view.js"):
        status, headers, body = raw_request(view, "GET", path, {"Host": host.format(port=port)})
        assert status == 403, (host, path, status)
        assert "Zanzibar" not in body.decode() and "Paris" not in body.decode()
        assert json.loads(body)["error"].startswith("Host ")


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "localhost:{port}", "LOCALHOST:{port}", "[::1]:{port}", "localhost.:{port}"])
def test_the_loopback_names_with_the_port_are_answered_without_cors_headers(view: str, host: str) -> None:
    port = view.rsplit(":", 1)[1]
    status, headers, body = raw_request(view, "GET", "/api/rows?limit=1", {"Host": host.format(port=port), "Origin": "http://evil.example"})
    assert status == 200 and json.loads(body)["total"] == ROWS
    assert not [h for h in headers if h.startswith("access-control-")], headers
    status, headers, _ = raw_request(view, "OPTIONS", "/api/rows", {"Host": host.format(port=port), "Origin": "http://evil.example",
                                                                   "Access-Control-Request-Method": "GET"})
    assert status != 200 or not [h for h in headers if h.startswith("access-control-")], (status, headers)
    assert not [h for h in headers if h.startswith("access-control-")], headers


def test_summary_counts_histogram_tokens_and_agreement(view: str, files: dict[str, Path]) -> None:
    rows = read(files["jsonl"])
    human = {r["id"]: r["label"] for r in read(files["labels"])}
    summary = api(f"{view}/api/summary")
    assert summary["rows"] == ROWS and summary["kind"] == "rubric" and summary["rubric"] == "semantic_equivalence_en"
    assert summary["status"] == dict(Counter(r["status"] for r in rows))
    assert summary["labels"] == dict(Counter(r["label"] for r in rows if r["label"] is not None))
    assert summary["error_kinds"] == dict(Counter(r["error_kind"] for r in rows if r["error_kind"]))
    scores = [r["score"] for r in rows if r["score"] is not None]
    assert sum(b["count"] for b in summary["score"]["histogram"]) == len(scores) == summary["score"]["count"]
    assert summary["score"]["mean"] == pytest.approx(sum(scores) / len(scores))
    assert summary["tokens"]["prompt"] == sum(r["prompt_tokens"] for r in rows)
    a = summary["agreement"]
    judged = [(human[r["id"]], r["label"]) for r in rows if r["id"] in human and r["status"] == "ok"]
    assert a["labelled"] == len(human) and a["judged"] == len(judged)
    assert a["accuracy"] == pytest.approx(sum(h == j for h, j in judged) / len(judged))
    cells = Counter(judged)
    labels = a["confusion"]["labels"]
    assert a["confusion"]["matrix"] == [[cells[(h, j)] for j in labels] for h in labels]
    assert [d["index"] for d in a["disagreements"]] == [i for i, r in enumerate(rows)
                                                        if r["id"] in human and r["status"] == "ok" and human[r["id"]] != r["label"]]


# --------------------------------------------------------------------------------------------
# The library over each format, pairwise and broken files
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["csv", "parquet"])
def test_csv_and_parquet_outputs_read_like_jsonl(files: dict[str, Path], kind: str) -> None:
    from gradekit.graders.view import ResultsFile, RowFilter, summarise

    rows = read(files["jsonl"])
    results = ResultsFile(files[kind], background=False)
    try:
        errors = results.rows(RowFilter(status="error"), limit=1000)
        assert [r["index"] for r in errors.rows] == [i for i, r in enumerate(rows) if r["status"] == "error"]
        assert [r["id"] for r in results.rows(limit=5).rows] == [r["id"] for r in rows[:5]]
        summary = summarise(results)
        assert summary["rows"] == ROWS and summary["status"] == dict(Counter(r["status"] for r in rows))
        # No --labels: the input's own gold label (kept as input_label) is the human label.
        assert summary["agreement"]["labelled"] == ROWS
    finally:
        results.close()


def test_pairwise_output_the_two_orders_disagree(files: dict[str, Path]) -> None:
    from gradekit.graders.view import ResultsFile, RowFilter, summarise

    rows = read(files["pairs"])
    results = ResultsFile(files["pairs"], background=False)
    try:
        assert results.kind == "pairwise" and results.judge_column == "winner"
        flipped = results.rows(RowFilter(flipped=True), limit=100)
        expected = [i for i, r in enumerate(rows) if r["agree"] is False]
        assert 0 < len(expected) < len(rows) and [r["index"] for r in flipped.rows] == expected
        summary = summarise(results)
        assert summary["pairwise"]["agree"] == {str(k).lower(): v for k, v in Counter(r["agree"] for r in rows).items()}
        assert summary["labels"] == dict(Counter(r["winner"] for r in rows))
        row = results.row(expected[0])
        assert {"label_ab", "label_ba", "rationale_ab", "rationale_ba", "raw_reply_ab", "raw_reply_ba"} <= set(row)
    finally:
        results.close()


GRADER = """
type: weighted
parts:
  exact: {weight: 3, type: string_match, expression: "{{references.answer}}", operation: EXACT_MATCH,
          parse: {type: REGEX_EXTRACT, regex: "<answer>(.*?)</answer>"}}
  loose: {weight: 1, type: string_match, expression: "{{references.answer}}", operation: PARTIAL_MATCH}
"""


@pytest.mark.parametrize("suffix", ["jsonl", "csv", "parquet"])
def test_a_grader_output_summarises_each_part(tmp_path: Path, suffix: str) -> None:
    from gradekit.graders.view import ResultsFile, RowFilter, summarise

    config, source, output = tmp_path / "g.yaml", tmp_path / "in.jsonl", tmp_path / f"out.{suffix}"
    config.write_text(GRADER, encoding="utf-8")
    rows = [{"id": 1, "response": "<answer>4</answer>", "answer": "4"}, {"id": 2, "response": "<answer>5</answer> or 6", "answer": "6"},
            {"id": 3, "response": "<answer>1</answer>"}]  # no answer: status invalid
    source.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    result = runner.invoke(app, ["grade", str(source), "--grader", str(config), "-o", str(output)])
    assert result.exit_code in (0, 1) and output.is_file(), result.output
    results = ResultsFile(output, background=False)
    try:
        summary = summarise(results)
        assert summary["kind"] == "grader" and summary["status"] == {"ok": 2, "invalid": 1}
        assert {k: (v["count"], v["mean"]) for k, v in summary["parts"].items()} == {"exact": (2, 0.0), "loose": (2, 1.0)}
        assert [r["index"] for r in results.rows(RowFilter(status="invalid")).rows] == [2]
    finally:
        results.close()


def test_pairwise_prompt_shows_both_orders(files: dict[str, Path]) -> None:
    from gradekit.graders.view._prompt import render_prompt
    from gradekit.judge import load_rubric

    row = read(files["pairs"])[1]
    rendered = render_prompt(load_rubric("llmbar_pairwise"), row, pairwise=True)
    ab, ba = rendered["messages"][-1]["content"], rendered["messages_ba"][-1]["content"]
    assert ab.index(row["output_1"]) < ab.index(row["output_2"]) and ba.index(row["output_2"]) < ba.index(row["output_1"])


def test_a_line_cut_short_by_a_killed_run_is_an_empty_row_and_a_warning(files: dict[str, Path], tmp_path: Path) -> None:
    from gradekit.graders.view import ResultsFile, summarise

    broken = tmp_path / "broken.jsonl"
    text = files["jsonl"].read_text(encoding="utf-8")
    broken.write_text(text + text.splitlines()[0][:40], encoding="utf-8")  # a last line cut mid-way
    results = ResultsFile(broken, background=False)
    try:
        assert results.total_rows == ROWS + 1
        assert results.row(ROWS)["status"] is None and results.row(ROWS - 1)["id"] == read(files["jsonl"])[-1]["id"]
        assert any("could not be read" in w for w in summarise(results)["warnings"])
    finally:
        results.close()


def test_the_first_page_is_answered_before_the_copy_for_filters_is_made(files: dict[str, Path]) -> None:
    """`gradekit view` listens and answers the page and its first rows from the file itself; the copy that
    filters and the summary run on starts only after that first page, so its answer is a state, not a race."""
    rows = read(files["jsonl"])
    proc, url = start_view(str(files["jsonl"]), "--labels", str(files["labels"]), "--on", "id")
    try:
        with urllib.request.urlopen(f"{url}/", timeout=120) as response:
            assert response.status == 200 and b"<html" in response.read().lower()
        first = api(f"{url}/api/rows?offset=0&limit=50")
        assert first["ready"] is False, "the copy was made before the first page was answered"
        assert first["total"] == ROWS and [r["index"] for r in first["rows"]] == list(range(50))
        assert [r["id"] for r in first["rows"]] == [r["id"] for r in rows[:50]]
        labelled = {r["id"]: r["label"] for r in input_rows()[:100]}  # what labels.csv holds
        assert [r["human_label"] for r in first["rows"]] == [labelled[r["id"]] for r in rows[:50]]
        last = api(f"{url}/api/rows/{ROWS - 1}")
        assert last["id"] == rows[-1]["id"] and last["human_label"] is None  # the last 20 rows have no human label
        summary = api(f"{url}/api/summary")  # waits for the copy: its figures are whole
        assert summary["rows"] == ROWS and summary["status"] == dict(Counter(r["status"] for r in rows).most_common())
        later = api(f"{url}/api/rows?offset=0&limit=50")
        assert later["ready"] is True and later["rows"] == first["rows"]  # the same rows, human label and all
    finally:
        stop_view(proc)


def test_a_deferred_copy_starts_when_a_filter_needs_it(files: dict[str, Path]) -> None:
    from gradekit.graders.view import ResultsFile, RowFilter, summarise

    rows = read(files["jsonl"])
    results = ResultsFile(files["jsonl"], deferred=True)
    try:
        page = results.rows(limit=10)
        assert page.ready is False and not results.indexing and page.total == ROWS
        errors = results.rows(RowFilter(status="error"))  # needs the copy: starts it and waits
        assert errors.ready and results.ready and errors.total == sum(r["status"] == "error" for r in rows)
        assert summarise(results)["rows"] == ROWS
    finally:
        results.close()


def test_closing_while_the_copy_runs_stops_it_and_removes_the_database(tmp_path: Path) -> None:
    from gradekit.graders.view import ResultsFile

    path = tmp_path / "big.jsonl"
    line = json.dumps({"id": 0, "status": "ok", "label": "correct", "question": "what is the capital of France? " * 4}) + "\n"
    path.write_text(line * 100_000, encoding="utf-8")
    results = ResultsFile(path)  # counts, then copies in the background
    folder = results._folder
    assert results.rows(limit=5).total == 100_000
    results.close()  # whatever the copy's progress: it is interrupted or done, never left writing
    assert not folder.exists()


@pytest.mark.parametrize("body, total", cases("view_row_counts"))
def test_the_row_count_is_the_rows_the_copy_holds(tmp_path: Path, body: str, total: int) -> None:
    """The first page's total comes from a line count (wc and grep, or Python's); it must be what DuckDB makes of the file."""
    from gradekit.graders.view import ResultsFile
    from gradekit.graders.view._results import count_lines

    path = tmp_path / "rows.jsonl"
    path.write_bytes(body.encode())
    assert count_lines(path) in (total, None) and count_lines(path, tools=False) == count_lines(path)  # None: ask DuckDB
    results = ResultsFile(path, background=False)
    try:
        assert results.total_rows == total and results.rows().total == total
        assert not [w for w in results.warnings if "counted" in w]
    finally:
        results.close()


@pytest.mark.parametrize("name, last, found", [
    pytest.param("late.jsonl", {"id": 30000, "status": "error", "note": {"deep": [1, 2]}}, '{"deep":[1,2]}', id="jsonl_column_empty_until_late"),
    pytest.param("mixed.jsonl", {"id": "x-1", "status": "error", "note": "deep"}, "deep", id="jsonl_type_changes_late"),
    pytest.param("late.csv", {"id": "x-1", "status": "error", "note": "deep"}, "deep", id="csv_type_changes_late"),
])
def test_values_past_the_type_sample_are_kept(tmp_path: Path, name: str, last: dict, found: str) -> None:
    """DuckDB guesses types from the first rows; a graded file's error columns are empty until the first failure."""
    from gradekit.graders.view import ResultsFile, RowFilter

    path = tmp_path / name
    rows = [{"id": i, "status": "ok", "note": None} for i in range(30000)] + [last]
    if name.endswith(".csv"):
        with path.open("w", encoding="utf-8", newline="") as f:
            writer = csv.DictWriter(f, ["id", "status", "note"])
            writer.writeheader()
            writer.writerows(rows)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    results = ResultsFile(path, background=False)
    try:
        errors = results.rows(RowFilter(status="error"))
        assert errors.total == 1 and errors.rows[0]["index"] == 30000 and errors.rows[0]["note"] == found
        assert str(errors.rows[0]["id"]) == str(last["id"])
        assert results.rows(RowFilter(q="deep")).total == 1
    finally:
        results.close()


# --------------------------------------------------------------------------------------------
# The commands
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("args, message", cases("view_refusals"))
def test_view_refuses_what_it_cannot_show(files: dict[str, Path], args: list[str], message: str | None) -> None:
    (files["folder"] / "notes.txt").write_text("hello", encoding="utf-8")
    argv = [a.format(**{k: str(v) for k, v in files.items()}) for a in args]
    if message is None:  # a CSV without result columns is still a table to browse: the report works
        result = runner.invoke(app, ["report", *argv, "-o", str(files["folder"] / "labels.html")])
        assert result.exit_code == 0, result.output
        return
    result = runner.invoke(app, ["view", *argv, "--no-browser", "--port", "0"])
    assert result.exit_code == 2 and message in result.output, result.output


def test_view_exits_1_when_the_port_is_taken(files: dict[str, Path]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.Popen([sys.executable, "-m", "gradekit", "view", str(files["jsonl"]), "--port", str(port), "--no-browser"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "could not serve" in err, err
    assert not list(Path(tempfile.gettempdir()).glob(f"gradekit-view-{proc.pid}-*")), "the viewer left its database behind"


def test_two_viewers_of_one_file_at_once(files: dict[str, Path]) -> None:
    first, first_url = start_view(str(files["jsonl"]))
    try:
        second, second_url = start_view(str(files["jsonl"]))
        try:
            assert api(f"{first_url}/api/rows?status=error")["total"] == api(f"{second_url}/api/rows?status=error")["total"]
        finally:
            stop_view(second)
    finally:
        stop_view(first)


def test_report_holds_the_worst_rows_first_inline(files: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    result = runner.invoke(app, ["report", str(files["jsonl"]), "-o", str(out), "--labels", str(files["labels"]), "--on", "id",
                                 "--rows", "20"])
    assert result.exit_code == 0, result.output
    html = out.read_text(encoding="utf-8")
    # Nothing to fetch: no element loads a file or a URL (the SVG namespace string is a name, not a request).
    assert not re.search(r"""(?:src|href)\s*=\s*["']?(?:https?:|//|/static)""", html, re.I)
    assert "<style>" in html and "fetch(" in html and 'data-mode="report"' in html
    data = json.loads(html.split('<script id="gradekit-data" type="application/json">', 1)[1].split("</script>", 1)[0])
    rows = read(files["jsonl"])
    human = {r["id"]: r["label"] for r in read(files["labels"])}
    errors = [i for i, r in enumerate(rows) if r["status"] == "error"]
    disagreements = [i for i, r in enumerate(rows) if r["status"] == "ok" and r["id"] in human and human[r["id"]] != r["label"]]
    shown = [r["index"] for r in data["rows"]]
    assert len(shown) == 20 and shown == (errors + disagreements + [i for i in range(ROWS) if i not in errors + disagreements])[:20]
    assert data["summary"]["rows"] == ROWS and data["summary"]["agreement"]["judged"] > 0


def test_report_escapes_row_text_that_looks_like_markup(tmp_path: Path) -> None:
    path = tmp_path / "evil.jsonl"
    path.write_text(json.dumps({"id": 1, "status": "ok", "label": "x", "score": 1.0,
                                "response": "</script><script>alert(1)</script><!--"}) + "\n", encoding="utf-8")
    result = runner.invoke(app, ["report", str(path), "-o", str(tmp_path / "r.html")])
    assert result.exit_code == 0, result.output
    html = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert "<script>alert(1)" not in html and html.count("</script>") == 2


def test_cli_help_loads_no_heavy_library() -> None:
    code = ("import sys; from typer.testing import CliRunner; from gradekit.graders.cli import app; "
            "[CliRunner().invoke(app, [c, '--help']) for c in ('view', 'report')]; "
            "print(','.join(m for m in ('duckdb', 'uvicorn', 'starlette', 'pyarrow') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env={**os.environ})
    assert out.returncode == 0, out.stderr
    assert "duckdb" not in out.stdout


@pytest.mark.parametrize("suffix", ["jsonl", "csv"])
def test_an_eval_run_shows_its_result_counts_and_per_criterion_figures(tmp_path: Path, suffix: str) -> None:
    """A file graded with an Evals-API definition: the summary holds the figures `gradekit grade --json` reported."""
    from gradekit.graders.view import ResultsFile, summarise

    criteria = [{"type": "string_check", "name": "exact", "input": "{{ sample.output_text }}", "reference": "{{ item.answer }}",
                 "operation": "eq"},
                {"type": "python", "name": "short", "source": "def grade(sample, item):\n    return 1.0 if len(sample['output_text']) < 6 else 0.0\n",
                 "pass_threshold": 0.5},
                {"type": "string_check", "name": "city", "input": "{{ item.city }}", "reference": "Paris", "operation": "eq"}]
    definition, source, output = tmp_path / "eval.json", tmp_path / "items.jsonl", tmp_path / f"out.{suffix}"
    definition.write_text(json.dumps({"name": "v", "data_source_config": {"type": "custom", "item_schema": {}}, "testing_criteria": criteria}))
    answers = ["Paris", "paris", "Paris, France", "Rome", "Paris", "Lyon"]
    rows = [{"item": {"answer": "Paris", **({"city": "Paris"} if n != 4 else {})}, "sample": {"output_text": a}} for n, a in enumerate(answers)]
    source.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    result = runner.invoke(app, ["grade", str(source), "--grader", str(definition), "-o", str(output), "--json", "--no-cache"])
    assert result.exit_code == 1, result.output  # row 4 lacks item.city: an errored row
    reported = json.loads(result.stdout)
    assert reported["result_counts"] == {"total": 6, "passed": 1, "failed": 4, "errored": 1}
    results = ResultsFile(output, background=False)
    try:
        summary = summarise(results)
    finally:
        results.close()
    assert summary["result_counts"] == reported["result_counts"]
    assert summary["per_testing_criteria_results"] == reported["per_testing_criteria_results"]
    plain = tmp_path / "plain.jsonl"  # any other graded file has no eval run
    plain.write_text(json.dumps({"score": 1.0, "status": "ok", "metrics": {"passed": 1.0}}) + "\n")
    results = ResultsFile(plain, background=False)
    try:
        assert summarise(results)["result_counts"] is None
    finally:
        results.close()


def test_an_eval_run_whose_criteria_have_their_own_ids_shows_its_figures(tmp_path: Path) -> None:
    """A retrieved eval's criteria keep their `id` whatever it looks like: the summary still finds them."""
    from gradekit.graders.view import ResultsFile, summarise

    criteria = [{"id": "exact_1", "type": "string_check", "name": "exact", "input": "{{ sample.output_text }}",
                 "reference": "{{ item.answer }}", "operation": "eq"},
                {"id": "close.2", "type": "text_similarity", "name": "close", "input": "{{ sample.output_text }}",
                 "reference": "{{ item.answer }}", "evaluation_metric": "fuzzy_match", "pass_threshold": 0.8}]
    definition, source, output = tmp_path / "eval.json", tmp_path / "items.jsonl", tmp_path / "out.jsonl"
    definition.write_text(json.dumps({"object": "eval", "id": "eval_1", "name": "v", "created_at": 1, "metadata": {},
                                      "data_source_config": {"type": "custom", "schema": {}}, "testing_criteria": criteria}))
    source.write_text("".join(json.dumps({"item": {"answer": "Paris"}, "sample": {"output_text": a}}) + "\n"
                              for a in ("Paris", "paris", "Rome")), encoding="utf-8")
    result = runner.invoke(app, ["grade", str(source), "--grader", str(definition), "-o", str(output), "--json", "--no-cache"])
    assert result.exit_code == 0, result.output
    reported = json.loads(result.stdout)
    assert reported["per_testing_criteria_results"] == [{"testing_criteria": "exact_1", "passed": 1, "failed": 2},
                                                         {"testing_criteria": "close.2", "passed": 2, "failed": 1}]
    results = ResultsFile(output, background=False)
    try:
        summary = summarise(results)
    finally:
        results.close()
    assert summary["result_counts"] == reported["result_counts"] == {"total": 3, "passed": 1, "failed": 2, "errored": 0}
    assert summary["per_testing_criteria_results"] == reported["per_testing_criteria_results"]
