"""Issue 17: each platform called the way its own code calls gradekit, one test per defect.

Ark's seed harness (``asyncio.run`` per sample), OpenRLHF's templated ``query``/``prompts``/
``labels``, DashScope's plain ground truth, TRL's pre-0.27 synchronous call, a Bailian seed-001
user file served unchanged, and the OpenAI export's score range.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from graders.platforms import ark_group_grader
from graders.platforms._ark import ArkTrajectory, ChatCompletionSample, PluginStatus
from judge.testing import FakeProvider

from .conftest import reference_judge

ROOT = Path(__file__).resolve().parent.parent

# ---- defect 1: Ark's harness calls the plugin with asyncio.run(...) per sample -----------------------

# Seed 000's main(): a ChatCompletionSample and two Trajectory objects, context {}, asyncio.run.
SEED_SAMPLE = {"messages": [{"role": "user", "content": "Which two companies grew?"}], "thinking": {"type": "enabled"},
               "extra": {"answer": "Jingli and Xinqin"}}
SEED_TRAJECTORIES = [
    {"messages": [{"role": "assistant", "content": "It was Jingli and Xinqin, together."}], "finish_reason": "stop", "usage": {}},
    {"messages": [{"role": "assistant", "content": "Jingli"}], "finish_reason": "stop", "usage": {}},
]


def seed_main(llm_grader: Any) -> Any:
    """Seed 000's ``main()``, verbatim in shape: build the objects, then ``asyncio.run`` the plugin."""
    sample = ChatCompletionSample(**SEED_SAMPLE)
    trajectories = [ArkTrajectory(**t) for t in SEED_TRAJECTORIES]
    return asyncio.run(llm_grader({}, sample, trajectories))


def test_ark_seed_harness_five_times_in_one_process_all_succeed(fake: FakeProvider, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the second asyncio.run answered RETRY "Event loop is closed" (the judge's client
    stayed bound to the first loop). After: every call from a new loop is SUCCESS."""
    fake.set_responder(reference_judge)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    plugin = ark_group_grader({"type": "llm", "rubric": "semantic_equivalence_en",
                               "judge": {"model": "fake-judge", "base_url": fake.base_url, "timeout": 10}}, name="llm_group_grader")
    results = [seed_main(plugin) for _ in range(5)]
    assert [r.status for r in results] == [PluginStatus.SUCCESS] * 5, [r.error for r in results]
    assert [r.rewards for r in results] == [[1.0, 0.0]] * 5
