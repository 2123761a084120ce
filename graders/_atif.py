"""Trajectories as they arrive: ATIF documents and chat messages, read into chat messages with named errors.

ATIF, the Agent Trajectory Interchange Format (Harbor RFC 0001, ``schema_version`` ``ATIF-v1.0`` to
``ATIF-v1.7``; NVIDIA NeMo Agent Toolkit's ``nat.atif`` and Harbor's ``harbor.models.trajectories``
are its models), is a ``steps`` list: each step has a ``step_id`` (1, 2, 3, ... in order), a
``source`` (``system``, ``user`` or ``agent``), a ``message`` (text, or content parts since
v1.6), and for an agent step optional ``reasoning_content``, ``tool_calls``
(``tool_call_id``, ``function_name``, ``arguments``) and an ``observation`` whose ``results``
answer them (``source_call_id``, ``content``). :func:`atif_messages` checks that shape and names
what is wrong (``steps[3].tool_calls[0]: function_name is missing``), then gives the chat messages
the judge core reads: the agent's message and calls as an assistant message, each result as a
``tool`` message answering its call (a result without a call id as a ``tool`` message too), user
and system steps as such. Fields ATIF adds in later minor versions are read past, not refused.

:func:`trajectory_messages` is the one door for every trajectory value a row or a request holds:
an ATIF document, a list of chat messages, Ark's ``{"messages": [...]}``, or JSON text of any of them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

ATIF_VERSION = re.compile(r"^ATIF-v1\.\d+$")
_SOURCES = ("system", "user", "agent")


class TrajectoryError(ValueError):
    """A trajectory that cannot be read; the message names the field at fault."""


def is_atif(value: Any) -> bool:
    """Whether ``value`` claims to be an ATIF document (a ``schema_version`` starting ``ATIF`` and ``steps``)."""
    return isinstance(value, Mapping) and isinstance(value.get("schema_version"), str) \
        and value["schema_version"].upper().startswith("ATIF") and "steps" in value


def _content(value: Any, where: str) -> str:
    """An ATIF message or result content: text, or content parts (text; an image named by its path)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        pieces = []
        for i, part in enumerate(value):
            if not isinstance(part, Mapping):
                raise TrajectoryError(f"{where}[{i}]: a content part must be an object, got {type(part).__name__}")
            kind = part.get("type")
            if kind == "text":
                if not isinstance(part.get("text"), str):
                    raise TrajectoryError(f"{where}[{i}]: a text part needs 'text'")
                pieces.append(part["text"])
            elif kind == "image":
                source = part.get("source") if isinstance(part.get("source"), Mapping) else {}
                pieces.append(f"[image: {source.get('path') or 'no path'}]")  # the judge reads text: the image is named, not lost
            else:
                raise TrajectoryError(f"{where}[{i}]: content part type {kind!r} is not 'text' or 'image'")
        return "\n".join(pieces)
    raise TrajectoryError(f"{where}: must be text or a list of content parts, got {type(value).__name__}")


