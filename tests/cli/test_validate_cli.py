"""`gradekit validate` end to end (in-process and once as a real subprocess), and `gradekit grade --group-by`."""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gradekit.graders.cli import app
from gradekit.judge.testing import FakeProvider, Reply

from ..conftest import invoke

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "graders"
runner = CliRunner()


def validate(*args: str) -> tuple[int, str]:
    return invoke("validate", *args)


def polite_judge(body: dict) -> Reply:
    answer = body["messages"][-1]["content"].split("Answer: ", 1)[1]
    return Reply(content="<answer>" + ("Yes" if "please" in answer.lower() else "No") + "</answer>")


@pytest.mark.parametrize(("response", "reward"), [
    pytest.param("response_content.json", 1.0, id="vertex_content"),
    pytest.param("response_message.json", -1.0, id="openai_message"),
    pytest.param("response.txt", 1.0, id="plain_text"),
])
def test_validate_single_reward(response: str, reward: float) -> None:
    code, text = validate("--grader", str(DATA / "vertex_single.json"), "--example", str(DATA / "example_vertex.json"),
                          "--response", str(DATA / response))
    assert code == 0, text
    assert text.splitlines()[0] == f"reward: {reward:g}"
    assert "logs:" in text and "final_answer: parsed" in text


@pytest.mark.parametrize("payload", [
    pytest.param({"id": "c", "object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant", "content": r"\boxed{Paris}"}}]},
                 id="openai_completion"),
    pytest.param([{"role": "assistant", "content": "thinking"}, {"role": "assistant", "content": r"\boxed{Paris}"}], id="message_list"),
    pytest.param({"candidates": [{"content": {"role": "model", "parts": [{"text": r"\boxed{Paris}"}]}}]}, id="vertex_generate_response"),
    pytest.param(r"\boxed{Paris}", id="json_string"),
])
def test_validate_response_shapes(tmp_path: Path, payload: object) -> None:
    response = tmp_path / "response.json"
    response.write_text(json.dumps(payload), encoding="utf-8")
    code, text = validate("--grader", str(DATA / "vertex_single.json"), "--example", str(DATA / "example_vertex.json"),
                          "--response", str(response), "--json")
    assert code == 0, text
    assert json.loads(text)["reward"] == 1.0


def test_validate_composite_json_with_the_fake_judge() -> None:
    with FakeProvider(responder=polite_judge) as fake:
        code, text = validate("--grader", str(DATA / "vertex_composite.json"), "--example", str(DATA / "example_vertex.json"),
                              "--response", str(DATA / "response_content.json"), "--json", "--base-url", fake.base_url, "--api-key", "k")
        requests = len(fake.chat_requests())
    assert code == 0, text
    result = json.loads(text)
    assert result["version"] == 1 and result["errors"] == [] and requests == 1
    assert set(result["parts"]) == {"answer", "json_city", "code", "polite"}
    assert all(set(p) == {"reward", "error"} for p in result["parts"].values())
    spec = json.loads((DATA / "vertex_composite.json").read_text(encoding="utf-8"))
    weights = {c["rewardConfig"]["rewardName"]: c["weight"] for c in spec["reinforcementTuningSpec"]["compositeRewardConfig"]["weightedRewardConfigs"]}
    rewards = {name: part["reward"] for name, part in result["parts"].items()}
    assert rewards == {"answer": 1.0, "json_city": 0.0, "code": 0.5, "polite": -1.0}
    assert result["reward"] == pytest.approx(sum(weights[n] * rewards[n] for n in weights) / sum(weights.values()))
    assert any(line.startswith("polite: judge label") for line in result["logs"])


