"""type: math_equivalence and its engine, against the real math_verify in real checker workers.

The front doors run as subprocesses (`python -m gradekit grade --grader`, `validate`, `serve` over
HTTP); the engine (MathVerifier) is driven from threads, fresh event loops and uvloop. Timeouts are
short (1-2 s) so that the degenerate inputs cost little; nothing here measures time: a check that
ran out of time says so in its outcome.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gradekit.graders import Grade, MathCheck, MathVerifier, Sample, load_grader, math_equivalence_grader
from gradekit.graders.sandbox._checkers import CheckerPool

from ..conftest import serve_in

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "tests" / "data" / "math_verify" / "cases.jsonl"
MATH_YAML = 'type: math_equivalence\nexpression: "{{references.answer}}"\ntimeout: %s\n'


def nested_frac(depth: int) -> str:
    text = "1"
    for _ in range(depth):
        text = r"\frac{1}{1+" + text + "}"
    return text


def gradekit(*args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gradekit", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def rows_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="module")
def verifier():
    with MathVerifier(timeout=2, workers=2) as v:
        yield v


# ---- the public suite, through `gradekit grade --grader` ----------------------------------------


# Where gradekit departs from the library's own expectation, on purpose (tests/data/math_verify/README.md).
DEPARTURES = {
    13: "equal: `Answer $ \\n 9 \\n $` is 9 (a LaTeX-only test the default reading passes)",
    14: "equal: `Answer \\( \\n 9 \\n \\)` is 9, the same",
    191: "invalid_gold: a malformed gold (a doubled backslash, no closing brace) reads only as a fragment: the coverage rule",
    235: "different: 1 + 1/e is not 1 - 1/e; the test pins a library result, not the maths",
}


def test_math_verify_suite_agrees_through_grade(tmp_path: Path) -> None:
    (tmp_path / "math.yaml").write_text(MATH_YAML % 5, encoding="utf-8")
    done = gradekit("grade", str(CASES), "--grader", "math.yaml", "-o", "out.jsonl", "--json", cwd=tmp_path)
    assert done.returncode in (0, 1), done.stderr  # 1: some rows carry no score (the malformed gold)
    summary = json.loads(done.stdout)
    cases, out = rows_of(CASES), rows_of(tmp_path / "out.jsonl")
    assert len(cases) > 100 and len(out) == len(cases) == summary["rows"]
    departed, said = {}, {}
    for case, row in zip(cases, out):
        assert row["id"] == case["id"] and row["parsed"] is not None
        got = {1.0: "equal", -1.0: "different"}.get(row["score"], f"{row['status']}/{row['error_kind']}")
        if got != case["expected"]:
            departed[case["id"]], said[case["id"]] = got, row["error"]
    assert set(departed) == set(DEPARTURES), (departed, said)  # the row's error says what an unexpected departure was
    assert all(DEPARTURES[k].startswith(v.split("/")[-1] if v.startswith("invalid") else v) for k, v in departed.items()), departed


# ---- the four measured defects, and degenerate rows, through a file run ---------------------------


def test_defects_and_degenerate_rows_end_as_named_rows(tmp_path: Path) -> None:
    rows = [
        # (1) an internal timeout is timeout, never wrong: a tower of powers, a ratio of huge factorials
        {"id": "tower", "response": "$9^{9^{9^{9^{9}}}}$", "answer": "1"},
        {"id": "factorials", "response": r"$\frac{1000000!}{999999!}$", "answer": "1000000"},
        # (2) the last \boxed{} counts; parts of one answer stay together
        {"id": "draft", "response": r"First \boxed{3}. Wait, that drops a term; redoing it gives \boxed{5}.", "answer": "5"},
        {"id": "draft_wrong", "response": r"So \boxed{5}. Hmm, no: the answer is \boxed{3}.", "answer": "5"},
        {"id": "parts", "response": r"$x = \boxed{2}$ or $x = \boxed{3}$", "answer": r"$\{2, 3\}$"},
        # (3) look-alikes in plain text: U+2212, fullwidth digits and signs, ×, ÷, a no-break space, superscripts
        {"id": "minus", "response": "The answer is \u22123", "answer": "-3"},
        {"id": "fullwidth", "response": "\uff11\uff12\uff0e\uff15", "answer": "12.5"},
        {"id": "times", "response": "2\u00d73", "answer": "6"},
        {"id": "divide", "response": "7\u00f72", "answer": r"\frac{7}{2}"},
        {"id": "nbsp", "response": "1\u00a0000", "answer": "1000"},
        {"id": "square", "response": "The volume is 2\u00b3", "answer": "8"},
        # (4) nothing a row writes can hang: deep nesting, str() of a 40-deep \frac, 200 KB
        {"id": "frac40", "response": "$" + nested_frac(40) + "$", "answer": "1"},
        {"id": "frac40_gold", "response": "1", "answer": "$" + nested_frac(40) + "$"},
        {"id": "parens", "response": "$" + "(" * 3000 + "1" + ")" * 3000 + "$", "answer": "1"},
        {"id": "huge", "response": "$" + "+".join(["x"] * 70000) + "$", "answer": "1"},
        # a recursion limit the library swallows (it then reads the last "1"): an error, not wrong
        {"id": "deep_sum", "response": "1+" * 1000 + "1", "answer": "1001"},
        # outcomes: an empty response is wrong; a gold that cannot be parsed is invalid; a missing gold too
        {"id": "empty", "response": "", "answer": "1"},
        {"id": "bad_gold", "response": "1", "answer": "???"},
        {"id": "no_gold", "response": "1"},
        {"id": "plain", "response": "so the result is $\\frac{1}{2}$", "answer": "0.5"},
    ]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    (tmp_path / "math.yaml").write_text(MATH_YAML % 2, encoding="utf-8")
    done = gradekit("grade", "rows.jsonl", "--grader", "math.yaml", "-o", "out.jsonl", "--json", cwd=tmp_path)
    assert done.returncode == 1, done.stderr  # some rows carry an error, and every row is written
    out = {row["id"]: row for row in rows_of(tmp_path / "out.jsonl")}
    assert list(out) == [r["id"] for r in rows]  # every row written, in order: the run finished
    for name in ("tower", "factorials", "frac40", "frac40_gold", "parens", "huge"):
        assert (out[name]["status"], out[name]["error_kind"], out[name]["score"]) == ("error", "timeout", None), out[name]
        assert "timed out" in out[name]["error"]
    for name in ("draft", "parts", "minus", "fullwidth", "times", "divide", "nbsp", "square", "plain"):
        assert (out[name]["status"], out[name]["score"]) == ("ok", 1.0), out[name]
    assert json.loads(out["draft"]["parsed"]) == {"gold": "5", "answer": "5", "kind": "number"}
    assert out["draft_wrong"]["score"] == -1.0 and json.loads(out["draft_wrong"]["parsed"])["answer"] == "3"
    assert (out["deep_sum"]["status"], out["deep_sum"]["error_kind"]) == ("error", "verifier_error")
    assert "recursion limit" in out["deep_sum"]["error"]
    assert (out["empty"]["status"], out["empty"]["score"]) == ("ok", -1.0)
    assert (out["bad_gold"]["status"], out["bad_gold"]["error_kind"]) == ("invalid", "invalid_gold")
    assert (out["no_gold"]["status"], out["no_gold"]["error_kind"]) == ("invalid", "input")
    summary = json.loads(done.stdout)
    assert summary["errors_by_kind"]["timeout"] == 6 and summary["rows"] == len(rows)


def test_references_object_and_top_level_columns_for_every_grader(tmp_path: Path) -> None:
    """``{"response", "references": {"answer"}}`` reads references.answer, for string_match as for math."""
    rows = [{"response": "5", "references": {"answer": "5"}, "answer": "4"}, {"response": "4", "answer": "4"}]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (tmp_path / "exact.yaml").write_text('type: string_match\nexpression: "{{references.answer}}"\n', encoding="utf-8")
    done = gradekit("grade", "rows.jsonl", "--grader", "exact.yaml", "-o", "out.jsonl", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert [r["score"] for r in rows_of(tmp_path / "out.jsonl")] == [1.0, 1.0]


# ---- validate and serve ---------------------------------------------------------------------------


def test_validate_shows_the_reward_the_parse_and_a_timeout(tmp_path: Path) -> None:
    (tmp_path / "math.yaml").write_text(MATH_YAML % 1, encoding="utf-8")
    (tmp_path / "example.json").write_text(json.dumps({"references": {"answer": "-3"}}), encoding="utf-8")
    (tmp_path / "good.txt").write_text("A first try gave \\boxed{3}. Then, correcting the sign: \\boxed{\u22123}", encoding="utf-8")
    (tmp_path / "slow.txt").write_text("$9^{9^{9^{9^{9}}}}$", encoding="utf-8")
    done = gradekit("validate", "--grader", "math.yaml", "--example", "example.json", "--response", "good.txt", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert shown["reward"] == 1 and "gold '-3', answer '-3'" in json.dumps(shown)
    done = gradekit("validate", "--grader", "math.yaml", "--example", "example.json", "--response", "slow.txt", "--json", cwd=tmp_path)
    assert done.returncode == 1
    shown = json.loads(done.stdout)
    assert shown["status"] == "error" and shown["error_kind"] == "timeout", shown


def test_serve_grades_math_over_http(tmp_path: Path) -> None:
    (tmp_path / "math.yaml").write_text(MATH_YAML % 1, encoding="utf-8")
    (tmp_path / "config.yaml").write_text("reward:\n  grader: math.yaml\n", encoding="utf-8")
    proc, url = serve_in(tmp_path)
    try:

        def post(body: dict) -> tuple[int, dict]:
            request = urllib.request.Request(url + "/compute_reward", data=json.dumps(body).encode(),
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=60) as reply:
                    return reply.status, json.loads(reply.read())
            except urllib.error.HTTPError as e:
                return e.code, json.loads(e.read())

        status, body = post({"response": "so \\boxed{\\frac{1}{2}}", "extra_params": {"answer": "0.5"}})
        assert (status, body["status"], body["score"]) == (200, "success", 1.0)
        status, body = post({"response": "\\boxed{3}", "extra_params": {"answer": "0.5"}})
        assert (status, body["score"]) == (200, -1.0)
        status, body = post({"response": "$9^{9^{9^{9^{9}}}}$", "extra_params": {"answer": "1"}})
        assert body["status"] != "success" and "timed out" in json.dumps(body), body
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


# ---- the engine from threads, fresh loops, uvloop; dedup; a killed worker --------------------------


def test_checks_from_threads_fresh_loops_and_uvloop(verifier: MathVerifier) -> None:
    pairs = [(str(n), f"\\boxed{{{n}}}") for n in range(12)] + [("2", "\\boxed{3}")]

    def in_thread(pair: tuple[str, str]) -> MathCheck:
        return verifier.check_sync(*pair)

    with ThreadPoolExecutor(6) as pool:
        threaded = list(pool.map(in_thread, pairs))
    fresh = [asyncio.run(verifier.check(*pair)) for pair in pairs[:4]]  # a new event loop for each call, as SyncGrader does
    import uvloop

    under_uvloop = uvloop.run(verifier.check_many(pairs))
    for results in (threaded, under_uvloop):
        assert [c.outcome for c in results] == ["equal"] * 12 + ["different"]
    assert [c.outcome for c in fresh] == ["equal"] * 4
    # No signal handler was installed in this process by any of it.
    assert signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None)


def test_the_same_pair_is_checked_once(tmp_path: Path) -> None:
    with MathVerifier(timeout=2, workers=2) as v:
        pairs = [("$\\frac{1}{3}$", "0.333333")] * 20 + [("7", "7.0")] * 5
        results = asyncio.run(v.check_many(pairs))
        assert {c.outcome for c in results} == {"equal"}
        stats = v.stats()
        assert stats["requests"] == 25 and stats["checks"] == 2 and stats["joined"] + stats["cache_hits"] == 23
        assert v.check_sync("7", "7.0").equal and v.stats()["checks"] == 2


def test_a_worker_killed_mid_check_is_an_error_and_the_next_check_works() -> None:
    with MathVerifier(timeout=30, workers=1) as v:
        assert v.check_sync("1", "1").equal
        pid = v.worker_pids[0]
        pending = v.submit("1", "$9^{9^{9^{9^{9}}}}$")  # runs until its 30 s alarm
        os.kill(pid, signal.SIGKILL)
        check = pending.result(timeout=60)
        assert (check.outcome, check.error_kind) == ("error", "verifier_error") and "died" in check.detail
        assert v.check_sync("2", "\\boxed{2}").equal
        assert v.worker_pids and v.worker_pids[0] != pid
        # A death says nothing about the pair: it is not remembered, a second ask checks it again.
        before = v.stats()["checks"]
        v.submit("1", "$9^{9^{9^{9^{9}}}}$")
        assert v.stats()["checks"] == before + 1 and v.stats()["cache_hits"] == 0


STUCK_WORKER = r'''
import json, os, sys, time
out = os.fdopen(os.dup(1), "wb", buffering=0)
def send(reply):
    out.write((json.dumps(reply) + "\n").encode())
token = os.urandom(8).hex()  # which process answered (every worker is pid 1 of its own namespace)
send({"ready": True})
for line in sys.stdin.buffer:
    request = json.loads(line)
    if request["response"] == "stuck":
        while True:  # no alarm, no handler: only the host's deadline ends this
            time.sleep(3600)
    send({"id": request["id"], "outcome": "equal", "detail": token})
'''


def test_the_host_kills_a_stuck_worker_and_resends_what_was_queued_behind_it() -> None:
    pool = CheckerPool(name="stub checker", workers=1, memory_mb=None, sandbox="auto", packages=(), source=STUCK_WORKER, margin=0.2)
    try:
        first = pool.submit({"gold": "1", "response": "ok"}, 5).result(timeout=60)
        stuck = pool.submit({"gold": "1", "response": "stuck"}, 0.5)
        behind = [pool.submit({"gold": "1", "response": f"ok {i}"}, 5) for i in range(3)]
        reply = stuck.result(timeout=60)
        assert (reply["outcome"], reply["error_kind"]) == ("error", "timeout") and "killed and replaced" in reply["detail"]
        after = [f.result(timeout=60) for f in behind]
        assert [r["outcome"] for r in after] == ["equal"] * 3
        assert {r["detail"] for r in after} != {first["detail"]}  # answered by the new worker
        assert pool.counts["killed"] == 1 and pool.counts["resent"] >= 1 and pool.counts["spawned"] == 2
    finally:
        pool.close()


LOADS_ON_THE_THIRD_TRY = r'''
import json, os, sys
out = os.fdopen(os.dup(1), "wb", buffering=0)
tries = len(os.listdir("."))  # the pool's scratch folder (the worker's working directory) counts the starts
open(f"start-{tries}", "w").close()
if tries < 2:
    os._exit(9)  # dies while loading, before its ready line
out.write(b'{"ready": true}\n')
for line in sys.stdin.buffer:
    request = json.loads(line)
    out.write((json.dumps({"id": request["id"], "outcome": "equal", "detail": str(tries)}) + "\n").encode())
'''

NEVER_LOADS = r'''
import os
os._exit(9)
'''


def test_a_worker_that_dies_while_loading_hands_every_request_to_the_next() -> None:
    """No request reached a worker that never loaded: the head request is re-sent too, not failed."""
    # no sandbox: its private /tmp would forget the starts the source counts in its working directory
    pool = CheckerPool(name="stub checker", workers=1, memory_mb=None, sandbox="none", packages=(), source=LOADS_ON_THE_THIRD_TRY)
    try:
        futures = [pool.submit({"gold": "1", "response": f"ok {i}"}, 5) for i in range(3)]
        replies = [f.result(timeout=60) for f in futures]
        assert [(r["outcome"], r["detail"]) for r in replies] == [("equal", "2")] * 3, replies
        assert pool.counts["died"] == 2 and pool.counts["spawned"] == 3 and pool.load_error is None
    finally:
        pool.close()


def test_a_checker_that_never_loads_fails_its_requests_and_refuses_the_next() -> None:
    """When the pool gives up, the worker still loading in the other place is stopped, not left to die later.

    Left running, it died a moment after the replies and counted a seventh death: the count raced the test.
    """
    pool = CheckerPool(name="stub checker", workers=2, memory_mb=None, sandbox="auto", packages=(), source=NEVER_LOADS)
    try:
        replies = [f.result(timeout=60) for f in [pool.submit({"gold": "1", "response": "x"}, 5) for _ in range(3)]]
        assert all((r["outcome"], r["error_kind"]) == ("error", "verifier_error") and "died while loading" in r["detail"]
                   for r in replies), replies
        assert pool.counts["died"] == 6  # three tries per worker place, then the pool gives up
        assert pool.counts["spawned"] == pool.counts["died"] + pool.counts["stopped"], pool.counts  # none left running
        spawned = pool.counts["spawned"]
        late = pool.submit({"gold": "1", "response": "x"}, 5).result(timeout=60)
        assert late["error_kind"] == "verifier_error" and "died while loading" in late["detail"]
        assert pool.counts["spawned"] == spawned  # refused without a new start
    finally:
        pool.close()


# ---- the grader's seam and config errors -----------------------------------------------------------


async def test_the_grade_carries_its_check() -> None:
    grader = math_equivalence_grader(timeout=2, workers=1)
    try:
        grade = await grader(Sample(response="\\boxed{4}", references={"answer": "5"}))
        assert grade.score == -1.0
        check = grader.check_of(grade)
        assert check is not None and check.outcome == "different" and (check.gold_parsed, check.answer_parsed) == ("5", "4")
        assert grader.check_of(Grade.scored(1.0)) is None
    finally:
        await grader.aclose()


@pytest.mark.parametrize("config, message", [
    pytest.param({"type": "math_equivalence"}, "expression", id="no_expression"),
    pytest.param({"type": "math_equivalence", "expression": "{{references.answer}}", "parse": "words"}, "parse", id="bad_parse"),
    pytest.param({"type": "math_equivalence", "expression": "x", "timeout": 0}, "timeout", id="zero_timeout"),
    pytest.param({"type": "math_equivalence", "expression": "x", "tmeout": 3}, "tmeout", id="typo"),
])
def test_config_mistakes_name_the_field(config: dict, message: str) -> None:
    from gradekit.graders import GraderConfigError

    with pytest.raises(GraderConfigError, match=message):
        load_grader(config)


def test_a_check_from_another_thread_while_a_loop_runs(verifier: MathVerifier) -> None:
    """check_sync inside a running loop's thread would block it; from a worker thread it is fine."""
    results: list[MathCheck] = []

    async def main() -> None:
        await asyncio.get_running_loop().run_in_executor(None, lambda: results.append(verifier.check_sync("3", "3")))

    asyncio.run(main())
    thread = threading.Thread(target=lambda: results.append(verifier.check_sync("4", "\\boxed{4}")))
    thread.start()
    thread.join()
    assert [c.outcome for c in results] == ["equal", "equal"]


# ---- in-process platform adapters: a check that cannot finish is never a reward of 0 -----------------


def test_verl_and_trl_adapters_never_turn_a_timeout_into_a_score() -> None:
    from gradekit.graders import GradingError, trl_reward_func, verl_compute_score

    config = {"type": "math_equivalence", "expression": "{{references.answer}}", "timeout": 1, "workers": 1}
    reward = verl_compute_score(config)
    try:
        assert reward(data_source="math", solution_str="so \\boxed{\\frac{1}{2}}", ground_truth="0.5")["score"] == 1.0
        assert reward(data_source="math", solution_str="\\boxed{3}", ground_truth="0.5")["score"] == -1.0
        with pytest.raises(GradingError, match="timed out"):
            reward(data_source="math", solution_str="$9^{9^{9^{9^{9}}}}$", ground_truth="1")
    finally:
        reward.close()
    skip = trl_reward_func(config, on_error=None, sync=True)
    assert skip(prompts=["q", "q"], completions=["\\boxed{2}", "$9^{9^{9^{9^{9}}}}$"], answer=["2", "1"]) == [1.0, None]
