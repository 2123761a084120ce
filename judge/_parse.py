"""Read a judge's reply: the one reader of completions (:func:`read_completion`) and the label parser under it.

A label is read guarded against planted and never-offered verdicts.

One rule for every output mode: a reply whose verdicts (each ``<tag>``, each regex match, each
verdict key of a JSON reply) name one label gives that label, however often it is repeated; a
reply that names two different ones is a parse failure (``ambiguous_verdict``), never a score.
"Last match wins" let a verdict planted in the graded text and quoted by the judge after its own
verdict decide the score; no order of reading tells a quote from an answer, so neither wins.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, StrictFloat, StrictInt, StrictStr, ValidationError, create_model

from ._criteria import (ChecklistUnread, Criterion, CriterionVerdict, as_written, criteria_of, json_entries_in, read_json_verdicts,
                        row_score)
from ._normalize import normalize_label
from ._rubric import AskMode, Rubric
from ._thinking import read_message
from ._verdict import clamp


@dataclass(frozen=True)
class Parsed:
    """A successful read: the canonical label, its score and the judge's reasoning.

    A checklist (judge._checklist) has no one label: ``criteria`` holds each criterion's verdict
    and ``score`` their weighted mean.
    """

    label: str | None
    score: float
    rationale: str | None
    problem: str | None = None  # a number output whose number is refused (not a number, out of range): an error, not re-asked
    criteria: tuple[CriterionVerdict, ...] | None = None


class ParseFailure(ValueError):
    """The reply holds no offered label. ``kind`` is "parse_failure" unless refined by the caller.

    ``reason`` names a failure a caller may count apart (``"ambiguous_verdict"``); None otherwise.
    ``criteria``: a checklist's verdicts as read, kept on the row's error (how many were read).
    """

    kind = "parse_failure"
    reason: str | None = None
    criteria: tuple[CriterionVerdict, ...] | None = None


class AmbiguousVerdict(ParseFailure):
    """The reply names two or more different verdicts: one may be quoted from the graded text."""

    reason = "ambiguous_verdict"

    def __init__(self, verdicts: list[str], what: str) -> None:
        self.verdicts = tuple(verdicts)
        seen = ", ".join(repr(v[:60]) for v in verdicts)
        super().__init__(f"ambiguous_verdict: {what} ({seen}); one may be quoted from the graded text, so none is taken")


class EchoedVerdict(ParseFailure):
    """The reply's JSON is JSON the prompt itself holds (a graded answer's planted verdict, the instructions'
    example), copied whole: the judge gave no verdict of its own, so none is taken."""

    reason = "echoed_json"


def _distinct(rubric: Rubric, answers: list[str]) -> list[str]:
    """The different verdicts among ``answers``, in order of first appearance.

    Two answers are one verdict when they name the same offered label ("Yes", "**YES**") or,
    for text outside the labels, fold to the same key; blank answers are no verdict at all.
    """
    seen: dict[str, str] = {}
    for answer in answers:
        matched = match_label(rubric, answer)
        key = f"label:{matched[0]}" if matched is not None else f"text:{normalize_label(answer)}"
        if matched is None and key == "text:":
            continue
        seen.setdefault(key, matched[0] if matched is not None else answer.strip())
    return list(seen.values())


def _one_verdict(rubric: Rubric, answers: list[str], where: str) -> str:
    """The single verdict of ``answers`` (the last spelling of it), or AmbiguousVerdict."""
    distinct = _distinct(rubric, answers)
    if len(distinct) > 1:
        raise AmbiguousVerdict(distinct, f"the reply holds {len(distinct)} different verdicts {where}")
    non_blank = [a for a in answers if normalize_label(a)]
    return (non_blank or answers)[-1]


# A menu of labels ("<answer>Yes</answer> or <answer>No</answer>", "Output (a) or Output (b)",
# “正确”或“错误”) is the rubric's instruction quoted back, not a verdict. Only a connector may sit
# between its items, on one line and without quote marks, so a judge's own verdict followed by
# quoted graded text ("...</answer>\n\nThe response says: <answer>Yes</answer>") is never a menu.
_CONNECTOR = re.compile(r"[ \t]*(?:,|/|\||、|，|or|nor|vs\.?|versus|或者?|还是)[ \t]*", re.IGNORECASE)


def _drop_menus(rubric: Rubric, found: list[tuple[int, int, str]], text: str) -> list[tuple[int, int, str]]:
    """``found`` (start, end, answer) without the runs of connector-joined occurrences naming two or more labels."""
    kept: list[tuple[int, int, str]] = []
    run: list[tuple[int, int, str]] = []

    def flush() -> None:
        if len(run) > 1 and len(_distinct(rubric, [a for _, _, a in run])) > 1:
            return
        kept.extend(run)

    for item in found:
        if run and _CONNECTOR.fullmatch(text, run[-1][1], item[0]):
            run.append(item)
            continue
        flush()
        run = [item]
    flush()
    return kept


def _tags(text: str, tag: str) -> list[tuple[int, int, str]]:
    pattern = rf"<\s*{re.escape(tag)}\s*>(.*?)<\s*/\s*{re.escape(tag)}\s*>"
    return [(m.start(), m.end(), m.group(1)) for m in re.finditer(pattern, text, re.DOTALL | re.IGNORECASE)]


def _regex(text: str, pattern: str) -> list[tuple[int, int, str]]:
    """Every match as (start, end, label): group "label", else group 1, else the whole match."""
    found = []
    for m in re.finditer(pattern, text, re.DOTALL):
        group: int | str = "label" if "label" in m.re.groupindex else (1 if m.re.groups else 0)
        found.append((m.start(), m.end(), m.group(group) or ""))
    return found


# --- JSON replies -------------------------------------------------------------------------------

_FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.DOTALL)


@functools.lru_cache(maxsize=128)
def _key_pattern(field: str) -> re.Pattern[str]:
    """``"field": "value"`` written as JSON outside a string (a quote inside a JSON string is escaped)."""
    return re.compile(rf'(?<!\\)"{re.escape(field)}"\s*:\s*"((?:[^"\\\n]|\\.)*)"')


# A key with a \u escape in it (``"judg\u0065ment":``), which the key count on the raw text would miss; escapes in
# values (a CJK label written as \u6b63\u786e) leave the fast path open.
_ESCAPED_KEY = re.compile(r'"(?:[^"\\]|\\.)*\\u[0-9a-fA-F]{4}(?:[^"\\]|\\.)*"\s*:')


@functools.lru_cache(maxsize=128)
def _key_only(field: str) -> re.Pattern[str]:
    """``"field":`` as a key, whatever its value."""
    return re.compile(rf'(?<!\\)"{re.escape(field)}"\s*:')


@dataclass
class _Found:
    """Every value of the verdict key a reply writes as JSON, and how often one object repeats the key."""

    values: list[Any]
    most_in_one_object: int = 0


def _decode(text: str, start: int, field: str, found: _Found) -> tuple[Any, int]:
    """One JSON value from ``start`` and where it ends; its verdict keys are added to ``found``.

    The pairs hook sees each key as written, so a duplicated key (which ``json``/``orjson`` resolve
    silently to its last value) and a verdict key inside a nested object are both counted.
    """

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        mine = [v for k, v in pairs if k == field]
        found.values.extend(mine)
        found.most_in_one_object = max(found.most_in_one_object, len(mine))
        return dict(pairs)

    return json.JSONDecoder(object_pairs_hook=hook).raw_decode(text, start)


def _json_reply(text: str, field: str) -> tuple[dict[str, Any], _Found]:
    """The reply's verdict object and every verdict value the reply writes as JSON.

    The reply is the whole text, a fenced block, or objects inside prose. Every complete object
    counts, and so does ``"field": "value"`` outside them (a malformed object of the judge's own
    beside a complete quoted one), so that a JSON reply is one object whose verdict key appears once.
    """
    text = text.strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1)
    try:
        value = orjson.loads(text)  # the fast path: one object, its verdict key written once
    except orjson.JSONDecodeError:
        value = None
    else:
        if not isinstance(value, dict):
            raise ParseFailure("reply is not a JSON object")
        if ("\\u" not in text or _ESCAPED_KEY.search(text) is None) and len(_key_only(field).findall(text)) <= 1:
            return value, _Found([value[field]] if field in value else [], int(field in value))
        found = _Found([])
        value, _ = _decode(text, 0, field, found)  # a repeated or escaped key: count the keys as written
        return value, found
    objects: list[dict[str, Any]] = []
    found = _Found([])
    outside: list[str] = []
    position = 0
    for brace in re.finditer(r"\{", text):
        if brace.start() < position:
            continue  # inside an object already read
        try:
            candidate, end = _decode(text, brace.start(), field, found)
        except json.JSONDecodeError:
            continue
        outside.append(text[position:brace.start()])
        position = end
        objects.append(candidate)
    outside.append(text[position:])
    for gap in outside:
        for raw in _key_pattern(field).findall(gap):
            try:
                found.values.append(json.loads(f'"{raw}"'))
            except json.JSONDecodeError:
                found.values.append(raw)
    if not objects:
        raise ParseFailure("reply is not a JSON object")
    with_field = [o for o in objects if field in o]
    return (with_field or objects)[-1], found


@functools.lru_cache(maxsize=128)
def _verdict_model(field: str, rationale_field: str | None) -> type[BaseModel]:
    # A number is a verdict too (a score_model's ``result``): read as its JSON text, never coerced from a bool.
    fields: dict[str, Any] = {field: (StrictStr | StrictInt | StrictFloat, ...)}
    if rationale_field and rationale_field != field:
        fields[rationale_field] = (str | None, None)
    return create_model("JudgeVerdict", __config__=ConfigDict(extra="allow"), **fields)


def match_label(rubric: Rubric, answer: str) -> tuple[str, float] | None:
    """Exact match after normalisation, only against the labels this rubric offers."""
    key = normalize_label(answer)
    for label, score in rubric.labels.items():
        if normalize_label(label) == key:
            return label, score
    return None


def parse_reply(rubric: Rubric, content: str | None, mode: AskMode, tool_arguments: str | None = None, *,
                data: str | None = None) -> Parsed:
    """Turn one reply into a label and score, or raise ParseFailure saying why.

    A reply naming two different verdicts raises :class:`AmbiguousVerdict` (a ParseFailure whose
    ``reason`` is ``"ambiguous_verdict"``): the judge re-asks as for any parse failure. ``data``: the
    text the row brought (judge._checklist.row_text), where a checklist's planted verdicts are looked for.
    """
    if rubric.is_checklist:
        return _parse_checklist(rubric, content, mode, tool_arguments, data)
    rationale: str | None = None
    out = rubric.output
    if mode in ("json_schema", "json_object", "tool"):
        assert out.field is not None
        source = tool_arguments if mode == "tool" else content
        if not source:
            raise ParseFailure("empty reply")
        obj, found = _json_reply(source, out.field)
        texts = [v if isinstance(v, str) else json.dumps(v, ensure_ascii=False) for v in found.values]
        if found.most_in_one_object > 1:
            # JSON parsers disagree on which duplicate wins (json and orjson take the last): never choose.
            raise AmbiguousVerdict(_distinct(rubric, texts) or texts,
                                   f"the key {out.field!r} appears {found.most_in_one_object} times in one JSON object")
        distinct = _distinct(rubric, texts)
        if len(distinct) > 1:
            raise AmbiguousVerdict(distinct, f"the reply holds {len(distinct)} different verdicts under the key {out.field!r}")
        try:
            verdict = _verdict_model(out.field, out.rationale_field).model_validate(obj)
        except ValidationError as e:
            raise ParseFailure(f"JSON verdict lacks a string or number {out.field!r}: {e.errors()[0]['msg']}") from e
        answer = getattr(verdict, out.field)
        if not isinstance(answer, str):
            answer = json.dumps(answer)
        if out.rationale_field and out.rationale_field != out.field:
            rationale = getattr(verdict, out.rationale_field, None)
    else:
        if not content or not content.strip():
            raise ParseFailure("empty reply")
        if mode == "tags" or out.mode == "tags":
            tag = rubric.verdict_tag
            occurrences = _drop_menus(rubric, _tags(content, tag), content)
            if not occurrences:
                raise ParseFailure(f"no <{tag}>…</{tag}> in the reply")
            answer = _one_verdict(rubric, [a for _, _, a in occurrences], f"in <{tag}> tags")
            if out.rationale_field:
                quoted = _tags(content, out.rationale_field)
                rationale = quoted[-1][2] if quoted else None
            if rationale is None:
                rationale = content[: content.lower().rfind(f"<{tag.lower()}")].strip() or None
        elif out.mode == "regex" or (out.mode == "number" and out.pattern is not None):
            assert out.pattern is not None
            occurrences = _drop_menus(rubric, _regex(content, out.pattern), content)
            if not occurrences:
                raise ParseFailure(f"pattern {out.pattern!r} does not match the reply")
            answer = _one_verdict(rubric, [a for _, _, a in occurrences], "matching the rubric's pattern")
            rationale = content.strip()
        else:  # text: the whole reply is the verdict
            answer = content
    if out.mode == "number":
        score, problem = number_score(rubric, answer.strip())
        return Parsed(label=answer.strip(), score=score, rationale=rationale, problem=problem)
    matched = match_label(rubric, answer)
    if matched is not None:
        return Parsed(label=matched[0], score=matched[1], rationale=rationale)
    if rubric.unmatched == "error":
        offered = ", ".join(repr(label) for label in rubric.labels)
        raise ParseFailure(f"verdict {answer.strip()[:80]!r} is not one of the offered labels ({offered})")
    return Parsed(label=answer.strip(), score=float(rubric.unmatched), rationale=rationale)


# --- a checklist: one verdict per criterion (judge._checklist, judge._criteria) ------------------


def _criterion(c: Criterion, **fields: Any) -> CriterionVerdict:
    return CriterionVerdict(id=c.id, weight=c.weight, required=c.required, **fields)


def _match_labels(labels: Mapping[str, float], answer: str) -> tuple[str, float] | None:
    key = normalize_label(answer)
    return next(((label, score) for label, score in labels.items() if normalize_label(label) == key), None)


def planted_verdicts(criteria: Sequence[Criterion], data: str | None) -> dict[str, set[tuple[str, str]]]:
    """The verdicts the row itself writes for each criterion (``{"c4": "yes"}``, ``<c4>yes</c4>``), as written
    (:func:`~judge._criteria.as_written`): a reply's verdict written the same way may be a quote of it."""
    if not data:
        return {}
    ids = {c.id for c in criteria}
    found: dict[str, set[tuple[str, str]]] = {}
    for key, value in json_entries_in(data, ids):
        found.setdefault(key, set()).add(as_written(value))
    for c in criteria:
        for _, _, answer in _tags(data, c.id):
            found.setdefault(c.id, set()).add(as_written(answer))
    return found


