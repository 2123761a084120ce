"""What the sandbox costs: per-call overhead of the python grader, and code_tests throughput.

    python benchmarks/sandbox.py                    # 300 calls per setup, 1,000 programs x 5 cases
    python benchmarks/sandbox.py --calls 100 --programs 200

Per-call overhead (one worker, a trivial ``evaluate``; median wall time per call, sequential):
(a) the sandbox: bubblewrap around a zygote, each call a fork (``sandbox: auto`` with bwrap),
    calls back to back; (a') the same with ``--gap-ms`` between calls (the work a zygote does
    after answering, the reap, the wipe and the next fork, is then off the caller's clock)
(a'') ``sandbox: auto`` on a machine without bubblewrap (a PATH without ``bwrap``): as root, the
    zygote as nobody in new pid, net, ipc, uts and mount namespaces (util-linux); not root, rlimits
(b) the same zygote without bubblewrap (``sandbox: none``: rlimits and the fork per call)
(c) today's design before the sandbox: one reused worker fed JSON lines (the baseline)
(d) a fresh ``python -I -S`` per call
(e) the floor of any fork per call: a bare ``os.fork()`` of a ``python -I -S`` process, one pipe
    round trip to the child and its exit and reap, no sandbox, no JSON, no thread hop
Ratios are against (c), and (a) is also given against (e), all run in the same script, since
this shared machine's absolute numbers drift. code_tests: 1,000 programs (70% right, 20% wrong
answer, 10% syntax error) x 5 stdin/stdout cases on as many workers as CPUs; programs/s and
cases/s (``--programs 0`` skips it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

from gradekit.graders._code_tests import code_tests_grader
from gradekit.graders._python import python_grader
from gradekit.graders._sample import Sample
from gradekit.graders.sandbox import SandboxWarning

EVALUATE = "def evaluate(example, response):\n    return 1.0\n"
SAMPLE = Sample(messages="q", response="x", references={"answer": "a"})
# The loop the python grader ran before the sandbox: a reused child, a JSON line in, a JSON line out.
REUSED = """
import json, sys
ns = {}
exec(sys.argv[1], ns)
fn = ns["evaluate"]
out = sys.stdout
for line in sys.stdin:
    msg = json.loads(line)
    out.write(json.dumps({"ok": True, "value": float(fn(*msg["args"]))}) + "\\n")
    out.flush()
"""
FRESH = """
import json, sys
ns = {}
exec(sys.argv[1], ns)
msg = json.loads(sys.stdin.read())
print(json.dumps({"ok": True, "value": float(ns["evaluate"](*msg["args"]))}))
"""


@contextlib.contextmanager
def without_bwrap() -> Iterator[None]:
    """PATH holds every program of the system's bin folders but ``bwrap``: auto runs as without it."""
    saved = os.environ["PATH"]
    with tempfile.TemporaryDirectory(prefix="gradekit-no-bwrap-") as folder:
        for bin_dir in ("/usr/local/bin", "/usr/bin", "/usr/sbin"):
            for program in sorted(Path(bin_dir).glob("*")) if Path(bin_dir).is_dir() else []:
                if program.name != "bwrap" and not Path(folder, program.name).exists():
                    Path(folder, program.name).symlink_to(program)
        os.environ["PATH"] = folder
        try:
            yield
        finally:
            os.environ["PATH"] = saved


def median_ms(times: list[float]) -> float:
    return statistics.median(times) * 1000


async def grader_calls(sandbox: str, calls: int, gap: float = 0.0) -> tuple[float, str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SandboxWarning)
        grader = python_grader(EVALUATE, workers=1, sandbox=sandbox)  # type: ignore[arg-type]
    try:
        first = await grader(SAMPLE)
        assert first.score == 1.0, first
        times = []
        for _ in range(calls):
            started = time.perf_counter()
            grade = await grader(SAMPLE)
            times.append(time.perf_counter() - started)
            assert grade.score == 1.0, grade
            if gap:
                await asyncio.sleep(gap)
    finally:
        grader.close()
    return median_ms(times), grader.isolation.kind


