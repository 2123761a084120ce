"""Table rows in, Samples out, Grades back to columns: shared by ``grade_frame`` and file runs with a grader.

A row is a mapping of column -> cell (a DataFrame row, a CSV or JSONL line, a Parquet record).
:class:`RowMapping` says which column fills which part of the :class:`Sample`; it is built and
checked once against the columns, then applied to every row. :func:`grade_columns` turns a Grade
into flat result columns.

Sample paths a mapping may fill: ``prompt`` (text, the user message), ``messages`` (a list of chat
messages), ``response``, ``system_instruction``, ``references.<key>`` (OpenAI's ``item.<key>``
is accepted too) and ``metadata.<key>``; dots in a key go into nested dicts. Unmapped, a column
named ``messages`` (else ``prompt``, else ``question``) is the prompt, ``response`` (else
``completion``, else ``output``) the response, ``system_instruction`` the system message, and
every other column is a reference under its own name, as OpenAI's ``item`` is the whole row:
``{{references.answer}}`` reads column ``answer``. A column ``references`` holding an object
(``{"response": ..., "references": {"answer": "5"}}``, as Vertex's examples carry it) gives its keys
as the references (over same-named columns), so ``{{references.answer}}`` reads it too.
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from ._io import InputError, RowError
from .._atif import TrajectoryError, is_atif, split_conversation, trajectory_messages
from .._sample import Grade, Message, Sample

# The result columns every row gets, before score_<part> and metric_<name>.
GRADE_COLUMNS = ["score", "status", "error_kind", "error"]

_DEFAULT_PROMPT = ("messages", "prompt", "question")
_DEFAULT_RESPONSE = ("response", "completion", "output")
_DEFAULT_SYSTEM = ("system_instruction",)
_ROLES = ("messages", "prompt", "response", "system_instruction", "trajectory")
_PATHS = "prompt, messages, response, system_instruction, trajectory, references.<key> or metadata.<key>"


class MappingError(InputError):
    """A mapping names a sample path that does not exist or a column the data does not have."""


@dataclass(frozen=True)
class _Plan:
    """Which column fills each part of the Sample, for one set of columns."""

    messages: Hashable | None
    prompt: Hashable | None
    response: Hashable | None
    system: Hashable | None
    references: tuple[tuple[tuple[str, ...], Hashable], ...]  # (key path, column)
    metadata: tuple[tuple[tuple[str, ...], Hashable], ...]
    # A column named ``references`` holding an object (Vertex's examples carry one): its keys are the
    # references, over the other columns', rather than ``references.references.<key>``.
    merged: Hashable | None = None
    # A whole rollout (chat messages with tool calls and results, or an ATIF document): its messages
    # before the first assistant turn are the prompt, the rest the response.
    trajectory: Hashable | None = None


class RowMapping:
    """Sample path -> column, checked up front; ``sample(row, where)`` applies it to one row.

    Build it with :meth:`build`. When the columns are known (a DataFrame, a CSV header), every
    mapped column is checked before the first row and the defaults are settled once; without
    them (JSONL), the defaults are settled per set of keys and a mapped key a row lacks is a
    missing cell.
    """

    def __init__(self, explicit: Mapping[str, Hashable], columns: Sequence[Hashable] | None) -> None:
        self.explicit = dict(explicit)
        self.columns = list(columns) if columns is not None else None
        self._plans: dict[tuple[Hashable, ...], _Plan] = {}
        self._plan = self._settle(self.columns) if self.columns is not None else None

    @classmethod
    def build(cls, mapping: Mapping[str, Hashable] | None, columns: Iterable[Hashable] | None) -> RowMapping:
        """Check ``mapping`` ({sample path: column}) against the columns (None: not known up front).

        Raises:
            MappingError: a path that is not a sample path, ``prompt`` and ``messages`` both
                mapped, or a mapped column that is not among the columns (the message lists them).
        """
        explicit = dict(mapping or {})
        known = list(columns) if columns is not None else None
        for path, column in explicit.items():
            head, dot, key = str(path).partition(".")
            if not ((path in _ROLES and not dot) or (head in ("references", "item", "metadata") and key and all(key.split(".")))):
                raise MappingError(f"mapping: {path!r} is not a sample path; use {_PATHS}")
            if known is not None and column not in known:
                listed = ", ".join(map(repr, known)) or "(none)"
                raise MappingError(f"mapping: {path!r} reads column {column!r}, which is not in the data; columns are {listed}")
        if "prompt" in explicit and "messages" in explicit:
            raise MappingError("mapping: map either 'prompt' (text) or 'messages' (a list of messages), not both")
        return cls(explicit, known)

    def _settle(self, columns: Sequence[Hashable]) -> _Plan:
        explicit = self.explicit
        present = set(columns)

        def default(names: tuple[str, ...]) -> Hashable | None:
            return next((n for n in names if n in present), None)

        messages = explicit.get("messages")
        prompt = explicit.get("prompt")
        if messages is None and prompt is None:
            found = default(_DEFAULT_PROMPT)
            messages, prompt = (found, None) if found == "messages" else (None, found)
        response = explicit["response"] if "response" in explicit else default(_DEFAULT_RESPONSE)
        system = explicit["system_instruction"] if "system_instruction" in explicit else default(_DEFAULT_SYSTEM)
        trajectory = explicit["trajectory"] if "trajectory" in explicit else default(("trajectory",))
        used = {c for c in (messages, prompt, response, system, trajectory) if c is not None}
        merged = "references" if "references" in present and "references" not in explicit.values() else None
        references: dict[tuple[str, ...], Hashable] = {(str(c),): c for c in columns if c not in used}
        metadata: dict[tuple[str, ...], Hashable] = {}
        for path, column in explicit.items():
            head, _, key = path.partition(".")
            if head in ("references", "item"):
                references[tuple(key.split("."))] = column
            elif head == "metadata":
                metadata[tuple(key.split("."))] = column
        return _Plan(messages, prompt, response, system, tuple(references.items()), tuple(metadata.items()), merged, trajectory)

    def _plan_for(self, row: Mapping[Hashable, Any]) -> _Plan:
        if self._plan is not None:
            return self._plan
        keys = tuple(row)
        plan = self._plans.get(keys)
        if plan is None:
            plan = self._plans[keys] = self._settle(keys)
        return plan

    def sample(self, row: Mapping[Hashable, Any], where: str) -> Sample:
        """The Sample for one row; RowError (naming ``where`` and the column) for an unusable cell.

        Missing cells (None, NaN, NA, NaT, or a key the row lacks) leave their part empty: no
        prompt, an empty response, no such reference. Numbers in text fields become their text.
        """
        if not self.explicit and is_eval_row(row):
            return eval_row_sample(row, where)
        if not self.explicit and is_atif(row):  # a JSONL line that is an ATIF document itself
            return Sample.model_construct(messages=[], response=[], references={}, metadata={}, tools=None) \
                .model_copy(update=_rollout(row, where, "the row"))
        plan = self._plan_for(row)
        messages: list[Message] = []
        response: list[Message] = []
        try:
            if plan.system is not None and not missing(value := row.get(plan.system)):
                messages.extend(_as_messages(value, "system", where, plan.system, "system_instruction"))
            if plan.messages is not None and not missing(value := row.get(plan.messages)):
                messages.extend(_message_list(value, where, plan.messages))
            elif plan.prompt is not None and not missing(value := row.get(plan.prompt)):
                messages.extend(_as_messages(value, "user", where, plan.prompt, "prompt"))
            if plan.response is not None and not missing(value := row.get(plan.response)):
                response = _as_messages(value, "assistant", where, plan.response, "response")
            elif messages and plan.messages is not None:  # a conversation with the rollout in it: split off the response
                messages, response = split_conversation(messages)
            if plan.trajectory is not None and not missing(value := row.get(plan.trajectory)):
                rollout = _rollout(value, where, f"column {plan.trajectory!r}")
                messages = [*messages, *rollout["messages"]]
                response = response or rollout["response"]
        except ValidationError as e:
            raise RowError(f"{where}: {_first_problem(e)}") from None
        references = _nest(row, plan.references)
        if plan.merged is not None:
            given = plain(row.get(plan.merged))
            if isinstance(given, str) and given.lstrip().startswith("{"):  # a CSV cell holding the object as JSON
                try:
                    given = json.loads(given)
                except ValueError:
                    pass
            if isinstance(given, Mapping):
                references.pop(str(plan.merged), None)
                references.update(given)
        # The messages are validated and the rest is plain data: no second validation pass.
        return Sample.model_construct(messages=messages, response=response, references=references,
                                      metadata=_nest(row, plan.metadata), tools=None)


def _rollout(value: Any, where: str, what: str) -> dict[str, list[Message]]:
    """A trajectory cell (chat messages, ``{"messages": [...]}``, an ATIF document, or JSON text of one) as the
    Sample's prompt messages and response."""
    try:
        conversation = trajectory_messages(plain(value))
        prompt, response = split_conversation([Message.model_validate(m) for m in conversation])
    except TrajectoryError as e:
        raise RowError(f"{where}: {what} is not a trajectory: {e}") from None
    except ValidationError as e:
        raise RowError(f"{where}: {what}: {_first_problem(e)}") from None
    return {"messages": prompt, "response": response}


