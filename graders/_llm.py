"""LLM graders: a rubric from prompts/ applied by a Judge, Vertex's autorater form, OpenAI's label_model and score_model.

Both turn a judge Verdict into a Grade one way: ``ok`` keeps the verdict's score; a row that lacks
a rubric variable is ``invalid`` (the sample cannot be graded this way); every other verdict
error (unreachable judge, refusal, unparseable reply, ...) is ``error`` with its kind and
reason. A failed verdict never becomes a number here; the group grader's policy decides.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from gradekit.judge import JudgeProtocol, Rubric, Verdict, load_rubric
from gradekit.judge._media import local_media
from gradekit.judge._parse import number_of
from gradekit.judge._rubric import VariableSpec

from ._sample import Grade, Grader, PlaceholderError, Sample, fill_placeholders, resolve_path
from ._string_match import IDENTITY, ParseConfig, parse_response

# Rubric variables that read a sample field when no mapping names them.
DEFAULT_PATHS = {
    "question": "prompt",
    "prompt": "prompt",
    "query": "prompt",
    "instruction": "prompt",
    "prediction": "response",
    "response": "response",
    "output": "response",
    "system": "system_instruction",
    "system_instruction": "system_instruction",
    "trajectory": "trajectory",  # the whole rollout (a variable of type trajectory)
    "messages": "trajectory",
}


def rubric_row(rubric: Rubric, sample: Sample, mapping: Mapping[str, str]) -> dict[str, Any]:
    """The rubric's variables read from the sample; a variable that cannot be read is left out,
    so the rubric itself reports it missing, by name."""
    row: dict[str, Any] = {}
    for var in rubric.variables:
        path = mapping.get(var) or DEFAULT_PATHS.get(var)
        if path is None:
            if var in sample.references:
                path = f"references.{var}"
            elif var in sample.metadata:
                path = f"metadata.{var}"
            elif var == "references" and "answer" in sample.references:  # Ark's extra.answer
                path = "references.answer"
            else:
                continue
        if path in ("prompt", "question") and not any(m.role == "user" for m in sample.messages):
            continue  # no question was sent (a server request without a prompt): missing, not an empty question
        try:
            row[var] = resolve_path(sample, path)
        except PlaceholderError:
            continue
    return row


PROMPT_MEDIA = "prompt_media"  # the variable a rubric without a media variable gets for the sample's images


def with_prompt_media(rubric: Rubric, row: dict[str, Any], sample: Sample) -> Rubric:
    """The rubric and row that send the sample's prompt images and audio (a Vertex example's
    inlineData, a Bailian/DashScope message's image parts) to the judge as content parts.

    A rubric with a media variable the row left empty gets them there; one without gets a copy with
    an optional ``prompt_media`` variable (not in its template: media go after the rendered text).
    A sample without media leaves both untouched, so text-only requests (and their cache keys) are as before.
    """
    media = sample.prompt_media
    if not media:
        return rubric
    own = next((var for var, spec in rubric.variables.items() if spec.type == "media"), None)
    if own is not None:
        if not row.get(own):
            row[own] = media
        return rubric
    row[PROMPT_MEDIA] = media
    return rubric.model_copy(update={"variables": {**rubric.variables, PROMPT_MEDIA: VariableSpec(type="media", required=False)}})


FLEX_COUNTS = ("flex_prompt_tokens", "flex_completion_tokens", "flex_cached_tokens", "flex_cache_write_tokens", "flex_reasoning_tokens")


def grade_from_verdict(verdict: Verdict, name: str, *, score: float | None = None, debug: list[str] | None = None,
                       rubric: Rubric | None = None) -> Grade:
    metrics = {
        "judge_prompt_tokens": float(verdict.usage.prompt_tokens),
        "judge_completion_tokens": float(verdict.usage.completion_tokens),
        "judge_attempts": float(verdict.usage.requests),
        "judge_latency_s": verdict.latency_s,
        "judge_cached": float(verdict.cached),
    }
    # Only where the provider reports them, so a chat model's metrics read as they always did.
    if verdict.usage.reasoning_tokens:
        metrics["judge_reasoning_tokens"] = float(verdict.usage.reasoning_tokens)
    if verdict.usage.cached_tokens:
        metrics["judge_cached_tokens"] = float(verdict.usage.cached_tokens)
    for part in ("cache_write_tokens", *FLEX_COUNTS):  # cache writes and the flex tier's part, where there are any
        if getattr(verdict.usage, part):
            metrics[f"judge_{part}"] = float(getattr(verdict.usage, part))
    lines = list(debug or [])
    columns = trajectory_columns(verdict)
    spent = {"usage": verdict.usage, "cache_hits": int(verdict.cached)}  # what the run's tally counts (the metrics are for reading)
    if verdict.status != "ok":
        status: Literal["invalid", "error"] = "invalid" if verdict.error_kind == "input" else "error"
        if verdict.criteria is not None:  # a checklist read too little: how much it read is part of the answer
            from ._checklist import criteria_metrics

            metrics.update(criteria_metrics(verdict.criteria))
        if verdict.raw:
            lines.append(f"{name}: judge reply {verdict.raw[:300]!r}")
        return Grade.failed(status, f"grader {name!r}: {verdict.error_kind}: {verdict.error}", error_kind=verdict.error_kind,
                            metrics=metrics, debug=lines, columns=columns, **spent)
    if rubric is not None and rubric.is_invalid(verdict.label):
        # The judge says the sample cannot be graded (CompassVerifier's INVALID): a state, not a score.
        if verdict.rationale:
            lines.append(f"{name}: rationale: {verdict.rationale[:500]}")
        return Grade.failed("invalid", f"grader {name!r}: judged_invalid: the judge labelled the sample {verdict.label!r}, "
                            f"which rubric {rubric.name!r} names invalid", error_kind="judged_invalid", metrics=metrics, debug=lines,
                            **spent)
    value = verdict.score if score is None else score
    assert value is not None
    if verdict.criteria is not None:  # a checklist: each criterion a part (criteria.<id>), none a made-up 0
        from ._checklist import criteria_metrics, criteria_parts

        read = sum(c.status == "ok" for c in verdict.criteria)
        lines.append(f"{name}: checklist {read}/{len(verdict.criteria)} criteria read -> {value:g}" + (" (cached)" if verdict.cached else ""))
        return Grade.scored(value, metrics={**metrics, **criteria_metrics(verdict.criteria)}, debug=lines,
                            parts=criteria_parts(verdict.criteria, name), **spent)
    if verdict.steps is not None:
        lines.extend(f"{name}: step {s.step}: " + (f"{s.label!r} -> {s.score:g}" if s.score is not None else f"{s.error_kind}: {s.error}")
                     for s in verdict.steps)
    lines.append(f"{name}: judge label {verdict.label!r} -> {value:g}" + (" (cached)" if verdict.cached else ""))
    if verdict.rationale:
        lines.append(f"{name}: rationale: {verdict.rationale[:500]}")
    return Grade.scored(value, metrics=metrics, debug=lines, columns=columns, **spent)


def trajectory_columns(verdict: Verdict) -> dict[str, Any]:
    """A trajectory verdict's output cells: ``trajectory_coverage`` and, per step, ``step_scores`` (None: a failed step)."""
    columns: dict[str, Any] = {}
    if verdict.coverage is not None:
        columns["trajectory_coverage"] = verdict.coverage.model_dump(exclude_none=True)
    if verdict.steps is not None:
        columns["step_scores"] = [s.score for s in verdict.steps]
    return columns


