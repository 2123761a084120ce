"""A plain `pip install .` (not only -e) ships the rubrics, and the public surface is deliberate."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from gradekit import judge

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("git") is None:
        pytest.skip("git is needed to copy the tracked tree")
    folder = tmp_path_factory.mktemp("wheel")
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-v", "-w", str(folder), str(ROOT)],
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    # setuptools' own warnings (a data folder it would not ship, a deprecated key) fail the build here, not a user's install.
    warned = [line for line in (build.stdout + build.stderr).splitlines() if "Warning" in line or "!!" in line]
    assert not warned, "\n".join(warned[:20])
    return next(folder.glob("gradekit-*.whl"))


def test_wheel_ships_every_rubric(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    index = (ROOT / "prompts" / "index.yaml").read_text(encoding="utf-8")
    for spec in sorted((ROOT / "prompts").glob("*.yaml")):
        assert f"gradekit/prompts/{spec.name}" in names
        assert spec.name in index or spec.name == "index.yaml", f"{spec.name} is not in prompts/index.yaml"
    for template in sorted((ROOT / "prompts").glob("*.j2")):
        assert f"gradekit/prompts/{template.name}" in names
    assert any(n.endswith("entry_points.txt") for n in names)
    assert "gradekit/py.typed" in names  # PEP 561: type checkers read gradekit's hints
    assert {n.split("/")[0] for n in names} == {"gradekit", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}
    for asset in ("index.html", "view.js", "view.css"):  # gradekit view's page: no CDN, so it ships in the wheel
        assert f"gradekit/graders/view/static/{asset}" in names
    assert "gradekit/graders/grader.schema.json" in names  # what `gradekit schema` prints


def test_gradekit_schema_prints_from_the_wheel(wheel: Path, tmp_path: Path) -> None:
    """Installed from the wheel alone, `gradekit schema` prints the shipped schema: the file is package data, not the checkout's."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "GRADEKIT_"))} | {"PYTHONPATH": str(site)}
    done = subprocess.run([sys.executable, "-m", "gradekit", "schema"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == (site / "gradekit" / "graders" / "grader.schema.json").read_text(encoding="utf-8")
    assert json.loads(done.stdout)["title"] == "gradekit grader file"


def test_llmbar_data_ship_in_the_wheel_and_work_from_any_folder(wheel: Path, tmp_path: Path) -> None:
    """Installed from the wheel alone (no checkout on the path), run from an empty folder."""
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {f"gradekit/eval_sets/{p.relative_to(ROOT / 'eval_sets').as_posix()}" for p in (ROOT / "eval_sets").rglob("*")
               if p.is_file() and "__pycache__" not in p.parts}
    assert shipped <= names and "gradekit/eval_sets/llmbar/data/LLMBar__Natural/GPT-4__Vanilla_NoRules.jsonl" in names
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)  # what pip install puts in site-packages for a pure-Python wheel
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "GRADEKIT_"))} | {"PYTHONPATH": str(site)}
    where = subprocess.run([sys.executable, "-c", "import gradekit.graders as g, gradekit.graders.calibration as c; print(g.__file__); print(c.llmbar_root())"],
                           cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120)
    assert where.returncode == 0, where.stderr
    assert all(line.startswith(str(site)) for line in where.stdout.split()), where.stdout
    demo = subprocess.run([sys.executable, "-m", "gradekit", "llmbar", "--subset", "GPTOut"], cwd=elsewhere, env=env,
                          capture_output=True, text=True, timeout=120)
    assert demo.returncode == 0, demo.stderr
    assert "Acc 76.6 / Agr 87.2" in demo.stdout and "reproduced" in demo.stdout
    server = subprocess.Popen([sys.executable, "-m", "gradekit", "llmbar", "--serve", "--subset", "all", "--judge", "GPT-4",
                               "--strategy", "Vanilla_NoRules"], cwd=elsewhere, env=env, stdout=subprocess.PIPE, text=True)
    try:
        base_url = server.stdout.readline().strip()
        assert base_url.startswith("http://127.0.0.1:"), base_url
        run = subprocess.run([sys.executable, "-m", "gradekit", "meta-eval", "--suite", "faireval", "-r", "llmbar_pairwise",
                              "--model", "gpt-4", "--base-url", base_url, "--api-key", "x", "--no-cache", "--json"],
                             cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert run.returncode == 0, run.stderr
    payload = json.loads(run.stdout)
    (row,) = payload["results"]
    published = next(p for p in payload["published"] if p["judge"] == "GPT-4/Vanilla_NoRules")
    assert (row["n"], row["accuracy"], row["agreement"]) == (66, pytest.approx(published["accuracy"]), pytest.approx(published["agreement"]))


def test_one_import_package_that_a_users_judge_or_graders_cannot_shadow(wheel: Path, tmp_path: Path) -> None:
    """The wheel installs `gradekit` alone: no top-level `judge` or `graders` to collide with PyPI's `judge` and
    `graders` distributions, and a script beside its own judge.py and graders/ still gets gradekit."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    project = tmp_path / "rl-env"  # an RL environment repository with modules of those names
    (project / "graders").mkdir(parents=True)
    (project / "judge.py").write_text("WHO = 'the project'\n", encoding="utf-8")
    (project / "graders" / "__init__.py").write_text("WHO = 'the project'\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "GRADEKIT_"))} | {"PYTHONPATH": str(site)}
    alone = subprocess.run([sys.executable, "-c", "import judge"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert alone.returncode != 0 and "No module named 'judge'" in alone.stderr
    script = ("import judge, graders, gradekit, gradekit.judge, gradekit.graders.cli\n"
              "from gradekit.judge import load_rubric\n"
              "assert judge.WHO == graders.WHO == 'the project'\n"
              "print(gradekit.__version__, load_rubric('semantic_equivalence_en').name, gradekit.__file__)")
    beside = subprocess.run([sys.executable, "-c", script], cwd=project, env=env, capture_output=True, text=True, timeout=120)
    assert beside.returncode == 0, beside.stderr
    version, rubric, where = beside.stdout.split()
    assert rubric == "semantic_equivalence_en" and where.startswith(str(site)) and version == wheel.name.split("-")[1]
    cli = subprocess.run([sys.executable, "-m", "gradekit", "--version"], cwd=project, env=env, capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0 and cli.stdout.strip() == f"gradekit {version}", cli.stdout + cli.stderr


def test_judge_public_names() -> None:
    assert judge.__all__ == sorted(judge.__all__)
    assert judge.__all__ == [
        "AskMode", "Breaker", "BreakerTripped", "Budget", "Cascade", "CascadeSpec", "Endpoint", "EndpointStats", "ErrorKind",
        "HedgePolicy", "HedgeStats", "Judge", "JudgeCache", "JudgeIdentity", "JudgeProtocol", "JudgeSpec", "JudgeStats", "Jury",
        "JurySpec", "Limiter", "Limits", "MemberUsage", "ModelPrice", "Pacer", "Pacing", "PanelInfo", "ParseFailure", "Parsed",
        "RayLimiter", "ReadInfo", "RedisJudgeCache", "RetryPolicy", "Rubric", "RubricError", "RubricInputError",
        "SharedLimiter", "StepVerdict", "SyncRunner", "TrajectoryCoverage", "Usage", "Verdict", "build_request", "cache_key", "clamp", "configure_limiter",
        "cost_usd", "default_cache_path", "endpoint_limiter", "estimate_tokens", "is_transient", "limiter_from_url",
        "list_rubrics", "load_prices", "load_rubric", "match_label", "normalize_label", "open_cache", "parse_reply",
        "process_limiter", "retry_after_seconds",
    ]
    for name in judge.__all__:
        assert hasattr(judge, name)


def test_graders_public_names() -> None:
    from gradekit import graders

    assert graders.__all__ == sorted(graders.__all__)
    for name in graders.__all__:
        assert hasattr(graders, name), name
    expected_core = {"Grade", "Sample", "Trajectory", "group_grader", "llm_grader", "python_grader", "weighted_grader",
                     "formula_grader", "string_match_grader", "load_grader", "parse_vertex_spec", "grade_file", "grade", "GradePlan"}
    assert expected_core <= set(graders.__all__)
    assert not [n for n in graders.__all__ if n.startswith("_")]
