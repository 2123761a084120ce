"""Read a label out of a judge's reply, guarded against planted and never-offered verdicts."""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from ._normalize import normalize_label
from ._rubric import AskMode, Rubric


@dataclass(frozen=True)
class Parsed:
    """A successful read: the canonical label, its score and the judge's reasoning."""

    label: str
    score: float
    rationale: str | None


class ParseFailure(ValueError):
    """The reply holds no offered label. ``kind`` is "parse_failure" unless refined by the caller."""

    kind = "parse_failure"


_FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.DOTALL)


def _json_object(text: str) -> dict[str, Any]:
    """The reply's JSON object: the whole text, a fenced block, or else the last object in prose."""
    text = text.strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1)
    try:
        value = orjson.loads(text)  # the fast path; the standard library below finds an object inside prose
    except orjson.JSONDecodeError:
        value = None
        decoder = json.JSONDecoder()
        # Scan from the end: the last complete object is the verdict, an earlier one may be quoted.
        for start in reversed([m.start() for m in re.finditer(r"\{", text)]):
            try:
                candidate, _ = decoder.raw_decode(text, start)
            except json.JSONDecodeError:
                continue
            if isinstance(candidate, dict):
                value = candidate
                break
    if not isinstance(value, dict):
        raise ParseFailure("reply is not a JSON object")
    return value


@functools.lru_cache(maxsize=128)
def _verdict_model(field: str, rationale_field: str | None) -> type[BaseModel]:
    fields: dict[str, Any] = {field: (str, ...)}
    if rationale_field and rationale_field != field:
        fields[rationale_field] = (str | None, None)
    return create_model("JudgeVerdict", __config__=ConfigDict(extra="allow"), **fields)


def _last_tag(text: str, tag: str) -> str | None:
    matches = re.findall(rf"<\s*{re.escape(tag)}\s*>(.*?)<\s*/\s*{re.escape(tag)}\s*>", text, re.DOTALL | re.IGNORECASE)
    return matches[-1] if matches else None


def _last_regex(text: str, pattern: str) -> str | None:
    last = None
    for last in re.finditer(pattern, text, re.DOTALL):
        pass
    if last is None:
        return None
    if "label" in last.re.groupindex:
        return last.group("label")
    return last.group(1) if last.re.groups else last.group(0)


def match_label(rubric: Rubric, answer: str) -> tuple[str, float] | None:
    """Exact match after normalisation, only against the labels this rubric offers."""
    key = normalize_label(answer)
    for label, score in rubric.labels.items():
        if normalize_label(label) == key:
            return label, score
    return None


def parse_reply(rubric: Rubric, content: str | None, mode: AskMode, tool_arguments: str | None = None) -> Parsed:
    """Turn one reply into a label and score, or raise ParseFailure saying why."""
    rationale: str | None = None
    out = rubric.output
    if mode in ("json_schema", "json_object", "tool"):
        assert out.field is not None
        source = tool_arguments if mode == "tool" else content
        if not source:
            raise ParseFailure("empty reply")
        obj = _json_object(source)
        try:
            verdict = _verdict_model(out.field, out.rationale_field).model_validate(obj)
        except ValidationError as e:
            raise ParseFailure(f"JSON verdict lacks a string {out.field!r}: {e.errors()[0]['msg']}") from e
        answer = getattr(verdict, out.field)
        if out.rationale_field and out.rationale_field != out.field:
            rationale = getattr(verdict, out.rationale_field, None)
    else:
        if not content or not content.strip():
            raise ParseFailure("empty reply")
        if mode == "tags" or out.mode == "tags":
            tag = rubric.verdict_tag
            found = _last_tag(content, tag)
            if found is None:
                raise ParseFailure(f"no <{tag}>…</{tag}> in the reply")
            answer = found
            if out.rationale_field:
                rationale = _last_tag(content, out.rationale_field)
            if rationale is None:
                rationale = content[: content.lower().rfind(f"<{tag.lower()}")].strip() or None
        elif out.mode == "regex":
            assert out.pattern is not None
            found = _last_regex(content, out.pattern)
            if found is None:
                raise ParseFailure(f"pattern {out.pattern!r} does not match the reply")
            answer = found
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
