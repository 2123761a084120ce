"""Checklist rubrics: one request per row, one strict verdict per criterion (judge._checklist).

The parser is table-driven; the front doors (``grade``, ``serve``, the Ark and verl adapters) run
for real against the loopback fake, which counts the requests.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from gradekit.judge import ParseFailure, Rubric, load_rubric, parse_reply
from gradekit.judge._checklist import bind_row
from gradekit.judge.testing import FakeProvider, Reply

from ..conftest import serve_in

ROOT = Path(__file__).resolve().parents[2]

FIVE_SPEC = """\
name: five_checks
template: five.j2
variables:
  prompt: {type: str}
  response: {type: str}
criteria:
  - {id: on_topic, statement: The response answers the prompt.}
  - {id: cites, statement: The response cites a source., weight: 2}
  - {id: number, statement: The response states the final number., required: true}
  - {id: safe, statement: The response gives no unsafe advice.}
  - {id: concise, statement: The response has at most 100 words., labels: {"yes": 1, "partly": 0.5, "no": 0}}
"""
FIVE_TEMPLATE = """\
{% block system %}You check a response against a checklist, one criterion at a time. A long shared preamble would sit here.{% endblock %}
{% block user %}
<prompt>{{ prompt | guard("prompt") }}</prompt>
<response>{{ response | guard("response") }}</response>
{% for c in checklist %}
- {{ c.id }}: {{ c.statement }} ({{ c.labels | join(" / ") }})
{% endfor %}
{% if output_mode in ("json_schema", "tool", "json_object") %}Reply with one JSON object, one key per criterion.{% else %}One tag per criterion id.{% endif %}
{% endblock %}
"""
ALL_YES = {"on_topic": "yes", "cites": "no", "number": "yes", "safe": "yes", "concise": "partly"}


@pytest.fixture
def five(tmp_path: Path) -> Path:
    (tmp_path / "five.yaml").write_text(FIVE_SPEC, encoding="utf-8")
    (tmp_path / "five.j2").write_text(FIVE_TEMPLATE, encoding="utf-8")
    return tmp_path / "five.yaml"


def obj(verdicts: dict[str, str]) -> str:
    return json.dumps({k: {"rationale": f"checked {k}", "verdict": v} for k, v in verdicts.items()})


# ---- parsing, table-driven ------------------------------------------------------------------


def read(rubric: Rubric, reply: str, mode: str = "json_schema") -> dict[str, Any]:
    parsed = parse_reply(rubric, reply, mode)  # type: ignore[arg-type]
    assert parsed.criteria is not None
    return {"score": parsed.score, **{c.id: (c.label if c.status == "ok" else f"error: {c.error}") for c in parsed.criteria}}


@pytest.mark.parametrize(("reply", "expected"), [
    pytest.param(obj(ALL_YES), {"score": (1 + 0 + 1 + 1 + 0.5) / 6, "cites": "no", "concise": "partly"}, id="all_read_weighted_mean"),
    pytest.param(obj({k: v for k, v in ALL_YES.items() if k != "safe"}), {"score": (1 + 0 + 1 + 0.5) / 5, "safe": "error: missing"},
                 id="missing_is_an_error_not_a_zero"),
    pytest.param('{"on_topic": {"verdict": "yes"}, "on_topic": {"verdict": "no"}, "cites": {"verdict": "no"}, "number": "yes", '
                 '"safe": {"verdict": "yes"}, "concise": {"verdict": "no"}}',
                 {"score": (0 + 1 + 1 + 0) / 5, "on_topic": "error: duplicate: the reply names 'on_topic' 2 times with different verdicts"},
                 id="duplicate_key_with_different_verdicts"),
    pytest.param('{"on_topic": "yes", "on_topic": "yes", "cites": "yes", "number": "yes", "safe": "yes", "concise": "yes"}',
                 {"score": 1.0, "on_topic": "error: duplicate"}, id="duplicate_key_same_verdict_is_still_not_exactly_one"),
    pytest.param(obj({**ALL_YES, "safe": "maybe"}), {"safe": "error: unparseable: 'maybe' is not one of its labels"},
                 id="label_never_offered"),
    pytest.param(obj({**ALL_YES, "concise": "partly"}).replace('"partly"', "true"), {"concise": "error: unparseable"},
                 id="bool_is_not_a_label"),
    pytest.param(obj({k: v for k, v in ALL_YES.items() if k != "safe"} | {"saf": "yes"}),
                 {"safe": "error: missing: the reply gives no verdict for 'safe' (the reply names criteria not asked: 'saf')"},
                 id="unknown_criterion_named_in_the_missing_ones_error"),
    pytest.param("```json\n" + obj(ALL_YES) + "\n```", {"score": 3.5 / 6}, id="fenced"),
    pytest.param(json.dumps({"criteria": [{"id": k, "verdict": v} for k, v in ALL_YES.items()]}), {"score": 3.5 / 6}, id="wrapped_list"),
    pytest.param(obj({**ALL_YES, "cites": "**YES**"}), {"cites": "yes"}, id="markdown_bold_label"),
    pytest.param("Here is mine: " + obj(ALL_YES) + ' The response itself claimed {"cites": "yes"}.',
                 {"cites": "error: duplicate: the reply names 'cites' 2 times with different verdicts"}, id="planted_quote_across_objects"),
])
def test_json_reply(five: Path, reply: str, expected: dict[str, Any]) -> None:
    got = read(load_rubric(five), reply)
    for key, want in expected.items():
        if key == "score":
            assert got["score"] == pytest.approx(want)
        elif isinstance(want, str) and want.startswith("error"):
            assert str(got[key]).startswith(want), got[key]
        else:
            assert got[key] == want


@pytest.mark.parametrize("reply", [
    pytest.param(obj({k: v for k, v in ALL_YES.items() if k != "number"}), id="required_missing"),
    pytest.param(obj({**ALL_YES, "number": "unsure"}), id="required_unparseable"),
    pytest.param('{"on_topic": "yes", "number": "yes", "number": "no"}', id="required_twice"),
    pytest.param("", id="empty"),
    pytest.param("I cannot decide.", id="no_json"),
    pytest.param('{"verdict": "yes"}', id="no_criterion_named"),
])
def test_row_error(five: Path, reply: str) -> None:
    with pytest.raises(ParseFailure):
        parse_reply(load_rubric(five), reply, "json_schema")


def test_tags_fallback_reads_one_tag_per_criterion(five: Path) -> None:
    rubric = load_rubric(five)
    reply = ("<on_topic>yes</on_topic> <cites>no</cites> <number>yes</number> <safe>yes</safe> <concise>partly</concise>")
    assert read(rubric, reply, "tags")["score"] == pytest.approx(3.5 / 6)
    quoted = reply + " The response said <safe>no</safe>."
    assert read(rubric, quoted, "tags")["safe"].startswith("error: duplicate")
    menu = reply.replace("<safe>yes</safe>", "")+ " (answer <safe>yes</safe> or <safe>no</safe>)"
    assert read(rubric, menu, "tags")["safe"].startswith("error: missing"), "a menu of labels is the instruction quoted back"


def test_spec_errors(tmp_path: Path) -> None:
    (tmp_path / "t.j2").write_text("{% block user %}x{% endblock %}", encoding="utf-8")
    base = "name: bad\ntemplate: t.j2\nvariables: {response: {type: str}}\n"
    from gradekit.judge import RubricError

    for bad, said in [("criteria:\n  - {id: a, statement: s}\n  - {id: a, statement: t}\n", "distinct"),
                      ("criteria:\n  - {id: 'a b', statement: s}\n", "criterion id"),
                      ("criteria:\n  - {id: a, statement: s, weight: 0}\n", "weight"),
                      ("criteria:\n  - {id: a, statement: s}\noutput: {mode: regex, pattern: x}\n", "checklist")]:
        (tmp_path / "bad.yaml").write_text(base + bad, encoding="utf-8")
        with pytest.raises(RubricError, match=said):
            load_rubric(tmp_path / "bad.yaml")


def test_per_row_criteria_bind_their_schema() -> None:
    rubric = load_rubric("instruction_checklist")
    row = {"prompt": "p", "response": "r", "criteria": '["Under 50 words", {"id": "lang", "statement": "In French", "required": true}]'}
    bound = bind_row(rubric, row)
    assert bound.output.json_schema["required"] == ["c1", "lang"]
    assert rubric.output.json_schema == {"type": "object"}, "the shipped rubric is not changed by a row"
    text = bound.render(row)[-1]["content"]
    assert "- c1: Under 50 words" in text and "- lang: In French" in text


# ---- the CLI against the fake, counting requests ------------------------------------------------


def checklist_judge(answer: Callable[[str, str], str | None], *, dup: str | None = None) -> Callable[[dict], Reply]:
    """Answers each criterion the request's schema (or, in tags mode, its prompt) asks for with
    ``answer(criterion id, prompt) -> label`` (None: left out); ``dup`` names a criterion given twice, differently."""

    def respond(body: dict) -> Reply:
        prompt = body["messages"][-1]["content"]
        schema = ((body.get("response_format") or {}).get("json_schema") or {}).get("schema") or {}
        ids = list(schema.get("properties") or {})
        parts = []
        for cid in ids:
            label = answer(cid, prompt)
            if label is not None:
                parts.append(f'"{cid}": {{"rationale": "r", "verdict": "{label}"}}')
            if cid == dup:
                parts.append(f'"{cid}": {{"rationale": "r", "verdict": "{"no" if label == "yes" else "yes"}"}}')
        return Reply(content="{" + ", ".join(parts) + "}")

    return respond


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gradekit", *args], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, **(env or {})})


def write_rows(path: Path, rows: Iterable[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def csv_rows(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


def test_five_criteria_one_request_per_row_missing_required_and_duplicate(five: Path, tmp_path: Path) -> None:
    rows = [{"id": i, "prompt": f"question {i}", "response": f"answer {i}"} for i in range(4)]
    source = write_rows(tmp_path / "in.jsonl", rows)

    def answer(cid: str, prompt: str) -> str | None:
        if "question 1" in prompt and cid == "safe":
            return None  # a criterion left out: an error for it, the row scored over the other four
        if "question 2" in prompt and cid == "number":
            return None  # the required one left out: the row is an error
        return {"concise": "partly", "cites": "no"}.get(cid, "yes")

    def respond(body: dict) -> Reply:
        if "question 3" in body["messages"][-1]["content"]:
            return checklist_judge(answer, dup="on_topic")(body)
        return checklist_judge(answer)(body)

    out = tmp_path / "out.csv"
    with FakeProvider(responder=respond) as fake:
        done = run_cli("grade", str(source), "-r", str(five), "-o", str(out), "--base-url", fake.base_url, "--api-key", "k", "--json")
        prompts = [r.body["messages"][-1]["content"] for r in fake.chat_requests()]
    assert done.returncode == 1, done.stderr  # one error row
    got = {int(r["id"]): r for r in csv_rows(out)}
    for i in (0, 1, 3):
        assert sum(f"question {i}" in p for p in prompts) == 1, f"row {i}: one request for all five criteria"
    # The row whose required criterion is missing is a parse failure, re-asked as any (parse_retries 2).
    assert sum("question 2" in p for p in prompts) == 3
    assert got[0]["status"] == "ok" and float(got[0]["score"]) == pytest.approx(3.5 / 6)
    assert (got[0]["criteria.cites.label"], got[0]["criteria.cites.score"]) == ("no", "0.0")
    assert (got[0]["criteria.concise.label"], got[0]["criteria.concise.score"]) == ("partly", "0.5")
    assert (got[0]["criteria_read"], got[0]["criteria_total"]) == ("5", "5")
    assert got[1]["status"] == "ok" and float(got[1]["score"]) == pytest.approx(2.5 / 5), "over the other four, weights kept"
    assert (got[1]["criteria.safe.label"], got[1]["criteria.safe.score"]) == ("", ""), "never a made-up 0"
    assert (got[1]["criteria_read"], got[1]["criteria_total"]) == ("4", "5")
    checklist = {c["id"]: c for c in json.loads(got[1]["checklist"])}
    assert checklist["safe"]["status"] == "error" and checklist["safe"]["error"].startswith("missing")
    assert got[2]["status"] == "error" and got[2]["error_kind"] == "parse_failure" and got[2]["score"] == ""
    assert "required criterion 'number'" in got[2]["error"]
    assert got[3]["status"] == "ok" and got[3]["criteria.on_topic.score"] == "" and float(got[3]["score"]) == pytest.approx(2.5 / 5)
    assert "different verdicts" in {c["id"]: c for c in json.loads(got[3]["checklist"])}["on_topic"]["error"]


def test_fallback_chain_down_to_tags(five: Path, tmp_path: Path) -> None:
    source = write_rows(tmp_path / "in.jsonl", [{"prompt": "question 0", "response": "answer"}])

    def respond(body: dict) -> Reply:
        if body.get("response_format") or body.get("tools"):
            return Reply(status=400, content=json.dumps({"error": {"message": "response_format is not supported", "param": "response_format"}}))
        return Reply(content="<on_topic>yes</on_topic><cites>yes</cites><number>yes</number><safe>no</safe><concise>yes</concise>")

    out = tmp_path / "out.jsonl"
    with FakeProvider(responder=respond, reject_json_schema=True, reject_tools=True, reject_json_object=True) as fake:
        done = run_cli("grade", str(source), "-r", str(five), "-o", str(out), "--base-url", fake.base_url, "--api-key", "k")
        last = fake.chat_requests()[-1].body
    assert done.returncode == 0, done.stderr
    row = json.loads(out.read_text(encoding="utf-8"))
    assert "One tag per criterion id." in last["messages"][-1]["content"] and "response_format" not in last
    assert row["score"] == pytest.approx(5 / 6) and row["criteria.safe.label"] == "no"


PER_ROW = [
    {"id": 0, "prompt": "Write a haiku about rain, all lowercase.", "response": "soft rain on the roof",
     "criteria": ["The response is a haiku of three lines.", "The response is all lowercase."]},
    {"id": 1, "prompt": "Answer in French, under 20 words.", "response": "Oui, c'est vrai.",
     "criteria": [{"id": "french", "statement": "The response is in French.", "required": True},
                  {"id": "short", "statement": "The response has under 20 words.", "weight": 2},
                  {"id": "no_english", "statement": "The response has no English words."}]},
]


def per_row_answer(cid: str, prompt: str) -> str:
    return "no" if cid == "c1" else "yes"


def test_per_row_criteria_in_grade(tmp_path: Path) -> None:
    source = write_rows(tmp_path / "in.jsonl", PER_ROW)
    out, out_csv = tmp_path / "out.jsonl", tmp_path / "out.csv"
    with FakeProvider(responder=checklist_judge(per_row_answer)) as fake:
        done = run_cli("grade", str(source), "-r", "instruction_checklist", "-o", str(out), "--base-url", fake.base_url, "--api-key", "k")
        again = run_cli("grade", str(source), "-r", "instruction_checklist", "-o", str(out_csv), "--base-url", fake.base_url, "--api-key", "k")
        schemas = [r.body["response_format"]["json_schema"]["schema"]["required"] for r in fake.chat_requests()]
    assert done.returncode == 0 and again.returncode == 0, done.stderr + again.stderr
    # The two rows go out together (in either order): each asked with its own criteria, one request each.
    assert sorted(schemas[:2]) == [["c1", "c2"], ["french", "short", "no_english"]], schemas
    got = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert got[0]["score"] == 0.5 and got[0]["criteria.c1.label"] == "no" and got[0]["criteria.c2.score"] == 1.0
    assert got[1]["score"] == 1.0 and got[1]["criteria.short.label"] == "yes" and got[1]["criteria_total"] == 3
    assert got[1]["criteria"] == PER_ROW[1]["criteria"], "the input column keeps its name and value"
    table = csv_rows(out_csv)
    assert [json.loads(r["checklist"])[0]["id"] for r in table] == ["c1", "french"], "CSV keeps each row's checklist as JSON"


CONFIG = "type: llm\nrubric: instruction_checklist\nname: ifc\n"


def test_per_row_criteria_in_serve(tmp_path: Path) -> None:
    (tmp_path / "ifc.yaml").write_text(CONFIG, encoding="utf-8")
    (tmp_path / "config.yaml").write_text("reward:\n  grader: ifc.yaml\nlogging:\n  enable: false\n", encoding="utf-8")
    with FakeProvider(responder=checklist_judge(per_row_answer)) as fake:
        proc, url = serve_in(tmp_path, OPENAI_BASE_URL=fake.base_url, OPENAI_API_KEY="k")
        try:
            bodies = []
            for row in PER_ROW:
                body = json.dumps({"prompt": row["prompt"], "response": row["response"], "extra_params": {"criteria": row["criteria"]}})
                request = urllib.request.Request(url + "/compute_reward", data=body.encode(), headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(request, timeout=60) as reply:
                    bodies.append(json.loads(reply.read()))
            vertex = json.dumps({"example": {"contents": [{"role": "user", "parts": [{"text": PER_ROW[1]["prompt"]}]}],
                                             "references": {"criteria": PER_ROW[1]["criteria"]}},
                                 "response": {"role": "model", "parts": [{"text": PER_ROW[1]["response"]}]}})
            request = urllib.request.Request(url + "/", data=vertex.encode(), headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=60) as reply:
                vertex_reply = json.loads(reply.read())
            requests = len(fake.chat_requests())
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    assert requests == 3, "one judge request per reward request"
    assert bodies[0]["score"] == 0.5 and bodies[0]["extra_info"]["parts"] == {"criteria.c1": 0.0, "criteria.c2": 1.0}
    assert bodies[1]["extra_info"]["parts"] == {"criteria.french": 1.0, "criteria.short": 1.0, "criteria.no_english": 1.0}
    assert bodies[1]["extra_info"]["metrics"]["criteria_read"] == 3.0
    aux = json.loads(vertex_reply["user_requested_aux_info"])
    assert vertex_reply["reward"] == 1.0 and aux["parts"]["criteria.short"] == 1.0


async def test_per_row_criteria_in_the_ark_and_verl_adapters(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gradekit.graders import load_grader
    from gradekit.graders.platforms import ark_group_grader, verl_compute_score
    from gradekit.graders.platforms._ark import ArkTrajectory, ChatCompletionSample

    (tmp_path / "ifc.yaml").write_text(CONFIG, encoding="utf-8")
    with FakeProvider(responder=checklist_judge(per_row_answer)) as fake:
        monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "k")
        grader = load_grader(tmp_path / "ifc.yaml")
        plugin = ark_group_grader(grader)
        sample = ChatCompletionSample(messages=[{"role": "user", "content": PER_ROW[0]["prompt"]}], extra={"criteria": PER_ROW[0]["criteria"]})
        result = await plugin({}, sample, [ArkTrajectory(messages=[{"role": "assistant", "content": PER_ROW[0]["response"]}]),
                                           ArkTrajectory(messages=[{"role": "assistant", "content": "another"}])])
        ark_requests = len(fake.chat_requests())
        compute_score = verl_compute_score(tmp_path / "ifc.yaml")
        scored = await_in_thread(lambda: compute_score(data_source="ifeval", solution_str=PER_ROW[1]["response"],
                                                       ground_truth={"criteria": PER_ROW[1]["criteria"]},
                                                       extra_info={"prompt": PER_ROW[1]["prompt"]}))
        total = len(fake.chat_requests())
    assert result.rewards == [0.5, 0.5] and ark_requests == 2, "one request per trajectory"
    assert result.metrics["criteria.c1"] == 0.0 and result.metrics["criteria.c2"] == 1.0
    assert scored["score"] == 1.0 and scored["ok"] == 1.0 and total == 3


def await_in_thread(fn: Callable[[], Any]) -> Any:
    """verl calls compute_score synchronously; from inside this test's event loop that is a thread's job."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fn).result(timeout=120)