def is_eval_row(row: Mapping[Hashable, Any]) -> bool:
    """A line of Evals-API run data: ``{"item": {...}, "sample": {...}}`` and nothing else."""
    return "item" in row and set(row) <= {"item", "sample"} and isinstance(plain(row.get("item")), Mapping)


def eval_row_sample(row: Mapping[Hashable, Any], where: str) -> Sample:
    """The Sample of an Evals-API row: ``item`` is the references, ``sample`` the response.

    The response is ``sample.output_text``, else the last choice's message; the whole ``sample``
    is kept in metadata so ``{{sample.output_json.x}}`` and a python grader see it as given.
    """
    item = plain(row["item"])
    given = plain(row.get("sample"))
    if missing(given):
        given = {}
    if not isinstance(given, Mapping):
        raise RowError(f"{where}: 'sample' must be an object (output_text, output_json, choices), got {type(given).__name__}")
    response: list[Message] = []
    text = given.get("output_text")
    try:
        if isinstance(text, str):
            response = [Message(role="assistant", content=text)]
        elif isinstance(given.get("choices"), list) and given["choices"]:
            last = given["choices"][-1]
            message = last.get("message") if isinstance(last, Mapping) else None
            if isinstance(message, Mapping):
                response = [Message.model_validate({"role": "assistant", **message})]
        elif given.get("output_json") is not None:
            response = [Message(role="assistant", content=json.dumps(given["output_json"], ensure_ascii=False))]
    except ValidationError as e:
        raise RowError(f"{where}: sample: {_first_problem(e)}") from None
    return Sample.model_construct(messages=[], response=response, references=dict(item), metadata={"sample": dict(given)}, tools=None)


