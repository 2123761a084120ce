"""Read a label out of a judge's reply, guarded against planted and never-offered verdicts.

One rule for every output mode: a reply whose verdicts (each ``<tag>``, each regex match, each
verdict key of a JSON reply) name one label gives that label, however often it is repeated; a
reply that names two different ones is a parse failure (``ambiguous_verdict``), never a score.
"Last match wins" let a verdict planted in the graded text and quoted by the judge after its own
verdict decide the score; no order of reading tells a quote from an answer, so neither wins.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, StrictFloat, StrictInt, StrictStr, ValidationError, create_model

from ._normalize import normalize_label
from ._rubric import AskMode, Rubric


@dataclass(frozen=True)
class Parsed:
    """A successful read: the canonical label, its score and the judge's reasoning."""

    label: str
    score: float
    rationale: str | None


class ParseFailure(ValueError):
    """The reply holds no offered label. ``kind`` is "parse_failure" unless refined by the caller.

    ``reason`` names a failure a caller may count apart (``"ambiguous_verdict"``); None otherwise.
    """

    kind = "parse_failure"
    reason: str | None = None


class AmbiguousVerdict(ParseFailure):
    """The reply names two or more different verdicts: one may be quoted from the graded text."""

    reason = "ambiguous_verdict"

    def __init__(self, verdicts: list[str], what: str) -> None:
        self.verdicts = tuple(verdicts)
        seen = ", ".join(repr(v[:60]) for v in verdicts)
        super().__init__(f"ambiguous_verdict: {what} ({seen}); one may be quoted from the graded text, so none is taken")


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
        if "\\u" not in text and len(_key_only(field).findall(text)) <= 1:
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


def parse_reply(rubric: Rubric, content: str | None, mode: AskMode, tool_arguments: str | None = None) -> Parsed:
    """Turn one reply into a label and score, or raise ParseFailure saying why.

    A reply naming two different verdicts raises :class:`AmbiguousVerdict` (a ParseFailure whose
    ``reason`` is ``"ambiguous_verdict"``): the judge re-asks as for any parse failure.
    """
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
        elif out.mode == "regex":
            assert out.pattern is not None
            occurrences = _drop_menus(rubric, _regex(content, out.pattern), content)
            if not occurrences:
                raise ParseFailure(f"pattern {out.pattern!r} does not match the reply")
            answer = _one_verdict(rubric, [a for _, _, a in occurrences], "matching the rubric's pattern")
            rationale = content.strip()
        else:  # text: the whole reply is the verdict
            answer = content
    matched = match_label(rubric, answer)
    if matched is not None:
        return Parsed(label=matched[0], score=matched[1], rationale=rationale)
    if rubric.unmatched == "error":
        offered = ", ".join(repr(label) for label in rubric.labels)
        raise ParseFailure(f"verdict {answer.strip()[:80]!r} is not one of the offered labels ({offered})")
    return Parsed(label=answer.strip(), score=float(rubric.unmatched), rationale=rationale)