def _step_id(value: Any, where: str) -> int:
    if isinstance(value, bool):
        raise TrajectoryError(f"{where}.step_id: must be a number, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():  # Harbor's agents write "1" as often as 1
        return int(value)
    raise TrajectoryError(f"{where}.step_id: must be a number, got {value!r}")


def atif_messages(document: Mapping[str, Any]) -> list[dict[str, Any]]:
    """An ATIF document as chat messages, checked first; a :class:`TrajectoryError` names what is wrong."""
    version = document.get("schema_version")
    if not isinstance(version, str) or not ATIF_VERSION.match(version):
        raise TrajectoryError(f"schema_version: {version!r} is not ATIF-v1.x (ATIF-v1.0 to ATIF-v1.7 are read)")
    steps = document.get("steps")
    if not isinstance(steps, list) or not steps:
        raise TrajectoryError("steps: an ATIF trajectory needs a non-empty list of steps")
    messages: list[dict[str, Any]] = []
    for index, step in enumerate(steps):
        where = f"steps[{index}]"
        if not isinstance(step, Mapping):
            raise TrajectoryError(f"{where}: must be an object, got {type(step).__name__}")
        if "step_id" not in step:
            raise TrajectoryError(f"{where}: step_id is missing")
        if _step_id(step["step_id"], where) != index + 1:
            raise TrajectoryError(f"{where}.step_id: expected {index + 1} (sequential from 1), got {step['step_id']!r}")
        source = step.get("source")
        if source not in _SOURCES:
            raise TrajectoryError(f"{where}.source: {source!r} is not one of system, user, agent")
        if "message" not in step:
            raise TrajectoryError(f"{where}: message is missing")
        text = _content(step.get("message"), f"{where}.message")
        if source != "agent":
            for name in ("tool_calls", "reasoning_content"):
                if step.get(name) is not None:
                    raise TrajectoryError(f"{where}.{name}: only an agent step has {name}, this one's source is {source!r}")
        calls = _calls(step.get("tool_calls"), where)
        results = _results(step.get("observation"), where, {c["id"] for c in calls})
        if source == "agent":
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if calls:
                message["tool_calls"] = calls
            reasoning = step.get("reasoning_content")
            if isinstance(reasoning, str) and reasoning:
                message["reasoning_content"] = reasoning
            messages.append(message)
        else:
            messages.append({"role": source, "content": text})
        messages.extend(results)
    return messages


def _calls(value: Any, where: str) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise TrajectoryError(f"{where}.tool_calls: must be a list, got {type(value).__name__}")
    calls = []
    for i, call in enumerate(value):
        at = f"{where}.tool_calls[{i}]"
        if not isinstance(call, Mapping):
            raise TrajectoryError(f"{at}: must be an object, got {type(call).__name__}")
        for name in ("tool_call_id", "function_name"):
            if not isinstance(call.get(name), str) or not call[name]:
                raise TrajectoryError(f"{at}: {name} is missing")
        arguments = call.get("arguments")
        if "arguments" not in call:
            raise TrajectoryError(f"{at}: arguments is missing (an empty object when the call takes none)")
        if not isinstance(arguments, (Mapping, str)):
            raise TrajectoryError(f"{at}.arguments: must be an object, got {type(arguments).__name__}")
        text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
        calls.append({"id": call["tool_call_id"], "type": "function", "function": {"name": call["function_name"], "arguments": text}})
    return calls


def _results(value: Any, where: str, call_ids: set[str]) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, Mapping) or not isinstance(value.get("results"), list):
        raise TrajectoryError(f"{where}.observation: must be an object with a list of results")
    out = []
    for i, result in enumerate(value["results"]):
        at = f"{where}.observation.results[{i}]"
        if not isinstance(result, Mapping):
            raise TrajectoryError(f"{at}: must be an object, got {type(result).__name__}")
        source = result.get("source_call_id")
        if source is not None and source not in call_ids:
            raise TrajectoryError(f"{at}.source_call_id: {source!r} is not the tool_call_id of a call in this step")
        content = _content(result.get("content"), f"{at}.content")
        refs = result.get("subagent_trajectory_ref")
        if isinstance(refs, list) and refs:
            named = ", ".join(str(r.get("session_id")) for r in refs if isinstance(r, Mapping))
            content = f"{content}\n[delegated to subagent trajectories: {named}]".strip()
        message: dict[str, Any] = {"role": "tool", "content": content}
        if source is not None:
            message["tool_call_id"] = source
        out.append(message)
    return out


def trajectory_messages(value: Any) -> list[dict[str, Any]]:
    """Any trajectory value as chat messages: an ATIF document, a list of chat messages, ``{"messages": [...]}``
    (Ark's Trajectory), or JSON text of any of them. A :class:`TrajectoryError` names what is wrong."""
    if isinstance(value, (str, bytes)):
        try:
            value = json.loads(value)
        except ValueError:
            raise TrajectoryError("a trajectory must be JSON: chat messages or an ATIF document") from None
    if hasattr(value, "tolist") and not isinstance(value, list):  # numpy / pyarrow arrays from pandas
        value = value.tolist()
    if is_atif(value):
        return atif_messages(value)
    if isinstance(value, Mapping):
        if isinstance(value.get("schema_version"), str):
            raise TrajectoryError(f"schema_version: {value['schema_version']!r} is not ATIF-v1.x")
        if "messages" not in value:
            raise TrajectoryError("a trajectory object needs 'messages' (chat messages) or 'schema_version' and 'steps' (ATIF)")
        value = value["messages"]
        if hasattr(value, "tolist") and not isinstance(value, list):
            value = value.tolist()
    if not isinstance(value, Sequence) or isinstance(value, (str, bytes)):
        raise TrajectoryError(f"a trajectory must be a list of chat messages or an ATIF document, got {type(value).__name__}")
    out = []
    for i, message in enumerate(value):
        if hasattr(message, "model_dump"):
            message = message.model_dump(exclude_none=True)
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise TrajectoryError(f"messages[{i}]: a chat message needs a role")
        out.append(dict(message))
    return out


def split_conversation(messages: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """(prompt, response) of a whole conversation: the prompt is what comes before the first assistant
    turn (system and user: the task), the response the rest, so a rollout's tool calls, results and
    later turns are the response and its last message is the final answer."""
    def role(message: Any) -> Any:
        return message.get("role") if isinstance(message, Mapping) else getattr(message, "role", None)

    first = next((i for i, m in enumerate(messages) if role(m) == "assistant"), len(messages))
    return list(messages[:first]), list(messages[first:])