def _checklist_tags(criteria: list[Criterion], rubric: Rubric, text: str,
                    planted: Mapping[str, set[tuple[str, str]]] | None = None) -> list[CriterionVerdict]:
    out = []
    for c in criteria:
        offered = c.offered(rubric.labels)
        shim = rubric.model_copy(update={"labels": offered})  # the label guards read rubric.labels
        found = _drop_menus(shim, _tags(text, c.id), text)
        if not found:
            out.append(_criterion(c, status="error", error=f"missing: the reply has no <{c.id}>…</{c.id}>"))
            continue
        try:
            answer = _one_verdict(shim, [a for _, _, a in found], f"in <{c.id}> tags")
        except AmbiguousVerdict as e:
            out.append(_criterion(c, status="error", error=f"duplicate: {e}"))
            continue
        if planted and as_written(answer) in planted.get(c.id, ()):
            out.append(_criterion(c, status="error", error=f"planted: the graded row itself holds <{c.id}>{answer.strip()[:60]}</{c.id}>; "
                                                            "the judge's may be a quote of it, so none is taken"))
            continue
        matched = _match_labels(offered, answer)
        if matched is None:
            out.append(_criterion(c, status="error",
                                error=f"unparseable: {answer.strip()[:60]!r} is not one of its labels ({', '.join(map(repr, offered))})"))
            continue
        out.append(_criterion(c, status="ok", label=matched[0], score=matched[1]))
    return out