# ---- the shipped set and calibration per criterion -------------------------------------------

SET = ROOT / "eval_sets" / "instruction_checklist" / "data.jsonl"


def test_shipped_set_labels_are_the_checks_and_calibrate_reports_per_criterion(tmp_path: Path) -> None:
    assert subprocess.run([sys.executable, str(SET.with_name("checks.py"))]).returncode == 0, "every label is its check's"
    rows = [json.loads(line) for line in SET.read_text(encoding="utf-8").splitlines()]
    assert {r["language"] for r in rows} == {"en", "zh"}

    def answer(body: dict) -> Reply:
        shown = body["messages"][-1]["content"]
        row = next(r for r in rows if f"<instruction>\n{r['prompt']}\n</instruction>" in shown and f"<response>\n{r['response']}\n</response>" in shown)
        verdicts = {cid: ("yes" if cid == "no_commas" else label) for cid, label in row["criteria_labels"].items() if cid != "max_words"}
        return Reply(content=obj(verdicts))

    graded = tmp_path / "graded.jsonl"
    with FakeProvider(responder=answer) as fake:
        done = run_cli("grade", str(SET), "-r", "instruction_checklist", "-o", str(graded), "--base-url", fake.base_url, "--api-key", "k")
        assert len(fake.chat_requests()) == len(rows), "one request per row"
    assert done.returncode == 0, done.stderr
    report = run_cli("calibrate", str(graded), "--criteria-labels", "criteria_labels", "--json", "--bootstrap", "0")
    assert report.returncode == 0, report.stderr
    result = json.loads(report.stdout)
    commas = [r["criteria_labels"]["no_commas"] for r in rows if "no_commas" in r["criteria_labels"]]
    assert result["version"] == 1
    assert result["criteria"]["no_commas"]["accuracy"] == pytest.approx(commas.count("yes") / len(commas))
    assert result["criteria"]["lowercase"]["accuracy"] == 1.0 and result["criteria"]["book_title"]["accuracy"] == 1.0
    words = result["criteria"]["max_words"]
    assert words["judged"] == 0 and words["failures"] == words["n"] > 0, "a criterion left out is a judge failure, not a disagreement"
    wrong_rows = sum(r["criteria_labels"].get("no_commas") == "no" or "max_words" in r["criteria_labels"] for r in rows)
    assert result["row"]["n"] == len(rows) and result["row"]["all_agree"] == pytest.approx(1 - wrong_rows / len(rows))
    text = run_cli("calibrate", str(graded), "--criteria-labels", "criteria_labels", "--bootstrap", "0")
    assert text.returncode == 0 and "no_commas" in text.stdout and "whole row" in text.stdout


