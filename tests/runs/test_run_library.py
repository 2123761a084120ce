"""The library door for a run, `gradekit.graders.grade(input, output, GradePlan(...))`, driven from Python.

Each test speaks HTTP to the loopback fake provider; the rubric and grader runs are checked against
`gradekit grade` over the same rows: the same output file, the same record as its --json.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gradekit.graders import GradeError, GradePlan, GradeRun, RunSummary, agrade, grade
from gradekit.judge import Budget, JudgeSpec, JurySpec
from gradekit.judge.testing import FakeProvider, Reply

from ..conftest import reference_judge
from ..calibration.test_pairwise import consistent_judge

ROOT = Path(__file__).resolve().parents[2]
ZH_SET = ROOT / "eval_sets" / "semantic_equivalence_zh" / "data.jsonl"
# Figures of time differ between any two runs; everything else in a record is the run's to say the same way.
TIMED = {"wall_s", "judgements_per_s", "reward_seconds_p50", "reward_seconds_p99", "slowest_rows", "pacing"}


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _small(tmp_path: Path, n: int = 6) -> Path:
    source = tmp_path / "rows.jsonl"
    source.write_text("".join(line + "\n" for line in ZH_SET.read_text(encoding="utf-8").splitlines()[:n]), encoding="utf-8")
    return source


def _cli(*args: str) -> tuple[int, dict]:
    """`gradekit grade ... --json` in a process of its own, with no judge settings from the environment."""
    env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "PYTHONUTF8": "1"}
    done = subprocess.run([sys.executable, "-m", "gradekit", "grade", *args, "--json"], capture_output=True, text=True, env=env,
                          timeout=300)
    return done.returncode, json.loads(done.stdout)


def _untimed(record: dict) -> dict:
    return {k: v for k, v in record.items() if k not in TIMED}


def test_a_rubric_run_from_python_writes_the_clis_file_and_record(tmp_path) -> None:
    source = _small(tmp_path)
    with FakeProvider(responder=reference_judge) as fake:
        judge = JudgeSpec.of(None, base_url=fake.base_url, api_key="k")
        run = grade(source, tmp_path / "lib.jsonl", GradePlan(rubric="semantic_equivalence_zh", judge=judge, cache=False))
        code, cli = _cli(str(source), "-r", "semantic_equivalence_zh", "-o", str(tmp_path / "cli.jsonl"), "--base-url", fake.base_url,
                         "--api-key", "k", "--no-cache")
    assert code == 0
    assert isinstance(run, GradeRun) and isinstance(run.summary, RunSummary)
    s = run.summary
    assert (s.results.rows, s.results.ok, s.results.errors, s.stats.usage.requests) == (6, 6, 0, 6)
    # The run filled its own record: the price of its tokens (gpt-4o-mini has a built-in price) and its pacing.
    assert s.stats.money.cost_usd is not None and s.stats.money.cost_usd > 0 and s.stats.pacing is not None and run.pacing is not None
    assert run.model == "gpt-4o-mini" and run.panel is None and run.failed_rows == 0
    assert _rows(tmp_path / "lib.jsonl") == _rows(tmp_path / "cli.jsonl")
    assert _untimed(s.model_dump()) == _untimed({k: cli[k] for k in s.model_dump()})
    assert cli["model"] == run.model and cli["hedges"] == run.hedges


def test_a_grader_run_from_python_counts_its_llm_part_and_resumes(tmp_path) -> None:
    config = tmp_path / "weighted.yaml"
    config.write_text("type: weighted\nparts:\n"
                      "  exact: {weight: 1, type: string_match, expression: '{{references.answer}}'}\n"
                      "  tone: {weight: 1, type: llm, rubric: tone, map: {response: response, tone: references.tone}}\n",
                      encoding="utf-8")
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"response": r, "answer": "Sure", "tone": "polite"}) + "\n"
                              for r in ["Thank you kindly.", "Whatever.", "Sure"]), encoding="utf-8")
    plan = GradePlan(grader=config, mapping={"references.answer": "answer", "references.tone": "tone"}, cache=False,
                     judge=JudgeSpec.of("tone-judge", base_url=None, api_key="k"))
    with FakeProvider(responder=lambda body: Reply(content="Polite. <answer>Yes</answer>")) as fake:
        plan = plan.model_copy(update={"judge": JudgeSpec.of("tone-judge", base_url=fake.base_url, api_key="k")})
        run = grade(source, tmp_path / "lib.jsonl", plan)
        sent = len(fake.chat_requests())
        again = grade(source, tmp_path / "lib.jsonl", plan)
        assert len(fake.chat_requests()) == sent, "a finished output is left alone: no request"
        code, cli = _cli(str(source), "--grader", str(config), "-o", str(tmp_path / "cli.jsonl"), "--map", "references.answer=answer",
                         "--map", "references.tone=tone", "--base-url", fake.base_url, "--api-key", "k", "--model", "tone-judge",
                         "--no-cache")
    assert code == 0 and sent == 3
    s = run.summary
    written = _rows(tmp_path / "lib.jsonl")
    assert (s.results.rows, s.results.ok, s.results.errors) == (3, 3, 0) and [r["parts"] for r in written] == [{"exact": -1.0, "tone": 1.0}] * 2 + [{"exact": 1.0, "tone": 1.0}]
    assert run.model == "tone-judge" and s.stats.pacing is not None and s.stats.money.saved_tokens == 0 and s.stats.money.cost_usd is None  # no price for it
    assert again.summary.already_complete and again.summary.results.rows == 3
    # The checkpoint names the judge the plan gives, as the command line's does: the CLI's run is the same one.
    checkpoint = json.loads((tmp_path / "lib.jsonl.checkpoint.json").read_text(encoding="utf-8"))
    assert json.loads((tmp_path / "cli.jsonl.checkpoint.json").read_text(encoding="utf-8"))["identity"]["settings"] == checkpoint["identity"]["settings"]
    assert _rows(tmp_path / "lib.jsonl") == _rows(tmp_path / "cli.jsonl")
    assert _untimed(s.model_dump()) == _untimed({k: cli[k] for k in s.model_dump()})


def test_the_plan_chooses_the_pairwise_and_batch_runs(tmp_path) -> None:
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"instruction": "q", "output_1": a, "output_2": b, "label": lab}) + "\n"
                             for a, b, lab in [("GOOD 1", "BAD", 1), ("BAD", "GOOD 2", 2), ("BAD", "GOOD 3", 1)]), encoding="utf-8")
    source = _small(tmp_path, 4)
    with FakeProvider(responder=consistent_judge) as fake:
        pair = grade(pairs, tmp_path / "pairs_out.jsonl", GradePlan(rubric="llmbar_pairwise", cache=False,
                                                                      judge=JudgeSpec.of("fake-judge", base_url=fake.base_url, api_key="k")))
    assert type(pair.summary).__name__ == "PairwiseRunSummary" and pair.summary.results.rows == 3
    assert pair.summary.results.report is not None and pair.summary.results.report.acc == pytest.approx(2 / 3)
    events: list[str] = []
    with FakeProvider(responder=reference_judge) as fake:
        batch = grade(source, tmp_path / "batch.jsonl", GradePlan(rubric="semantic_equivalence_zh", batch=True, batch_poll=0.001, cache=False,
                                                                  judge=JudgeSpec.of(None, base_url=fake.base_url, api_key="k")),
                      on_event=events.append)
        assert fake.batch_requests() and not [r for r in fake.requests if r.path.endswith("/chat/completions") and r.batch_id is None]
    assert batch.summary.results.rows == 4 and batch.summary.stats.money.cost_basis == "Batch API: 50% of the live price"
    assert any("created batch" in e for e in events)


def test_a_pairwise_runs_tiebreak_is_held_and_counted_by_the_runs_budget(tmp_path) -> None:
    from ..calibration.test_pairwise import first_position_judge

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"instruction": "q", "output_1": a, "output_2": b}) + "\n"
                             for a, b in [("GOOD 1", "BAD"), ("BAD", "GOOD 2")]), encoding="utf-8")
    budget = Budget()
    with FakeProvider(responder=first_position_judge) as fake, FakeProvider(responder=consistent_judge) as referee:
        run = grade(pairs, tmp_path / "out.jsonl", GradePlan(
            rubric="llmbar_pairwise", cache=False, on_conflict="third", judge=JudgeSpec.of("fake-judge", base_url=fake.base_url, api_key="k"),
            tiebreak=JudgeSpec.of("referee", base_url=referee.base_url, api_key="k")), budget=budget)
        asked, referred = len(fake.requests), len(referee.requests)
    assert (asked, referred) == (4, 2)  # every pair's orders disagree: the referee is asked once per pair
    assert [r["winner"] for r in _rows(tmp_path / "out.jsonl")] == ["1", "2"]
    # The referee's requests are the run's: in its record and in its budget (a --max-cost-usd cap holds them too).
    assert run.summary.stats.usage.requests == 6
    assert budget.spent_tokens == run.summary.stats.usage.prompt_tokens + run.summary.stats.usage.completion_tokens > 0


def test_a_jury_plan_fills_its_block_and_each_call_may_come_from_a_new_loop(tmp_path) -> None:
    source = _small(tmp_path, 4)
    with FakeProvider(responder=reference_judge) as fake:
        jury = JurySpec(tuple(JudgeSpec.of(m, base_url=fake.base_url, api_key="k") for m in ("gpt-4o-mini", "gpt-4o")))
        budget = Budget()
        first = grade(source, tmp_path / "a.jsonl", GradePlan(rubric="semantic_equivalence_zh", judge=jury, cache=False), budget=budget)
        second = asyncio.run(agrade(source, tmp_path / "b.jsonl", GradePlan(rubric="semantic_equivalence_zh", judge=jury, cache=False)))
    for run in (first, second):
        assert run.panel is not None and [m["model"] for m in run.panel["members"]] == ["gpt-4o-mini", "gpt-4o"]
        assert run.summary.stats.money.cost_usd == pytest.approx(sum(m["cost_usd"] for m in run.panel["members"]))
        assert run.summary.results.rows == 4 and run.summary.stats.usage.requests == 8
    assert _rows(tmp_path / "a.jsonl") == _rows(tmp_path / "b.jsonl")


@pytest.mark.parametrize("plan, message", [
    pytest.param({"rubric": "tone", "grader": Path("g.yaml")}, "one of the two", id="rubric_and_grader"),
    pytest.param({}, "one of the two", id="neither"),
    pytest.param({"rubric": "tone", "mapping": {"answer": "x"}}, "`mapping`: rubric 'tone' has no variable 'answer'", id="unknown_variable"),
])
def test_a_plan_that_cannot_run_is_refused_before_any_request(tmp_path, plan, message) -> None:
    source = _small(tmp_path, 2)
    with FakeProvider(responder=reference_judge) as fake:
        with pytest.raises(GradeError, match=message.replace("(", r"\(")):
            grade(source, tmp_path / "out.jsonl", GradePlan(**plan, judge=JudgeSpec.of(None, base_url=fake.base_url, api_key="k")))
        assert not fake.requests and not (tmp_path / "out.jsonl").exists()


def test_an_empty_input_is_an_input_error_naming_the_file(tmp_path) -> None:
    from gradekit.graders import InputError  # public: grade() says it raises it

    empty = tmp_path / "empty.jsonl"
    empty.write_text("", encoding="utf-8")
    with pytest.raises(InputError, match="no rows to grade"):
        grade(empty, tmp_path / "out.jsonl", GradePlan(rubric="tone", cache=False))


@pytest.mark.parametrize("plan, message", [
    pytest.param({"grader": Path("g.yaml"), "canary": Path("c.jsonl")}, "`keep_reasoning` and `canary` work with a single-answer", id="grader_canary"),
    pytest.param({"rubric": "llmbar_pairwise", "keep_reasoning": True}, "`keep_reasoning` and `canary` work with", id="pairwise_reasoning"),
    pytest.param({"grader": Path("g.yaml"), "batch": True}, "`batch` and `tiebreak` work with a rubric", id="grader_batch"),
])
def test_options_a_run_kind_cannot_honour_are_refused_not_dropped(tmp_path, plan, message) -> None:
    source = _small(tmp_path, 2)
    with pytest.raises(GradeError, match=message):
        grade(source, tmp_path / "out.jsonl", GradePlan(**plan, cache=False))
    assert not (tmp_path / "out.jsonl").exists()


def test_agrade_refuses_a_ray_run_whose_driver_would_block_the_loop(tmp_path) -> None:
    with pytest.raises(GradeError, match="call grade"):
        asyncio.run(agrade(_small(tmp_path, 2), tmp_path / "out.jsonl", GradePlan(rubric="tone", ray="local")))


def test_the_record_is_results_and_stats_in_small_parts_read_flat() -> None:
    """Issue 47: a run's record is two parts, each model at most 15 fields; --json and a saved record read it flat,
    key for key, and a flat record validates back into the parts."""
    from pydantic import BaseModel

    from gradekit.graders.runs import _pairwise, _record

    models = [m for module in (_record, _pairwise) for m in vars(module).values()
              if isinstance(m, type) and issubclass(m, BaseModel) and m.__module__ == module.__name__]
    assert {"RunSummary", "RunResults", "RunStats", "Money", "PairwiseRunSummary", "PairwiseResults"} <= {m.__name__ for m in models}
    assert not [(m.__name__, len(m.model_fields)) for m in models if len(m.model_fields) > 15]
    s = RunSummary()
    s.results.rows, s.stats.money.cost_usd, s.stats.judge_calls_saved = 3, 0.5, 2
    flat = s.model_dump(mode="json")
    assert list(flat) == [key for key, _ in RunSummary.FLAT if key != "canary"] and flat["cost_usd"] == 0.5
    assert RunSummary.model_validate(flat) == s