def _parse_checklist(rubric: Rubric, content: str | None, mode: AskMode, tool_arguments: str | None = None,
                     data: str | None = None) -> Parsed:
    """A checklist reply -> a Parsed whose ``criteria`` hold one verdict per criterion, or ParseFailure.

    The row fails (ParseFailure, carrying the criteria as read) when the reply is empty or holds
    nothing readable, when no criterion was read or fewer than the rubric's ``min_criteria_read``
    share, or when a required criterion is in error; otherwise its score is the weighted mean over
    the criteria read. A criterion whose verdict the row itself writes (``data``) is in error.
    """
    criteria = criteria_of(rubric)
    if not criteria:
        raise ParseFailure("the checklist has no criteria for this row")
    source = tool_arguments if mode == "tool" else content
    if not source or not source.strip():
        raise ParseFailure("empty reply")
    planted = planted_verdicts(criteria, data)
    if mode in ("json_schema", "json_object", "tool"):
        try:
            verdicts = read_json_verdicts(criteria, rubric.labels, source, planted)
        except ChecklistUnread as e:
            raise ParseFailure(str(e)) from None
    else:
        verdicts = _checklist_tags(criteria, rubric, source, planted)

    def failure(message: str) -> ParseFailure:
        failed = ParseFailure(message)
        failed.criteria = tuple(verdicts)
        return failed

    failed_required = [v for v in verdicts if v.required and v.status != "ok"]
    if failed_required:
        raise failure("; ".join(f"required criterion {v.id!r}: {v.error}" for v in failed_required))
    score = row_score(verdicts)
    if score is None:
        raise failure("no criterion could be read: " + "; ".join(f"{v.id}: {v.error}" for v in verdicts[:5]))
    read = sum(v.status == "ok" for v in verdicts)
    if read < rubric.min_criteria_read * len(verdicts):
        # A judge that answers 1 of 10 has not judged the row: a weighted mean of that one is no score of it.
        unread = [v for v in verdicts if v.status != "ok"]
        raise failure(f"only {read} of {len(verdicts)} criteria read (criteria_read {read}), under the rubric's min_criteria_read "
                      f"({rubric.min_criteria_read:g}); not read: {', '.join(v.id for v in unread[:10])}"
                      f"{', ...' if len(unread) > 10 else ''} (e.g. {unread[0].id}: {unread[0].error})")
    return Parsed(label=None, score=score, rationale=None, criteria=tuple(verdicts))


