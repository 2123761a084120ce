"""The pandas front door (grade_frame / agrade_frame) and the row -> Sample mapping it shares with file runs."""

from __future__ import annotations

import asyncio
import json
import math
import re
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gradekit.graders import (
    Grade,
    Sample,
    SyncGrader,
    agrade_frame,
    grade_frame,
    llm_grader,
    string_match_grader,
    weighted_grader,
)
from gradekit.graders.runs._frame import _shared_runner
from gradekit.graders.runs._io import RowError
from gradekit.graders.runs._rows import MappingError, RowMapping, grade_columns
from gradekit.judge import Judge, Limiter
from gradekit.judge.testing import FakeProvider, Reply

from ..conftest import InFlight


def recorder():
    """A grader that keeps every Sample it sees and scores response == references.answer."""
    seen: list[Sample] = []

    async def grade(sample: Sample) -> Grade:
        seen.append(sample)
        return Grade.scored(1.0 if sample.response_text == str(sample.references.get("answer")) else -1.0)

    return grade, seen


def semantic_judge(body: dict) -> Reply:
    """Reads the rendered rubric like a model would: correct iff a reference appears in the prediction."""
    user = body["messages"][-1]["content"]
    prediction = re.search(r"<prediction>\n(.*?)\n</prediction>", user, re.S).group(1)  # type: ignore[union-attr]
    references = re.findall(r"^- (.*)$", re.search(r"<references>\n(.*?)</references>", user, re.S).group(1), re.M)  # type: ignore[union-attr]
    hit = any(r.lower() in prediction.lower() for r in references)
    return Reply(content=json.dumps({"rationale": "r", "judgement": "correct" if hit else "incorrect"}))


CAPITALS = pd.DataFrame(
    {"question": ["Capital of France?", "Capital of Italy?", "Capital of Spain?"], "response": ["Paris", "Milan", "Madrid"],
     "answer": ["Paris", "Rome", "Madrid"], "score": [0.9, 0.1, 0.8], "source": ["a", "b", "c"]},
    index=pd.Index([30, 10, 30], name="id"),  # duplicated and unsorted: kept as given
)


def test_defaults_keep_index_order_and_inputs_and_add_result_columns() -> None:
    grader, seen = recorder()
    out = grade_frame(CAPITALS, grader)
    assert out.index.equals(CAPITALS.index) and out.index.name == "id"
    assert list(out.columns) == ["question", "response", "answer", "input_score", "source", "score", "status", "error_kind", "error"]
    assert out["input_score"].tolist() == [0.9, 0.1, 0.8], "a human score column is kept beside the grader's"
    assert out["score"].tolist() == [1.0, -1.0, 1.0] and out["status"].tolist() == ["ok"] * 3
    first = next(s for s in seen if s.response_text == "Paris")
    assert first.prompt_text == "Capital of France?" and first.messages[0].role == "user"
    assert first.references == {"answer": "Paris", "score": 0.9, "source": "a"}, "every other column is a reference (OpenAI's item)"
    assert CAPITALS.columns.tolist()[3] == "score", "the input frame is not modified"


def test_references_placeholders_read_columns_of_the_same_name() -> None:
    out = grade_frame(CAPITALS, string_match_grader("{{references.answer}}"))
    assert out["score"].tolist() == [1.0, -1.0, 1.0]


def test_explicit_mapping_fills_each_sample_path() -> None:
    df = pd.DataFrame({"q": ["2+2?"], "out": ["4"], "gold": ["4"], "sys": ["Be terse."], "src": ["gsm"], "nested": ["x"]})
    grader, seen = recorder()
    mapping = {"prompt": "q", "response": "out", "references.answer": "gold", "system_instruction": "sys",
               "metadata.source": "src", "references.deep.key": "nested"}
    out = grade_frame(df, grader, mapping)
    assert out["score"].tolist() == [1.0]
    sample = seen[0]
    assert [(m.role, m.text) for m in sample.messages] == [("system", "Be terse."), ("user", "2+2?")]
    assert sample.response_text == "4" and sample.metadata == {"source": "gsm"}
    assert sample.references["answer"] == "4" and sample.references["deep"] == {"key": "x"}
    assert sample.references["gold"] == "4", "mapped columns stay in the item too"