# What a grader (an ``llm`` node) may set over its rubric's trajectory settings.
TRAJECTORY_SETTINGS = ("granularity", "step_aggregate", "navigate", "navigate_rounds", "trajectory_budget", "truncation",
                       "trajectory_reasoning")


def with_settings(rubric: Rubric, settings: Mapping[str, Any] | None) -> Rubric:
    """``rubric`` with a grader's trajectory settings over its own, checked as the rubric's own would be."""
    given = {k: v for k, v in (settings or {}).items() if v is not None}
    unknown = [k for k in given if k not in TRAJECTORY_SETTINGS]
    if unknown:
        raise ValueError(f"{', '.join(unknown)}: not a trajectory setting ({', '.join(TRAJECTORY_SETTINGS)})")
    if not given:
        return rubric
    return Rubric.model_validate({**rubric.model_dump(), **given, "directory": rubric.directory})


def trajectory_output_columns(rubric: Rubric) -> tuple[str, ...]:
    if not rubric.trajectory_variables:
        return ()
    return ("trajectory_coverage", "step_scores") if rubric.granularity == "step" else ("trajectory_coverage",)


def llm_grader(judge: JudgeProtocol, rubric: Rubric | str | Path, mapping: Mapping[str, str] | None = None, *, name: str | None = None,
               settings: Mapping[str, Any] | None = None) -> Grader:
    """Grade with any rubric (a shipped name, a path to a .yaml spec, or a Rubric).

    Args:
        judge: the Judge client (it carries the shared limiter, cache and retry policy).
        rubric: which rubric to apply.
        mapping: rubric variable -> sample path (``prompt``, ``response``, ``system_instruction``,
            ``references.<key>``, ``metadata.<key>``). Unmapped variables read the usual field:
            question/prompt -> prompt, prediction/response -> response, else a reference or
            metadata key of the same name (``references`` falls back to Ark's ``answer``); ``trajectory``
            reads the whole conversation (prompt, tool calls and results, final answer).
        settings: trajectory settings over the rubric's (``granularity``, ``step_aggregate``, ``navigate``,
            ``navigate_rounds``, ``trajectory_budget``, ``truncation``, ``trajectory_reasoning``).
    """
    spec = with_settings(rubric if isinstance(rubric, Rubric) else load_rubric(rubric), settings)
    paths = dict(mapping or {})
    unknown = [v for v in paths if v not in spec.variables]
    if unknown:
        raise ValueError(f"mapping names {', '.join(map(repr, unknown))}, which rubric {spec.name!r} does not have "
                         f"(its variables: {', '.join(spec.variables)})")
    label = name or spec.name

    async def grade(sample: Sample) -> Grade:
        row = rubric_row(spec, sample, paths)
        verdict = await judge.judge(with_prompt_media(spec, row, sample), row)
        return grade_from_verdict(verdict, label, rubric=spec)

    grade.__name__ = label
    grade.output_columns = trajectory_output_columns(spec)  # type: ignore[attr-defined]
    grade.rubric = spec  # type: ignore[attr-defined]
    return grade


