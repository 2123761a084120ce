"""A trajectory as the judge reads it: numbered, delimited steps inside a token budget, every cut said.

An agent rollout (chat messages with ``tool_calls`` and ``tool`` results) becomes :class:`Steps`:
the leading system prompt, the task (the user messages before the first assistant turn) and one
:class:`Step` per assistant turn with the tool calls it made and the results they returned (a user
or system message later in the conversation is a step of its own). :func:`fit` renders them as
text for the ``trajectory`` rubric variable within a token budget. When the whole does not fit, a
named strategy decides what stays, and every cut is written where it was made:

``middle_out`` (the default)
    each tool result, argument, text and thought longer than a cap keeps its head and tail
    (``[tool result cut: 48,211 of 52,000 characters omitted]``), the cap shrinking until the
    whole fits; below a floor, whole steps go from the middle outwards, the first and the last
    ones staying (``[steps 5-37 omitted: 33 steps, 14 tool calls (web_search x12, fetch x2),
    about 61,000 tokens]``), and the steps kept get the largest cap that fits again.
``keep_recent``
    the same cuts, but whole steps go from the start: the latest steps stay.
``none``
    nothing is cut: a trajectory over its budget is a :class:`TrajectoryOverflow`.

The task and the final answer (the last step's text) are never cut; when they alone do not fit,
the row is a ``context_overflow``, never a score. What the judge was shown is a
:class:`TrajectoryCoverage`.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from ._tokens import ESTIMATE, TokenCounter

Strategy = Literal["middle_out", "keep_recent", "none"]
STRATEGIES: tuple[str, ...] = ("middle_out", "keep_recent", "none")
# Below this many tokens a piece is not cut further: whole steps go instead (a 60-token head and
# tail still says what a tool returned; less says nothing).
CAP_FLOOR = 60
_MARK_TOKENS = 16  # what a cut's marker costs, conservatively
_STEP_TOKENS = 14  # a step's own markup: <step number=".." role="..">, </step>
_PIECE_TOKENS = 12  # a tool call's or result's markup
_TAGS = ("step", "tool_call", "tool_result", "thinking", "system_prompt", "trajectory", "task", "final_answer")
_TAG_RE = re.compile(r"<(/?)\s*(" + "|".join(_TAGS) + r")\b", re.IGNORECASE)


class TrajectoryInputError(ValueError):
    """A value that cannot be read as a trajectory; the message says what is wrong and where."""


class TrajectoryOverflow(ValueError):
    """The parts that are never cut (the task, the final answer) do not fit the budget."""


def guard(text: str) -> str:
    """Neutralise the trajectory's own delimiters inside data, so a tool result cannot close its step."""
    return _TAG_RE.sub(r"<\\\1\2", text) if "<" in text else text


# ---- the steps --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """One tool call: its id, the function's name and its arguments as the model wrote them."""

    id: str | None
    name: str
    arguments: str


@dataclass(frozen=True)
class Result:
    """One tool result (or observation) and the call it answers."""

    call_id: str | None
    name: str
    content: str


@dataclass
class Step:
    """One step: an assistant turn with its tool calls and their results, or a user/system message mid-trajectory."""

    number: int
    role: str
    text: str = ""
    reasoning: str = ""
    calls: list[Call] = field(default_factory=list)
    results: list[Result] = field(default_factory=list)


@dataclass
class Steps:
    """A parsed trajectory: what :func:`fit` renders. ``judged`` marks the step a per-step verdict is about."""

    system: str
    task: str
    steps: list[Step]
    judged: int | None = None

    @property
    def final_answer(self) -> str:
        """The last step's text when it is an assistant answer (no tool call left unanswered); else ""."""
        last = self.steps[-1] if self.steps else None
        return last.text if last is not None and last.role == "assistant" and not last.calls else ""

    @property
    def ends_in_tool_call(self) -> bool:
        last = self.steps[-1] if self.steps else None
        return last is not None and bool(last.calls)

    def assistant_steps(self) -> list[int]:
        """The numbers of the assistant steps, the ones a per-step verdict is given for."""
        return [s.number for s in self.steps if s.role == "assistant"]

    def upto(self, number: int) -> Steps:
        """The trajectory up to and including step ``number``, that step marked as the one judged."""
        return Steps(self.system, self.task, [s for s in self.steps if s.number <= number], judged=number)