def test_a_messages_column_is_the_prompt_and_cells_may_be_lists_or_json_text(tmp_path: Path) -> None:
    chat = [{"role": "system", "content": "sys"}, {"role": "user", "content": "Capital of France?"}]
    df = pd.DataFrame({"messages": [chat, json.dumps(chat)], "completion": ["Paris", "Paris"], "answer": ["Paris", "Paris"]})
    grader, seen = recorder()
    assert grade_frame(df, grader)["status"].tolist() == ["ok", "ok"]
    assert all([m.role for m in s.messages] == ["system", "user"] and s.prompt_text == "Capital of France?" for s in seen)
    # Parquet hands list cells back as numpy arrays of dicts.
    path = tmp_path / "rows.parquet"
    df.iloc[:1].to_parquet(path)
    back = pd.read_parquet(path)
    assert isinstance(back["messages"].iloc[0], np.ndarray)
    grader, seen = recorder()
    assert grade_frame(back, grader)["score"].tolist() == [1.0]
    assert seen[0].prompt_text == "Capital of France?"


def test_mapping_problems_fail_before_any_row_is_graded() -> None:
    grader, seen = recorder()
    with pytest.raises(MappingError, match=r"'response' reads column 'model_output', which is not in the data; columns are 'question', 'response'"):
        grade_frame(CAPITALS, grader, {"response": "model_output"})
    with pytest.raises(MappingError, match=r"'answer' is not a sample path; use prompt, messages"):
        grade_frame(CAPITALS, grader, {"answer": "answer"})
    with pytest.raises(MappingError, match="either 'prompt'"):
        grade_frame(CAPITALS, grader, {"prompt": "question", "messages": "question"})
    with pytest.raises(ValueError, match="duplicate columns 'a'"):
        grade_frame(pd.DataFrame([[1, 2]], columns=["a", "a"]), grader)
    assert seen == []


def test_unusable_cells_are_invalid_rows_and_missing_cells_are_missing() -> None:
    df = pd.DataFrame({"messages": [[{"role": "user", "content": "hi"}], 42, [{"content": "no role"}], None],
                       "response": ["Paris", "Paris", "Paris", np.nan], "answer": ["Paris", "Paris", "Paris", None]},
                      index=["a", "b", "c", "d"])
    out = grade_frame(df, string_match_grader("{{references.answer}}"))
    assert out["status"].tolist() == ["ok", "invalid", "invalid", "invalid"]
    assert out.loc["b", "error_kind"] == "input"
    assert out.loc["b", "error"] == "index 'b': column 'messages' (messages) must be a list of chat messages, got int"
    assert out.loc["c", "error"].startswith("index 'c': column 'messages' (messages) item 0: role: Field required")
    assert "no references key 'answer'" in out.loc["d", "error"], "a NaN reference is a missing reference, not the text 'nan'"
    assert math.isnan(out.loc["d", "score"])


def test_a_grader_that_raises_or_returns_garbage_costs_only_its_row() -> None:
    async def flaky(sample: Sample) -> Grade:
        if sample.response_text == "boom":
            raise RuntimeError("kaput")
        if sample.response_text == "none":
            return None  # type: ignore[return-value]
        return Grade.scored(0.5)

    df = pd.DataFrame({"response": ["ok", "boom", "none", "ok"]})
    out = grade_frame(df, flaky)
    assert out["status"].tolist() == ["ok", "error", "error", "ok"] and len(out) == 4
    assert out.loc[1, "error"] == "index 1: the grader raised RuntimeError: kaput" and out.loc[1, "error_kind"] == "exception"
    assert "returned NoneType, not a Grade" in out.loc[2, "error"]