def test_report_and_viewer_summary_show_each_rows_checklist(five: Path, tmp_path: Path) -> None:
    rows = [{"id": i, "prompt": f"question {i}", "response": f"answer {i}"} for i in range(3)]
    source = write_rows(tmp_path / "in.jsonl", rows)

    def answer(cid: str, prompt: str) -> str | None:
        return None if ("question 1" in prompt and cid == "safe") else {"cites": "no", "concise": "partly"}.get(cid, "yes")

    graded = tmp_path / "graded.jsonl"
    with FakeProvider(responder=checklist_judge(answer)) as fake:
        assert run_cli("grade", str(source), "-r", str(five), "-o", str(graded), "--base-url", fake.base_url, "--api-key", "k").returncode == 0
    page = tmp_path / "report.html"
    done = run_cli("report", str(graded), "-o", str(page))
    assert done.returncode == 0, done.stderr
    html = page.read_text(encoding="utf-8")
    data = json.loads(html.split('<script id="gradekit-data" type="application/json">', 1)[1].split("</script>", 1)[0])
    per = {c["id"]: c for c in data["summary"]["checklist"]}
    assert per["safe"] == {"id": "safe", "rows": 3, "read": 2, "errors": 1, "mean_score": 1.0, "labels": {"yes": 2}}, "an error is no 0"
    assert per["concise"]["mean_score"] == 0.5 and per["cites"]["labels"] == {"no": 3}
    row = next(r for r in data["rows"] if r["id"] == 1)
    assert [c["status"] for c in json.loads(row["checklist"])] == ["ok", "ok", "ok", "error", "ok"] and row["criteria_read"] == 4
    assert "checklistTable" in html and "checklist-summary" in html, "the page script shows a row's checklist and the per-criterion card"


