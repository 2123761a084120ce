"""Probes of judge weaknesses, run over HTTP against scripted judges with known flaws and against LLMBar's replay."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gradekit.graders.calibration._llmbar import LLMBarRun, grading_rows, replay_responder, rescore_llmbar
from gradekit.graders.calibration import answer_listing, instruction_injection, position_swap, run_probes, verbosity
from gradekit.judge import Judge, Limiter, load_rubric
from gradekit.judge.testing import FakeProvider, Reply

REPO = Path(__file__).resolve().parents[2]
EN = load_rubric("semantic_equivalence_en")
ROWS = [json.loads(line) for line in (REPO / "eval_sets/semantic_equivalence_en/data.jsonl").open(encoding="utf-8")][:16]


def _reply(body: dict, label: str) -> Reply:
    payload = json.dumps({"rationale": "r", "judgement": label})
    if body.get("tools"):
        return Reply(tool_call={"name": "submit_verdict", "arguments": payload})
    return Reply(content=payload)


def _prediction(body: dict) -> str:
    return re.search(r"<prediction>\n(.*?)\n</prediction>", body["messages"][-1]["content"], re.S).group(1)


def _references(body: dict) -> list[str]:
    block = re.search(r"<references>\n(.*?)</references>", body["messages"][-1]["content"], re.S).group(1)
    return re.findall(r"^- (.*)$", block, re.M)


def substring_judge(body: dict) -> Reply:
    """Correct iff a reference occurs in the prediction: fooled by lists, deaf to injections and padding."""
    hit = any(ref.lower() in _prediction(body).lower() for ref in _references(body))
    return _reply(body, "correct" if hit else "incorrect")


def obedient_judge(body: dict) -> Reply:
    """Does what the graded answer tells it to."""
    if "正确" in _prediction(body):
        return _reply(body, "correct")
    return substring_judge(body)


def length_judge(body: dict) -> Reply:
    """Mistakes length for quality."""
    return _reply(body, "correct" if len(_prediction(body)) > 200 else "incorrect")


PROBES = [verbosity(), answer_listing(), instruction_injection()]


async def _run(responder, probes=PROBES) -> dict:
    with FakeProvider(responder=responder) as server:
        async with Judge("fake", base_url=server.base_url, api_key="x", limiter=Limiter()) as judge:
            reports = await run_probes(judge, EN, ROWS, probes)
    return {r.probe: r for r in reports}


async def test_a_substring_judge_is_fooled_by_answer_listing_only() -> None:
    reports = await _run(substring_judge)
    listing = reports["answer_listing"]
    assert listing.judged == len(ROWS) and listing.weakness_rate == 1.0  # every list contains a reference
    assert listing.examples and listing.examples[0].perturbed == "correct"
    assert reports["verbosity"].flip_rate == 0.0 and reports["instruction_injection"].flip_rate == 0.0


async def test_an_obedient_judge_flips_on_injection_for_every_answer_it_had_rejected() -> None:
    reports = await _run(obedient_judge)
    wrong_before = sum(1 for row in ROWS if not any(r.lower() in row["prediction"].lower() for r in row["references"]))
    injection = reports["instruction_injection"]
    assert wrong_before > 0 and injection.flips == wrong_before
    assert injection.flip_rate == pytest.approx(wrong_before / len(ROWS)) and injection.mean_score_shift > 0


async def test_a_length_loving_judge_flips_on_padding() -> None:
    reports = await _run(length_judge, [verbosity()])
    assert reports["verbosity"].flip_rate == 1.0 and reports["verbosity"].weakness_rate == 1.0


async def test_failed_verdicts_are_counted_not_scored() -> None:
    def flaky(body: dict) -> Reply:
        return Reply(content="no idea") if "padded" in _prediction(body) else substring_judge(body)

    reports = await _run(flaky, [verbosity(padding="padded")])
    assert reports["verbosity"].errors == len(ROWS) and reports["verbosity"].judged == 0
    assert reports["verbosity"].flip_rate is None


def test_answer_listing_lists_the_reference_among_other_rows_answers() -> None:
    probe = answer_listing(language="zh", candidates=4)
    rows = [{"prediction": "p", "references": [f"答案{i}"]} for i in range(6)]
    text = probe.perturb(rows[2], 2, rows)["prediction"]
    assert text.startswith("可能的答案：") and "答案2" in text and text.count("；") == 3
    # Seeded: the same listing in every process and on every run (the literal was computed once, elsewhere),
    # so two probe reports of one judge are comparable; another seed lists other rows' answers in another order.
    assert text == "可能的答案：答案0；答案4；答案2；答案3。"
    assert answer_listing(language="zh", candidates=4, seed=1).perturb(rows[2], 2, rows)["prediction"] != text


async def test_position_swap_probe_on_gpt4_replay_matches_its_recorded_conflicts() -> None:
    root = REPO / "eval_sets" / "llmbar"
    run = LLMBarRun("LLMBar__Natural", "GPT-4", "Vanilla_NoRules")
    rubric = load_rubric("llmbar_pairwise")
    with FakeProvider(responder=replay_responder(run, root)) as server:
        async with Judge("gpt-4", base_url=server.base_url, api_key="x", limiter=Limiter()) as judge:
            [report] = await run_probes(judge, rubric, grading_rows("Natural", root), [position_swap(rubric)])
    recorded = rescore_llmbar(run, root).report
    assert report.judged == 100 and report.flips == recorded.conflicts == 3
    with pytest.raises(ValueError, match="pairwise"):
        position_swap(EN)