def _zygote_pid(pid: int) -> int:
    """The zygote: the first python process under the worker (bubblewrap's own come first)."""
    while not Path(f"/proc/{pid}/comm").read_text().startswith("python"):
        pid = int(Path(f"/proc/{pid}/task/{pid}/children").read_text().split()[0])
    return pid


def _cpu_and_faults(pid: int) -> tuple[float, int, float, int]:
    """(CPU s, minor faults) of a process itself and of its reaped children, from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return ((int(fields[11]) + int(fields[12])) / tick, int(fields[7]),
            (int(fields[13]) + int(fields[14])) / tick, int(fields[8]))


async def cost_per_call(sandbox: str, calls: int) -> tuple[float, float, float, float]:
    """Where a call's CPU goes: the zygote's own CPU and page faults, and its calls' children's
    (reaped, so counted in the zygote's cutime/cminflt), per call."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SandboxWarning)
        grader = python_grader(EVALUATE, workers=1, sandbox=sandbox)  # type: ignore[arg-type]
    try:
        await grader(SAMPLE)
        pid = _zygote_pid(grader.worker_pids[0])
        before = _cpu_and_faults(pid)
        for _ in range(calls):
            await grader(SAMPLE)
        after = _cpu_and_faults(pid)
    finally:
        grader.close()
    own_cpu, own_faults, child_cpu, child_faults = (b - a for a, b in zip(before, after))
    return own_cpu / calls * 1000, own_faults / calls, child_cpu / calls * 1000, child_faults / calls


def reused_worker(calls: int) -> float:
    proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", REUSED, EVALUATE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    message = json.dumps({"op": "call", "args": [{"references": {"answer": "a"}}, {"parts": [{"text": "x"}]}]}) + "\n"
    times = []
    loop = asyncio.new_event_loop()
    try:
        for _ in range(calls + 1):
            started = time.perf_counter()
            # through a thread, as the grader does it, so the comparison is like for like
            loop.run_until_complete(loop.run_in_executor(None, _round_trip, proc, message))
            times.append(time.perf_counter() - started)
    finally:
        loop.close()
        proc.stdin.close()
        proc.wait()
    return median_ms(times[1:])


def _round_trip(proc: subprocess.Popen, message: str) -> None:
    proc.stdin.write(message)  # type: ignore[union-attr]
    proc.stdin.flush()  # type: ignore[union-attr]
    assert json.loads(proc.stdout.readline())["value"] == 1.0  # type: ignore[union-attr]


BARE_FORK = """
import os, statistics, sys, time
times = []
for _ in range(int(sys.argv[1]) + 1):
    request_r, request_w = os.pipe()
    reply_r, reply_w = os.pipe()
    started = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        os.close(request_w)
        os.read(request_r, 16)
        os.write(reply_w, b"1")
        os._exit(0)
    os.close(request_r)
    os.close(reply_w)
    os.write(request_w, b"go")
    os.read(reply_r, 1)
    os.waitpid(pid, 0)
    times.append(time.perf_counter() - started)
    os.close(request_w)
    os.close(reply_r)
print(statistics.median(times[1:]) * 1000)
"""


def bare_fork(calls: int) -> float:
    """(e): fork, one byte each way and exit, timed inside a bare interpreter (the floor)."""
    done = subprocess.run([sys.executable, "-I", "-S", "-c", BARE_FORK, str(calls)], capture_output=True, text=True, check=True)
    return float(done.stdout)


def fresh_process(calls: int) -> float:
    message = json.dumps({"args": [{"references": {"answer": "a"}}, {"parts": [{"text": "x"}]}]})
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-I", "-S", "-c", FRESH, EVALUATE], input=message, capture_output=True, text=True)
        times.append(time.perf_counter() - started)
        assert json.loads(done.stdout)["value"] == 1.0
    return median_ms(times)


def program(i: int) -> tuple[str, float]:
    """A program and the reward it should get on the five cases."""
    if i % 10 == 9:
        return "a, b = map(int, input().split(\n", -1.0
    if i % 10 >= 7:
        return "a, b = map(int, input().split())\nprint(a - b)\n", 2 * (1 / 5) - 1  # right only when b == 0
    return "```python\nimport sys\na, b = map(int, sys.stdin.readline().split())\nprint(a + b)\n```", 1.0


async def code_tests_throughput(programs: int, workers: int) -> tuple[float, float, int]:
    cases = [{"input": f"{a} {b}\n", "output": f"{a + b}\n"} for a, b in ((1, 2), (3, 4), (10, 0), (7, 8), (100, 23))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SandboxWarning)
        grader = code_tests_grader(workers=workers, timeout=5)
    wrong = 0
    try:
        # one warm-up per worker, as a training run's first batch would have
        await asyncio.gather(*(grader(Sample(messages="q", response=program(0)[0], references={"tests": cases})) for _ in range(workers)))
        started = time.perf_counter()
        semaphore = asyncio.Semaphore(workers * 2)

        async def one(i: int) -> None:
            nonlocal wrong
            code, expected = program(i)
            async with semaphore:
                grade = await grader(Sample(messages="q", response=code, references={"tests": cases}))
            if grade.score is None or abs(grade.score - expected) > 1e-9:
                wrong += 1

        await asyncio.gather(*(one(i) for i in range(programs)))
        elapsed = time.perf_counter() - started
    finally:
        grader.close()
    return programs / elapsed, programs * len(cases) / elapsed, wrong


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--fresh-calls", type=int, default=60, help="calls for (d), which is slow")
    parser.add_argument("--gap-ms", type=float, default=10.0,
                        help="(a'): the sandbox again with this pause between calls, as a training run's reward calls come")
    parser.add_argument("--programs", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()

    sandboxed, kind = asyncio.run(grader_calls("auto", args.calls))
    spaced, _ = asyncio.run(grader_calls("auto", max(1, args.calls // 3), args.gap_ms / 1000))
    with without_bwrap():
        unbwrapped, unbwrapped_kind = asyncio.run(grader_calls("auto", args.calls))
    plain, _ = asyncio.run(grader_calls("none", args.calls))
    reused = reused_worker(args.calls)
    fresh = fresh_process(args.fresh_calls)
    bare = bare_fork(args.calls)
    print(f"per call, median wall time of {args.calls} sequential calls, ratio to today's reused worker")
    print(f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; a forked call also pays CPython's copy-on-write page")
    print(" faults and an exit, which a reused worker does not, and both grow with the load)")
    rows = [(f"(a) sandbox ({kind}), fork per call", sandboxed),
            (f"(a') the same, calls {args.gap_ms:g} ms apart", spaced),
            (f"(a'') auto without bwrap ({unbwrapped_kind})", unbwrapped), ("(b) sandbox: none, fork per call", plain),
            ("(c) reused worker (before)", reused), (f"(d) fresh python per call ({args.fresh_calls} calls)", fresh),
            ("(e) bare os.fork() + pipe round trip + reap", bare)]
    for label, wall in rows:
        print(f"  {label:44s} {wall:8.2f} ms  x{wall / reused:7.2f}")
    print(f"  a fresh process per call costs x{fresh / sandboxed:.1f} the sandbox's time; "
          f"the sandbox costs x{sandboxed / bare:.2f} a bare fork (x{spaced / bare:.2f} spaced), without bwrap "
          f"x{unbwrapped / bare:.2f}, sandbox: none x{plain / bare:.2f}")
    print("CPU and minor page faults per call (from /proc/<zygote>/stat; the children are the calls' forks):")
    for sandbox, label in (("auto", "auto"), ("auto", "auto, no bwrap"), ("none", "none")):
        with without_bwrap() if label == "auto, no bwrap" else contextlib.nullcontext():
            own_cpu, own_faults, child_cpu, child_faults = asyncio.run(cost_per_call(sandbox, args.calls))
        print(f"  sandbox: {label:13s} zygote {own_cpu:5.2f} ms, {own_faults:4.0f} faults; "
              f"its calls' children {child_cpu:5.2f} ms, {child_faults:4.0f} faults")
    if args.programs <= 0:
        return
    per_s, cases_s, wrong = asyncio.run(code_tests_throughput(args.programs, args.workers))
    print(f"code_tests: {args.programs} programs x 5 cases on {args.workers} workers: {per_s:.0f} programs/s, "
          f"{cases_s:.0f} cases/s, {wrong} rewards different from expected")


if __name__ == "__main__":
    main()
