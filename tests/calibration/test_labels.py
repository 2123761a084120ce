"""Human labelling: the labels store, `gradekit view --annotate` (blind, active sampling) over HTTP, and the labels
read back by `gradekit calibrate --ppi` and `gradekit report`.

One graded file from a real `gradekit grade` run against the loopback fake provider; the viewer and
the CLI run as subprocesses; the viewer is SIGKILLed mid-session to show that no acknowledged label is lost.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from typer.testing import CliRunner

from gradekit.graders.calibration import LabelsError, LabelStore, read_labels
from gradekit.graders.cli import app
from gradekit.judge.testing import FakeProvider, Reply

from ..conftest import need, reference_judge
from ..view.test_view import grade, start_view

need("duckdb", "pip install 'gradekit[view]'")

ROWS = 40
GARBLED = "GARBLED"
JUDGE_COLUMNS = ("score", "label", "rationale", "raw_reply", "error")


def judge_reply(body: dict) -> Reply:
    if GARBLED in body["messages"][-1]["content"]:
        return Reply(content="Hmm. Maybe?")
    return reference_judge(body)


@pytest.fixture(scope="module")
def graded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("labels")
    source = folder / "in.jsonl"
    rows = [{"id": f"q{i:03d}", "question": f"Capital of France? ({i})", "references": ["Paris"],
             "prediction": f"{GARBLED} Paris" if i % 13 == 5 else ("Paris." if i % 3 else "Lyon.")} for i in range(ROWS)]
    source.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    with FakeProvider(responder=judge_reply) as fake:
        grade(str(source), "-r", "semantic_equivalence_en", "-o", str(folder / "out.jsonl"), "--base-url", fake.base_url)
    return folder / "out.jsonl"


def call(url: str, body: Any = None, headers: dict[str, str] | None = None, raw: bytes | None = None) -> tuple[int, Any]:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    request = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET",
                                     headers={**({"Content-Type": "application/json"} if body is not None else {}), **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def run(*args: str) -> subprocess.CompletedProcess:
    """A one-shot command in this process (Click's runner): the same exit status, stdout and stderr, no interpreter start."""
    result = CliRunner().invoke(app, list(args))
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


def test_label_30_rows_blind_and_active_then_kill_calibrate_and_restart(graded: Path, tmp_path: Path) -> None:
    store = tmp_path / "labels.jsonl"
    proc, url = start_view(str(graded), "--annotate", "--blind", "--labels", str(store), "--on", "id",
                           "--rubric", "semantic_equivalence_en", "--labeller", "ann")
    try:
        status, page = call(url + "/api/rows?limit=100")
        assert status == 200 and len(page["rows"]) == ROWS
        for row in page["rows"]:  # blind: nothing the judge said is in an unlabelled row
            assert not set(JUDGE_COLUMNS) & set(row), row
            assert row["labelled"] is False and row["human_label"] is None
        assert call(url + "/api/rows/3")[1].keys().isdisjoint(JUDGE_COLUMNS)
        assert call(url + "/api/rows?q=reference")[1]["total"] == 0  # the rationale text is not searchable either
        assert call(url + "/api/rows?sort=-score")[0] == 400 and call(url + "/api/rows?label=correct")[0] == 400
        summary = call(url + "/api/summary")[1]
        assert summary["blind"] is True and summary["score"] is None and summary["labels"] == {}

        seen = []
        for n in range(30):
            status, drawn = call(url + "/api/next?strategy=active")
            assert status == 200 and 0 < drawn["p"] <= 1 and drawn["index"] not in seen
            status, answer = call(f"{url}/api/rows/{drawn['index']}/label", {"label": "correct" if n % 2 else "incorrect",
                                                                              "note": f"n{n}"})
            assert status == 200, answer
            assert answer["record"]["p"] == drawn["p"] and answer["record"]["labeller"] == "ann"
            seen.append(drawn["index"])
        assert len(set(seen)) == 30
        revealed = call(f"{url}/api/rows/{seen[0]}")[1]  # labelled: the judge's columns are back
        assert revealed["labelled"] is True and "label" in revealed and revealed["human_label"] == "incorrect"

        # Refusals: outside the vocabulary, no such row, another site's page, a form post.
        assert call(f"{url}/api/rows/0/label", {"label": "yes"})[0] == 400
        assert call(f"{url}/api/rows/{ROWS}/label", {"label": "correct"})[0] == 404
        assert call(f"{url}/api/rows/0/label", {"label": "correct"}, {"Origin": "http://evil.example"})[0] == 403
        assert call(f"{url}/api/rows/0/label", {"label": "correct"}, {"Origin": url})[0] == 403  # a browser: needs the token
        assert call(f"{url}/api/rows/0/label", raw=b"label=correct",
                    headers={"Content-Type": "application/x-www-form-urlencoded"})[0] == 415
        assert call(f"{url}/api/rows/0/label", {"label": "correct"}, {"Host": "attacker.example"})[0] == 403
        assert call(f"{url}/api/next", headers={"Sec-Fetch-Site": "cross-site"})[0] == 403  # an <img> on another site
    finally:
        proc.send_signal(signal.SIGKILL)  # no shutdown: what was acknowledged must already be on disk
        proc.wait(timeout=60)

    lines = [json.loads(line) for line in store.read_text(encoding="utf-8").splitlines()]
    assert len(lines) == 30 and len({line["id"] for line in lines}) == 30
    assert all(line["label"] in ("correct", "incorrect") and 0 < line["p"] <= 1 for line in lines)

    done = run("calibrate", str(graded), "--labels", str(store), "--on", "id", "--ppi", "--json", "--bootstrap", "0")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["ppi"]["n_labeled"] == 30 and report["ppi"]["method"] == "ipw-ppi"
    assert 0 <= report["ppi"]["ci_low"] <= report["ppi"]["estimate"] <= report["ppi"]["ci_high"] <= 1

    labelled = {line["id"] for line in lines}
    proc, url = start_view(str(graded), "--annotate", "--labels", str(store), "--on", "id", "--label-values", "correct,incorrect")
    try:
        assert call(url + "/api/rows?q=reference")[1]["total"] > 0  # not blind: the rationale is searched again
        progress = call(url + "/api/labels")[1]
        assert progress["labelled"] == 30 and progress["total"] == ROWS and progress["ppi"]["n_labeled"] == 30
        keys = {row["index"]: row["id"] for row in call(url + "/api/rows?limit=100")[1]["rows"]}
        for strategy in ("random", "active") * 10:  # offers only: never a labelled row
            assert keys[call(f"{url}/api/next?strategy={strategy}")[1]["index"]] not in labelled
        for _ in range(ROWS - 30):
            index = call(url + "/api/next?strategy=random")[1]["index"]
            assert call(f"{url}/api/rows/{index}/label", {"label": "correct"})[0] == 200
        assert call(url + "/api/next")[0] == 404  # every row labelled
        last = call(f"{url}/api/rows/{index}/label", {"label": None})  # an undo is an act too
        assert last[0] == 200 and call(url + "/api/next")[1]["index"] == index
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert len(read_labels(store, "id").records) == ROWS - 1


def test_annotate_refuses_what_it_cannot_use(graded: Path, tmp_path: Path) -> None:
    unknown = run("view", str(graded), "--annotate", "--labels", str(tmp_path / "l.jsonl"), "--on", "nope", "--no-browser")
    assert unknown.returncode == 2 and "nope" in unknown.stderr and "question" in unknown.stderr  # names the columns
    # No --label-values, no --rubric, an empty store and no judge label column in the file: nothing to offer.
    unjudged = tmp_path / "unjudged.jsonl"
    unjudged.write_text("".join(json.dumps({"id": f"q{i}", "question": "q?"}) + "\n" for i in range(3)), encoding="utf-8")
    no_values = run("view", str(unjudged), "--annotate", "--labels", str(tmp_path / "l.jsonl"), "--on", "id", "--no-browser")
    assert no_values.returncode == 2 and "--label-values" in no_values.stderr
    target = tmp_path / "real.jsonl"
    target.write_text("", encoding="utf-8")
    (tmp_path / "link.jsonl").symlink_to(target)
    linked = run("view", str(graded), "--annotate", "--labels", str(tmp_path / "link.jsonl"), "--on", "id",
                 "--label-values", "a,b", "--no-browser")
    assert linked.returncode == 2 and "symlink" in linked.stderr and "Traceback" not in linked.stderr


WRITER = """
import sys
from gradekit.graders.calibration._labels import LabelStore
store = LabelStore(sys.argv[1], "id", sys.argv[2])
for i in range(150):
    store.append(f"{sys.argv[2]}{i}", "x" * (1 + i * 37 % 3000), None, 0.5)
"""


def test_store_survives_two_writers_and_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "labels.jsonl"
    LabelStore(path, "id").append("a", "yes")
    with path.open("ab") as f:
        f.write(b'{"id": "b", "label": "n')  # a writer killed mid-line
    state = read_labels(path, "id")
    assert [r["id"] for r in state.records] == ["a"] and "torn last line" in state.warnings[0]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), name], env=env) for name in ("p", "q")]
    assert [w.wait(timeout=120) for w in writers] == [0, 0]
    state = read_labels(path, "id")
    assert len(state.records) == 301 and len(state.warnings) == 1  # the torn line only: no two lines ever interleaved
    LabelStore(path, "id").append("a", None)  # undo
    assert "a" not in read_labels(path, "id").by_key("id")
    link = tmp_path / "link.jsonl"
    link.symlink_to(path)
    with pytest.raises(LabelsError, match="symlink"):
        LabelStore(link, "id")