# --- a completion: its final answer read into a Reading, or why it gives none ------------------


@dataclass(frozen=True)
class Reading:
    """A completion's verdict (label and score) and what a Verdict shows beside it."""

    label: str | None  # None for a checklist: its verdicts are in ``criteria``
    score: float
    rationale: str | None
    raw: str | None  # the reply's text (or its tool call's arguments)
    thinking: str | None  # set apart from the answer, never read for the verdict
    score_source: str | None = None  # with logprobs: "logprobs" or why the label's own score was used
    problem: str | None = None  # a number output's number refused (Parsed.problem): the verdict is a parse_failure
    criteria: tuple[CriterionVerdict, ...] | None = None  # a checklist: one verdict per criterion

    def verdict_fields(self) -> dict[str, Any]:
        """The Verdict fields of this reading, status included (``reasoning`` is the caller's: it keeps it, or not)."""
        if self.problem is not None:
            return {"status": "error", "error_kind": "parse_failure", "error": self.problem, "label": self.label,
                    "rationale": self.rationale, "raw": self.raw}
        fields: dict[str, Any] = {"status": "ok", "label": self.label, "score": self.score, "rationale": self.rationale, "raw": self.raw}
        if self.score_source is not None:
            fields["score_source"] = self.score_source
        if self.criteria is not None:
            fields["criteria"] = list(self.criteria)
        return fields