def test_composite_parts_and_metrics_become_columns() -> None:
    exact = string_match_grader("{{references.answer}}", correct=1.0, wrong=-1.0)
    city = string_match_grader("{{references.city}}", correct=1.0, wrong=-1.0)

    async def timed(sample: Sample) -> Grade:
        grade = await weighted_grader({"exact": (exact, 3.0), "city": (city, 1.0)})(sample)
        return grade.model_copy(update={"metrics": {**grade.metrics, "latency_s": 0.25}})

    df = pd.DataFrame({"response": ["Paris", "Lyon"], "answer": ["Paris", "Paris"], "city": ["Lyon", None]})
    out = grade_frame(df, timed)
    assert {"score_exact", "score_city", "metric_latency_s"} <= set(out.columns)
    assert out["score_exact"].tolist() == [1.0, -1.0]
    assert out.loc[0, "score_city"] == -1.0 and math.isnan(out.loc[1, "score_city"]), "a failed part has no score"
    assert out["metric_latency_s"].tolist() == [0.25, 0.25]
    assert out.loc[1, "status"] == "invalid", "the whole grade fails when a part cannot be graded"


async def test_llm_grader_over_http_with_bounded_concurrency(fake: FakeProvider, make_judge) -> None:
    def judge_or_refuse(body: dict) -> Reply:
        if "Atlantis" in body["messages"][-1]["content"]:
            return Reply(status=400, error_message="no such city")
        return semantic_judge(body)

    in_flight = InFlight(judge_or_refuse, meet=2, hold=0.02)
    fake.set_responder(in_flight)
    judge = make_judge(limiter=Limiter(concurrency=16), timeout=120)
    questions = [f"Capital #{i}?" for i in range(11)] + ["Capital of Atlantis?"]
    df = pd.DataFrame({"question": questions, "response": ["Paris"] * 12, "answer": ["Paris"] * 6 + ["Rome"] * 6})
    seen: list[tuple[int, int]] = []
    out = await agrade_frame(df, llm_grader(judge, "semantic_equivalence_en"), {"references.references": "answer"},
                             concurrency=3, progress=lambda done, total: seen.append((done, total)))
    assert 1 < in_flight.peak <= 3, f"grade_frame's concurrency bounds the requests in flight (peak {in_flight.peak})"
    assert out["status"].tolist() == ["ok"] * 11 + ["error"]
    assert out["score"].tolist()[:11] == [1.0] * 6 + [0.0] * 5
    assert out.loc[11, "error_kind"] == "bad_request"
    assert (out["metric_judge_prompt_tokens"].iloc[:11] > 0).all() and "metric_judge_attempts" in out.columns
    assert seen[-1] == (12, 12)


def _judge(fake: FakeProvider) -> Judge:
    return Judge("fake-judge", base_url=fake.base_url, api_key="test-key", limiter=Limiter(concurrency=4), timeout=5.0)


def test_sync_call_inside_a_running_loop_and_again_with_the_same_grader(fake: FakeProvider) -> None:
    """Jupyter's case: the cell's code runs inside a loop. Two calls share the grader's connections."""
    fake.set_responder(semantic_judge)
    judge = _judge(fake)
    grader = llm_grader(judge, "semantic_equivalence_en")
    df = pd.DataFrame({"question": ["Capital of France?"], "response": ["Paris"], "references": ["Paris"]})

    async def cell() -> pd.DataFrame:
        assert asyncio.get_running_loop().is_running()
        return grade_frame(df, grader)

    try:
        for _ in range(2):
            out = asyncio.run(cell())
            assert (out.loc[0, "status"], out.loc[0, "score"]) == ("ok", 1.0), out.loc[0, "error"]
    finally:
        _shared_runner().run(judge.aclose())
    assert len(fake.chat_requests()) == 2


def test_sync_call_from_a_plain_thread(fake: FakeProvider) -> None:
    fake.set_responder(semantic_judge)
    judge = _judge(fake)
    grader = llm_grader(judge, "semantic_equivalence_en")
    df = pd.DataFrame({"question": ["Capital of Italy?", "Capital of Spain?"], "response": ["Rome", "Lisbon"], "references": ["Rome", "Madrid"]})
    results: list[pd.DataFrame] = []
    thread = threading.Thread(target=lambda: results.append(grade_frame(df, grader)))
    thread.start()
    thread.join()
    _shared_runner().run(judge.aclose())
    assert results[0]["score"].tolist() == [1.0, 0.0]