def test_calibrate_names_vocabularies_and_clips_small_samples(graded: Path, tmp_path: Path) -> None:
    rows = [json.loads(line) for line in graded.read_text(encoding="utf-8").splitlines()]
    judged = [r for r in rows if r["status"] == "ok"][:4]
    yes_no = tmp_path / "yn.csv"
    yes_no.write_text("id,label\n" + "".join(f"{r['id']},{'yes' if r['label'] == 'correct' else 'no'}\n" for r in judged))
    for extra in ([], ["--ppi"]):
        done = run("calibrate", str(graded), "--labels", str(yes_no), "--on", "id", "--bootstrap", "0", *extra)
        assert done.returncode == 2, done.stdout
        assert all(word in done.stderr for word in ("yes", "no", "correct", "incorrect", "--label-map")), done.stderr
    mapped = run("calibrate", str(graded), "--labels", str(yes_no), "--on", "id", "--bootstrap", "0", "--json",
                 "--label-map", "yes=correct,no=incorrect")
    assert mapped.returncode == 0 and json.loads(mapped.stdout)["classification"]["accuracy"] == 1.0

    four = tmp_path / "four.csv"  # 4 labels of a 0/1 score, all agreeing with the judge: a normal interval leaves [0, 1]
    four.write_text("id,label\n" + "".join(f"{r['id']},{r['label']}\n" for r in judged))
    done = run("calibrate", str(graded), "--labels", str(four), "--on", "id", "--ppi", "--json", "--bootstrap", "0")
    assert done.returncode == 0, done.stderr
    ppi = json.loads(done.stdout)["ppi"]
    bounds = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            bounds.extend(v for k, v in node.items() if k in ("ci_low", "ci_high") and v is not None)
            for v in node.values():
                walk(v)

    walk(ppi)
    assert len(bounds) == 4 and all(0 <= b <= 1 for b in bounds), ppi
    assert ppi["n_labeled"] == 4 and ppi["score_range"] == [0.0, 1.0]


