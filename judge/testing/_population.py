"""Judges of known reliability, for testing juries and cascades against a truth the test knows.

A :class:`JudgePopulation` is a FakeProvider responder: it reads the model a request names and
the row it shows, and answers the row's true label with that model's accuracy, else another
offered label. Real judges are not coins: some rows are easy for a model and some hard, and a
sample at temperature 1 repeats the model's view of the row. So each (model, row) is easy with a
probability set from the model's accuracy and the easy/hard per-call accuracies, and each call
on an easy row is right with ``easy`` probability, on a hard one with ``hard``. Every draw is a
hash of the seed, the model, the row, and the request's ``seed`` and ``temperature``: the same
request gets the same answer (as a cache would), samples with their own seeds are independent.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ._fake_provider import Reply, _fill, _forced_tool, asked_form


def _uniform(*parts: Any) -> float:
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def labelled_reply(body: Mapping[str, Any], label: str) -> Reply:
    """A reply naming ``label`` in the form the request asks for: schema enum, tool call, JSON object, the verdict tag
    or the quoted verdict line the prompt's last line asks for, else the bare label."""
    tool = _forced_tool(dict(body))
    rf = body.get("response_format") or {}
    schema = (tool or {}).get("parameters") if tool is not None else (rf.get("json_schema") or {}).get("schema")
    if schema is not None:
        args = _fill(schema)
        field = next((k for k, p in (schema.get("properties") or {}).items() if "enum" in p), None)
        if field is not None:
            args[field] = label
        if tool is not None:
            return Reply(tool_call={"name": tool.get("name", ""), "arguments": json.dumps(args)}, finish_reason="tool_calls")
        return Reply(content=json.dumps(args))
    if rf.get("type") == "json_object":
        return Reply(content=json.dumps({"verdict": label, "label": label, "judgement": label, "grade": label}))
    return Reply(content=asked_form(dict(body), label))  # the tag, or the quoted verdict line, the prompt asks for


class JudgePopulation:
    """A responder whose models judge rows of known truth with known accuracy.

    Args:
        accuracy: per model name, the chance one call is right (over rows and calls).
        truth: the row a request shows -> (row key, true label), or None for a request it does not
            know (answered by :func:`~gradekit.judge.testing.auto_reply`).
        labels: the offered labels; a wrong call names another one.
        easy, hard: a call's chance of being right on a row easy / hard for the model. A model's
            share of easy rows is (accuracy - hard) / (easy - hard).
        failing: per model name, an HTTP status it answers every request with (a broken juror).
        seed: changes every draw.
    """

    def __init__(self, accuracy: Mapping[str, float], truth: Callable[[Mapping[str, Any]], tuple[str, str] | None],
                 labels: Sequence[str], *, easy: float = 0.98, hard: float = 0.5, failing: Mapping[str, int] | None = None,
                 seed: int = 0) -> None:
        for model, a in accuracy.items():
            if not hard <= a <= easy:
                raise ValueError(f"{model}: accuracy {a} is outside [hard, easy] = [{hard}, {easy}]")
        self.accuracy, self.truth, self.labels = dict(accuracy), truth, list(labels)
        self.easy, self.hard, self.failing, self.seed = easy, hard, dict(failing or {}), seed

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> JudgePopulation:
        """From JSON (``python -m gradekit.judge.testing --population FILE``): ``accuracy``, ``labels``, ``truth``
        ({row key: label}), ``key_pattern`` (a regex whose group 1, searched in the last user message,
        is the row key), and optionally ``easy``, ``hard``, ``failing``, ``seed``."""
        import re

        pattern = re.compile(spec["key_pattern"])
        truth = {str(k): str(v) for k, v in spec["truth"].items()}

        def find(body: Mapping[str, Any]) -> tuple[str, str] | None:
            messages = [m for m in body.get("messages") or [] if m.get("role") == "user"]
            content = messages[-1].get("content") if messages else None
            if isinstance(content, list):
                content = " ".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
            match = pattern.search(str(content or ""))
            key = match.group(1) if match else None
            return (key, truth[key]) if key in truth else None

        return cls(spec["accuracy"], find, spec["labels"], easy=spec.get("easy", 0.98), hard=spec.get("hard", 0.5),
                   failing={str(k): int(v) for k, v in (spec.get("failing") or {}).items()}, seed=int(spec.get("seed", 0)))

    def label_for(self, model: str, key: str, true: str, sample: Any = None, temperature: Any = None) -> str:
        """What ``model`` answers on row ``key`` (true label ``true``) for one request."""
        share = (self.accuracy[model] - self.hard) / (self.easy - self.hard)
        p = self.easy if _uniform(self.seed, "row", model, key) < share else self.hard
        if _uniform(self.seed, "call", model, key, sample, temperature) < p:
            return true
        others = [lab for lab in self.labels if lab != true] or [true]
        return others[int(_uniform(self.seed, "wrong", model, key, sample, temperature) * len(others))]

    def __call__(self, body: dict[str, Any]) -> Reply | None:
        model = str(body.get("model"))
        if model in self.failing:
            return Reply(status=self.failing[model], error_message=f"{model} is down")
        if model not in self.accuracy:
            return None
        found = self.truth(body)
        if found is None:
            return None
        key, true = found
        return labelled_reply(body, self.label_for(model, key, true, body.get("seed"), body.get("temperature")))