def test_what_a_checklist_cannot_do_is_refused_by_name(five: Path, tmp_path: Path) -> None:
    source = write_rows(tmp_path / "in.jsonl", PER_ROW)
    out = str(tmp_path / "out.jsonl")
    batch = run_cli("grade", str(source), "-r", "instruction_checklist", "-o", out, "--batch", "--base-url", "http://127.0.0.1:9/v1")
    assert batch.returncode == 2 and "takes its criteria per row" in batch.stderr + batch.stdout
    jury = run_cli("grade", str(source), "-r", str(five), "-o", out, "--model", "a", "--model", "b", "--base-url", "http://127.0.0.1:9/v1")
    assert jury.returncode == 2 and "is a checklist" in jury.stderr + jury.stdout


async def test_a_jury_over_a_checklist_is_an_input_error_not_a_score(five: Path) -> None:
    from gradekit.judge import Judge, Jury

    with FakeProvider() as fake:
        jurors = [Judge(m, base_url=fake.base_url, api_key="k") for m in ("a", "b")]
        jury = Jury(jurors)
        try:
            verdict = await jury.judge(load_rubric(five), {"prompt": "p", "response": "r"})
        finally:
            await jury.aclose()
        assert not fake.chat_requests()
    assert verdict.status == "error" and verdict.error_kind == "input" and verdict.score is None and "checklist" in verdict.error