# ---- Vertex's autorater ---------------------------------------------------------------------


# The autorater prompt is the user's configuration, already filled: the rubric machinery (render,
# request, cache, limiter, retry, parse) runs it through a one-line template that holds no wording,
# only the variable.
_AUTORATER_TEMPLATE = "{% block user %}{{ autorater_prompt }}{% endblock %}\n"




def _autorater_rubric(name: str, parse: ParseConfig, labels: dict[str, float] | None, unmatched: float = 0.0) -> Rubric:
    """The expected reply as the one label (exactMatchScorer), or, with ``labels`` None, the reply as a number
    (parsedResponseConversionScorer: the rubric's number output reads it)."""
    output: dict[str, Any] = {"mode": "regex", "pattern": parse.regex} if parse.type == "REGEX_EXTRACT" else {"mode": "text"}
    if labels is None:
        output = {**output, "mode": "number", "noun": "autorater's parsed reply"}
    return Rubric.model_validate({
        "name": name,
        "description": "Vertex autorater",
        "template": "autorater.j2",
        "inline_template": _AUTORATER_TEMPLATE,
        "variables": {"autorater_prompt": {"type": "str"}},
        "output": {**output, "rationale_field": None},
        **({"labels": labels, "unmatched": unmatched} if labels is not None else {}),
    })