def test_a_grader_config_file_is_built_and_closed(fake: FakeProvider, tmp_path: Path) -> None:
    fake.set_responder(semantic_judge)
    config = tmp_path / "grader.yaml"
    config.write_text(
        f"judge: {{model: fake-judge, base_url: '{fake.base_url}'}}\n"
        "type: weighted\n"
        "parts:\n"
        "  exact: {weight: 1, type: string_match, expression: '{{references.answer}}'}\n"
        "  judge: {weight: 1, type: llm, rubric: semantic_equivalence_en, map: {references: references.answer}}\n",
        encoding="utf-8",
    )
    df = pd.DataFrame({"question": ["Capital of France?", "Capital of Italy?"], "response": ["Paris", "It is Rome"], "answer": ["Paris", "Rome"]})
    out = grade_frame(df, config)
    assert out["score_exact"].tolist() == [1.0, -1.0] and out["score_judge"].tolist() == [1.0, 1.0]
    assert out["score"].tolist() == [1.0, 0.0]
    out = grade_frame(df, str(config))  # a fresh build each call: the first one's judge was closed
    assert out["status"].tolist() == ["ok", "ok"]


async def test_sync_grader_works_from_both_doors() -> None:
    with SyncGrader(string_match_grader("{{references.answer}}")) as grader:
        assert grade_frame(CAPITALS, grader)["score"].tolist() == [1.0, -1.0, 1.0]
        assert (await agrade_frame(CAPITALS, grader))["score"].tolist() == [1.0, -1.0, 1.0]


def test_an_empty_frame_gets_the_result_columns() -> None:
    grader, _ = recorder()
    out = grade_frame(CAPITALS.iloc[:0], grader)
    assert len(out) == 0 and list(out.columns)[-4:] == ["score", "status", "error_kind", "error"]


def test_numbers_and_numpy_cells_become_plain_values() -> None:
    df = pd.DataFrame({"question": ["2+2?"], "response": [4], "answer": pd.array([4], dtype="Int64"), "weight": np.float32([0.5])})
    grader, seen = recorder()
    out = grade_frame(df, grader)
    assert out["score"].tolist() == [1.0]
    assert seen[0].response_text == "4"
    assert seen[0].references == {"answer": 4, "weight": 0.5} and type(seen[0].references["answer"]) is int


# ---- RowMapping on its own: what a file run over CSV/JSONL rows uses -------------------------------


def test_row_mapping_without_known_columns_settles_defaults_per_row() -> None:
    rows = RowMapping.build({"references.answer": "gold"}, None)
    sample = rows.sample({"prompt": "Capital?", "output": "Paris", "gold": "Paris", "id": 7}, "row 1")
    assert (sample.prompt_text, sample.response_text) == ("Capital?", "Paris")
    assert sample.references == {"answer": "Paris", "gold": "Paris", "id": 7}
    other = rows.sample({"messages": '[{"role": "user", "content": "Hi"}]', "response": "Hello"}, "row 2")
    assert other.prompt_text == "Hi" and other.references == {}, "a mapped key a row lacks is a missing cell"
    with pytest.raises(RowError, match=r"^row 3: column 'messages' \(messages\) is not a valid JSON list"):
        rows.sample({"messages": "[oops", "response": "x"}, "row 3")


def test_grade_columns_flatten_one_grade() -> None:
    grade = Grade.scored(0.5, parts={"a": Grade.scored(1.0), "b": Grade.failed("error", "down")}, metrics={"judge_attempts": 2.0})
    assert grade_columns(grade) == {"score": 0.5, "status": "ok", "error_kind": None, "error": None,
                                    "score_a": 1.0, "score_b": None, "metric_judge_attempts": 2.0}