def test_report_shows_labelled_rows_and_disagreements(graded: Path, tmp_path: Path) -> None:
    rows = [json.loads(line) for line in graded.read_text(encoding="utf-8").splitlines()]
    store = LabelStore(tmp_path / "labels.jsonl", "id")
    judged = [r for r in rows if r["status"] == "ok"]
    for r in judged[:6]:
        store.append(r["id"], r["label"])
    store.append(judged[0]["id"], "incorrect" if judged[0]["label"] == "correct" else "correct")  # changed: the last act wins
    out = tmp_path / "report.html"
    done = run("report", str(graded), "-o", str(out), "--labels", str(store.path), "--on", "id")
    assert done.returncode == 0, done.stderr
    html = out.read_text(encoding="utf-8")
    data = json.loads(html.split('<script id="gradekit-data" type="application/json">', 1)[1].split("</script>", 1)[0])
    agreement = data["summary"]["agreement"]
    assert agreement["labelled"] == 6 and agreement["disagreed"] == 1
    assert [d["key"] for d in agreement["disagreements"]] == [judged[0]["id"]]


def test_int_keys_are_written_as_the_file_holds_them(tmp_path: Path) -> None:
    graded = tmp_path / "out.jsonl"
    rows = [{"id": 1000 + i, "prediction": "p", "score": float(i % 2), "label": ["incorrect", "correct"][i % 2],
             "status": "ok", "rationale": "r"} for i in range(6)]
    graded.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    store = tmp_path / "labels.jsonl"
    store.write_text('{"id": "elsewhere", "label": "correct"}\n{"id": 1002, "label": "incorrect"}\n', encoding="utf-8")
    proc, url = start_view(str(graded), "--annotate", "--labels", str(store), "--on", "id", "--label-values", "correct,incorrect")
    try:
        assert call(url + "/api/rows/4/label", {"label": "correct"})[0] == 200
        status, body = call(url + "/api/rows/5/label", raw=b'{"label": "correct", "note": "\\ud800"}',
                            headers={"Content-Type": "application/json"})
        assert status == 400 and "surrogate" in body["error"]  # valid JSON, no UTF-8: a named error, not a 500
        offered = {call(url + "/api/next?strategy=random")[1]["index"] for _ in range(20)}
        assert 2 not in offered and 4 not in offered  # labelled already (an int key in the file) or just now
    finally:
        proc.kill()
        proc.wait()
    last = json.loads(store.read_text(encoding="utf-8").splitlines()[-1])
    assert last["id"] == 1004 and last["label"] == "correct"  # the row's id as the row has it, an int, not "1004"