def autorater_grader(
    judge: JudgeProtocol,
    prompt: str,
    *,
    parse: ParseConfig = IDENTITY,
    expression: str | None = None,
    correct: float = 1.0,
    wrong: float = -1.0,
    response_parse: ParseConfig = IDENTITY,
    name: str = "autorater",
) -> Grader:
    """Vertex's autoraterScorer.

    Args:
        judge: the Judge that plays the autorater.
        prompt: the autorater prompt with ``{{prompt}}``, ``{{response}}``,
            ``{{system_instruction}}`` and ``{{references.key}}`` placeholders.
        parse: how to read the autorater's reply (``REGEX_EXTRACT``: one distinct match, else a parse failure).
        expression: exactMatchScorer: the expected parsed reply (may hold ``{{references.key}}``);
            ``correct`` if it matches, ``wrong`` otherwise. None: parsedResponseConversionScorer,
            the parsed reply is the score itself (a non-number is an error).
        response_parse: the reward config's parseResponseConfig, applied to the graded response
            before it fills ``{{response}}``.
    """
    for reward in (correct, wrong):
        if math.isnan(reward):
            raise ValueError(f"autorater {name!r}: rewards must be numbers")
    clamped = (max(-1.0, min(1.0, correct)), max(-1.0, min(1.0, wrong)))
    if expression is not None and re.search(r"\{\{\s*response\s*\}\}", expression):
        raise ValueError(f"autorater {name!r}: the expected expression cannot use {{{{response}}}}")
    fixed = None
    if expression is not None and "{{" not in expression:
        fixed = _autorater_rubric(name, parse, {expression: clamped[0]}, clamped[1])
    numeric = _autorater_rubric(name, parse, None) if expression is None else None

    async def grade(sample: Sample) -> Grade:
        response = parse_response(sample.response_text, response_parse)
        try:
            text = fill_placeholders(prompt, sample, response=response or "")
            rubric = fixed or numeric or _autorater_rubric(name, parse, {fill_placeholders(expression or "", sample): clamped[0]}, clamped[1])
        except PlaceholderError as e:
            return Grade.failed("invalid", f"grader {name!r}: {e}", error_kind="input")
        row: dict[str, Any] = {"autorater_prompt": text}
        verdict = await judge.judge(with_prompt_media(rubric, row, sample), row)
        if expression is not None or verdict.status != "ok":
            return grade_from_verdict(verdict, name)
        return grade_from_verdict(verdict, name, score=number_of(verdict.label))  # the number as given (the Grade clamps it)

    grade.__name__ = name
    return grade


# The two-block template a label_model or score_model rubric renders its (already filled) messages through.
_LABEL_MODEL_TEMPLATE = "{% block system %}{{ system_text }}{% endblock %}\n{% block user %}{{ user_text }}{% endblock %}\n"


def _model_grader_rubric(name: str, kind: str, spec: dict[str, Any]) -> Rubric:
    """The rubric an OpenAI label_model or score_model grader runs as: its messages rendered through _LABEL_MODEL_TEMPLATE
    (system and user text, and the media parts); ``spec`` adds how the reply is read."""
    return Rubric.model_validate({
        "name": name,
        "description": f"OpenAI {kind} grader",
        "template": "label_model.j2",
        "inline_template": _LABEL_MODEL_TEMPLATE,
        "variables": {"system_text": {"type": "str", "required": False}, "user_text": {"type": "str"},
                      "media": {"type": "media", "required": False}},
        **spec,
    })