@dataclass(frozen=True)
class Unread:
    """A completion that gives no verdict. ``kind``: ``refusal`` (deterministic: never re-asked),
    ``truncated`` (the same limit cuts the same reply off again: no re-ask) or ``parse_failure``."""

    kind: Literal["refusal", "truncated", "parse_failure"]
    error: str
    raw: str | None
    thinking: str | None
    criteria: tuple[CriterionVerdict, ...] | None = None  # a checklist's verdicts as read (how many were)


class _Refused(Exception):
    pass


def read_completion(rubric: Rubric, completion: Mapping[str, Any], mode: AskMode, *, logprobs: bool = False,
                    prompt: Sequence[Mapping[str, Any]] | None = None, data: str | None = None) -> Reading | Unread:
    """The one reader of replies: a chat completion and the rubric it answers -> a Reading or an Unread.

    The verdict is read from the final answer only (the thinking is set apart first), in the ask
    mode the request used; ``logprobs`` scores G-Eval style where the reply carries them. With the
    request's ``prompt`` (its messages), a JSON reply that only repeats a JSON object of the prompt
    (a verdict planted in the graded answer, copied whole) is a parse_failure (``echoed_json``). With
    ``data`` (the text a checklist row brought), a criterion's verdict the row itself writes is not taken.
    """
    try:
        parsed, thinking = _read(rubric, completion, mode, prompt, data)
    except _Refused as refusal:
        return Unread("refusal", str(refusal), raw_text(completion), reasoning_of(completion))
    except ParseFailure as failure:
        kind: Literal["truncated", "parse_failure"] = "truncated" if getattr(failure, "kind", "") == "truncated" else "parse_failure"
        return Unread(kind, str(failure), raw_text(completion), reasoning_of(completion), failure.criteria)
    score, source = parsed.score, None
    # A number's score is the number, not a label's weight; a checklist has no one label to weigh.
    if logprobs and rubric.output.mode != "number" and parsed.label is not None:
        weighted, source = logprob_score(rubric, completion, parsed.label)
        score = parsed.score if weighted is None else weighted
    return Reading(parsed.label, score, parsed.rationale, raw_text(completion), thinking, source, parsed.problem, criteria=parsed.criteria)


