"""`gradekit grade`, `rubrics` and `render` end to end: real files, the fake provider over HTTP, vcrpy cassettes."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gradekit.graders.cli import app
from gradekit.judge.testing import FakeProvider, Reply

from ..conftest import invoke, reference_judge

ROOT = Path(__file__).resolve().parents[2]
ZH_SET = ROOT / "eval_sets" / "semantic_equivalence_zh" / "data.jsonl"
runner = CliRunner()


def grade(*args: str) -> tuple[int, str]:
    return invoke("grade", *args)


def rows(path: Path) -> list[dict]:
    if path.suffix == ".csv":
        with path.open(encoding="utf-8", newline="") as f:
            return list(csv.DictReader(f))
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture
def judge_server():
    with FakeProvider(responder=reference_judge) as fake:
        yield fake


def test_grade_jsonl_one_output_row_per_input_row_in_order(judge_server, tmp_path) -> None:
    out = tmp_path / "out.jsonl"
    code, text = grade(str(ZH_SET), "-r", "semantic_equivalence_zh", "-o", str(out), "--base-url", judge_server.base_url,
                       "--api-key", "k", "--cache", str(tmp_path / "c.sqlite3"), "--json")
    inputs, outputs = rows(ZH_SET), rows(out)
    assert code == 0, text
    assert [o["id"] for o in outputs] == [i["id"] for i in inputs]
    assert [o["input_label"] for o in outputs] == [i["label"] for i in inputs]  # the human label survives
    for o in outputs:
        assert set(o) >= {"score", "label", "status", "error", "rationale", "prompt_tokens", "completion_tokens", "cached"}
        assert o["status"] == "ok" and o["score"] == (1.0 if o["label"] == "正确" else 0.0)
        hit = any(r in o["prediction"] for r in o["references"])  # what the stand-in judge decides
        assert o["label"] == ("正确" if hit else "错误")
    summary = json.loads(text)
    assert summary["version"] == 1 and summary["rows"] == len(inputs) and summary["errors"] == 0
    assert sum(summary["label_counts"].values()) == len(inputs)
    assert summary["requests"] == len(inputs) == len(judge_server.chat_requests())


def test_rerun_is_served_from_the_cache_with_zero_requests(judge_server, tmp_path) -> None:
    args = [str(ZH_SET), "-r", "semantic_equivalence_zh", "--base-url", judge_server.base_url, "--api-key", "k",
            "--cache", str(tmp_path / "c.sqlite3"), "--json"]
    assert grade(*args, "-o", str(tmp_path / "a.jsonl"))[0] == 0
    sent = len(judge_server.chat_requests())
    code, text = grade(*args, "-o", str(tmp_path / "b.jsonl"))
    assert code == 0 and len(judge_server.chat_requests()) == sent
    assert json.loads(text)["cache_hits"] == len(rows(ZH_SET))
    # Same verdicts; a hit spends no tokens, so only the accounting columns differ.
    strip = lambda rs: [{k: v for k, v in r.items() if k not in ("cached", "prompt_tokens", "completion_tokens")} for r in rs]  # noqa: E731
    assert strip(rows(tmp_path / "a.jsonl")) == strip(rows(tmp_path / "b.jsonl"))
    assert all(r["cached"] and r["prompt_tokens"] == 0 for r in rows(tmp_path / "b.jsonl"))


def test_csv_in_csv_out_with_map_and_json_list_cells(judge_server, tmp_path) -> None:
    src = tmp_path / "in.csv"
    with src.open("w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(["q", "gold", "answer", "extra"])
        w.writerow(["Capital of France?", '["Paris", "Paris, France"]', "It is Paris.", "x"])
        w.writerow(["Largest planet?", "Jupiter", "Saturn", "y"])
    out = tmp_path / "out.csv"
    code, text = grade(str(src), "-r", "semantic_equivalence_en", "-o", str(out), "--base-url", judge_server.base_url,
                       "--api-key", "k", "--no-cache", "--map", "question=q", "--map", "references=gold", "--map", "prediction=answer")
    assert code == 0, text
    got = rows(out)
    assert [(r["q"], r["extra"], r["label"], r["score"]) for r in got] == [
        ("Capital of France?", "x", "correct", "1.0"), ("Largest planet?", "y", "incorrect", "0.0")]


def test_missing_csv_column_fails_before_any_request(judge_server, tmp_path) -> None:
    src = tmp_path / "in.csv"
    src.write_text("question,references\nq,a\n", encoding="utf-8")
    code, text = grade(str(src), "-r", "semantic_equivalence_en", "-o", str(tmp_path / "o.jsonl"), "--base-url",
                       judge_server.base_url, "--api-key", "k", "--no-cache")
    assert code == 2 and "in.csv" in text and "'prediction'" in text and "--map prediction=COLUMN" in text
    assert judge_server.chat_requests() == []


def test_csv_lacking_two_variables_names_both_with_guessed_maps(judge_server, tmp_path) -> None:
    src = tmp_path / "in.csv"
    src.write_text("question,answer,model_answer\nq,a,b\n", encoding="utf-8")
    code, text = grade(str(src), "-r", "semantic_equivalence_en", "-o", str(tmp_path / "o.jsonl"), "--base-url",
                       judge_server.base_url, "--api-key", "k", "--no-cache")
    text = " ".join(text.split())
    assert code == 2 and "'references'" in text and "'prediction'" in text, text
    assert "--map references=answer --map prediction=model_answer" in text and "columns are question, answer, model_answer" in text
    assert judge_server.chat_requests() == []


def test_jsonl_row_lacking_two_fields_names_both(judge_server, tmp_path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text('{"question": "q", "answer": ["a"], "model_answer": "a"}\n', encoding="utf-8")
    out = tmp_path / "out.jsonl"
    code, _ = grade(str(src), "-r", "semantic_equivalence_en", "-o", str(out), "--base-url", judge_server.base_url,
                    "--api-key", "k", "--no-cache", "--keep-going")
    [row] = rows(out)
    assert code == 1 and row["status"] == "error" and row["error_kind"] == "input"
    assert "'references'" in row["error"] and "'prediction'" in row["error"]
    assert "--map references=answer --map prediction=model_answer" in row["error"]
    assert judge_server.chat_requests() == []


def test_a_rubric_path_that_does_not_exist_says_no_such_file(tmp_path) -> None:
    code, text = grade(str(ZH_SET), "-r", str(tmp_path / "my_rubric.yaml"), "-o", str(tmp_path / "o.jsonl"), "--api-key", "k")
    assert code == 2 and "no such rubric file" in text and "unknown rubric" not in text


def test_bad_rows_get_explicit_error_rows_and_nothing_is_lost(judge_server, tmp_path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text(
        '{"question": "q1", "references": ["a"], "prediction": "a"}\n'
        '{"question": "q2", "references": ["a"]}\n'
        "{not json\n"
        '["a list"]\n'
        '{"question": "q5", "references": ["b"], "prediction": "c"}\n',
        encoding="utf-8",
    )
    out = tmp_path / "out.jsonl"
    code, text = grade(str(src), "-r", "semantic_equivalence_en", "-o", str(out), "--base-url", judge_server.base_url,
                       "--api-key", "k", "--no-cache", "--json")
    got = rows(out)
    assert code == 1 and len(got) == 5
    assert [r["status"] for r in got] == ["ok", "error", "error", "error", "ok"]
    assert "row 2" in got[1]["error"] and "'prediction'" in got[1]["error"] and got[1]["score"] is None
    assert "row 3" in got[2]["error"] and "not valid JSON" in got[2]["error"]
    assert "row 4" in got[3]["error"] and "object" in got[3]["error"]
    assert json.loads(text)["errors_by_kind"] == {"input": 3}
    assert len(judge_server.chat_requests()) == 2


def test_judge_failures_become_error_rows_not_scores(tmp_path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"question": f"q{i}", "references": ["a"], "prediction": "a"}) + "\n" for i in range(4)))

    def responder(body: dict) -> Reply:
        if "<question>\nq0\n" in body["messages"][-1]["content"]:
            return Reply(status=400, error_message="this prompt is rejected")
        return reference_judge(body)

    with FakeProvider(responder=responder) as fake:
        code, text = grade(str(src), "-r", "semantic_equivalence_en", "-o", str(tmp_path / "o.jsonl"), "--base-url",
                           fake.base_url, "--api-key", "k", "--no-cache", "--json")
    got = rows(tmp_path / "o.jsonl")
    assert code == 1 and [r["status"] for r in got] == ["error", "ok", "ok", "ok"]
    assert got[0]["score"] is None and got[0]["error_kind"] == "bad_request" and got[0]["error"].startswith("row 1:")
    assert "this prompt is rejected" in got[0]["error"]


def test_record_then_replay_offline_reproduces_the_run(tmp_path) -> None:
    cassette = tmp_path / "run.yaml"
    with FakeProvider(responder=reference_judge) as fake:
        code, _ = grade(str(ZH_SET), "-r", "semantic_equivalence_zh", "-o", str(tmp_path / "rec.jsonl"),
                        "--base-url", fake.base_url, "--api-key", "secret-key", "--record", str(cassette))
        assert code == 0
    assert "secret-key" not in cassette.read_text(encoding="utf-8")  # credentials are filtered out
    # The server is gone: a replay under another address gets every reply from the cassette.
    code, text = grade(str(ZH_SET), "-r", "semantic_equivalence_zh", "-o", str(tmp_path / "rep.jsonl"),
                       "--base-url", "http://127.0.0.1:9/v1", "--replay", str(cassette), "--json")
    assert code == 0, text
    assert [r["label"] for r in rows(tmp_path / "rep.jsonl")] == [r["label"] for r in rows(tmp_path / "rec.jsonl")]

    # A row the cassette never saw is an explicit error naming the row, not a network call.
    extra = tmp_path / "more.jsonl"
    lines = ZH_SET.read_text(encoding="utf-8").splitlines()[:2]
    extra.write_text("\n".join([*lines, json.dumps({"question": "新问题", "references": ["x"], "prediction": "y"})]) + "\n", encoding="utf-8")
    code, text = grade(str(extra), "-r", "semantic_equivalence_zh", "-o", str(tmp_path / "more_out.jsonl"),
                       "--base-url", "http://127.0.0.1:9/v1", "--replay", str(cassette), "--json")
    got = rows(tmp_path / "more_out.jsonl")
    assert code == 1 and [r["status"] for r in got] == ["ok", "ok", "error"]
    assert got[2]["error_kind"] == "not_recorded" and got[2]["error"].startswith("row 3:")


def test_usage_errors_exit_2_with_a_message(tmp_path) -> None:
    assert grade(str(tmp_path / "none.jsonl"), "-r", "tone", "-o", str(tmp_path / "o.jsonl"), "--api-key", "k")[0] == 2
    code, text = grade(str(ZH_SET), "-r", "nope", "-o", str(tmp_path / "o.jsonl"), "--api-key", "k")
    assert code == 2 and "unknown rubric 'nope'" in text
    code, text = grade(str(ZH_SET), "-r", "tone", "-o", str(tmp_path / "o.txt"), "--api-key", "k")
    assert code == 2 and "o.txt" in text
    code, text = grade(str(ZH_SET), "-r", "tone", "-o", str(tmp_path / "o.jsonl"), "--api-key", "k", "--map", "tone")
    assert code == 2 and "VAR=COLUMN" in text
    code, text = grade(str(ZH_SET), "-r", "tone", "-o", str(tmp_path / "o.jsonl"), "--api-key", "k", "--map", "x=y")
    assert code == 2 and "no variable 'x'" in text


def test_rubrics_and_render_commands() -> None:
    result = runner.invoke(app, ["rubrics", "--json"])
    listing = json.loads(result.output)
    assert result.exit_code == 0 and listing["version"] == 1
    names = {r["name"]: r for r in listing["rubrics"]}
    assert names["tone"]["variables"] == {"response": "str", "tone": "str"}
    row = json.dumps({"question": "q", "references": ["a"], "prediction": "p"})
    result = runner.invoke(app, ["render", "-r", "semantic_equivalence_en", "--row", row])
    request = json.loads(result.output)
    assert result.exit_code == 0 and request["messages"][-1]["role"] == "user" and "<prediction>\np\n</prediction>" in request["messages"][-1]["content"]
    result = runner.invoke(app, ["render", "-r", "semantic_equivalence_en", "--row", '{"question": "q"}'])
    assert result.exit_code == 2 and "'references'" in result.output


def test_real_subprocess_run(tmp_path) -> None:
    with FakeProvider(responder=reference_judge) as fake:
        env = {**os.environ, "OPENAI_BASE_URL": fake.base_url, "OPENAI_API_KEY": "k", "GRADEKIT_CACHE": str(tmp_path / "c.sqlite3")}
        done = subprocess.run(
            [sys.executable, "-m", "gradekit", "grade", str(ZH_SET), "-r", "semantic_equivalence_zh", "-o", str(tmp_path / "o.csv")],
            env=env, capture_output=True, text=True, timeout=120,
        )
    assert done.returncode == 0, done.stderr
    assert "judgements/s" in done.stdout and "rows" in done.stdout
    assert len(rows(tmp_path / "o.csv")) == len(rows(ZH_SET))
