"""Grading on a Ray cluster: one provider limit for all actors, the runner's overhead, the limiter actor's cost.

A local two-node cluster (ray.cluster_utils.Cluster: a head and a second node, one CPU each, no
dashboard) on this machine; the fake provider enforces its limit server-side (token bucket,
429 + Retry-After) and counts what arrives on its own clock.

    python benchmarks/ray_scale.py                         # all three, the issue's sizes
    python benchmarks/ray_scale.py --only limit --rows 400
    python benchmarks/ray_scale.py --only overhead --grader-rows 200000

(1) limit: 4 actors on 2 nodes, rps 40, against a fake enforcing 40 req/s: the rate the
    provider accepted as a share of its limit and the share of 429s; controls: 4 actors with
    in-process limiters of 40/4 and of 40 each.
(2) overhead: a deterministic grader (string match) over N rows: `--ray` (2 actors) against
    the local streaming runner, as a ratio of wall times.
(3) limiter: permits per second the limiter actor grants to 8 worker actors (16 requests in
    flight each, a limit far above what they can take), batched as shipped and with one permit
    per actor call; and 8 workers against rps 500: the share of the limit they get.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

from gradekit.judge import load_rubric
from gradekit.judge.testing import FakeProvider, RecordedRequest

RUBRIC = "semantic_equivalence_en"


def rows_file(path: Path, n: int) -> Path:
    with path.open("w", encoding="utf-8") as f:
        for i in range(n):
            f.write(json.dumps({"id": i, "question": f"q-{i}", "references": ["x"], "prediction": "y"}) + "\n")
    return path


def accepted_rate(requests: list[RecordedRequest], skip_s: float = 2.0) -> float:
    """Accepted requests per second after the first ``skip_s`` (the fake's bucket starts full: a burst)."""
    ok = sorted(r.time for r in requests if r.status == 200)
    steady = [t for t in ok if t >= ok[0] + skip_s] if ok else []
    return (len(steady) - 1) / (steady[-1] - steady[0]) if len(steady) > 1 else 0.0


def run_limit(rows: int, tmp: Path, rps: float) -> None:
    from gradekit.judge import Judge
    from gradekit.graders.runs._file import rubric_settings
    from gradekit.graders.runs._ray import grade_file_ray, worker_spec

    rubric = load_rubric(RUBRIC)
    mapping = {v: v for v in rubric.variables}
    source = rows_file(tmp / "limit.jsonl", rows)
    print(f"(1) 4 actors on 2 nodes, {rows} rows, a fake enforcing {rps:g} req/s")
    for label, limiter, each in ((f"shared limiter actor, --rps {rps:g}", "ray", rps), (f"control: in-process {rps:g}/4 per actor", None, rps / 4),
                                 (f"control: in-process {rps:g} per actor", None, rps)):
        with FakeProvider(rate_limit_rps=rps) as fake:
            spec = worker_spec(rubric=rubric, model="fake-judge", base_url=fake.base_url, api_key="k", timeout=30, limiter=limiter,
                               limiter_key=f"{fake.base_url}|fake-judge", rps=each, tpm=None, concurrency=8, cache=None, no_cache=True)
            settings = rubric_settings(Judge("fake-judge", base_url=fake.base_url, api_key="k"), rubric, mapping)
            started = time.perf_counter()
            summary = asyncio.run(grade_file_ray(spec, source, tmp / f"limit-{each}-{limiter}.jsonl", mapping, workers=4,
                                                 settings=settings, resume=False))
            wall = time.perf_counter() - started
            sent = fake.chat_requests()
        refused = sum(r.status == 429 for r in sent)
        print(f"    {label:38s} accepted {accepted_rate(sent) / rps:5.3f} of the limit; 429s {refused}/{len(sent)} "
              f"({refused / max(1, len(sent)):.1%}); rows ok {summary.results.ok}/{rows}; {wall:.1f} s")


def run_overhead(rows: int, tmp: Path) -> None:
    from gradekit.graders import load_grader
    from gradekit.graders.runs._file import grade_file_with
    from gradekit.graders.runs._ray import grade_file_ray
    from gradekit.graders.runs._ray_worker import WorkerSpec

    config = tmp / "match.yaml"
    config.write_text('type: string_match\nexpression: "{{references.answer}}"\n', encoding="utf-8")
    source = tmp / "det.jsonl"
    with source.open("w", encoding="utf-8") as f:
        for i in range(rows):
            f.write(json.dumps({"id": i, "response": str(i % 7), "answer": str(i % 5)}) + "\n")
    mapping = {"references.answer": "answer"}
    print(f"(2) a string-match grader over {rows} rows")
    grader = load_grader(config)
    started = time.perf_counter()
    local = asyncio.run(grade_file_with(grader, source, tmp / "det-local.jsonl", mapping, concurrency=18, resume=False))
    local_s = time.perf_counter() - started
    spec = WorkerSpec(grader_config=str(config), limiter=None, no_cache=True, concurrency=16)
    started = time.perf_counter()
    on_ray = asyncio.run(grade_file_ray(spec, source, tmp / "det-ray.jsonl", mapping, workers=2, settings={"bench": 1}, resume=False,
                                        batch=256))
    ray_s = time.perf_counter() - started
    # The fixed cost of a run (actors started, judge/grader imported and built in each): a 1-row run.
    one = tmp / "one.jsonl"
    one.write_text(source.open(encoding="utf-8").readline(), encoding="utf-8")
    started = time.perf_counter()
    asyncio.run(grade_file_ray(spec, one, tmp / "one-out.jsonl", mapping, workers=2, settings={"bench": 1}, resume=False))
    fixed_s = time.perf_counter() - started
    same = (tmp / "det-local.jsonl").read_bytes() == (tmp / "det-ray.jsonl").read_bytes()
    print(f"    local streaming runner {local_s:7.1f} s ({local.rows / local_s:8.0f} rows/s)")
    print(f"    --ray, 2 actors        {ray_s:7.1f} s ({on_ray.rows / ray_s:8.0f} rows/s); ray/local wall {ray_s / local_s:.2f}; "
          f"identical output: {same}")
    marginal = max(1e-9, ray_s - fixed_s)
    print(f"    of which start-up (a 1-row run) {fixed_s:.1f} s; per row after it {rows / marginal:8.0f} rows/s, "
          f"{marginal / local_s:.2f} of the local wall")


class _Taker:
    """A worker actor that takes permits as fast as it can for a while (the benchmark's load)."""

    async def take(self, rps: float, key: str, until: float, inflight: int, lease_s: float) -> list[float]:
        """Permit times (wall clock: every worker is on this machine) from now until ``until``."""
        from gradekit.judge import RayLimiter

        limiter = RayLimiter(rps=rps, key=key, concurrency=inflight, lease_s=lease_s)
        times: list[float] = []

        async def loop() -> None:
            while time.time() < until:
                async with limiter.slot():
                    times.append(time.time())

        await asyncio.gather(*(loop() for _ in range(inflight)))
        return times


def run_limiter(seconds: float) -> None:
    import ray

    from gradekit.judge._ray_limiter import LEASE_S

    taker = ray.remote(num_cpus=0)(_Taker)
    print(f"(3) the limiter actor, 8 worker actors x 16 in flight, {seconds:g} s each")
    workers = [taker.remote() for _ in range(8)]
    for label, rps, lease in (("batched (as shipped), no effective limit", 1e6, LEASE_S),
                              ("one permit per call, no effective limit", 1e6, 1e-9),
                              ("batched, --rps 500", 500.0, LEASE_S)):
        key = f"bench-{label}-{time.time()}"
        ray.get([w.__ray_ready__.remote() for w in workers])
        times = sorted(t for ts in ray.get([w.take.remote(rps, key, time.time() + seconds, 16, lease) for w in workers]) for t in ts)
        steady = [t for t in times if t >= times[0] + 1.0]  # after every worker has started and booked its first batch
        granted = (len(steady) - 1) / (steady[-1] - steady[0])
        share = f"; {granted / rps:.3f} of the limit" if rps < 1e5 else ""
        print(f"    {label:42s} {granted:8.0f} permits/s{share}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("limit", "overhead", "limiter"))
    parser.add_argument("--rows", type=int, default=600, help="rows for (1): 600 at 40 req/s is 15 s per scenario")
    parser.add_argument("--rps", type=float, default=40.0, help="the provider's limit in (1)")
    parser.add_argument("--grader-rows", type=int, default=1_000_000, help="rows for (2)")
    parser.add_argument("--seconds", type=float, default=5.0, help="load time per scenario of (3)")
    args = parser.parse_args()

    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, namespace="gradekit", log_to_driver=False)
        print(f"cluster: {len([n for n in ray.nodes() if n['Alive']])} nodes, {ray.cluster_resources().get('CPU')} CPUs", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            if args.only in (None, "limit"):
                run_limit(args.rows, Path(tmp), args.rps)
            if args.only in (None, "limiter"):
                run_limiter(args.seconds)
            if args.only in (None, "overhead"):
                run_overhead(args.grader_rows, Path(tmp))
            sys.stdout.flush()
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main()