def _message_parts(content: Any, sample: Sample, root: Path | None, media: list[Any]) -> str:
    """A message's text with its placeholders filled; its images and clips go to ``media``, marked in the text by position."""
    if isinstance(content, Mapping):  # one part on its own (the SDK: "either as a single item or an array of items")
        content = [content]
    if not isinstance(content, list):
        return fill_placeholders(str(content or ""), sample)
    pieces = []
    for part in content:
        if isinstance(part, str):
            pieces.append(fill_placeholders(part, sample))
            continue
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind in ("input_text", "output_text", "text"):
            pieces.append(fill_placeholders(str(part.get("text") or ""), sample))
        elif kind == "input_image":
            url = local_media(fill_placeholders(str(part.get("image_url") or ""), sample), root)
            media.append({"type": "input_image", "image_url": url, **({"detail": part["detail"]} if part.get("detail") else {})})
            pieces.append(f"[image {len(media)}]")
        elif kind == "input_audio":
            audio = dict(part.get("input_audio") or {})
            audio["data"] = fill_placeholders(str(audio.get("data") or ""), sample)
            media.append({"type": "input_audio", "input_audio": audio})
            pieces.append(f"[audio {len(media)}]")
        else:
            raise ValueError(f"a content part of type {kind!r} is not one of input_text, input_image, input_audio")
    return "\n".join(pieces)


def label_model_grader(judge: JudgeProtocol, messages: list[Mapping[str, Any]], labels: list[str], passing_labels: list[str], *,
                       name: str = "label_model", media_root: Path | None = None) -> Grader:
    """OpenAI's ``label_model`` grader, run locally: the judge picks one of ``labels`` (a JSON enum);
    a label in ``passing_labels`` scores 1, any other 0 (OpenAI's pass/fail of a label grader).

    Args:
        messages: OpenAI's ``input``: ``[{role, content}]`` whose content may use
            ``{{ sample.output_text }}`` and ``{{ item.<key> }}`` (gradekit's ``response`` and
            ``references.<key>`` too). System and developer messages become the system prompt;
            the others, in order, the user prompt (an assistant turn is marked as such). A content
            may be a list of parts (``input_text``, ``input_image`` with a URL, a data: URI or a path,
            ``input_audio``): the images and clips reach the judge as the chat API's content parts
            after the text, which marks each one's place (``[image 1]``).
        media_root: the folder a local image path is read from (the input's); a path outside it is refused.
    """
    if not labels or len(set(labels)) != len(labels):
        raise ValueError(f"label_model {name!r}: labels must be distinct and at least one")
    unknown = [p for p in passing_labels if p not in labels]
    if unknown or not passing_labels:
        raise ValueError(f"label_model {name!r}: passing_labels must be some of the labels; not labels: {unknown}")
    schema = {"type": "object", "properties": {"label": {"type": "string", "enum": list(labels)}}, "required": ["label"],
              "additionalProperties": False}
    rubric = _model_grader_rubric(name, "label_model", {
        "output": {"mode": "json_schema", "field": "label", "schema": schema, "rationale_field": None},
        "labels": {label: 1.0 if label in passing_labels else 0.0 for label in labels},
    })

    async def grade(sample: Sample) -> Grade:
        try:
            row = _model_grader_row(messages, sample, media_root)
        except (PlaceholderError, ValueError) as e:
            return Grade.failed("invalid", f"grader {name!r}: {e}", error_kind="input")
        verdict = await judge.judge(rubric, row)
        return grade_from_verdict(verdict, name)

    grade.__name__ = name
    return grade


def _model_grader_row(messages: list[Mapping[str, Any]], sample: Sample, media_root: Path | None, *,
                      system_suffix: str = "") -> dict[str, Any]:
    """The rubric row of a label_model or score_model: system and developer messages become the
    system prompt, the others (in order) the user prompt, an assistant turn marked as such.

    Raises:
        PlaceholderError, ValueError: a placeholder the sample lacks, a refused image path or part type.
    """
    system, user = [], []
    media: list[Any] = []
    for message in messages:
        text = _message_parts(message.get("content"), sample, media_root, media)
        role = message.get("role", "user")
        if role in ("system", "developer"):
            system.append(text)
        else:
            user.append(text if role == "user" else f"[{role}]\n{text}")
    if system_suffix:
        system.append(system_suffix)
    return {"system_text": "\n\n".join(system), "user_text": "\n\n".join(user), "media": media}