def content_text(content: Any, *, name_other_parts: bool = True) -> str:
    """A message's content as text: a string, or the text parts of a content-part list.

    ``name_other_parts``: an image or audio part becomes ``[image_url]`` (the judge is told it was
    there, not shown it); otherwise it is left out.
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        pieces = []
        for part in content:
            if isinstance(part, str):
                pieces.append(part)
            elif isinstance(part, Mapping):
                if isinstance(part.get("text"), str):
                    pieces.append(part["text"])
                elif name_other_parts:
                    pieces.append(f"[{part.get('type') or 'part'}]")
        return "".join(pieces)
    if isinstance(content, Mapping):
        import json

        return json.dumps(content, ensure_ascii=False)
    return str(content)


def _plain(message: Any) -> Mapping[str, Any]:
    if isinstance(message, Mapping):
        return message
    dump = getattr(message, "model_dump", None)
    if callable(dump):
        return dump(exclude_none=True)
    raise TrajectoryInputError(f"a trajectory message must be an object with a role, got {type(message).__name__}")


def _arguments(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    import json

    return json.dumps(value, ensure_ascii=False)


def read_steps(value: Any) -> Steps:
    """A trajectory value as :class:`Steps`: a list of chat messages, ``{"messages": [...]}`` (Ark's
    Trajectory), or Steps already. Raises :class:`TrajectoryInputError` naming the message at fault.

    An ATIF document is refused with a pointer to its reader: files and rows are read in
    ``gradekit.graders`` (``trajectory_messages``), which validates ATIF and turns it into messages.
    """
    if isinstance(value, Steps):
        return value
    if isinstance(value, str):
        import json

        try:
            value = json.loads(value)
        except ValueError:
            raise TrajectoryInputError("a trajectory must be a list of chat messages (JSON), got text that is not JSON") from None
    if isinstance(value, Mapping):
        if isinstance(value.get("schema_version"), str) and "steps" in value:
            raise TrajectoryInputError("this is an ATIF document: read it with gradekit.graders.trajectory_messages() "
                                       "(gradekit grade and gradekit serve do so) before it reaches the judge")
        if "messages" not in value:
            raise TrajectoryInputError("a trajectory must be a list of chat messages or an object with 'messages'")
        value = value["messages"]
    if hasattr(value, "tolist") and not isinstance(value, list):  # numpy / pyarrow arrays from pandas
        value = value.tolist()
    if not isinstance(value, Sequence) or isinstance(value, (str, bytes)):
        raise TrajectoryInputError(f"a trajectory must be a list of chat messages, got {type(value).__name__}")
    return _from_messages(value)


def _from_messages(messages: Sequence[Any]) -> Steps:
    system: list[str] = []
    task: list[str] = []
    steps: list[Step] = []
    current: Step | None = None
    names: dict[str, str] = {}  # tool call id -> function name, for the results that answer it
    for i, raw in enumerate(messages):
        message = _plain(raw)
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise TrajectoryInputError(f"message {i}: has no role")
        text = content_text(message.get("content"))
        if role in ("system", "developer") and not steps:
            system.append(text)
            continue
        if role == "user" and not steps:
            task.append(text)
            continue
        if role == "assistant":
            calls = []
            for j, call in enumerate(message.get("tool_calls") or []):
                call = _plain(call)
                function = call.get("function") if isinstance(call.get("function"), Mapping) else call
                name = function.get("name")
                if not isinstance(name, str):
                    raise TrajectoryInputError(f"message {i}: tool_calls[{j}] has no function name")
                cid = call.get("id")
                calls.append(Call(str(cid) if cid is not None else None, name, _arguments(function.get("arguments"))))
                if cid is not None:
                    names[str(cid)] = name
            reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
            current = Step(len(steps) + 1, "assistant", text, reasoning if isinstance(reasoning, str) else "", calls)
            steps.append(current)
            continue
        if role in ("tool", "function", "ipython"):
            cid = message.get("tool_call_id")
            cid = str(cid) if cid is not None else None
            name = message.get("name") or (names.get(cid, "") if cid is not None else "")
            result = Result(cid, str(name or ""), text)
            if current is not None and current.role == "assistant":
                current.results.append(result)
            else:  # a result with no call before it: a step of its own, not lost
                steps.append(Step(len(steps) + 1, "tool", results=[result]))
            continue
        current = Step(len(steps) + 1, "user" if role == "user" else role, text)
        steps.append(current)
        current = None
    return Steps("\n\n".join(system), "\n\n".join(task), steps)


# ---- what the judge saw -------------------------------------------------------------------------------


class TrajectoryCoverage(BaseModel):
    """What the judge was shown of a trajectory: steps and tokens shown of the total, and how it was cut."""

    model_config = ConfigDict(frozen=True)

    steps_shown: int
    steps_total: int
    tokens_shown: int
    tokens_total: int
    strategy: str
    steps_cut: int = 0  # steps shown with a piece cut to its head and tail
    budget: int | None = None  # the trajectory's token budget (None: none applied)
    counter: str = "estimate"  # how tokens were counted: tiktoken:<encoding> or the conservative estimate
    step: int | None = None  # a per-step verdict: the step judged
    steps_read: int | None = None  # navigate: the distinct steps the judge's read_steps/search answers showed
    rounds: int | None = None  # navigate: the requests the navigation took


# ---- rendering -------------------------------------------------------------------------------------------


@dataclass
class _Piece:
    kind: str  # text, reasoning, arguments, result, system
    text: str
    tokens: int
    fixed: bool = False  # never cut (the final answer)
    label: str = ""  # the markup's attributes

    def shown(self, cap: int | None) -> str:
        if cap is None or self.fixed or self.tokens <= cap:
            return self.text
        return _cut(self.text, self.tokens, cap, self.kind)


_NOUN = {"result": "tool result", "arguments": "arguments", "text": "text", "reasoning": "reasoning", "system": "system prompt"}


def _cut(text: str, tokens: int, cap: int, kind: str) -> str:
    """``text`` cut to its head and tail worth ``cap`` tokens, the cut said between them."""
    keep = max(1, int(len(text) * cap / max(tokens, 1)))
    head = (keep * 2) // 3
    tail = keep - head
    omitted = len(text) - head - tail
    if omitted <= 0:
        return text
    return (f"{text[:head]}\n[{_NOUN[kind]} cut: {omitted:,} of {len(text):,} characters omitted]\n"
            f"{text[len(text) - tail:] if tail else ''}")


@dataclass
class _StepPieces:
    step: Step
    pieces: list[_Piece]
    overhead: int

    def cost(self, cap: int | None) -> int:
        total = self.overhead
        for p in self.pieces:
            if cap is None or p.fixed or p.tokens <= cap:
                total += p.tokens
            else:
                total += cap + _MARK_TOKENS
        return total

    def full(self) -> int:
        return self.cost(None)


def _pieces(steps: Steps, counter: TokenCounter, keep_reasoning: bool) -> tuple[_Piece | None, list[_StepPieces]]:
    system = _Piece("system", steps.system, counter.count(steps.system)) if steps.system else None
    out = []
    last = steps.steps[-1].number if steps.steps else None
    for step in steps.steps:
        pieces: list[_Piece] = []
        final = step.number == last
        if keep_reasoning and step.reasoning:
            pieces.append(_Piece("reasoning", step.reasoning, counter.count(step.reasoning)))
        if step.text:
            pieces.append(_Piece("text", step.text, counter.count(step.text), fixed=final))
        for call in step.calls:
            pieces.append(_Piece("arguments", call.arguments, counter.count(call.arguments), label=_attrs(call.id, call.name)))
        for result in step.results:
            pieces.append(_Piece("result", result.content, counter.count(result.content), label=_attrs(result.call_id, result.name)))
        out.append(_StepPieces(step, pieces, _STEP_TOKENS + _PIECE_TOKENS * (len(step.calls) + len(step.results))))
    return system, out


def _attrs(cid: str | None, name: str) -> str:
    parts = []
    if cid:
        parts.append(f'id="{_attr(cid)}"')
    if name:
        parts.append(f'name="{_attr(name)}"')
    return (" " + " ".join(parts)) if parts else ""


def _attr(value: str) -> str:
    return guard(value).replace('"', "'").replace("\n", " ")[:200]


def _render_step(sp: _StepPieces, cap: int | None, judged: int | None) -> str:
    step = sp.step
    mark = ' judged="true"' if judged == step.number else ""
    lines = [f'<step number="{step.number}" role="{step.role}"{mark}>']
    for piece in sp.pieces:
        body = guard(piece.shown(cap))
        if piece.kind == "reasoning":
            lines.append(f"<thinking>\n{body}\n</thinking>")
        elif piece.kind == "text":
            lines.append(body)
        elif piece.kind == "arguments":
            lines.append(f"<tool_call{piece.label}>\n{body}\n</tool_call>")
        else:
            lines.append(f"<tool_result{piece.label}>\n{body}\n</tool_result>")
    if step.role == "assistant" and not step.text and not step.calls:
        lines.append("[empty reply]")
    lines.append("</step>")
    return "\n".join(lines)


def _omitted(run: Sequence[_StepPieces]) -> str:
    """The marker for a run of omitted steps: how many, their tool calls by name, about how many tokens."""
    first, last = run[0].step.number, run[-1].step.number
    calls = Counter(call.name for sp in run for call in sp.step.calls)
    n_calls = sum(calls.values())
    named = ", ".join(f"{name or 'unnamed'} x{n}" for name, n in calls.most_common())
    what = f"steps {first}-{last}" if first != last else f"step {first}"
    tokens = sum(sp.full() for sp in run)
    return (f"[{what} omitted: {len(run)} step{'s' if len(run) != 1 else ''}, {n_calls} tool call{'s' if n_calls != 1 else ''}"
            + (f" ({named})" if named else "") + f", about {tokens:,} tokens]")


@dataclass
class Rendered:
    """A trajectory rendered for the judge: ``str()`` is the text of the ``trajectory`` variable.

    ``task``, ``final_answer``, ``system``, ``steps_total`` and ``judged_step`` are there for the
    template too (``{{ trajectory.task }}``); they are data, shown whole.
    """

    text: str
    coverage: TrajectoryCoverage
    task: str
    final_answer: str
    system: str
    steps_total: int
    ends_in_tool_call: bool
    judged_step: int | None = None

    def __str__(self) -> str:
        return self.text


def _largest_cap(system: _Piece | None, kept: Sequence[_StepPieces], fixed: int, budget: int) -> int | None:
    """The largest cap (>= CAP_FLOOR) at which ``kept`` fits ``budget``, or None when not even the floor does."""
    sizes = sorted({p.tokens for sp in kept for p in sp.pieces if not p.fixed} | ({system.tokens} if system else set()))

    def cost(cap: int) -> int:
        total = fixed + sum(sp.cost(cap) for sp in kept)
        if system is not None:
            total += system.tokens if system.tokens <= cap else cap + _MARK_TOKENS
        return total

    if cost(CAP_FLOOR) > budget:
        return None
    if not sizes or cost(sizes[-1]) <= budget:
        return None if not sizes else sizes[-1]
    low, high = CAP_FLOOR, sizes[-1]  # cost(low) fits, cost(high) does not
    while high - low > 1:
        mid = (low + high) // 2
        if cost(mid) <= budget:
            low = mid
        else:
            high = mid
    return low


def fit(steps: Steps, budget: int | None, *, strategy: Strategy = "middle_out", counter: TokenCounter = ESTIMATE,
        keep_reasoning: bool = False) -> Rendered:
    """Render ``steps`` within ``budget`` tokens (None: whole), cutting by ``strategy``; see the module's docstring.

    Raises:
        TrajectoryOverflow: the parts never cut (the final answer, the last step's markup) exceed the budget,
            or the strategy is ``none`` and the whole does not fit.
    """
    system, all_steps = _pieces(steps, counter, keep_reasoning)
    total = (system.tokens if system else 0) + sum(sp.full() for sp in all_steps) + 4
    attempt_budget = budget
    for _ in range(4):  # the costs are estimates of the markup: check the text, and shrink once more if it is over
        text, shown, cut_steps = _layout(system, all_steps, attempt_budget, strategy, steps.judged)
        tokens = counter.count(text)
        if budget is None or tokens <= budget:
            coverage = TrajectoryCoverage(steps_shown=shown, steps_total=len(all_steps), tokens_shown=tokens,
                                          tokens_total=max(total, tokens) if shown < len(all_steps) or cut_steps else tokens,
                                          strategy=strategy if (shown < len(all_steps) or cut_steps) else "whole",
                                          steps_cut=cut_steps, budget=budget, counter=counter.source, step=steps.judged)
            return Rendered(text, coverage, steps.task, steps.final_answer, steps.system, len(all_steps),
                            steps.ends_in_tool_call, steps.judged)
        assert attempt_budget is not None
        attempt_budget = int(attempt_budget * budget / tokens * 0.97) - 1
        if attempt_budget <= 0:
            break
    raise TrajectoryOverflow(f"the trajectory cannot be shown within {budget:,} tokens")


def _layout(system: _Piece | None, all_steps: list[_StepPieces], budget: int | None, strategy: str,
            judged: int | None) -> tuple[str, int, int]:
    """(text, steps shown, steps with a cut) for one budget."""
    fixed = 4
    full = (system.tokens if system else 0) + sum(sp.full() for sp in all_steps) + fixed
    if budget is None or full <= budget:
        return _join(system, None, [(sp, False) for sp in all_steps], judged), len(all_steps), 0
    if strategy == "none":
        raise TrajectoryOverflow(f"the trajectory is about {full:,} tokens, over its budget of {budget:,} (truncation: none)")
    if not all_steps:
        raise TrajectoryOverflow(f"the system prompt alone is over the budget of {budget:,} tokens")
    cap = _largest_cap(system, all_steps, fixed, budget)
    if cap is not None:
        return _finish(system, all_steps, [], cap, judged)
    # Whole steps go: the last one always stays (the answer, or the step judged); the order says which others.
    last = all_steps[-1]
    others = all_steps[:-1]
    order = _keep_order(len(others), strategy)
    kept: set[int] = set()
    marker = _MARK_TOKENS + 24
    base = fixed + (min(system.tokens, CAP_FLOOR + _MARK_TOKENS) if system else 0) + last.cost(CAP_FLOOR) + marker
    if base > budget:
        raise TrajectoryOverflow(f"the final answer and the last step alone are about {base:,} tokens, over the budget of {budget:,}")
    used = base
    for index in order:
        extra = others[index].cost(CAP_FLOOR)
        if used + extra > budget:
            break  # the order is the order of priority: a later step does not jump ahead of one that did not fit
        used += extra
        kept.add(index)
    kept_steps = [sp for i, sp in enumerate(others) if i in kept] + [last]
    dropped = [sp for i, sp in enumerate(others) if i not in kept]
    cap = _largest_cap(system, kept_steps, fixed + marker, budget) or CAP_FLOOR
    return _finish(system, kept_steps, dropped, cap, judged, all_steps)


def _keep_order(n: int, strategy: str) -> list[int]:
    """Which of the steps before the last are kept first: both ends inwards, or the latest first."""
    if strategy == "keep_recent":
        return list(range(n - 1, -1, -1))
    order = []
    low, high = 0, n - 1
    while low <= high:
        order.append(low)
        if high != low:
            order.append(high)
        low, high = low + 1, high - 1
    return order


def _finish(system: _Piece | None, kept: list[_StepPieces], dropped: list[_StepPieces], cap: int, judged: int | None,
            all_steps: list[_StepPieces] | None = None) -> tuple[str, int, int]:
    cut = sum(1 for sp in kept if any(not p.fixed and p.tokens > cap for p in sp.pieces))
    if all_steps is None:
        return _join(system, cap, [(sp, False) for sp in kept], judged), len(kept), cut
    dropped_ids = {id(sp) for sp in dropped}
    sequence: list[tuple[Any, bool]] = []
    run: list[_StepPieces] = []
    for sp in all_steps:
        if id(sp) in dropped_ids:
            run.append(sp)
            continue
        if run:
            sequence.append((_omitted(run), True))
            run = []
        sequence.append((sp, False))
    if run:
        sequence.append((_omitted(run), True))
    return _join(system, cap, sequence, judged), len(kept), cut


def _join(system: _Piece | None, cap: int | None, sequence: Sequence[tuple[Any, bool]], judged: int | None) -> str:
    parts = []
    if system is not None:
        parts.append(f"<system_prompt>\n{guard(system.shown(cap))}\n</system_prompt>")
    for item, is_marker in sequence:
        parts.append(item if is_marker else _render_step(item, cap, judged))
    return "\n".join(parts)
