"""The one flag table: the field or argument a Python user sets (a judge spec field, a run's, a
calibration's or an export's argument) and the command-line flag that sets it.

The library (judge/ and every folder of graders/ but the front doors) names fields in its messages
(`base_url`, `human_column`, `resume=False`), never flags, so a Python user reads the names they
set. What the command line shows (stderr, the run summary, an output file's ``error`` cells, the
viewer's notes) says each field as the flag that sets it. It lives below graders/cli, graders/runs
and graders/view, which write those outputs. One name says one flag in every command.
"""

from __future__ import annotations

import re

# The judge spec's fields (judge._spec, judge.Budget): options of `gradekit grade` and the other judging commands.
JUDGE_FLAGS: dict[str, str] = {
    "model": "--model", "base_url": "--base-url", "api_key": "--api-key", "params": "--judge-param", "timeout": "--timeout",
    "row_deadline": "--row-deadline",
    "params.temperature": "--temperature", "params.reasoning_effort": "--reasoning-effort",
    "params.max_completion_tokens": "--max-completion-tokens",
    "limits.rps": "--rps", "limits.tpm": "--tpm", "limits.concurrency": "--concurrency", "limits.adapt": "--no-adapt",
    "limits.url": "--limiter", "limits.key": "--limiter-key", "max_cost_usd": "--max-cost", "max_tokens": "--max-tokens",
    "prices": "--prices", "context_window": "--context-window", "api": "--api", "service_tier": "--service-tier",
    "flex_deadline_s": "--flex-deadline", "hedge": "--hedge",
}
FLAGS: dict[str, str] = {
    **JUDGE_FLAGS,
    # a file run's arguments (graders.runs, graders.grading's GradePlan): grade_file, RunOptions, Canary (mapping, group_by, retry_errors and
    # keep_going are for graders/runs/_file.py's messages, said as fields once its rewrite lands)
    "resume=False": "--restart", "encoding": "--encoding", "on_drift": "--on-drift", "canary_every": "--canary-every",
    "ray": "--ray", "ray=local": "--ray local", "canary": "--canary", "mapping": "--map", "group_by": "--group-by", "retry_errors": "--retry-errors", "keep_going": "--keep-going",
    # calibration's arguments: calibrate_rows, cascades, answer and pairwise suites, the LLMBar data
    "human_column": "--human-column", "judge_column": "--judge-column", "label_rows": "--labels", "on": "--on",
    "label_map": "--label-map", "limit": "--limit", "root": "--data",
    "target": "--target", "delta": "--delta", "samples": "--samples", "confidence": "--confidence",
    # the exporters' arguments (graders.platforms)
    "endpoint": "--endpoint-url", "rescale": "--rescale", "export_foundry_grader": "--to foundry",
}
# A field in backticks: a name (`human_column`, `params.temperature`) or a name set to a value (`resume=False`).
_FIELD = re.compile(r"`([a-z_.]+(?:=[A-Za-z0-9_]+)?)`")


def in_flags(message: str) -> str:
    """A library message with each `field` it names said as the flag that sets it (other backticks stay)."""
    return _FIELD.sub(lambda m: FLAGS.get(m.group(1), m.group(0)), message)


def said_as_flags(message: str | None) -> str | None:
    """:func:`in_flags` for an optional message (a row's ``error`` cell)."""
    return message if message is None else in_flags(message)