def test_validate_reports_a_failing_part(tmp_path: Path) -> None:
    config = tmp_path / "grader.yaml"
    config.write_text(
        "type: weighted\n"
        "parts:\n"
        "  exact: {weight: 1, type: string_match, expression: '{{references.answer}}', operation: PARTIAL_MATCH}\n"
        "  code:\n"
        "    weight: 1\n"
        "    type: python\n"
        "    workers: 1\n"
        "    source: |\n"
        "      def evaluate(example, response):\n"
        "          print('looking for', example['references']['unit'])\n"
        "          return 1.0\n",
        encoding="utf-8",
    )
    code, text = validate("--grader", str(config), "--example", str(DATA / "example_vertex.json"), "--response", str(DATA / "response.txt"), "--json")
    assert code == 1, text
    result = json.loads(text)
    assert result["reward"] is None and result["status"] == "invalid"
    assert result["parts"]["exact"] == {"reward": 1.0, "error": None}
    assert result["parts"]["code"]["reward"] is None and "KeyError: 'unit'" in result["parts"]["code"]["error"]
    assert len(result["errors"]) == 1 and result["errors"][0].startswith("code: ")
    code, text = validate("--grader", str(config), "--example", str(DATA / "example_vertex.json"), "--response", str(DATA / "response.txt"))
    assert code == 1 and "reward: none (invalid)" in text
    assert re.search(r"^  code +none +error: python grader 'code'", text, re.M), text


@pytest.mark.parametrize(("args", "message"), [
    pytest.param(("--example", "missing.json"), "missing.json", id="missing_example"),
    pytest.param(("--example", str(DATA / "response.txt")), "not valid JSON", id="example_not_json"),
    pytest.param(("--grader", str(DATA / "reward_vertex.py")), "reward_vertex.py", id="grader_not_yaml"),
    pytest.param(("--grader", str(DATA / "autorater_tone.yaml")), "needs a judge", id="llm_without_a_judge"),
])
def test_validate_cannot_start(args: tuple[str, ...], message: str) -> None:
    defaults = {"--grader": str(DATA / "vertex_single.json"), "--example": str(DATA / "example_vertex.json"), "--response": str(DATA / "response.txt")}
    defaults.update(dict(zip(args[::2], args[1::2])))
    code, text = validate(*[x for pair in defaults.items() for x in pair])
    assert code == 2, text
    assert message in text


