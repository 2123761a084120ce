"""`gradekit grade --ray`, the cluster's limiter actor and grade_dataset, on a real two-node Ray cluster.

Real parts only: a head and a second node started here (ray.cluster_utils.Cluster, one CPU
each, no dashboard, shut down after this module), judge actors in Ray's own worker processes,
`gradekit grade` subprocesses and the FakeProvider over HTTP with its server-side token bucket.
Rate assertions count what the fake saw on its own clock and answered 429; each comes with a
control that must break the same rule. Without Ray the module skips, except in CI (CI set),
where a missing Ray fails it: `.ci/run` installs `gradekit[ray]`.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gradekit.judge import load_rubric
from gradekit.judge.testing import FakeProvider

from ..conftest import Gate

RUBRIC = "semantic_equivalence_en"


def _need_ray() -> None:
    try:
        import ray  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("Ray is missing; CI must install it (pip install 'gradekit[ray]')")
        pytest.skip("Ray is not installed: pip install 'gradekit[ray]'")


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A head node and a second node on this machine, one CPU each; this process is a driver of it."""
    _need_ray()
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, namespace="gradekit", log_to_driver=False)
        yield cluster.address
    finally:
        ray.shutdown()
        cluster.shutdown()


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GRADEKIT_", "OPENAI_", "RAY_"))}
    return {**env, **extra}


def _rows(path: Path, n: int, tag: str = "q") -> Path:
    path.write_text("".join(json.dumps({"id": i, "question": f"{tag}-{i:03d}", "references": ["x"], "prediction": "y"}) + "\n"
                            for i in range(n)), encoding="utf-8")
    return path


def _grade(source: Path, output: Path, base_url: str, *options: str) -> list[str]:
    return [sys.executable, "-m", "gradekit", "grade", str(source), "-r", RUBRIC, "-o", str(output), "--base-url", base_url,
            "--api-key", "k", "--model", "fake-judge", "--json", *options]


def _settings(base_url: str, source: Path) -> dict:
    """The checkpoint settings `gradekit grade -r RUBRIC` computes, for in-process runs."""
    from gradekit.judge import Judge
    from gradekit.graders.runs._file import rubric_settings

    rubric = load_rubric(RUBRIC)
    return rubric_settings(Judge("fake-judge", base_url=base_url, api_key="k"), rubric, {v: v for v in rubric.variables})


def _spec(base_url: str, *, limiter: str = "ray", rps: float | None = None, cache: str | None = None, no_cache: bool = True):
    from gradekit.graders.runs._ray import worker_spec
    from gradekit.judge import JudgeSpec, Limits

    judge = JudgeSpec.of("fake-judge", base_url=base_url, api_key="k", timeout=30,
                         limits=Limits(url=limiter, key=f"{base_url}|fake-judge", rps=rps, concurrency=4))
    return worker_spec(rubric=load_rubric(RUBRIC), judge=judge, cache=cache, no_cache=no_cache)


def _run(spec, source: Path, output: Path, base_url: str, **options):
    from gradekit.graders.runs._ray import grade_file_ray

    rubric = load_rubric(RUBRIC)
    return asyncio.run(grade_file_ray(spec, source, output, {v: v for v in rubric.variables}, settings=_settings(base_url, source),
                                      **options))


def _ids(path: Path) -> list[int]:
    return [json.loads(line)["id"] for line in path.read_text(encoding="utf-8").splitlines()]


# ---- without Ray --------------------------------------------------------------------------

def test_ray_without_ray_installed_exits_2_naming_the_extra(tmp_path: Path) -> None:
    """A `ray` package that fails to import stands for a machine without the extra."""
    shadow = tmp_path / "shadow" / "ray"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError(\"No module named 'ray'\")\n")
    source = _rows(tmp_path / "in.jsonl", 2)
    env = _env(PYTHONPATH=os.pathsep.join([str(tmp_path / "shadow"), os.environ.get("PYTHONPATH", "")]))
    with FakeProvider() as fake:
        done = subprocess.run(_grade(source, tmp_path / "out.jsonl", fake.base_url, "--ray", "auto"), env=env,
                              capture_output=True, text=True, timeout=60)
        assert fake.chat_requests() == []
    assert done.returncode == 2, done.stderr
    assert "gradekit[ray]" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "out.jsonl").exists()


