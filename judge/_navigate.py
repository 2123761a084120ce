"""A judge that reads the trace itself: ``navigate: true``.

For a trajectory too long to show whole, the judge gets the budgeted overview (the trajectory as
:func:`gradekit.judge._trajectory.fit` cuts it, into half the room its window leaves) and two tools:
``read_steps(start, end)``, the steps start..end in full, and ``search(pattern)``, the steps whose
text holds the pattern (case-insensitive, ``|`` between alternatives; a literal, never a regular
expression a judge could make run for ever). Each answer is fitted into what is left of the room,
divided over the rounds to come. The judge calls them for at most ``navigate_rounds`` requests (6),
each one bounded by the judge's timeout and retry policy, and then gives its verdict as the rubric
asks; a judge still calling tools after the last round is a ``parse_failure``. Every round is a
request of its own: counted in usage (and the spend cap), cached under its own key.

An endpoint that does not take tools (its dialect refused the ``tool`` mode, or refuses the
navigation request's tools) gets the budgeted view: the row is judged once as any trajectory is.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from ._cache import cache_key
from ._parse import Reading, read_completion
from ._rubric import AskMode, PromptOverflow, Room, Rubric, RubricInputError
from ._trajectory import Steps, fit
from ._verdict import NO_USAGE, Usage, Verdict
from ._wire import Failed, spent_by

if TYPE_CHECKING:
    from ._budget import Budget
    from ._cache import JudgeCache
    from ._dialect import Dialect


class NavigatingJudge(Protocol):
    """What navigation asks of a judge (judge._client's ``Judge`` meets it): how it builds and sends a request, where
    it caches and spends, and its one plain judgement to fall back to. A protocol: the client imports this module."""

    RELEARN: type[Exception]  # what ``_send`` raises when a request must be built again
    dialect: Dialect
    cache: JudgeCache | None
    budget: Budget | None
    base_url: str
    model: str
    logprobs: int | None

    @property
    def endpoint(self) -> str: ...

    def room(self, rubric: Rubric) -> Room: ...

    def _request(self, rubric: Rubric, messages: list[dict[str, Any]], mode: AskMode) -> dict[str, Any]: ...

    async def _send(self, request: dict[str, Any]) -> tuple[dict[str, Any], Usage]: ...

    async def judge_once(self, rubric: Rubric, row: Mapping[str, Any]) -> Verdict: ...


TOOLS = [
    {"type": "function", "function": {
        "name": "read_steps",
        "description": "Read steps start..end of the trajectory in full (as far as room allows; any cut is said).",
        "parameters": {"type": "object", "properties": {"start": {"type": "integer", "minimum": 1}, "end": {"type": "integer", "minimum": 1}},
                       "required": ["start", "end"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "search",
        "description": "Find the steps whose text, tool arguments or tool results contain the pattern (case-insensitive; "
                       "separate alternatives with |). Returns each matching step's number and the matching lines.",
        "parameters": {"type": "object", "properties": {"pattern": {"type": "string"}}, "required": ["pattern"],
                       "additionalProperties": False}}},
]
NAMES = {"read_steps", "search"}
OVERVIEW_TOKENS = 16_000  # the overview's budget when the window is unknown and the rubric sets none
ANSWER_TOKENS = 4_000  # a tool answer's budget when the window is unknown
_MATCHES = 20  # at most this many steps answer a search


def read_steps(steps: Steps, start: Any, end: Any, budget: int, counter: Any) -> tuple[str, set[int]]:
    """The answer to ``read_steps``: the steps in the range, fitted into ``budget`` tokens."""
    if not isinstance(start, int) or not isinstance(end, int) or isinstance(start, bool) or isinstance(end, bool):
        return "read_steps needs integer start and end.", set()
    total = len(steps.steps)
    start, end = max(1, start), min(total, end)
    if start > end:
        return f"No such steps: the trajectory has steps 1-{total}.", set()
    chosen = [s for s in steps.steps if start <= s.number <= end]
    try:
        rendered = fit(Steps("", "", chosen, judged=None), budget, counter=counter)
    except ValueError:
        return f"Steps {start}-{end} do not fit in the room left ({budget:,} tokens): read fewer steps.", set()
    return rendered.text, {s.number for s in chosen}


def search(steps: Steps, pattern: Any, budget: int, counter: Any) -> tuple[str, set[int]]:
    """The answer to ``search``: each step holding the pattern, with the lines that do, within ``budget`` tokens."""
    if not isinstance(pattern, str) or not pattern.strip():
        return "search needs a non-empty pattern.", set()
    needles = [p.strip().lower() for p in pattern.split("|") if p.strip()][:10]
    lines_out: list[str] = []
    found: set[int] = set()
    used = 0
    for step in steps.steps:
        texts = [("text", step.text), ("reasoning", step.reasoning)]
        texts += [(f"tool_call {c.name}", c.arguments) for c in step.calls] + [(f"tool_result {r.name}", r.content) for r in step.results]
        hits = []
        for where, text in texts:
            low = text.lower()
            if not any(n in low for n in needles):
                continue
            for line in text.splitlines():
                if any(n in line.lower() for n in needles):
                    hits.append(f"  ({where}) {line.strip()[:300]}")
                    if len(hits) >= 5:
                        break
        if not hits:
            continue
        block = f"step {step.number}:\n" + "\n".join(hits)
        cost = counter.count(block)
        if used + cost > budget or len(found) >= _MATCHES:
            lines_out.append(f"[more steps match; room for {len(found)} of them: search for something narrower]")
            break
        used += cost
        found.add(step.number)
        lines_out.append(block)
    if not found:
        return f"No step contains {pattern!r}.", set()
    return "\n".join(lines_out), found


def _answer(steps: Steps, call: Mapping[str, Any], budget: int, counter: Any) -> tuple[str, set[int]]:
    function = call.get("function") or {}
    try:
        args = json.loads(function.get("arguments") or "{}")
    except ValueError:
        return "The arguments are not JSON.", set()
    if not isinstance(args, dict):
        return "The arguments must be a JSON object.", set()
    if function.get("name") == "read_steps":
        return read_steps(steps, args.get("start"), args.get("end"), budget, counter)
    return search(steps, args.get("pattern"), budget, counter)


async def navigate(judge: NavigatingJudge, rubric: Rubric, row: Mapping[str, Any]) -> Verdict:
    """Judge ``row`` letting the judge read the trace with tools; see the module's docstring."""
    if "tool" in judge.dialect.refused_modes:
        return await judge.judge_once(rubric, row)  # no tools here: the budgeted view
    started = time.perf_counter()
    spent = NO_USAGE  # every round's requests
    mode = rubric.ask_modes[0]
    var = rubric.trajectory_variables[0]

    def finish(**fields: Any) -> Verdict:
        return Verdict(latency_s=time.perf_counter() - started, mode=mode, usage=spent, **fields)

    room = judge.room(rubric)
    overview_room = Room(room.tokens // 2 if room.tokens is not None else None, room.counter)
    rubric_view = rubric if room.tokens is not None or rubric.trajectory_budget is not None else \
        rubric.model_copy(update={"trajectory_budget": OVERVIEW_TOKENS})
    try:
        steps = rubric.prepare(row)[var]
        messages, coverage = rubric_view.render_fitted(row, mode, room=overview_room)
    except RubricInputError as e:
        return finish(status="error", error_kind="input", error=str(e))
    except PromptOverflow as e:
        return finish(status="error", error_kind="context_overflow", error=str(e))
    counter = room.counter
    used = sum(counter.count(m["content"] if isinstance(m.get("content"), str) else "") + 4 for m in messages)
    seen: set[int] = set()
    answer_tokens = 0
    for round_ in range(1, rubric.navigate_rounds + 1):
        request = judge._request(rubric, messages, mode)
        request["tools"] = [*(request.get("tools") or []), *TOOLS]
        request["tool_choice"] = "auto"
        key = cache_key(judge.base_url, request)
        completion = judge.cache.get(key) if judge.cache is not None else None
        if completion is None:
            reservation = None
            if judge.budget is not None:
                reservation = await judge.budget.start(used, 1024, model=judge.model)
                if reservation is None:
                    return finish(status="skipped", error_kind="budget", error=judge.budget.reason())
            billed = NO_USAGE
            try:
                try:
                    completion, billed = await judge._send(request)
                except BaseException as exc:
                    billed = spent_by(exc)
                    raise
                finally:  # before the verdict below is made: it counts this round's requests too
                    spent += billed
                    if reservation is not None:
                        judge.budget.settle(reservation, billed.prompt_tokens, billed.completion_tokens, billed.cached_tokens)
            except Failed as failure:
                if failure.output_format:  # this endpoint takes no tools: remember it, and show the budgeted view
                    judge.dialect.refuse_mode("tool")
                    judge.dialect.keep(judge.cache, judge.endpoint)
                    return await judge.judge_once(rubric, row)
                return finish(status="error", error_kind=failure.kind, error=f"navigation round {round_}: {failure}", coverage=coverage)
            except judge.RELEARN:  # a parameter fix (or the window) was learnt mid-navigation: the plain view is asked instead
                return await judge.judge_once(rubric, row)
        message = ((completion.get("choices") or [{}])[0] or {}).get("message") or {}
        calls = [c for c in message.get("tool_calls") or [] if (c.get("function") or {}).get("name") in NAMES]
        navigation = _coverage(coverage, seen, answer_tokens, round_)
        if not calls:
            reading = read_completion(rubric, completion, mode, logprobs=judge.logprobs is not None, prompt=request["messages"])
            if isinstance(reading, Reading):
                if judge.cache is not None:
                    judge.cache.put(key, completion)
                return finish(**reading.verdict_fields(), reasoning=reading.thinking, coverage=navigation)
            return finish(status="error", error_kind=reading.kind, error=reading.error, raw=reading.raw, coverage=navigation)
        if judge.cache is not None:
            judge.cache.put(key, completion)
        last = round_ == rubric.navigate_rounds
        left = (room.tokens - used) if room.tokens is not None else ANSWER_TOKENS * len(calls)
        share = max(64, left // max(1, len(calls) * (rubric.navigate_rounds - round_ + 1))) if room.tokens is not None else ANSWER_TOKENS
        messages = [*messages, {"role": "assistant", "content": message.get("content") or "", "tool_calls": message["tool_calls"]}]
        for call in message["tool_calls"]:
            if (call.get("function") or {}).get("name") not in NAMES:
                text, found = "Unknown tool: use read_steps or search, or give your verdict.", set()
            else:
                text, found = _answer(steps, call, share, counter)
            if last:
                text += "\n[this was your last tool call: give your verdict now]"
            seen |= found
            tokens = counter.count(text)
            answer_tokens += tokens
            used += tokens + 8
            messages.append({"role": "tool", "tool_call_id": call.get("id") or "", "content": text})
    return finish(status="error", error_kind="parse_failure", coverage=_coverage(coverage, seen, answer_tokens, rubric.navigate_rounds),
                  error=f"the judge used all {rubric.navigate_rounds} navigation rounds (navigate_rounds) without giving a verdict")


def _coverage(coverage: Any, seen: set[int], answer_tokens: int, rounds: int) -> Any:
    if coverage is None:
        return None
    return coverage.model_copy(update={"steps_read": len(seen), "rounds": rounds, "tokens_shown": coverage.tokens_shown + answer_tokens})
