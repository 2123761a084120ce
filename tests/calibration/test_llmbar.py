"""LLMBar reproduced from the recorded GPT-4 / ChatGPT completions: re-scored file by file, and replayed end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gradekit.graders.cli import app
from gradekit.graders.calibration._llmbar import (
    LLMBarRun,
    comparison_spec,
    llmbar_root,
    grading_rows,
    list_runs,
    llmbar_published,
    published_statistics,
    replay_grade,
    replay_responder,
    rescore_llmbar,
    resolve_run,
    upstream_statistics,
)
from gradekit.graders.calibration import grade_pairwise_file
from gradekit.judge import Judge, JudgeCache, Limiter, ParseFailure, Rubric, load_rubric, parse_reply
from gradekit.judge.testing import FakeProvider

REPO = Path(__file__).resolve().parents[2]
RUNS = list_runs(REPO / "eval_sets" / "llmbar")
NATURAL_GPT4 = LLMBarRun("LLMBar__Natural", "GPT-4", "Vanilla_NoRules")


def test_the_shipped_copy_has_147_recorded_runs() -> None:
    assert len(RUNS) == 147
    assert {r.judge for r in RUNS} == {"GPT-4", "ChatGPT"} and len({r.subset for r in RUNS}) == 8


@pytest.mark.parametrize("run", RUNS, ids=[f"{r.subset}/{r.judge}/{r.strategy}" for r in RUNS])
def test_rescoring_raw_completions_reproduces_the_published_statistics(run: LLMBarRun) -> None:
    rescored = rescore_llmbar(run, REPO / "eval_sets" / "llmbar")
    published = published_statistics(run, REPO / "eval_sets" / "llmbar")
    mine = upstream_statistics(rescored.report)
    assert mine == {k: published[k] for k in mine}  # the strings, byte for byte
    assert rescored.differs_from_recorded == 0  # and every row's winners, not only the totals


# Upstream reads a reply with its regexes in order, "1" first, anywhere in the text; "." matches no newline.
COT = {"1": "Output \\(a\\) is better.", "2": "Output \\(b\\) is better."}
LINE = {"1": "(?:^|\\n) ?Output \\(a\\)", "2": "(?:^|\\n) ?Output \\(b\\)"}


@pytest.mark.parametrize(("parsing", "reply", "label"), [
    pytest.param(COT, "Output (b) is better. On reflection, Therefore, Output (a) is better.", "Output (a)", id="first_regex_wins_not_last_match"),
    pytest.param(COT, "Therefore, Output (b) is better. Output (a) is better\n", "Output (b)", id="dot_does_not_match_newline"),
    pytest.param(COT, "Therefore, Output (b) is better!", "Output (b)", id="dot_is_any_character"),
    pytest.param(COT, "Output (a) is good.", None, id="no_match"),
    pytest.param(LINE, "Output (b)\nOutput (a)", "Output (a)", id="line_start_a_anywhere"),
    pytest.param(LINE, "I prefer Output (a)\n Output (b)", "Output (b)", id="only_line_starts_count"),
    pytest.param(LINE, "", None, id="empty_reply"),
])
def test_comparison_spec_reads_replies_as_upstream_does(parsing: dict, reply: str, label: str | None) -> None:
    spec = comparison_spec(parsing)
    if label is None:
        with pytest.raises(ValueError):
            parse_reply(spec, reply, "text")
    else:
        assert parse_reply(spec, reply, "text").label == label


def test_gradekits_own_last_match_rule_would_misread_recorded_replies() -> None:
    # Why comparison_spec exists: the plain spec cannot give the published parse. Upstream takes the first of
    # its regexes that matches; "last match wins" misread replies naming both outputs as better, and the
    # one-verdict rule refuses them (ambiguous_verdict) instead: never a different label, but no label either.
    naive = Rubric.model_validate({"name": "naive", "template": "-", "variables": {}, "labels": {"Output (a)": 1, "Output (b)": -1},
                                   "output": {"mode": "regex", "pattern": r"(?P<label>Output \([ab]\)) is better."}})
    run = LLMBarRun("LLMBar__Natural", "ChatGPT", "Swap_CoT")
    rows = [json.loads(line) for line in (REPO / "eval_sets/llmbar/data/LLMBar__Natural/ChatGPT__Swap_CoT.jsonl").open()]
    exact = comparison_spec(COT)
    differ = refused = 0
    for step in (step for row in rows for step in row["results"]):  # both stages share the CoT regexes
        for order in ("swap = False", "swap = True"):
            text = step[order]["completion"][0]
            try:
                differ += parse_reply(naive, text, "text").label != parse_reply(exact, text, "text").label
            except ParseFailure as failure:
                refused += failure.reason == "ambiguous_verdict"
    assert refused > 0 and differ == 0 and rescore_llmbar(run, REPO / "eval_sets" / "llmbar").differs_from_recorded == 0


def test_data_is_found_from_any_folder_or_a_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the package's own copy, wherever the command runs (the wheel test covers an install)
    from importlib import resources

    assert llmbar_root().resolve() == Path(str(resources.files("gradekit.eval_sets"))).resolve() / "llmbar"
    assert (llmbar_root() / "manifest.json").read_bytes() == (REPO / "eval_sets" / "llmbar" / "manifest.json").read_bytes()
    with pytest.raises(ValueError, match="manifest.json"):
        llmbar_root(tmp_path)
    with pytest.raises(ValueError, match="no LLMBar subset 'Naturel'; subsets are: LLMBar__Adversarial__GPTInst"):
        resolve_run("Naturel", "GPT-4", "Vanilla")
    with pytest.raises(ValueError, match="no recorded run GPT-4/Vanilla_3shot"):
        resolve_run("Natural", "GPT-4", "Vanilla_3shot")


async def test_replay_end_to_end_reproduces_the_published_acc_agr(tmp_path: Path) -> None:
    result = await replay_grade(NATURAL_GPT4, output=tmp_path / "graded.jsonl", root=REPO / "eval_sets" / "llmbar")
    report = result.summary.results.report
    assert result.summary.results.errors == 0 and result.summary.stats.usage.requests == 200
    assert (round(report.acc * 100, 1), round(report.agr * 100, 1)) == llmbar_published(NATURAL_GPT4, REPO / "eval_sets" / "llmbar")
    rows = [json.loads(line) for line in (tmp_path / "graded.jsonl").read_text().splitlines()]
    assert [r["idx"] for r in rows] == list(range(100))
    # The rows hold the replayed judge's own words, mapped back per order.
    recorded = [json.loads(line) for line in (REPO / "eval_sets/llmbar/data/LLMBar__Natural/GPT-4__Vanilla_NoRules.jsonl").open()]
    assert [(r["winner_ab"], r["winner_ba"]) for r in rows] == \
        [(x["results"][-1]["swap = False"]["winner"], x["results"][-1]["swap = True"]["winner"]) for x in recorded]


async def test_replay_matches_on_instance_and_order_not_prompt_bytes(tmp_path: Path) -> None:
    root = REPO / "eval_sets" / "llmbar"
    rows = grading_rows("Natural", root)[:6]
    source = tmp_path / "rows.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    arena = load_rubric("arena_hard_pairwise")  # different wording and delimiters: still the same instances
    with FakeProvider(responder=replay_responder(NATURAL_GPT4, root)) as server:
        async with Judge("gpt-4", base_url=server.base_url, api_key="x", limiter=Limiter()) as judge:
            respond = replay_responder(NATURAL_GPT4, root)
            body = {"messages": [{"role": "user", "content": arena.render(rows[0])[-1]["content"]}]}
            recorded = json.loads((root / "data/LLMBar__Natural/GPT-4__Vanilla_NoRules.jsonl").open().readline())
            assert respond(body).content == recorded["results"][-1]["swap = False"]["completion"][0]
            plain = {"messages": [{"role": "user", "content": f"Task: {rows[0]['instruction']}\nFirst: {rows[0]['output_2']}\n"
                                                            f"Second: {rows[0]['output_1']}"}]}
            assert respond(plain).content == recorded["results"][-1]["swap = True"]["completion"][0]  # no delimiters
            changed = dict(rows[1], output_1=rows[1]["output_1"] + " (edited)")
            verdict = await judge.judge(load_rubric("llmbar_pairwise"), changed)
    assert verdict.status == "error" and verdict.error_kind == "bad_request" and "no recorded completion" in verdict.error


async def test_a_second_run_is_served_from_the_cache_without_requests(tmp_path: Path) -> None:
    root = REPO / "eval_sets" / "llmbar"
    source = tmp_path / "rows.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in grading_rows("Natural", root)[:20]))
    rubric = load_rubric("llmbar_pairwise")
    variables = {v: v for v in rubric.variables}
    cache = JudgeCache(tmp_path / "cache.sqlite3")
    with FakeProvider(responder=replay_responder(NATURAL_GPT4, root)) as server:
        async with Judge("gpt-4", base_url=server.base_url, api_key="x", limiter=Limiter(), cache=cache) as judge:
            first = await grade_pairwise_file(judge, rubric, source, tmp_path / "a.jsonl", variables)
            sent = len(server.chat_requests())
            second = await grade_pairwise_file(judge, rubric, source, tmp_path / "b.jsonl", variables)
        assert len(server.chat_requests()) == sent == 40
    assert (first.stats.cache_hits, second.stats.cache_hits, second.stats.usage.requests) == (0, 40, 0)
    assert (tmp_path / "a.jsonl").read_text() != "" and \
        [json.loads(x)["winner"] for x in (tmp_path / "a.jsonl").open()] == [json.loads(x)["winner"] for x in (tmp_path / "b.jsonl").open()]


def test_llmbar_command_prints_the_published_figures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    result = CliRunner().invoke(app, ["llmbar", "-o", str(tmp_path / "natural.jsonl")])
    assert result.exit_code == 0, result.output
    assert "Acc 93.5 / Agr 97.0" in result.output and "reproduced" in result.output
    other = CliRunner().invoke(app, ["llmbar", "--subset", "MT-Bench", "--judge", "ChatGPT", "--json"])
    payload = json.loads(other.output)
    report = payload["summary"]["report"]
    assert report["acc"] * 100 == pytest.approx(payload["published_acc"]) == 71.25  # MT-Bench, human labels
    assert report["agr"] * 100 == pytest.approx(payload["published_agr"]) == pytest.approx(57.5)
    cot = CliRunner().invoke(app, ["llmbar", "--strategy", "CoT"])
    assert cot.exit_code == 2 and "do not answer a verdict-only pairwise rubric" in cot.output


def test_demo_command_runs_as_a_real_process_from_the_repository_root() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "GRADEKIT_"))}
    done = subprocess.run([sys.executable, "-c", "from gradekit.graders.cli import main; main()", "llmbar"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Acc 93.5 / Agr 97.0" in done.stdout


@pytest.mark.parametrize("run", [
    LLMBarRun("Processed__LLMEval2", "GPT-4", "Vanilla_NoRules"),  # content-filtered replies: refusals, counted wrong
    LLMBarRun("LLMBar__Adversarial__Neighbor", "ChatGPT", "Metrics_Reference"),
], ids=lambda r: f"{r.subset}/{r.judge}/{r.strategy}")
async def test_other_replays_reproduce_their_published_figures_too(run: LLMBarRun) -> None:
    root = REPO / "eval_sets" / "llmbar"
    result = await replay_grade(run, root=root)
    report = result.summary.results.report
    assert report.acc * 100 == pytest.approx(result.published_acc) and report.agr * 100 == pytest.approx(result.published_agr)
    recorded = rescore_llmbar(run, root)
    assert report.failures_ab + report.failures_ba == recorded.report.failures_ab + recorded.report.failures_ba
    assert set(result.summary.results.errors_by_kind) <= {"refusal"}