def test_an_address_nothing_listens_at_exits_2_at_once(tmp_path: Path) -> None:
    _need_ray()
    import socket

    from typer.testing import CliRunner

    from gradekit.graders.cli import app

    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    source = _rows(tmp_path / "in.jsonl", 2)
    with FakeProvider() as fake:
        result = CliRunner().invoke(app, ["grade", str(source), "-r", RUBRIC, "-o", str(tmp_path / "o.jsonl"), "--base-url",
                                          fake.base_url, "--api-key", "k", "--ray", f"127.0.0.1:{port}"])
        assert fake.chat_requests() == []
    assert result.exit_code == 2, result.output
    assert f"127.0.0.1:{port}" in result.output and "Traceback" not in result.output


def test_ray_auto_without_a_cluster_says_what_to_do_in_gradekits_words(tmp_path: Path) -> None:
    _need_ray()
    source = _rows(tmp_path / "in.jsonl", 2)
    # RAY_TMPDIR: where `ray start` leaves the address of a running cluster; an empty one, so none is found.
    env = _env(RAY_TMPDIR=str(tmp_path / "ray"), PYTHONPATH=os.environ.get("PYTHONPATH", ""))
    with FakeProvider() as fake:
        done = subprocess.run(_grade(source, tmp_path / "out.jsonl", fake.base_url, "--ray", "auto"), env=env,
                              capture_output=True, text=True, timeout=120)
        assert fake.chat_requests() == []
    assert done.returncode == 2, done.stderr
    assert "ray start --head" in done.stderr and "--ray local" in done.stderr
    assert "--address" not in done.stderr and "Traceback" not in done.stderr


def test_a_ray_local_run_is_priced_as_the_local_run(tmp_path: Path) -> None:
    _need_ray()
    from ..conftest import reference_judge

    source = _rows(tmp_path / "in.jsonl", 3)
    env = _env(PYTHONPATH=os.environ.get("PYTHONPATH", ""))
    with FakeProvider(responder=reference_judge) as fake:
        costs = []
        for name, ray_options in (("local", []), ("ray", ["--ray", "local", "--ray-workers", "1"])):
            command = [sys.executable, "-m", "gradekit", "grade", str(source), "-r", RUBRIC, "-o", str(tmp_path / f"{name}.jsonl"),
                       "--base-url", fake.base_url, "--api-key", "k", "--no-cache", "--json", *ray_options]  # default model: priced
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, done.stderr[-2000:]
            costs.append(json.loads(done.stdout)["cost_usd"])
    assert costs[0] is not None and costs[1] == costs[0]


def _session_processes(session: str) -> list[int]:
    """The processes of one local Ray cluster: those naming its session folder, those the raylet started (they carry
    RAY_RAYLET_PID), and those writing into its logs."""
    pids, raylets = [], set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if session in cmdline and "raylet" in cmdline.split(" ", 1)[0]:
                raylets.add(entry)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            fds = [os.readlink(f"/proc/{entry}/fd/{fd}") for fd in os.listdir(f"/proc/{entry}/fd")]
        except OSError:
            continue
        if session in cmdline or any(f"RAY_RAYLET_PID={r}".encode() in environ for r in raylets) \
                or (cmdline.startswith("ray::") and any(fd.startswith(session) for fd in fds)):
            pids.append(int(entry))
    return pids


def test_a_local_cluster_the_run_started_ends_with_its_driver_killed_by_sigkill(tmp_path: Path) -> None:
    """Issue 48: `grade --ray local` killed with SIGKILL left its cluster's processes running (2 after 60 s)."""
    _need_ray()
    import glob
    import signal

    from ..conftest import Gate

    source = _rows(tmp_path / "in.jsonl", 8)
    gate = Gate(*range(8), pattern=r"q-(\d+)")  # every row held at the judge: the run is mid-way when it is killed
    with FakeProvider(responder=gate) as fake:
        proc = subprocess.Popen(_grade(source, tmp_path / "out.jsonl", fake.base_url, "--ray", "local", "--ray-workers", "1",
                                       "--no-cache"), env=_env(PYTHONPATH=os.environ.get("PYTHONPATH", "")),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 240
            while not fake.chat_requests() and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.2)
            assert fake.chat_requests(), "the run never reached the judge"
            sessions = glob.glob(f"/tmp/ray/session_*_{proc.pid}")
            assert len(sessions) == 1, sessions
            assert _session_processes(sessions[0]), "the cluster's processes were found while it ran"
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            gate.open.set()
            if proc.poll() is None:
                proc.kill()
        left = _session_processes(sessions[0])
        deadline = time.monotonic() + 60
        while left and time.monotonic() < deadline:
            time.sleep(1)
            left = _session_processes(sessions[0])
    for pid in left:  # the test cleans up after a failure, whatever the cause
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    assert not left, f"{len(left)} processes of the killed run's cluster still run"