def _read(rubric: Rubric, completion: Mapping[str, Any], mode: AskMode,
          prompt: Sequence[Mapping[str, Any]] | None = None, data: str | None = None) -> tuple[Parsed, str | None]:
    """The verdict of a completion, read from its final answer only, and the thinking set apart from it."""
    choice = (completion.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    finish_reason = choice.get("finish_reason")
    if message.get("refusal"):
        raise _Refused(f"the judge refused: {message['refusal']}")
    if finish_reason == "content_filter":
        raise _Refused("the judge's reply was withheld by a content filter")
    tool_args = None
    if mode == "tool":
        calls = message.get("tool_calls") or []
        tool_args = calls[0]["function"]["arguments"] if calls else None
    reply = read_message(message)
    if reply.thought and not (reply.answer or "").strip() and not tool_args:
        # A thinking model stopped before its answer: the draft in its thinking is not a verdict.
        raise _truncated(f"the reply has no final answer after its thinking (finish_reason={finish_reason}); "
                         "raise `params.max_completion_tokens` (or lower `params.reasoning_effort`)")
    if finish_reason == "length" and mode != "text":
        # Cut off by the token limit: whatever verdict it holds may be a draft or a quote, not the answer.
        detail = "raise `params.max_completion_tokens`" if reply.thought else "raise max_tokens (`params.max_completion_tokens`)"
        raise _truncated(f"reply cut off at the token limit (finish_reason=length); {detail}")
    try:
        parsed = parse_reply(rubric, reply.answer, mode, tool_args, data=data)
        if prompt and mode in ("json_schema", "json_object", "tool") and not rubric.is_checklist:
            _refuse_echo(rubric, tool_args if mode == "tool" else reply.answer, prompt)
        return parsed, reply.thinking
    except ParseFailure as failure:
        if finish_reason == "length":
            raise _truncated(f"reply cut off at max_tokens (finish_reason=length): {failure}") from failure
        raise


def _prompt_text(prompt: Sequence[Mapping[str, Any]]) -> str:
    parts: list[str] = []
    for message in prompt:
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return "\n".join(parts)


def _objects_in(text: str) -> list[dict[str, Any]]:
    """Every JSON object written in ``text``, nested ones included (control characters inside strings allowed:
    a row's text may hold a raw newline in what it means as JSON, and a judge copies it back escaped)."""
    decoder = json.JSONDecoder(strict=False)
    found: list[dict[str, Any]] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            found.append(value)
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    for brace in re.finditer(r"\{", text):
        try:
            value, _ = decoder.raw_decode(text, brace.start())
        except json.JSONDecodeError:
            continue
        walk(value)
    return found


def _refuse_echo(rubric: Rubric, source: str | None, prompt: Sequence[Mapping[str, Any]]) -> None:
    """Raise EchoedVerdict when the reply's verdict object is one the prompt already holds.

    Only an object with more than its verdict key (a rationale, a score) can be told apart: two judges
    agreeing on ``{"judgement": "正确"}`` write the same object, but no judge writes another's rationale
    word for word. Cheap when the prompt never writes the verdict key, as almost every prompt does not.
    """
    field = rubric.output.field
    text = _prompt_text(prompt)
    if not source or not field or f'"{field}"' not in text:
        return
    try:
        obj, _ = _json_reply(source, field)
    except ParseFailure:
        return
    if len(obj) < 2 or field not in obj:
        return
    if any(_copied(obj, planted) for planted in _objects_in(text)):
        raise EchoedVerdict(f"echoed_json: the reply only repeats a JSON object the prompt itself holds "
                            f"({json.dumps(obj, ensure_ascii=False)[:80]}), with no verdict of its own; none is taken")


def _same_text(value: Any) -> Any:
    """A JSON value as compared for a copy: strings with their whitespace runs folded (a judge that copies
    ``"…相同。  "`` writes ``"…相同。"``), everything else as it is."""
    if isinstance(value, str):
        return " ".join(value.split())
    if isinstance(value, dict):
        return {k: _same_text(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_same_text(v) for v in value]
    return value


def _copied(reply: Mapping[str, Any], planted: Mapping[str, Any]) -> bool:
    """Whether every key of the reply's object holds what the planted object holds there: the reply is the
    planted object, or the part of it a strict schema lets through (a planted object with a key the schema
    has not, copied into the schema's keys, is still a copy)."""
    return all(key in planted and _same_text(planted[key]) == _same_text(value) for key, value in reply.items())


def _truncated(message: str) -> ParseFailure:
    failure = ParseFailure(message)
    failure.kind = "truncated"
    return failure


def reasoning_of(completion: Mapping[str, Any]) -> str | None:
    """The thinking of a completion (a reasoning field or an inline ``<think>`` block), or None."""
    choice = (completion.get("choices") or [{}])[0]
    return read_message(choice.get("message") or {}).thinking


def raw_text(completion: Mapping[str, Any]) -> str | None:
    """The reply's text, or the arguments of its (first) tool call."""
    choice = (completion.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    if message.get("tool_calls"):
        return message["tool_calls"][0]["function"]["arguments"]
    return message.get("content")


_MIN_PROB = 0.01  # alternatives below 1% are noise, not a judgement


def logprob_score(rubric: Rubric, completion: Mapping[str, Any], label: str) -> tuple[float | None, str]:
    """G-Eval-style score: the probability-weighted mean of label scores at the verdict token.

    The verdict is the last occurrence of the parsed label in the reply (searching from the end,
    so a label word in earlier reasoning is never taken); its verdict token is the first token
    of that occurrence after which only one offered label is still possible ("a" in
    "Output (a)"). Alternatives there at or above 1% that name exactly one label carry that
    label's probability mass; the score is the mass-weighted mean of the label scores.
    """
    choice = (completion.get("choices") or [{}])[0]
    tokens = ((choice.get("logprobs") or {}).get("content")) or []
    if not tokens:
        return None, "label_no_logprobs"
    texts = [str(t.get("token") or "").lower() for t in tokens]
    full = "".join(texts)
    target = label.lower()
    begin = full.rfind(target)
    if begin < 0:
        return None, "label_no_verdict_token"
    offered = {name: name.lower() for name in rubric.labels}
    position = 0
    for token, text in zip(tokens, texts):
        start, position = position, position + len(text)
        if position <= begin:
            continue
        if start >= begin + len(target):
            break
        written = full[begin:start] if start > begin else ""  # the label's characters before this token
        lead = full[start:begin] if start < begin else ""  # e.g. the space or quote in ' "correct'
        if sum(v.startswith(written) for v in offered.values()) < 2:
            break  # the label was decided by an earlier token that did not name it alone
        if _names(offered, written, lead, text) != label:
            continue
        mass: dict[str, float] = {}
        for alt in token.get("top_logprobs") or [token]:
            p = math.exp(float(alt.get("logprob", -math.inf)))
            named = _names(offered, written, lead, str(alt.get("token") or "").lower())
            if named is not None and p >= _MIN_PROB:
                mass[named] = mass.get(named, 0.0) + p
        total = sum(mass.values())
        if total <= 0:  # even the chosen token was below 1%: no distribution worth weighting
            break
        return clamp(sum(p * rubric.labels[name] for name, p in mass.items()) / total), "logprobs"
    return None, "label_no_verdict_token"


def _names(offered: Mapping[str, str], written: str, lead: str, text: str) -> str | None:
    """The one label that ``written`` + this token's text spells (fully or as a unique start)."""
    if lead:
        text = text[len(lead):] if text.startswith(lead) else text.lstrip(" \t\n\"'*`:")
    if not text:
        return None
    spelled = written + text
    # The token may run past the label ("a)." after "Output ("): spelled then starts with it.
    named = [name for name, low in offered.items() if low.startswith(spelled) or spelled.startswith(low)]
    return named[0] if len(named) == 1 else None


# --- number outputs -------------------------------------------------------------------------------


def number_score(rubric: Rubric, text: str) -> tuple[float, str | None]:
    """A number output's score and, when the number is refused, why (the reply stays readable: no re-ask).

    The score is the number itself when the rubric's range lies in [-1, 1] (clamped there without a
    range), else the number rescaled to 0..1 over the range.
    """
    out = rubric.output
    try:
        value = float(text.strip())
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        return 0.0, f"the {out.noun} {text!r} is not a number"
    if out.range is None:
        return clamp(value), None
    low, high = out.range
    if not low <= value <= high:
        return 0.0, f"the {out.noun} {value:g} is outside its range [{low:g}, {high:g}]"
    return score_in_range(value, low, high), None


def score_in_range(raw: float, low: float, high: float) -> float:
    """A number in [low, high] as a score: as it is when the range lies in [-1, 1], else rescaled to 0..1."""
    if -1.0 <= low and high <= 1.0:
        return raw
    return (raw - low) / (high - low)


def number_of(label: str | None) -> float | None:
    """The number a number output's verdict gives (its label, a finite number once read), or None."""
    try:
        value = float((label or "").strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _one_number(raw: str | None, field: str) -> str | None:
    """The one number a reply that missed the schema still gives: the whole reply (``7``, ``"0.8"``),
    or an object's ``field`` or ``score``. None when there is no such single number."""
    text = (raw or "").strip().strip("`").strip()
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if isinstance(value, dict):
        value = value.get(field, value.get("score"))
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return json.dumps(value)


def read_missed_schema(rubric: Rubric, unread: Unread) -> Reading | None:
    """A number asked for as JSON whose last reply missed the schema (a parse_failure once the re-asks are
    spent) but still gives one number: that number's Reading (not cached: the reply is not the schema's)."""
    out = rubric.output
    if out.mode != "number" or out.field is None or unread.kind != "parse_failure":
        return None
    text = _one_number(unread.raw, out.field)
    if text is None:
        return None
    score, problem = number_score(rubric, text)
    return Reading(text, score, None, unread.raw, unread.thinking, problem=problem)
