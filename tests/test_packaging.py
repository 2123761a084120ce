"""A plain `pip install .` (not only -e) ships the rubrics, and the public surface is deliberate."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import judge

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_ships_every_rubric(tmp_path: Path) -> None:
    if shutil.which("git") is None:
        pytest.skip("git is needed to copy the tracked tree")
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(ROOT)],
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    wheel = next(tmp_path.glob("gradekit-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    index = (ROOT / "prompts" / "index.yaml").read_text(encoding="utf-8")
    for spec in sorted((ROOT / "prompts").glob("*.yaml")):
        assert f"judge/prompts/{spec.name}" in names
        assert spec.name in index or spec.name == "index.yaml", f"{spec.name} is not in prompts/index.yaml"
    for template in sorted((ROOT / "prompts").glob("*.j2")):
        assert f"judge/prompts/{template.name}" in names
    assert any(n.endswith("entry_points.txt") for n in names)


def test_judge_public_names() -> None:
    assert judge.__all__ == sorted(judge.__all__)
    assert judge.__all__ == [
        "AskMode", "Budget", "ErrorKind", "Judge", "JudgeCache", "Limiter", "ModelPrice", "Pacer", "Pacing", "ParseFailure", "Parsed", "RetryPolicy", "Rubric",
        "RubricError", "RubricInputError", "SharedLimiter", "SyncRunner", "Verdict", "build_request", "cache_key", "clamp",
        "configure_limiter", "cost_usd", "default_cache_path", "estimate_tokens", "is_transient", "limiter_from_url", "list_rubrics", "load_prices", "load_rubric",
        "match_label", "normalize_label", "parse_reply", "process_limiter", "retry_after_seconds",
    ]
    for name in judge.__all__:
        assert hasattr(judge, name)


def test_graders_public_names() -> None:
    import graders

    assert graders.__all__ == sorted(graders.__all__)
    for name in graders.__all__:
        assert hasattr(graders, name), name
    expected_core = {"Grade", "Sample", "Trajectory", "group_grader", "llm_grader", "python_grader", "weighted_grader",
                     "formula_grader", "string_match_grader", "load_grader", "parse_vertex_spec", "grade_file"}
    assert expected_core <= set(graders.__all__)
    assert not [n for n in graders.__all__ if n.startswith("_")]