def test_bedrock_lambda_reports_each_criterion_in_its_metrics_list(tmp_path: Path) -> None:
    from gradekit.graders import RewardServer, create_app, export_bedrock_lambda, load_grader
    from gradekit.judge import Judge

    from ..platforms.test_foundry_bedrock import lambda_call

    records = [{"id": f"s-{i}", "messages": [{"role": "user", "content": row["prompt"]}, {"role": "assistant", "content": row["response"]}],
                "metadata": {"criteria": row["criteria"]}} for i, row in enumerate(PER_ROW)]
    with FakeProvider(responder=checklist_judge(per_row_answer)) as fake:
        grader = load_grader({"type": "llm", "rubric": "instruction_checklist", "name": "ifc"},
                             judge=lambda: Judge("fake", base_url=fake.base_url, api_key="k", cache=None))
        server = RewardServer(create_app(grader), port=0, log_level="warning").start()
        try:
            source = export_bedrock_lambda({"type": "llm", "rubric": "instruction_checklist", "name": "ifc"}, endpoint=server.url)
            ran = lambda_call(tmp_path, source, records)
            requests = len(fake.chat_requests())
        finally:
            server.stop()
    assert ran.returncode == 0, ran.stderr
    out = json.loads(ran.stdout)
    assert requests == 2 and [r["aggregate_reward_score"] for r in out] == [0.5, 1.0]
    assert out[0]["metrics_list"] == [{"name": "ifc", "value": 0.5, "type": "Reward"},
                                      {"name": "criteria_read", "value": 2.0, "type": "Metric"},
                                      {"name": "criteria_total", "value": 2.0, "type": "Metric"},
                                      {"name": "part.criteria.c1", "value": 0.0, "type": "Metric"},
                                      {"name": "part.criteria.c2", "value": 1.0, "type": "Metric"}]
    assert {m["name"] for m in out[1]["metrics_list"]} == {"ifc", "criteria_read", "criteria_total", "part.criteria.french",
                                                           "part.criteria.short", "part.criteria.no_english"}


def test_checklist_calibration_prints_no_library_warnings(tmp_path: Path) -> None:
    """Issue 48: a criterion every human and the judge call "yes" made scikit-learn warn on stderr (a 1 x 1 confusion matrix)."""
    rows = [{"id": i, "prompt": "p", "response": "r", "criteria": ["A.", "B."],
             "criteria_labels": {"c1": "yes", "c2": "yes" if i % 2 else "no"}} for i in range(6)]
    source = write_rows(tmp_path / "in.jsonl", rows)
    with FakeProvider(responder=checklist_judge(lambda cid, prompt: "yes")) as fake:
        graded = run_cli("grade", str(source), "-r", "instruction_checklist", "-o", str(tmp_path / "out.jsonl"), "--base-url",
                         fake.base_url, "--api-key", "k", "--no-cache")
    assert graded.returncode == 0, graded.stderr
    done = run_cli("calibrate", str(tmp_path / "out.jsonl"), "--criteria-labels", "criteria_labels", "--bootstrap", "200")
    assert done.returncode == 0, done.stderr
    assert "c1" in done.stdout and "Warning" not in done.stderr and "warnings.warn" not in done.stderr, done.stderr