def _nest(row: Mapping[Hashable, Any], pairs: tuple[tuple[tuple[str, ...], Hashable], ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for keys, column in pairs:
        value = row.get(column)
        if type(value) is str:  # the common cell: no conversion, no nesting check beyond one key
            if len(keys) == 1:
                out[keys[0]] = value
                continue
        elif missing(value):
            continue
        if len(keys) == 1:
            out[keys[0]] = plain(value)
            continue
        target = out
        for key in keys[:-1]:
            nxt = target.get(key)
            if not isinstance(nxt, dict):
                nxt = target[key] = {}
            target = nxt
        target[keys[-1]] = plain(value)
    return out


def missing(value: Any) -> bool:
    """None, a float NaN, pandas' NA and NaT: an empty cell, whichever reader produced it."""
    if value is None:
        return True
    if isinstance(value, float):
        return value != value
    kind = type(value).__name__  # by name: no pandas or numpy import for CSV and JSONL runs
    if kind in ("NAType", "NaTType"):
        return True
    if kind in ("float32", "float16", "longdouble", "datetime64", "timedelta64"):
        return bool(value != value)  # numpy's NaN and NaT are unequal to themselves
    return False


def plain(value: Any) -> Any:
    """Cells as plain Python: numpy scalars -> numbers, arrays (Parquet lists) -> lists, recursively."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    ndim = getattr(value, "ndim", None)
    if ndim is not None and hasattr(value, "tolist"):
        return value.item() if ndim == 0 else [plain(v) for v in value.tolist()]
    return value


def _text(value: Any) -> str:
    value = plain(value)
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(type(value).__name__)
    return str(value)


def _as_messages(value: Any, role: str, where: str, column: Hashable, part: str) -> list[Message]:
    """A text cell as one message, or a cell that already holds messages (a list, or JSON text of one)."""
    if type(value) is str:
        return [Message(role=role, content=value)]
    value = plain(value)
    if isinstance(value, str):
        return [Message(role=role, content=value)]
    if isinstance(value, list) or (isinstance(value, Mapping) and "role" in value):
        return _message_list(value, where, column, part=part, role=role)
    try:
        return [Message(role=role, content=_text(value))]
    except TypeError:
        raise RowError(f"{where}: column {column!r} ({part}) must be text or a list of messages, got {type(value).__name__}") from None


def _message_list(value: Any, where: str, column: Hashable, *, part: str = "messages", role: str = "user") -> list[Message]:
    value = plain(value)
    if isinstance(value, str) and value.lstrip().startswith("["):  # CSV cells carry lists as JSON text
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise RowError(f"{where}: column {column!r} ({part}) is not a valid JSON list of messages: {e.msg}") from None
    if isinstance(value, Mapping):
        value = [value]
    if not isinstance(value, list):
        raise RowError(f"{where}: column {column!r} ({part}) must be a list of chat messages, got {type(value).__name__}")
    out = []
    for number, message in enumerate(value):
        if isinstance(message, str):
            message = {"role": role, "content": message}
        if not isinstance(message, Mapping):
            raise RowError(f"{where}: column {column!r} ({part}) item {number} must be a message object, got {type(message).__name__}")
        try:
            out.append(Message.model_validate(message))
        except ValidationError as e:
            raise RowError(f"{where}: column {column!r} ({part}) item {number}: {_first_problem(e)}") from None
    return out


def _first_problem(e: ValidationError) -> str:
    err = e.errors()[0]
    return f"{'.'.join(map(str, err['loc'])) or 'value'}: {err['msg']}"


# ---- grades back to columns ----------------------------------------------------------------


def grade_columns(grade: Grade) -> dict[str, Any]:
    """One Grade as flat result columns.

    ``score`` (None unless status is ``ok``), ``status`` (ok / invalid / error), ``error_kind``
    and ``error``; ``score_<part>`` for each part of a composite grader (None for a part that
    failed); ``metric_<name>`` for each metric (the LLM grader's judge_prompt_tokens, ...).
    """
    out: dict[str, Any] = {"score": grade.score, "status": grade.status, "error_kind": grade.error_kind, "error": grade.error}
    for name, part in grade.parts.items():
        out[f"score_{name}"] = part.score
    for name, value in grade.metrics.items():
        out[f"metric_{name}"] = value
    return out


class GradeColumns:
    """:func:`grade_columns` for ``total`` rows filled in any order, as column lists (what a DataFrame wants).

    Each Grade is reduced to its cells when it arrives and then dropped: holding 100k Grade objects
    until the end would make the garbage collector rescan them all, a third of a fast run's time.
    A row without some part or metric gets None there.
    """

    def __init__(self, total: int) -> None:
        self.total = total
        self._fixed: dict[str, list[Any]] = {name: [None] * total for name in GRADE_COLUMNS}
        self._parts: dict[str, list[Any]] = {}
        self._metrics: dict[str, list[Any]] = {}

    def put(self, position: int, grade: Grade) -> None:
        fixed = self._fixed
        fixed["score"][position] = grade.score
        fixed["status"][position] = grade.status
        fixed["error_kind"][position] = grade.error_kind
        fixed["error"][position] = grade.error
        for name, part in grade.parts.items():
            column = self._parts.get(name)
            if column is None:
                column = self._parts[name] = [None] * self.total
            column[position] = part.score
        for name, value in grade.metrics.items():
            column = self._metrics.get(name)
            if column is None:
                column = self._metrics[name] = [None] * self.total
            column[position] = value

    def columns(self) -> dict[str, list[Any]]:
        """GRADE_COLUMNS, then score_<part>, then metric_<name>, each in the order first seen."""
        return {**self._fixed, **{f"score_{k}": v for k, v in self._parts.items()}, **{f"metric_{k}": v for k, v in self._metrics.items()}}