def test_blind_hides_a_grader_rows_metrics_and_an_eval_runs_figures(tmp_path: Path) -> None:
    graded = tmp_path / "out.jsonl"
    name = "exact-5f1c7a52-0d0e-4c5e-9b1e-6b8f0a3e2d41"
    rows = [{"id": f"r{i}", "item": {"answer": "Paris"}, "sample": {"output_text": "Paris"}, "score": float(i % 2),
             "status": "ok", "parts": {name: float(i % 2)}, "metrics": {f"{name}.passed": float(i % 2), "passed": float(i % 2)}}
            for i in range(4)]
    graded.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    proc, url = start_view(str(graded), "--annotate", "--blind", "--labels", str(tmp_path / "l.jsonl"), "--on", "id",
                           "--label-values", "good,bad")
    try:
        page = call(url + "/api/rows")[1]
        assert all(not {"metrics", "parts", "score"} & set(row) for row in page["rows"])
        summary = call(url + "/api/summary")[1]
        assert summary["result_counts"] is None and summary["per_testing_criteria_results"] is None
        assert "metrics" not in summary["columns"]
        assert call(url + "/api/rows?q=passed")[1]["rows"] == []  # nor found by searching what is hidden
        assert call(url + "/api/rows/1/label", {"label": "good"})[0] == 200
        assert call(url + "/api/rows/1")[1]["metrics"]["passed"] == 1.0  # labelled: shown
    finally:
        proc.kill()
        proc.wait()


def test_store_lines_without_a_usable_label_leave_their_rows_unlabelled(graded: Path, tmp_path: Path) -> None:
    path = tmp_path / "labels.jsonl"
    path.write_text('{"id": "q001", "label": "correct"}\n{"id": "q002"}\n{"id": "q003", "label": {"x": 1}}\n'
                    '{"id": "q005", "label": true}\n{"id": "q006", "label": "correct", "note": "\\ud800"}\n', encoding="utf-8")
    assert "lone surrogate" in read_labels(path, "id").warnings[-1]  # no text: skipped, never a 500 of every answer
    proc, url = start_view(str(graded), "--annotate", "--labels", str(path), "--on", "id")  # the values come from the file
    try:
        progress = call(url + "/api/labels")[1]
        assert "correct" in progress["values"] and progress["labelled"] == 1  # the store's and the graded file's own labels
        assert sum("neither a text nor a number" in w for w in progress["warnings"]) == 3
        assert [call(url + f"/api/rows/{i}")[1]["labelled"] for i in (1, 2, 3, 5, 6)] == [True, False, False, False, False]
        assert call(url + "/api/rows?limit=10")[0] == 200
    finally:
        proc.kill()
        proc.wait()


def test_two_viewers_on_one_labels_file_never_offer_a_row_the_other_labelled(tmp_path: Path) -> None:
    graded = tmp_path / "out.jsonl"
    rows = [{"id": i, "prediction": "p", "score": float(i % 2), "label": ["incorrect", "correct"][i % 2], "status": "ok"}
            for i in range(6)]
    graded.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    store = tmp_path / "labels.jsonl"
    options = ("--annotate", "--labels", str(store), "--on", "id", "--label-values", "correct,incorrect")
    first, first_url = start_view(str(graded), *options, "--labeller", "a")
    try:
        second, second_url = start_view(str(graded), *options, "--labeller", "b")
        try:
            for index in range(5):  # five rows labelled in the first viewer, none in the second
                assert call(f"{first_url}/api/rows/{index}/label", {"label": "correct"})[0] == 200
            assert {call(second_url + "/api/next?strategy=random")[1]["index"] for _ in range(10)} == {5}
            assert call(second_url + "/api/labels")[1]["labelled"] == 5
            assert call(f"{second_url}/api/rows/5/label", {"label": "incorrect"})[0] == 200
            assert call(first_url + "/api/next?strategy=active")[0] == 404  # the second viewer's label counts in the first
        finally:
            second.kill()
            second.wait()
    finally:
        first.kill()
        first.wait()
    assert {json.loads(line)["labeller"] for line in store.read_text(encoding="utf-8").splitlines()} == {"a", "b"}