def test_validate_real_subprocess(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "GRADEKIT_"))}
    done = subprocess.run(
        [sys.executable, "-c", "from gradekit.graders.cli import main; main()", "validate", "--grader", str(DATA / "weighted.yaml"),
         "--example", str(DATA / "example_vertex.json"), "--response", str(DATA / "response.txt"), "--json"],
        env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    result = json.loads(done.stdout)
    # The example has no <answer> tags: the normalised match reads nothing (wrong, -1); the python
    # length reward sees 7 words <= 20 (1.0).
    assert done.returncode == 0, done.stderr
    assert {n: p["reward"] for n, p in result["parts"].items()} == {"exact": -1.0, "length": 1.0}
    assert result["reward"] == pytest.approx((3 * -1.0 + 1 * 1.0) / 4)


# ---- gradekit grade --group-by: the reward spread report -----------------------------------------


def se_judge(body: dict) -> Reply:
    user = body["messages"][-1]["content"]
    prediction = user.split("<prediction>\n", 1)[1].split("\n</prediction>", 1)[0]
    references = [line[2:] for line in user.split("<references>\n", 1)[1].split("</references>", 1)[0].splitlines() if line.startswith("- ")]
    hit = any(r.lower() in prediction.lower() for r in references)
    return Reply(content=json.dumps({"rationale": "r", "judgement": "correct" if hit else "incorrect"}))


def test_grade_group_by_reports_the_spread(tmp_path: Path) -> None:
    answers = {"p1": ["Paris", "Paris", "Paris"], "p2": ["Paris", "Lyon", "Nice"], "p3": ["Lyon", "Lyon"], "p4": ["Paris"]}
    source = tmp_path / "rows.jsonl"
    with source.open("w", encoding="utf-8") as f:
        for prompt_id, predictions in answers.items():
            for prediction in predictions:
                f.write(json.dumps({"prompt_id": prompt_id, "question": "Capital of France?", "references": ["Paris"], "prediction": prediction}) + "\n")
    out = tmp_path / "out.jsonl"
    with FakeProvider(responder=se_judge) as fake:
        result = runner.invoke(app, ["grade", str(source), "-r", "semantic_equivalence_en", "-o", str(out), "--base-url", fake.base_url,
                                     "--api-key", "k", "--no-cache", "--group-by", "prompt_id", "--json"])
        text = runner.invoke(app, ["grade", str(source), "-r", "semantic_equivalence_en", "-o", str(tmp_path / "o2.jsonl"),
                                   "--base-url", fake.base_url, "--api-key", "k", "--no-cache", "--group-by", "prompt_id"]).output
    assert result.exit_code == 0, result.output
    spread = json.loads(result.output)["spread"]
    groups: dict[str, list[float]] = defaultdict(list)
    for row in map(json.loads, out.read_text(encoding="utf-8").splitlines()):
        groups[row["prompt_id"]].append(row["score"])
    flat = [s for g in groups.values() for s in g]
    multi = [g for g in groups.values() if len(g) > 1]
    assert spread["groups"] == len(groups) and spread["rewards"] == len(flat)
    assert spread["all_equal_share"] == pytest.approx(sum(len(set(g)) == 1 for g in multi) / len(multi))
    assert spread["mean"] == pytest.approx(statistics.fmean(flat))
    assert spread["variance"] == pytest.approx(statistics.pvariance(flat))
    assert spread["too_easy"] is False and spread["too_hard"] is False
    assert "reward spread" in text and "4 groups" in text
    # p1 is all correct (1.0), p3 all incorrect (0.0): one group too easy, one too hard, counted explicitly.
    assert (spread["too_easy_groups"], spread["too_hard_groups"]) == (1, 1)
    assert "too easy (all max): 1 groups; too hard (all min): 1 groups" in " ".join(text.split())


def test_grade_group_by_unknown_csv_column(tmp_path: Path) -> None:
    source = tmp_path / "rows.csv"
    source.write_text("question,references,prediction\nq,Paris,Paris\n", encoding="utf-8")
    result = runner.invoke(app, ["grade", str(source), "-r", "semantic_equivalence_en", "-o", str(tmp_path / "o.csv"),
                                 "--base-url", "http://127.0.0.1:9/v1", "--api-key", "k", "--no-cache", "--group-by", "prompt_id"])
    assert result.exit_code == 2 and "prompt_id" in result.output


# ---- the user-facing examples stay working ----------------------------------------------------


def test_examples_validate(tmp_path: Path) -> None:
    examples = ROOT / "examples" / "graders"
    code, text = validate("--grader", str(examples / "math_answer.yaml"), "--example", str(examples / "example.json"),
                          "--response", str(examples / "response.txt"), "--json")
    assert code == 0, text
    result = json.loads(text)
    assert {n: p["reward"] for n, p in result["parts"].items()} == {"correct": 1.0, "format": 1.0}
    wrong = tmp_path / "wrong.txt"
    wrong.write_text(r"First \boxed{1000}, then \boxed{1,080}.", encoding="utf-8")
    code, text = validate("--grader", str(examples / "math_answer.yaml"), "--example", str(examples / "example.json"),
                          "--response", str(wrong), "--json")
    assert {n: p["reward"] for n, p in json.loads(text)["parts"].items()} == {"correct": -1.0, "format": -1.0}


async def test_example_group_config_loads() -> None:
    from gradekit.graders import load_group_grader
    from gradekit.graders import Sample, Trajectory
    from gradekit.judge import Judge

    grader = load_group_grader(ROOT / "examples" / "graders" / "search_agent_group.yaml", judge=Judge("m", base_url="http://127.0.0.1:9/v1"))
    result = await grader(Sample(messages="q", references={"answer": "a"}), [Trajectory(messages="a, without searching")])
    assert result.rewards == [-1.0]
