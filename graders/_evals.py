"""An OpenAI Evals-API definition (``name``, ``data_source_config``, ``testing_criteria``) as one grader.

The Evals API goes read-only on 2026-10-31 and shuts down on 2026-11-30; its definitions keep
running here. Each testing criterion is built as the gradekit node of its type (string_check,
text_similarity, python, label_model, score_model, multi) and decides pass/fail as an eval run does:

- ``string_check`` and ``label_model``: passes when it scores 1 (a match, a passing label);
- ``text_similarity``, ``python``, ``multi``: passes when the score reaches ``pass_threshold``;
  without one (python and multi may omit it) only a full score of 1 passes, so a missing
  threshold never inflates a pass rate;
- ``score_model``: passes when the judge's number (``raw_score``, in the criterion's ``range``)
  reaches ``pass_threshold``; without one, only the top of the range passes. A reply without a
  number in range is an error, never a fail.

A row passes when every criterion passes, fails when one fails; a criterion that could not be
judged (an error or an invalid grade) makes the row an error, never a fail. Criteria are named as
OpenAI names them in ``per_testing_criteria_results``: the criterion's ``id`` when the definition
came from ``client.evals.retrieve()`` (``"<name>-<uuid>"``), else ``"<name>-<uuid5>"`` with a UUID
derived from the eval's name and the criterion's position, stable from run to run. Source of the
shape: OpenAI's evals guide (developers.openai.com/api/docs/guides/evals) and the SDK's
``openai.types.evals.run_retrieve_response`` (``ResultCounts``, ``PerTestingCriteriaResult``).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from ._sample import Grade, Grader, Sample, aclose_grader, usage_of

_UUID_NAMESPACE = uuid.UUID("5f1c7a52-0d0e-4c5e-9b1e-6b8f0a3e2d41")  # gradekit's, for criteria without an id
_FULL_SCORE_TYPES = ("string_check", "label_model")
# Fields the Evals API adds to a criterion it returns; the gradekit node does not take them.
_RETURNED_FIELDS = ("id",)


class EvalDefinition(BaseModel):
    """The part of an eval that decides its grades; anything else ``evals.retrieve()`` returns is ignored."""

    model_config = ConfigDict(extra="ignore")

    name: str | None = None
    data_source_config: dict[str, Any] | None = None
    testing_criteria: list[dict[str, Any]]


def is_eval_definition(data: Mapping[str, Any]) -> bool:
    return "testing_criteria" in data and "type" not in data


def criterion_name(eval_name: str | None, index: int, criterion: Mapping[str, Any]) -> str:
    """The name OpenAI's run results give the criterion: its id, else ``<name>-<uuid>``."""
    if isinstance(criterion.get("id"), str) and criterion["id"]:
        return criterion["id"]
    name = str(criterion.get("name") or criterion.get("type") or "criterion")
    seed = "|".join((eval_name or "", str(index), name))
    return f"{name}-{uuid.uuid5(_UUID_NAMESPACE, seed)}"


def criterion_node(criterion: Mapping[str, Any]) -> dict[str, Any]:
    """The gradekit node of one criterion: the fields the API adds on return are dropped."""
    return {k: v for k, v in criterion.items() if k not in _RETURNED_FIELDS}


def passes(criterion: Mapping[str, Any], grade: Grade) -> bool:
    if grade.score is None:
        return False
    if criterion.get("type") in _FULL_SCORE_TYPES:
        return grade.score >= 1.0
    if criterion.get("type") == "score_model":
        raw = grade.metrics.get("raw_score", grade.score)
        threshold = criterion.get("pass_threshold")
        top = (criterion.get("range") or [0.0, 1.0])[1]
        return raw >= (float(threshold) if isinstance(threshold, (int, float)) else float(top))
    threshold = criterion.get("pass_threshold")
    return grade.score >= (float(threshold) if isinstance(threshold, (int, float)) else 1.0)


class EvalGrader:
    """All testing criteria of one eval on one sample: a part per criterion, score 1 (passed) or 0 (failed)."""

    def __init__(self, criteria: list[tuple[str, Mapping[str, Any], Grader]], name: str) -> None:
        self.criteria = criteria
        self.__name__ = name

    @property
    def names(self) -> list[str]:
        return [name for name, _, _ in self.criteria]

    async def __call__(self, sample: Sample) -> Grade:
        grades = await asyncio.gather(*(grader(sample) for _, _, grader in self.criteria))
        parts: dict[str, Grade] = {}
        metrics: dict[str, float] = {}
        failed_to_judge: list[tuple[str, Grade]] = []
        for (name, criterion, _), grade in zip(self.criteria, grades):
            # A model criterion's judge tokens, requests and cache hits, per part, for the row's metrics (the run's
            # summary and cost count the grade's usage).
            metrics.update({f"{name}.{key}": value for key, value in grade.metrics.items() if key.startswith("judge_")})
            if grade.status != "ok":
                failed_to_judge.append((name, grade))
                parts[name] = grade
                continue
            passed = passes(criterion, grade)
            parts[name] = grade.model_copy(update={"metrics": {**grade.metrics, "passed": float(passed)}})
            metrics[f"{name}.passed"] = float(passed)
            if "raw_score" in grade.metrics:  # a score_model's number, in its range: what pass_threshold was compared with
                metrics[f"{name}.raw_score"] = grade.metrics["raw_score"]
        if failed_to_judge:
            worst = "error" if any(g.status == "error" for _, g in failed_to_judge) else "invalid"
            first_name, first = failed_to_judge[0]
            return Grade.failed(worst, f"criterion {first_name!r}: {first.error}", error_kind=first.error_kind,
                                parts=parts, metrics=metrics, **usage_of(grades))
        passed = all(value for key, value in metrics.items() if key.endswith(".passed"))
        return Grade.scored(1.0 if passed else 0.0, parts=parts, metrics={**metrics, "passed": float(passed)}, **usage_of(grades))

    async def aclose(self) -> None:
        for _, _, grader in self.criteria:
            await aclose_grader(grader)