# ---- the file runner on the cluster -------------------------------------------------------

def test_a_killed_local_run_resumes_on_the_cluster_with_the_same_output_as_a_local_run(cluster: str, tmp_path: Path) -> None:
    """`--ray` is a drop-in: same file, order and summary; resumes what a local run left."""
    from gradekit.graders.runs._file import MARK_EVERY_S

    source = _rows(tmp_path / "in.jsonl", 60)
    with FakeProvider() as fake:
        reference = tmp_path / "reference.jsonl"
        done = subprocess.run(_grade(source, reference, fake.base_url, "--no-cache"), env=_env(), capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
    # Rows from 10 on pass only as this test's loop lets them (automatic replies, as for the reference):
    # the local run cannot finish before it is killed, however slowly this process is scheduled.
    gate = Gate(*range(10, 60), pattern=r"q-(\d+)", answer=lambda body: None)
    with FakeProvider(latency=0.05, responder=gate) as fake:
        output = tmp_path / "out.jsonl"
        cache = str(tmp_path / "cache.sqlite3")
        local = subprocess.Popen(_grade(source, output, fake.base_url, "--concurrency", "2", "--cache", cache), env=_env(),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        checkpoint = output.with_name(output.name + ".checkpoint.json")
        deadline = time.monotonic() + 60  # a safety net only
        while not (checkpoint.exists() and json.loads(checkpoint.read_text() or "{}").get("mark")):
            assert local.poll() is None and time.monotonic() < deadline, local.communicate()
            gate.step(MARK_EVERY_S)  # a finished row writes a checkpoint once MARK_EVERY_S has passed
            time.sleep(0.05)
        local.send_signal(signal.SIGKILL)
        local.communicate()
        gate.open.set()
        done = subprocess.run(_grade(source, output, fake.base_url, "--cache", cache, "--ray", cluster, "--ray-workers", "2",
                                     "--rps", "50"), env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["ray"]["nodes"] == 2 and summary["ray"]["workers"] == 2
    assert summary["ray"]["address"]
    assert 0 < summary["resumed_from"] < 60
    assert summary["rows"] == summary["ok"] == 60
    # Rows judged before the kill but not yet written come back from the cache: only "cached" and the
    # tokens (a cache hit costs none) may differ from the reference.
    ours, theirs = ([json.loads(line) for line in p.read_text(encoding="utf-8").splitlines()] for p in (output, reference))
    assert [list(row) for row in ours] == [list(row) for row in theirs]
    volatile = ("cached", "prompt_tokens", "completion_tokens")
    assert [{k: v for k, v in row.items() if k not in volatile} for row in ours] == \
        [{k: v for k, v in row.items() if k not in volatile} for row in theirs]
    assert _ids(output) == list(range(60))


def _input_folders(root: Path) -> dict[str, Path]:
    """A folder per format, with rows Ray Data's own readers would get wrong (gradekit's parser must read them)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    jsonl = root / "jsonl"
    _rows(jsonl / "a.jsonl", 4, "a") if jsonl.mkdir() is None else None
    (jsonl / "sub").mkdir()
    lines = [json.dumps({"id": 10, "question": "line\u2028separator", "references": ["x"], "prediction": "y"}, ensure_ascii=False),
             "{not json", "", json.dumps({"id": 11, "question": "q", "references": ["x"], "prediction": "y", "extra": {"k": 1}}),
             json.dumps({"id": 12, "references": ["x"], "prediction": "y"})]  # no question: that row's input error
    (jsonl / "sub" / "b.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (jsonl / ".hidden.jsonl").write_text("{}\n")
    csv_folder = root / "csv"
    csv_folder.mkdir()
    (csv_folder / "1.csv").write_text('id,question,references,prediction\n1,"two\nlines",007,7\n2,q,x\n3,q,x,y,extra\n',
                                      encoding="utf-8")
    (csv_folder / "2.csv").write_text("id,question,references,prediction\n4,q," + "x" * (128 * 1024 + 1) + ",y\n5,q,x,y\n",
                                      encoding="utf-8")
    parquet = root / "parquet"
    parquet.mkdir()
    table = pa.table({"id": list(range(9)), "question": [f"q{i}" for i in range(9)], "references": [["x", "y"]] * 9,
                      "prediction": ["y"] * 9, "score": [0.5] * 9})
    pq.write_table(table.slice(0, 5), parquet / "year=2024" / "a.parquet") if (parquet / "year=2024").mkdir() is None else None
    pq.write_table(table.slice(5), parquet / "b.parquet", row_group_size=2)
    many = root / "many"  # more files than read tasks run at once: their order must still be the listing's
    for n in range(40):
        _rows(many / f"part-{n:03d}.jsonl", 3, f"p{n}") if many.mkdir(exist_ok=True) is None else None
    return {"jsonl": jsonl, "csv": csv_folder, "parquet": parquet, "many": many}


def _plain(rows) -> list:
    return [("error", str(row)) if isinstance(row, Exception) else row for row in rows]


def test_ray_data_reads_a_folder_row_for_row_as_the_local_reader(cluster: str, tmp_path: Path) -> None:
    """Bad rows stay error rows, CSV cells stay text, no hive column from year=2024/, and a skip lands where a local one does."""
    from gradekit.graders.runs._io import read_rows
    from gradekit.graders.runs._ray_input import ray_rows

    for kind, folder in _input_folders(tmp_path).items():
        local = _plain(read_rows(folder))
        assert len(local) > 4 and any(isinstance(row, tuple) for row in local) == (kind in ("jsonl", "csv")), kind
        for skip in (0, 1, 4, 5, len(local) - 1, len(local)):
            assert _plain(ray_rows(folder, skip)) == local[skip:], (kind, skip)


def test_a_folder_graded_on_the_cluster_is_byte_for_byte_the_local_output(cluster: str, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from gradekit.graders.cli import app

    folders = _input_folders(tmp_path)
    with FakeProvider() as fake:
        for kind in ("jsonl", "csv"):
            local, remote = tmp_path / f"local-{kind}.jsonl", tmp_path / f"ray-{kind}.jsonl"
            result = CliRunner().invoke(app, ["grade", str(folders[kind]), "-r", RUBRIC, "-o", str(local), "--base-url", fake.base_url,
                                              "--api-key", "k", "--model", "fake-judge", "--no-cache", "--json"], env=_env())
            assert result.exit_code == 1, result.output  # the bad rows are error rows
            summary = _run(_spec(fake.base_url), folders[kind], remote, fake.base_url, workers=2)
            assert local.read_bytes() == remote.read_bytes(), kind
            expected = json.loads(result.output)
            timing = ("wall_s", "judgements_per_s", "pacing", "reward_seconds_p50", "reward_seconds_p99", "slowest_rows")
            assert {k: v for k, v in summary.model_dump().items() if k not in timing} == \
                {k: v for k, v in expected.items() if k in summary.model_dump() and k not in timing}


def test_an_actor_killed_mid_run_loses_no_row_and_duplicates_none(cluster: str, tmp_path: Path) -> None:
    import ray

    source = _rows(tmp_path / "in.jsonl", 80)
    output = tmp_path / "out.jsonl"
    killed: list[str] = []

    def kill_one(_verdict) -> None:
        if not killed and len(fake.chat_requests()) >= 20:
            name = sorted(n for n in ray.util.list_named_actors() if n.startswith("gradekit-judge-"))[0]
            ray.kill(ray.get_actor(name, namespace="gradekit"), no_restart=True)
            killed.append(name)

    with FakeProvider(latency=0.1) as fake:
        cache = str(tmp_path / "cache.sqlite3")
        summary = _run(_spec(fake.base_url, cache=cache, no_cache=False), source, output, fake.base_url, workers=2,
                       on_row=kill_one)
        sent = len(fake.chat_requests())
    assert killed
    assert summary.results.rows == summary.results.ok == 80
    assert _ids(output) == list(range(80))  # every row once, in order
    # Redone rows whose reply had arrived came from the cache: only what was in flight went again.
    assert sent <= 80 + 2 * (4 + 2)
    with pytest.raises(ValueError):
        ray.get_actor(killed[0], namespace="gradekit")


RPS = 10


def test_actors_on_two_nodes_share_one_limit_and_the_control_breaks_it(cluster: str, tmp_path: Path) -> None:
    """4 actors sharing --rps 10 against a fake enforcing 10 req/s: at most 1% answered 429.

    Control: the same 4 actors each with an in-process limiter of 10 req/s send 4x the limit.
    """
    source = _rows(tmp_path / "in.jsonl", 36)
    with FakeProvider(rate_limit_rps=RPS) as fake:
        summary = _run(_spec(fake.base_url, rps=RPS), source, tmp_path / "shared.jsonl", fake.base_url, workers=4)
        shared = fake.chat_requests()
    with FakeProvider(rate_limit_rps=RPS) as fake:
        _run(_spec(fake.base_url, rps=RPS, limiter="memory://"), source, tmp_path / "apart.jsonl", fake.base_url, workers=4)
        apart = fake.chat_requests()
    assert summary.results.ok == 36
    refused = sum(r.status == 429 for r in shared)
    assert refused <= 0.01 * len(shared), f"{refused} of {len(shared)} answered 429 under one shared limit"
    assert sum(r.status == 429 for r in apart) > 0.1 * len(apart)


def test_the_limiter_actor_restarts_and_permits_go_on(cluster: str) -> None:
    import ray

    from gradekit.judge import RayLimiter

    limiter = RayLimiter(rps=100, key="restart-test")
    limiter.check()

    async def take(n: int) -> None:
        for _ in range(n):
            async with limiter.slot():
                pass

    asyncio.run(take(5))
    actor = ray.get_actor("gradekit-limiter", namespace="gradekit")
    ray.kill(actor, no_restart=False)
    asyncio.run(take(5))  # a new event loop, and a restarted actor behind the same handle
    stats = ray.get(actor.stats.remote())
    # The restarted actor serves the slots taken after the kill (the first may be met while it restarts, and
    # is then paced locally), and only those: the state of the five before the kill died with the old actor.
    assert 1 <= stats["restart-test|100|None"]["granted"] <= 5, stats


def test_a_hold_told_by_one_process_delays_another(cluster: str) -> None:
    """Retry-After is cluster-wide: a hold told through one limiter moves the other's next booking past it."""
    from gradekit.judge import RayLimiter

    first, second = RayLimiter(rps=50, key="hold-test"), RayLimiter(rps=50, key="hold-test")
    first.hold(120.0)  # sent without waiting for the answer, as after a 429
    deadline = time.monotonic() + 60
    while True:  # the hold is fire-and-forget: wait for it to land, however slow the machine
        start, _ = asyncio.run(second._reserve(1, 0))
        if start - time.monotonic() > 60 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert start - time.monotonic() > 60  # the booking starts after the hold, not now
    assert second._local._resume_at - time.monotonic() > 60  # and the second process holds locally too


def test_gradekit_limiter_ray_in_the_environment_makes_a_workers_process_limiter_the_actor(cluster: str) -> None:
    import ray

    @ray.remote(num_cpus=0, runtime_env={"env_vars": {"GRADEKIT_LIMITER": "ray", "GRADEKIT_RPS": "7"}})
    def which() -> tuple[str, float | None]:
        from gradekit.judge import process_limiter

        limiter = process_limiter()
        return type(limiter).__name__, limiter.rps  # type: ignore[attr-defined]

    assert ray.get(which.remote()) == ("RayLimiter", 7.0)


def test_grade_dataset_adds_grade_columns_lazily(cluster: str) -> None:
    import ray.data

    from gradekit.graders import grade_dataset

    rows = [{"id": i, "question": f"q-{i}", "references": ["x"], "prediction": "y"} for i in range(12)]
    rows[3]["prediction"] = None  # a row lacking a variable gets its error row, not a failed batch
    with FakeProvider() as fake:
        ds = grade_dataset(ray.data.from_items(rows), RUBRIC, workers=2, concurrency=4, base_url=fake.base_url, model="fake-judge",
                           api_key="k")
        assert fake.chat_requests() == []  # lazy: nothing is judged until the dataset is consumed
        out = sorted(ds.take_all(), key=lambda r: r["id"])
        assert len(fake.chat_requests()) == 11
    assert [r["id"] for r in out] == list(range(12))
    assert all(r["status"] == "ok" for i, r in enumerate(out) if i != 3)
    assert out[3]["status"] == "error" and out[3]["error_kind"] == "input"
    assert {"score", "label", "status", "error_kind", "question"} <= set(out[0])


def test_a_grader_files_judge_block_holds_on_the_cluster_as_it_does_locally(cluster: str, tmp_path: Path) -> None:
    """The file's judge: (its endpoint, model, params, prompt cap) reaches the actors: same bodies, same checkpoint, same rows.

    The command line names no endpoint or model, so a worker that ignored the block would send to the default
    endpoint (nothing answers there) with another model and without the params.
    """
    with FakeProvider() as fake:
        config = tmp_path / "judge.yaml"
        config.write_text(f"""type: llm
rubric: {RUBRIC}
map: {{question: prompt, references: references.answer, prediction: response}}
judge:
  model: file-judge
  base_url: {fake.base_url}
  params: {{seed: 7, reasoning_effort: low}}
  max_prompt_tokens: 4000
""", encoding="utf-8")
        source = tmp_path / "in.jsonl"
        source.write_text("".join(json.dumps({"prompt": f"g-{i:03d}", "response": "y", "answer": "x"}) + "\n" for i in range(12)),
                          encoding="utf-8")
        outputs, bodies, checkpoints = [], [], []
        for where, extra in (("local", []), ("ray", ["--ray", cluster, "--ray-workers", "2"])):
            before = len(fake.chat_requests())
            output = tmp_path / f"{where}.jsonl"
            done = subprocess.run([sys.executable, "-m", "gradekit", "grade", str(source), "--grader", str(config), "-o", str(output),
                                   "--api-key", "k", "--judge-param", "temperature=0", "--no-cache", "--json", *extra],
                                  env=_env(), capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, done.stderr[-3000:]
            rows = [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()]
            outputs.append([{**r, "metrics": {k: v for k, v in r["metrics"].items() if k != "judge_latency_s"}} for r in rows])
            checkpoints.append(json.loads(output.with_name(output.name + ".checkpoint.json").read_text(encoding="utf-8")))
            bodies.append(sorted(json.dumps(r.body, sort_keys=True) for r in fake.chat_requests()[before:]))
    assert len(bodies[0]) == 12 and bodies[0] == bodies[1]
    sent = json.loads(bodies[0][0])
    assert (sent["model"], sent["seed"], sent["reasoning_effort"], sent["temperature"]) == ("file-judge", 7, "low", 0)
    assert outputs[0] == outputs[1] and {r["status"] for r in outputs[0]} == {"ok"}
    assert {k: v for k, v in checkpoints[0].items() if k not in ("input", "output", "mark", "updated")} == \
        {k: v for k, v in checkpoints[1].items() if k not in ("input", "output", "mark", "updated")}


def test_an_exported_openai_base_url_stays_beneath_a_grader_files_judge_on_the_cluster(cluster: str, tmp_path: Path) -> None:
    """Issue 48: the environment is a default, below the file's judge.base_url, on the actors as in a local run."""
    with FakeProvider() as declared, FakeProvider() as exported:
        config = tmp_path / "judge.yaml"
        config.write_text(f"type: llm\nrubric: {RUBRIC}\nmap: {{question: prompt, references: references.answer, prediction: response}}\n"
                          f"judge:\n  model: file-judge\n  base_url: {declared.base_url}\n", encoding="utf-8")
        source = tmp_path / "in.jsonl"
        source.write_text("".join(json.dumps({"prompt": f"e-{i:03d}", "response": "y", "answer": "x"}) + "\n" for i in range(6)),
                          encoding="utf-8")
        done = subprocess.run([sys.executable, "-m", "gradekit", "grade", str(source), "--grader", str(config), "-o",
                               str(tmp_path / "out.jsonl"), "--no-cache", "--json", "--ray", cluster, "--ray-workers", "2"],
                              env=_env(OPENAI_BASE_URL=exported.base_url, OPENAI_API_KEY="k", GRADEKIT_MODEL="shell-model"),
                              capture_output=True, text=True, timeout=300)
        reached = len(declared.chat_requests()), len(exported.chat_requests())
        models = {r.body["model"] for r in declared.chat_requests()}
    assert done.returncode == 0, done.stderr[-3000:]
    assert reached == (6, 0) and models == {"file-judge"}, (reached, models)
    assert "the grader file's judge.base_url" in " ".join(done.stderr.split())