# OpenAI's score_model: the model replies with its reasoning steps and a number (the graders guide's
# output shape); the rubric's number output reads the number, checks its range and scores it.
_SCORE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "steps": {"type": "array", "items": {"type": "object", "properties": {"description": {"type": "string"},
                                                                                "conclusion": {"type": "string"}},
                                             "required": ["description", "conclusion"], "additionalProperties": False}},
        "result": {"type": "number"},  # the range is added per grader (minimum, maximum)
    },
    "required": ["steps", "result"],
    "additionalProperties": False,
}
# sampling_params as OpenAI's ScoreModelGrader names them -> the chat API's request fields.
_SAMPLING_FIELDS = {"temperature": "temperature", "top_p": "top_p", "seed": "seed", "reasoning_effort": "reasoning_effort",
                    "max_completions_tokens": "max_completion_tokens", "max_completion_tokens": "max_completion_tokens"}


def score_model_grader(judge: JudgeProtocol, messages: list[Mapping[str, Any]], *, range: tuple[float, float] = (0.0, 1.0),
                       sampling_params: Mapping[str, Any] | None = None, name: str = "score_model",
                       media_root: Path | None = None) -> Grader:
    """OpenAI's ``score_model`` grader, run locally: the judge replies ``{"steps": [...], "result": <number>}``
    with the number in ``range`` (default [0, 1]).

    A reply without a number, or a number outside ``range``, is an error grade (``parse_failure``),
    never a score: OpenAI's grader has no answer for it either, and a clamped number would read as a
    judgement. ``input`` messages are templated and carry images as label_model's do.

    Args:
        messages: OpenAI's ``input``: ``[{role, content}]``, content a string or a list of parts.
        range: [low, high]; the grade's ``raw_score`` metric holds the number as the judge gave it.
        sampling_params: OpenAI's (``temperature``, ``top_p``, ``seed``, ``max_completions_tokens``,
            ``reasoning_effort``), sent with every request of this grader.
        media_root: the folder a local image path is read from (the input's).
    """
    low, high = float(range[0]), float(range[1])
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise ValueError(f"score_model {name!r}: range must be [low, high] with low < high, got {list(range)}")
    sampling = {}
    for key, value in (sampling_params or {}).items():
        if key not in _SAMPLING_FIELDS:
            raise ValueError(f"score_model {name!r}: sampling_params.{key} is not one of {', '.join(sorted(_SAMPLING_FIELDS))}")
        if value is not None:
            sampling[_SAMPLING_FIELDS[key]] = value
    rubric = _model_grader_rubric(name, "score_model", {
        "output": {"mode": "number", "range": (low, high), "noun": "score_model's result", "field": "result", "rationale_field": None,
                   "schema": {**_SCORE_SCHEMA, "properties": {**_SCORE_SCHEMA["properties"],
                                                              "result": {"type": "number", "minimum": low, "maximum": high}}}},
        "sampling": sampling,
    })
    instruction = (f"Reply with a JSON object: \"steps\", your reasoning as a list of {{\"description\", \"conclusion\"}}, "
                   f"and \"result\", the score as one number from {low:g} to {high:g}.")

    async def grade(sample: Sample) -> Grade:
        try:
            row = _model_grader_row(messages, sample, media_root, system_suffix=instruction)
        except (PlaceholderError, ValueError) as e:
            return Grade.failed("invalid", f"grader {name!r}: {e}", error_kind="input")
        verdict = await judge.judge(rubric, row)
        grade = grade_from_verdict(verdict, name)
        if verdict.status != "ok":
            return grade
        return grade.model_copy(update={"metrics": {**grade.metrics, "raw_score": number_of(verdict.label)}})

    grade.__name__ = name
    return grade