class ResultCounts(BaseModel):
    """An eval run's ``result_counts``, as ``openai.types.evals.run_retrieve_response.ResultCounts``."""

    total: int = 0
    passed: int = 0
    failed: int = 0
    errored: int = 0


class PerTestingCriteriaResult(BaseModel):
    testing_criteria: str
    passed: int = 0
    failed: int = 0


def _cell(value: Any) -> Any:
    if isinstance(value, str) and value.startswith("{"):  # CSV cells hold the metrics column as JSON text
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return None
    return value


def run_figures(rows: Iterable[Mapping[str, Any]], names: list[str]) -> tuple[ResultCounts, list[PerTestingCriteriaResult]]:
    """``result_counts`` and ``per_testing_criteria_results`` of the output rows an EvalGrader wrote.

    Read back from the output, so a resumed or already finished run reports the whole file.
    """
    counts = ResultCounts()
    per = {name: PerTestingCriteriaResult(testing_criteria=name) for name in names}
    for row in rows:
        counts.total += 1
        metrics = _cell(row.get("metrics")) or {}
        if row.get("status") != "ok":
            counts.errored += 1
        elif float(metrics.get("passed", 0)) == 1.0:
            counts.passed += 1
        else:
            counts.failed += 1
        for name, result in per.items():
            value = metrics.get(f"{name}.passed")
            if value is None or value == "":
                continue  # errored, or the row could not be read: neither passed nor failed
            if float(value) == 1.0:
                result.passed += 1
            else:
                result.failed += 1
    return counts, list(per.values())


def sdk_problems(data: Mapping[str, Any]) -> list[str]:
    """What the openai SDK's own types say is wrong with an eval definition (empty: nothing).

    Each criterion is checked against its type's TypedDict in ``openai.types.eval_create_params``
    (one by one: the SDK declares the list an ``Iterable``, which pydantic does not look into), and
    ``data_source_config`` against ``DataSourceConfig``. What ``evals.retrieve()`` returned
    (``"object": "eval"``) keeps its ``schema`` in place of ``item_schema``: its config is not
    checked, and the ``id`` the API gave each criterion is dropped first. ``multi`` is no eval
    criterion in the SDK; it is checked as ``openai.types.graders.MultiGraderParam``.
    """
    from openai.types import eval_create_params as p
    from openai.types.graders import MultiGraderParam
    from pydantic import TypeAdapter, ValidationError

    kinds: dict[str, Any] = {"string_check": p.StringCheckGraderParam, "text_similarity": p.TestingCriterionTextSimilarity,
                             "python": p.TestingCriterionPython, "score_model": p.TestingCriterionScoreModel,
                             "label_model": p.TestingCriterionLabelModel, "multi": MultiGraderParam}
    problems: list[str] = []

    def check(kind: Any, value: Any, where: str) -> None:
        try:
            TypeAdapter(kind).validate_python(value)
        except ValidationError as e:
            problems.extend(f"{where}{'.' if err['loc'] else ''}{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors()[:10])

    if data.get("object") != "eval":
        if "data_source_config" not in data:
            problems.append("data_source_config: required")
        else:
            check(p.DataSourceConfig, data["data_source_config"], "data_source_config")
    criteria = data.get("testing_criteria")
    if not isinstance(criteria, list):
        return [*problems, "testing_criteria: must be a list"]
    for index, criterion in enumerate(criteria):
        where = f"testing_criteria.{index}"
        kind = kinds.get(criterion.get("type")) if isinstance(criterion, Mapping) else None
        if kind is None:
            problems.append(f"{where}.type: one of {', '.join(kinds)}")
            continue
        node = criterion_node(criterion)
        members = node.get("graders")
        if kind is MultiGraderParam and isinstance(members, Mapping) and members and "type" not in members:
            # The SDK types ``graders`` as one grader; the API takes a map of them (name -> grader): the multi's own
            # fields with a stand-in member, then each member against its own type.
            from openai.types import graders as g

            member_kinds = {"string_check": g.StringCheckGraderParam, "text_similarity": g.TextSimilarityGraderParam,
                            "python": g.PythonGraderParam, "score_model": g.ScoreModelGraderParam,
                            "label_model": g.LabelModelGraderParam}
            stand_in = {"type": "string_check", "name": "x", "input": "", "reference": "", "operation": "eq"}
            check(kind, {**node, "graders": stand_in}, where)
            for name, member in members.items():
                member_kind = member_kinds.get(member.get("type")) if isinstance(member, Mapping) else None
                if member_kind is None:
                    problems.append(f"{where}.graders.{name}.type: one of {', '.join(member_kinds)}")
                else:
                    check(member_kind, member, f"{where}.graders.{name}")
            continue
        check(kind, node, where)
    return problems
