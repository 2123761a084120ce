"""Drift, seen and caught: every row records who answered it, the summary says when that changed, and a canary
(`grade --canary`) stops a run, or flags its rows, when the served judge's answers change mid-run.

Everything runs against the loopback fake provider over HTTP, through the real `gradekit grade` command."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gradekit.graders.cli import app
from gradekit.graders.runs._drift import LONG_RUN_ROWS, ServedTally, alias_note, is_alias
from gradekit.judge.testing import FakeProvider, Reply

from ..cases import cases
from ..conftest import invoke, reference_judge, serve_in

runner = CliRunner()


def grade(*args: str) -> tuple[int, str]:
    return invoke("grade", *args)


def grade_json(*args: str) -> tuple[int, dict, str]:
    """Exit status, the --json printed on stdout, and stderr."""
    result = runner.invoke(app, ["grade", *args])
    return result.exit_code, json.loads(result.stdout) if result.stdout.strip() else {}, result.stderr


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def write_rows(path: Path, count: int, start: int = 0) -> Path:
    """``count`` rows: the even ones answer with their reference (correct), the odd ones do not (incorrect)."""
    with path.open("w", encoding="utf-8") as f:
        for i in range(start, start + count):
            answer = str(i) if i % 2 == 0 else "no idea"
            f.write(json.dumps({"id": f"r{i}", "question": f"what is number {i}?", "references": [str(i)],
                                "prediction": answer, "label": "correct" if i % 2 == 0 else "incorrect"}) + "\n")
    return path


class Switch:
    """A judge the provider replaces after ``after`` requests: a new served fingerprint, and (``flip``) inverted answers."""

    def __init__(self, after: int, *, flip: bool = True, model: str = "fake-judge-2024-01-01") -> None:
        self.after, self.flip, self.model = after, flip, model
        self.seen = 0
        self._lock = threading.Lock()

    def __call__(self, body: dict) -> Reply:
        with self._lock:
            self.seen += 1
            changed = self.seen > self.after
        reply = reference_judge(body)
        if changed and self.flip and reply.content:
            verdict = json.loads(reply.content)
            verdict["judgement"] = {"correct": "incorrect", "incorrect": "correct"}[verdict["judgement"]]
            reply = Reply(content=json.dumps(verdict))
        return reply.model_copy(update={"model": self.model, "system_fingerprint": "fp_new" if changed else "fp_old"})


# ---- drift, seen ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model, alias", cases("model_aliases"))
def test_alias_names(model: str, alias: bool) -> None:
    assert is_alias(model) is alias


def test_alias_note_only_for_long_runs_and_names_what_was_served() -> None:
    served = [{"model": "gpt-4o-2024-08-06", "system_fingerprint": "fp_1", "rows": 5}]
    assert alias_note("gpt-4o", served, LONG_RUN_ROWS - 1, 1.0) is None  # short
    assert alias_note("gpt-4o-2024-08-06", served, 10 * LONG_RUN_ROWS, 1.0) is None  # pinned
    note = alias_note("gpt-4o", served, LONG_RUN_ROWS, 1.0)
    assert note is not None and "'gpt-4o' is an alias" in note and "gpt-4o-2024-08-06" in note and "\n" not in note
    assert alias_note("gpt-4o", served, 3, 3600.0) is not None  # long in time
    jury = alias_note("jury(gpt-4o-2024-08-06, deepseek-chat)", served, LONG_RUN_ROWS, 1.0)
    assert jury is not None and "'deepseek-chat' is an alias" in jury and "gpt-4o-2024-08-06'" not in jury
    assert alias_note("cascade(gpt-4o-mini-2024-07-18 -> gpt-4o-2024-08-06)", served, LONG_RUN_ROWS, 1.0) is None


def test_served_tally_counts_groups_and_changes_through_a_checkpoint() -> None:
    tally = ServedTally()
    for row, fp in enumerate(["a", "a", None, "b", "b", "a"], start=1):
        tally.add(row, "m" if fp else None, fp)
    again = ServedTally.restore(json.loads(json.dumps(tally.state())))
    again.add(7, "m", "a")
    assert [(g["system_fingerprint"], g["rows"], g["first_row"], g["last_row"]) for g in again.groups] == [
        ("a", 4, 1, 7), ("b", 2, 4, 5)]
    assert [c["row"] for c in again.changes] == [4, 6] and again.change_count == 2
    assert again.changes[0]["was"] == {"model": "m", "system_fingerprint": "a"}


def test_every_row_records_who_answered_and_the_summary_says_when_it_changed(tmp_path: Path) -> None:
    data = write_rows(tmp_path / "rows.jsonl", 12)
    out = tmp_path / "out.jsonl"
    with FakeProvider(responder=Switch(after=5, flip=False)) as fake:
        code, text = grade(str(data), "-r", "semantic_equivalence_en", "-o", str(out), "--base-url", fake.base_url, "--api-key", "k",
                           "--model", "fake-judge", "--concurrency", "1", "--no-cache", "--json")
    assert code == 0, text
    written = rows(out)
    assert [r["served_model"] for r in written] == ["fake-judge-2024-01-01"] * 12
    assert [r["system_fingerprint"] for r in written] == ["fp_old"] * 5 + ["fp_new"] * 7
    summary = json.loads(text)
    assert summary["served"] == [
        {"model": "fake-judge-2024-01-01", "system_fingerprint": "fp_old", "rows": 5, "first_row": 1, "last_row": 5},
        {"model": "fake-judge-2024-01-01", "system_fingerprint": "fp_new", "rows": 7, "first_row": 6, "last_row": 12}]
    assert summary["served_changes"] == [{"row": 6, "model": "fake-judge-2024-01-01", "system_fingerprint": "fp_new",
                                          "was": {"model": "fake-judge-2024-01-01", "system_fingerprint": "fp_old"}}]
    assert summary["served_changes_total"] == 1 and summary["served_note"] is None  # 12 rows is not a long run


def test_a_cached_row_records_who_answered_when_it_was_cached_and_streams_keep_the_fingerprint(tmp_path: Path) -> None:
    data = write_rows(tmp_path / "rows.jsonl", 4)
    cache = tmp_path / "c.sqlite3"
    with FakeProvider(responder=reference_judge, system_fingerprint="fp_then") as fake:
        base = [str(data), "-r", "semantic_equivalence_en", "--base-url", fake.base_url, "--api-key", "k", "--cache", str(cache)]
        assert grade(*base, "-o", str(tmp_path / "a.jsonl"), "--judge-param", "stream=true")[0] == 0
        assert {r["system_fingerprint"] for r in rows(tmp_path / "a.jsonl")} == {"fp_then"}  # read off the stream's chunks
        fake.system_fingerprint = "fp_now"
        assert grade(*base, "-o", str(tmp_path / "b.jsonl"), "--judge-param", "stream=true")[0] == 0
    again = rows(tmp_path / "b.jsonl")
    assert all(r["cached"] for r in again) and {r["system_fingerprint"] for r in again} == {"fp_then"}


def test_view_filters_rows_by_who_answered(tmp_path: Path) -> None:
    pytest.importorskip("duckdb")
    from gradekit.graders.view._results import ResultsFile, ViewError, as_filter
    from gradekit.graders.view import summarise

    data = write_rows(tmp_path / "rows.jsonl", 9)
    out = tmp_path / "out.jsonl"
    with FakeProvider(responder=Switch(after=4, flip=False)) as fake:
        assert grade(str(data), "-r", "semantic_equivalence_en", "-o", str(out), "--base-url", fake.base_url, "--api-key", "k",
                     "--concurrency", "1", "--no-cache")[0] == 0
    results = ResultsFile(out, background=False)
    try:
        newer = results.rows(as_filter({"system_fingerprint": "fp_new"}))
        assert newer.total == 5 and [r["index"] for r in newer.rows] == [4, 5, 6, 7, 8]
        assert results.rows(as_filter({"served_model": "fake-judge-2024-01-01", "system_fingerprint": "fp_old"})).total == 4
        assert summarise(results)["system_fingerprints"] == {"fp_new": 5, "fp_old": 4}
        with pytest.raises(ViewError, match="drift"):
            results.rows(as_filter({"drift": "true"}))  # no run flagged this file: a named error, never a silent "no filter"
    finally:
        results.close()


# ---- a canary ------------------------------------------------------------------------------------------------


class Toggle:
    """A judge the test replaces at will: ``changed`` gives a new fingerprint and inverted answers."""

    def __init__(self) -> None:
        self.changed = False
        self.after: int | None = None  # change by itself after this many requests
        self.seen = 0
        self._lock = threading.Lock()

    def __call__(self, body: dict) -> Reply:
        with self._lock:
            self.seen += 1
            if self.after is not None and self.seen > self.after:
                self.changed = True
            changed = self.changed
        reply = reference_judge(body)
        if changed and reply.content:
            verdict = json.loads(reply.content)
            verdict["judgement"] = {"correct": "incorrect", "incorrect": "correct"}[verdict["judgement"]]
            reply = Reply(content=json.dumps(verdict))
        return reply.model_copy(update={"model": "fake-judge-2024-01-01", "system_fingerprint": "fp_new" if changed else "fp_old"})


@pytest.mark.parametrize("values, rows, seconds", [
    pytest.param(["500"], 500, None, id="rows"),
    pytest.param(["10m"], None, 600.0, id="minutes"),
    pytest.param(["200", "90s"], 200, 90.0, id="whichever_first"),
    pytest.param(["1h"], None, 3600.0, id="hours"),
])
def test_canary_every_reads_rows_and_times(values, rows, seconds) -> None:
    from gradekit.graders.runs._canary import parse_every

    assert parse_every(values) == (rows, seconds)


@pytest.mark.parametrize("bad", ["0", "-5", "ten", "5d", "0s", ""])
def test_canary_every_refuses_what_is_not_a_count_or_a_time(bad) -> None:
    from gradekit.graders.runs._canary import parse_every

    with pytest.raises(ValueError, match="`canary_every`"):  # the library's name; `gradekit grade` says --canary-every
        parse_every([bad])


def test_the_sequential_levels_sum_to_alpha_and_the_exact_test() -> None:
    from gradekit.graders.runs._canary import level, mcnemar_p

    assert sum(level(0.05, k) for k in range(1, 100_000)) == pytest.approx(0.05, rel=1e-4)
    assert mcnemar_p(0, 0) == 1.0 and mcnemar_p(3, 3) == 1.0
    assert mcnemar_p(10, 0) == pytest.approx(2 / 1024) and mcnemar_p(0, 10) == mcnemar_p(10, 0)


def canary_args(fake: FakeProvider, data: Path, out: Path, canary: Path, *more: str) -> list[str]:
    return [str(data), "-r", "semantic_equivalence_en", "-o", str(out), "--base-url", fake.base_url, "--api-key", "k",
            "--concurrency", "2", "--cache", str(out.parent / "cache.sqlite3"), "--canary", str(canary), "--canary-every", "10",
            "--json", *more]


def test_a_judge_that_changes_midway_stops_the_run_at_the_next_canary_check_and_resumes_only_once_it_agrees_again(tmp_path) -> None:
    data = write_rows(tmp_path / "rows.jsonl", 80)
    canary = write_rows(tmp_path / "canary.jsonl", 16, start=1000)
    out = tmp_path / "out.jsonl"
    judge = Toggle()
    judge.after = 16 + 30  # the canary's start, then 30 rows' requests: the provider swaps the judge mid-run
    with FakeProvider(responder=judge) as fake:
        code, stop, err = grade_json(*canary_args(fake, data, out, canary))
        assert code == 3, err
        assert stop["stopped"] == "drift" and stop["error_kind"] == "drift" and "the judge changed" in stop["message"]
        assert "the judge changed" in err and "--on-drift flag" in err
        written = rows(out)
        assert 0 < len(written) < 80
        assert {r["system_fingerprint"] for r in written} == {"fp_old"} and not any(r["drift"] for r in written)
        assert [r["id"] for r in written] == [f"r{i}" for i in range(len(written))]  # in order, nothing after the cut
        drift = stop["summary"]["canary"]["drift"]
        assert drift["agreement_start"] == 1.0 and drift["agreement_now"] == 0.0 and drift["served_now"][0]["system_fingerprint"] == "fp_new"

        again, _, err = grade_json(*canary_args(fake, data, out, canary))  # still the new judge: refused before any row
        assert again == 3 and "the judge changed" in err and rows(out) == written

        judge.after, judge.changed = None, False  # the provider rolls the judge back
        done, summary, err = grade_json(*canary_args(fake, data, out, canary))
    assert done == 0, err
    final = rows(out)
    assert [r["id"] for r in final] == [f"r{i}" for i in range(80)]
    assert {r["system_fingerprint"] for r in final} == {"fp_old"} and not any(r["drift"] for r in final)
    # Rows the new judge answered before the stop are in the cache; after a change none is read from it.
    assert not any(r["cached"] for r in final[len(written):])
    assert summary["canary"]["drift"] is None and summary["rows"] == 80


def test_on_drift_flag_goes_on_and_flags_every_row_after_the_change(tmp_path) -> None:
    data = write_rows(tmp_path / "rows.jsonl", 80)
    canary = write_rows(tmp_path / "canary.jsonl", 16, start=1000)
    out = tmp_path / "out.jsonl"
    judge = Toggle()
    judge.after = 16 + 30
    with FakeProvider(responder=judge) as fake:
        code, summary, err = grade_json(*canary_args(fake, data, out, canary, "--on-drift", "flag"))
    assert code == 0, err
    written = rows(out)
    assert [r["id"] for r in written] == [f"r{i}" for i in range(80)]
    assert all(r["drift"] for r in written if r["system_fingerprint"] == "fp_new")  # every row after the change is flagged
    assert not any(r["drift"] for r in written[:5]) and written[-1]["drift"]
    assert summary["canary"]["drift"]["check"] >= 1 and summary["canary"]["flagged_rows"] == sum(r["drift"] for r in written)
    assert len(summary["served"]) == 2 and summary["served_changes_total"] >= 1


def test_a_judge_that_does_not_change_passes_every_check_and_a_warm_cache_from_another_judge_is_counted(tmp_path) -> None:
    data = write_rows(tmp_path / "rows.jsonl", 40)
    canary = write_rows(tmp_path / "canary.jsonl", 8, start=1000)
    judge = Toggle()
    with FakeProvider(responder=judge) as fake:
        code, text = grade(*canary_args(fake, data, tmp_path / "a.jsonl", canary))
        assert code == 0, text
        first = json.loads(text)["canary"]
        assert first["checks"] >= 4 and first["drift"] is None and first["agreement_start"] == first["agreement_last"] == 1.0
        assert not any(r["drift"] for r in rows(tmp_path / "a.jsonl"))

        judge.changed = True  # a new judge from the start of the next run: no drift within it, but its cache is the old judge's
        code, text = grade(*canary_args(fake, data, tmp_path / "b.jsonl", canary))
    assert code == 0, text
    second = json.loads(text)
    assert second["canary"]["drift"] is None and second["canary"]["cached_other_judge"] == 40
    assert "40 cached rows were served by another" in canary_text_of(second["canary"])


def canary_text_of(block: dict) -> str:
    from gradekit.graders.cli._grade_print import canary_text

    return canary_text(block)


@pytest.mark.parametrize("more, message", [
    pytest.param(["--on-drift", "flag"], "go with --canary", id="on_drift_alone"),
    pytest.param(["--canary-every", "10"], "go with --canary", id="every_alone"),
])
def test_canary_options_without_a_canary_are_refused(tmp_path, more, message) -> None:
    data = write_rows(tmp_path / "rows.jsonl", 2)
    code, text = grade(str(data), "-r", "semantic_equivalence_en", "-o", str(tmp_path / "o.jsonl"), *more)
    assert code == 2 and message in text


def test_a_canary_label_the_rubric_does_not_offer_is_exit_2_before_any_request(tmp_path) -> None:
    data = write_rows(tmp_path / "rows.jsonl", 2)
    canary = tmp_path / "canary.jsonl"
    canary.write_text(json.dumps({"question": "q", "references": ["a"], "prediction": "a", "label": "yes"}) + "\n")
    with FakeProvider(responder=reference_judge) as fake:
        code, text = grade(str(data), "-r", "semantic_equivalence_en", "-o", str(tmp_path / "o.jsonl"), "--base-url", fake.base_url,
                           "--api-key", "k", "--canary", str(canary))
        assert code == 2 and "--canary" in text and "'yes'" in text and not fake.chat_requests()


def test_serve_runs_the_canary_on_a_schedule_and_exposes_it_in_metrics(tmp_path: Path) -> None:
    import time
    import urllib.request

    write_rows(tmp_path / "canary.jsonl", 12, start=1000)
    (tmp_path / "grader.yaml").write_text("type: llm\nrubric: semantic_equivalence_en\njudge: {model: fake-judge}\n", encoding="utf-8")
    (tmp_path / "config.yaml").write_text(
        "reward:\n  grader: grader.yaml\nlogging:\n  enable: false\n"
        "canary:\n  file: canary.jsonl\n  rubric: semantic_equivalence_en\n  every_s: 0.2\n  on_drift: fail\n", encoding="utf-8")
    judge = Toggle()

    def get(url: str) -> str:
        with urllib.request.urlopen(url, timeout=30) as reply:
            return reply.read().decode()

    def reward(url: str) -> dict:
        body = json.dumps({"prompt": "what is number 2?", "response": "2", "extra_params": {"references": ["2"]}})
        request = urllib.request.Request(url + "/compute_reward", data=body.encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as reply:
            return json.loads(reply.read())

    def wait(url: str, line: str) -> str:
        deadline = time.monotonic() + 60  # a safety net against a hang, not a timed assertion
        while line not in (text := get(url + "/metrics")):
            assert time.monotonic() < deadline, f"no {line!r} in /metrics:\n{text}"
            time.sleep(0.05)
        return text

    with FakeProvider(responder=judge) as fake:
        proc, url = serve_in(tmp_path, OPENAI_BASE_URL=fake.base_url, OPENAI_API_KEY="k")
        try:
            wait(url, 'gradekit_canary_agreement{check="start"} 1.0')
            metrics = wait(url, "gradekit_canary_checks_total 2.0")  # checks go on, on the schedule
            assert "gradekit_canary_drift 0.0" in metrics
            assert reward(url)["status"] == "success"

            judge.changed = True  # the provider swaps the judge under the running server
            metrics = wait(url, "gradekit_canary_drift 1.0")
            assert 'gradekit_canary_agreement{check="last"} 0.0' in metrics
            failed = reward(url)
            assert failed["status"] == "fail" and failed["extra_info"]["error_kind"] == "drift"
            stats = json.loads(get(url + "/stats"))["canary"]
            assert stats["drift"]["served_now"] == [{"model": "fake-judge-2024-01-01", "system_fingerprint": "fp_new"}]
        finally:
            proc.terminate()
            _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "canary: the judge changed" in err


async def test_after_the_canary_sees_a_change_no_row_reads_the_old_judges_cached_verdict(tmp_path) -> None:
    """Through the library: rows 0-2 are held at the fake until the canary has seen the change; every later row is in the
    cache (the old judge's verdicts), and none of them is read from it."""
    import asyncio
    import time

    from gradekit.graders.runs import Canary
    from gradekit.graders.runs import grade_file
    from gradekit.judge import Judge, JudgeCache, Limiter, load_rubric

    from ..conftest import Gate

    rubric = load_rubric("semantic_equivalence_en")
    mapping = {v: v for v in rubric.variables}
    data = write_rows(tmp_path / "rows.jsonl", 40)
    warm = tmp_path / "warm.jsonl"
    warm.write_text("".join(data.read_text().splitlines(keepends=True)[3:]), encoding="utf-8")  # every row but 0-2
    canary_rows = [json.loads(line) for line in write_rows(tmp_path / "canary.jsonl", 12, start=1000).read_text().splitlines()]
    judge = Toggle()
    gate = Gate(0, 1, 2, pattern=r"number (\d+)\?", answer=judge)
    with FakeProvider(responder=gate) as fake:
        def build(cache: JudgeCache | None, concurrency: int) -> Judge:
            return Judge("fake-judge", base_url=fake.base_url, api_key="k", cache=cache, limiter=Limiter(concurrency=concurrency))

        # One row in flight: the run keeps concurrency + 2 = 3 rows going, rows 0-2, all held at the fake.
        cached, fresh = build(JudgeCache(tmp_path / "cache.sqlite3"), 1), build(None, 8)
        await grade_file(cached, rubric, warm, tmp_path / "warm.out.jsonl", mapping)
        judge.after = judge.seen + 12  # the start's check meets the old judge; the checks after it, the new one
        canary = Canary([{k: r[k] for k in mapping} for r in canary_rows], [r["label"] for r in canary_rows], rubric, fresh,
                        every_rows=None, every_seconds=0.05, on_drift="flag")
        run = asyncio.ensure_future(grade_file(cached, rubric, data, tmp_path / "out.jsonl", mapping, canary=canary))
        deadline = time.monotonic() + 60  # a safety net against a hang, not a timed assertion
        while canary.drift is None:
            assert time.monotonic() < deadline and not run.done(), "the canary never saw the change"
            await asyncio.sleep(0.01)
        gate.open.set()  # rows 0-2 go on; the rows after them are in the cache, from the old judge
        summary = await run
        await cached.aclose()
        await fresh.aclose()
    written = rows(tmp_path / "out.jsonl")
    assert [r["id"] for r in written] == [f"r{i}" for i in range(40)] and summary.stats.canary["drift"] is not None
    assert not any(r["cached"] for r in written) and all(r["drift"] and r["system_fingerprint"] == "fp_new" for r in written)
