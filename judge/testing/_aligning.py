"""A judge whose agreement with human labels depends on what its prompt teaches it, and an optimiser that reads
its disagreements: the fake provider ``gradekit align`` is tested against.

Each labelled row has a key (found in a user message by ``key_pattern``), a true label, and maybe a
trait: a kind of case the judge gets wrong until it is taught (a number written in words, a hedged
answer). The judge answers a row without a trait with its true label. On a row with trait ``t`` it
answers another label unless its prompt teaches ``t``: the system message or an earlier turn (never
the row's own message) holds ``lessons[t]``, or an earlier turn shows a row with trait ``t`` (a
few-shot example). A judge built ``learnable=False`` is one no prompt can improve: it gets every
trait row wrong whatever it is told.

The optimiser (requests that name ``optimiser``) reads the keys in its prompt and answers the JSON
``gradekit align`` asks for: a guideline (the lesson) for each trait among the rows it was shown.
The lab records what each side saw, so a test can check that the test rows never reached the
optimiser (``optimiser_keys``) and were judged with two prompts only, the original and the chosen
one (``prompts_for``).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from ._fake_provider import Reply
from ._population import labelled_reply


def _text(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return " ".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
    return str(content or "")


class AlignmentLab:
    """A FakeProvider responder: the prompt-sensitive judge and the optimiser (see the module docstring).

    Args:
        truth: row key -> its true (human) label.
        labels: the offered labels; a wrong answer names the first other one.
        key_pattern: a regex whose group 1, searched in a user message, is the row key.
        traits: row key -> its trait, for the rows the judge gets wrong until taught.
        lessons: trait -> the words that teach it (what the optimiser writes as a guideline).
        optimiser: the model name the optimiser answers to; any other model is the judge.
        learnable: False for a judge no prompt can improve.
    """

    def __init__(self, truth: Mapping[str, str], labels: Sequence[str], key_pattern: str, *, traits: Mapping[str, str],
                 lessons: Mapping[str, str], optimiser: str = "fake-optimiser", learnable: bool = True) -> None:
        self.truth, self.labels, self.traits, self.lessons = dict(truth), list(labels), dict(traits), dict(lessons)
        self.pattern = re.compile(key_pattern)
        self.optimiser, self.learnable = optimiser, learnable
        self.optimiser_keys: set[str] = set()  # every row key the optimiser's prompts showed
        self._prompts: dict[str, set[str]] = {}  # row key -> digests of the prompts (all but the row's own message) it was judged with
        self._lock = threading.Lock()

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> AlignmentLab:
        """From JSON (``python -m gradekit.judge.testing --lab FILE``): ``truth``, ``labels``, ``key_pattern``, ``traits``,
        ``lessons``, and optionally ``optimiser`` and ``learnable``."""
        return cls({str(k): str(v) for k, v in spec["truth"].items()}, spec["labels"], spec["key_pattern"],
                   traits={str(k): str(v) for k, v in (spec.get("traits") or {}).items()}, lessons=spec.get("lessons") or {},
                   optimiser=spec.get("optimiser", "fake-optimiser"), learnable=bool(spec.get("learnable", True)))

    def prompts_for(self, key: str) -> int:
        """How many different prompts row ``key`` was judged with."""
        with self._lock:
            return len(self._prompts.get(key, ()))

    def __call__(self, body: dict[str, Any]) -> Reply | None:
        messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
        if str(body.get("model")) == self.optimiser:
            return self._optimise(messages)
        users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
        if not users:
            return None
        found = self.pattern.search(_text(messages[users[-1]]))
        key = found.group(1) if found else None
        if key not in self.truth:
            return None
        taught = messages[:users[-1]]  # the system message and the earlier turns: what the prompt teaches
        with self._lock:
            self._prompts.setdefault(key, set()).add(hashlib.sha256(json.dumps(taught, sort_keys=True).encode()).hexdigest())
        true = self.truth[key]
        trait = self.traits.get(key)
        if trait is None or (self.learnable and self._knows(trait, taught)):
            return labelled_reply(body, true)
        return labelled_reply(body, next((lab for lab in self.labels if lab != true), true))

    def _knows(self, trait: str, taught: list[dict[str, Any]]) -> bool:
        text = "\n".join(_text(m) for m in taught)
        lesson = self.lessons.get(trait)
        if lesson and lesson in text:
            return True
        shown = {m.group(1) for m in self.pattern.finditer(text)}  # the rows of the few-shot examples
        return any(self.traits.get(k) == trait for k in shown)

    def _optimise(self, messages: list[dict[str, Any]]) -> Reply:
        text = "\n".join(_text(m) for m in messages if m.get("role") == "user")
        keys = {m.group(1) for m in self.pattern.finditer(text)}
        with self._lock:
            self.optimiser_keys |= keys
        traits = sorted({self.traits[k] for k in keys if k in self.traits})
        proposal = {"guidelines": [self.lessons[t] for t in traits if t in self.lessons],
                    "label_definitions": {label: f"what the human labels call {label}" for label in self.labels}}
        return Reply(content=json.dumps(proposal))
