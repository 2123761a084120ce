"""What graders read and return: a Sample in OpenAI chat form, its Trajectories, and a Grade.

A Sample is the prompt messages, the graded response (text, or assistant messages with tool
calls), ``references`` (Vertex's ``references``, Ark's ``extra``, OpenAI's ``item``) and metadata.
The converters at the bottom turn it into the shapes user code expects on each platform
(Vertex's example/Content, OpenAI's sample/item) and back.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from gradekit.judge import SyncRunner, Usage, clamp
from gradekit.judge._media import data_uri
from gradekit.judge._trajectory import content_text as _content_text

if TYPE_CHECKING:
    from gradekit.judge._embeddings import RouteReply

GradeStatus = Literal["ok", "invalid", "error"]


# ---- messages ---------------------------------------------------------------------------------


class FunctionCall(BaseModel):
    """A tool call's function: its name and its arguments as the JSON text the model wrote."""

    model_config = ConfigDict(extra="allow")

    name: str = ""
    arguments: str = ""

    @field_validator("arguments", mode="before")
    @classmethod
    def _arguments_text(cls, v: Any) -> str:
        # Some SDKs hand over parsed arguments; keep the text form the model produced.
        if v is None:
            return ""
        return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str | None = None
    type: str = "function"
    function: FunctionCall


class Message(BaseModel):
    """One chat message; ``content`` is a string or a list of content parts."""

    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[Any] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    reasoning_content: str | None = None

    @property
    def text(self) -> str:
        """The text of the content; list content (Ark 1.6, multimodal) is flattened to its text parts."""
        return content_text(self.content)


def content_text(content: Any) -> str:
    """The text of a message's content; list content keeps its text parts (judge._trajectory's reading)."""
    return _content_text(content, name_other_parts=False)


def _messages(value: Any, default_role: str) -> Any:
    """Accept a string, one message, or a list of messages/strings wherever messages are expected."""
    if value is None:
        return []
    if isinstance(value, (str, Message)) or (isinstance(value, Mapping) and "role" in value):
        value = [value]
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [{"role": default_role, "content": m} if isinstance(m, str) else m for m in value]
    return value


# A JSON object field that also takes null: platforms' bodies and YAML files write null where they mean "none".
EmptyIfNull = Annotated[dict[str, Any], BeforeValidator(lambda v: {} if v is None else v)]
# Message lists a field takes in any short form _messages accepts, a bare string being a message of the role.
_UserMessages = Annotated[list[Message], BeforeValidator(lambda v: _messages(v, "user"))]
_AssistantMessages = Annotated[list[Message], BeforeValidator(lambda v: _messages(v, "assistant"))]


class Trajectory(BaseModel):
    """One rollout of a sample: the generated messages (Ark's ``Trajectory``)."""

    model_config = ConfigDict(extra="allow")

    messages: _AssistantMessages = Field(default_factory=list)
    finish_reason: str | None = None
    usage: EmptyIfNull = Field(default_factory=dict)
    extra: dict[str, Any] | None = None


class Sample(BaseModel):
    """One thing to grade: prompt messages, the response, references and metadata.

    ``response`` takes plain text or assistant messages (with tool calls, for agent rollouts).
    ``tools`` are the tool definitions the model was offered (Ark's ``sample.tools``).
    """

    model_config = ConfigDict(extra="forbid")

    messages: _UserMessages = Field(default_factory=list)
    response: _AssistantMessages = Field(default_factory=list)
    references: EmptyIfNull = Field(default_factory=dict)
    metadata: EmptyIfNull = Field(default_factory=dict)
    tools: list[dict[str, Any]] | None = None

    @property
    def prompt_text(self) -> str:
        """The last user message: the question being answered."""
        for message in reversed(self.messages):
            if message.role == "user":
                return message.text
        return ""

    @property
    def system_text(self) -> str:
        return "\n".join(m.text for m in self.messages if m.role in ("system", "developer"))

    @property
    def final_message(self) -> Message | None:
        return self.response[-1] if self.response else None

    @property
    def response_text(self) -> str:
        """The final answer: the content of the last response message."""
        final = self.final_message
        return final.text if final is not None else ""

    @property
    def conversation(self) -> list[dict[str, Any]]:
        """The whole conversation as chat messages, prompt then response: the ``trajectory`` a rubric reads."""
        return [m.model_dump(exclude_none=True) for m in (*self.messages, *self.response)]

    def with_response(self, response: Any) -> Sample:
        return self.model_copy(update={"response": Sample(response=response).response})

    @property
    def prompt_media(self) -> list[dict[str, Any]]:
        """The images and audio clips of the prompt's messages, as chat content parts, in order.

        Read from a content list: OpenAI's ``image_url`` / ``input_image`` / ``input_audio`` parts,
        DashScope's ``{"image": url}`` parts (Bailian's messages), and the
        ``image_url`` parts a Vertex example's ``inlineData`` / ``fileData`` became. LLM graders
        send them to the judge after the rendered text.
        """
        parts: list[dict[str, Any]] = []
        for message in self.messages:
            if not isinstance(message.content, list):
                continue
            for part in message.content:
                if not isinstance(part, Mapping):
                    continue
                kind = part.get("type")
                if kind in ("image_url", "input_image", "input_audio"):
                    parts.append(dict(part))
                elif kind is None and isinstance(part.get("image"), str):  # DashScope's multimodal message part
                    parts.append({"type": "image_url", "image_url": {"url": part["image"]}})
        return parts


# ---- the grade --------------------------------------------------------------------------------


class Grade(BaseModel):
    """What a grader says about one sample.

    ``status``: ``ok`` (``score`` is set, clamped to [-1, 1]); ``invalid`` (the sample or the
    response cannot be graded this way: a missing reference, a python grader that raised, timed
    out or returned a non-number); ``error`` (a transient failure such as an unreachable judge).
    Neither failure carries a score: could-not-judge is a state, not a number.
    """

    score: float | None = None
    status: GradeStatus = "ok"
    error: str | None = None
    error_kind: str | None = None  # the judge's ErrorKind, "timeout", "memory", "exception", ...
    parts: dict[str, Grade] = Field(default_factory=dict)
    metrics: dict[str, float] = Field(default_factory=dict)
    debug: list[str] = Field(default_factory=list)
    # Extra output-row cells, for the columns the grader declares in its ``output_columns`` (a file
    # run writes the same columns on every row, so they are declared before the first grade).
    columns: dict[str, Any] = Field(default_factory=dict)
    # What the grader's judges billed (a composite's: its parts' sum); None when no judge was asked (a
    # deterministic grader), so a failed row's attempts column says "no judge" apart from "0 requests".
    usage: Usage | None = None
    cache_hits: int = 0  # judgements served from the response cache (a hybrid's two orders count two)

    @field_validator("score")
    @classmethod
    def _clamp(cls, v: float | None) -> float | None:
        if v is None:
            return None
        if math.isnan(v):
            raise ValueError("a score cannot be NaN")
        return clamp(v)

    @model_validator(mode="after")
    def _state(self) -> Grade:
        if self.status == "ok" and self.score is None:
            raise ValueError("an ok grade needs a score")
        if self.status != "ok" and self.score is not None:
            raise ValueError(f"a grade with status {self.status!r} carries no score")
        return self

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @classmethod
    def scored(cls, score: float, **fields: Any) -> Grade:
        return cls(score=score, status="ok", **fields)

    @classmethod
    def failed(cls, status: Literal["invalid", "error"], error: str, **fields: Any) -> Grade:
        return cls(status=status, error=error, **fields)


def usage_of(grades: Iterable[Grade]) -> dict[str, Any]:
    """The ``usage`` and ``cache_hits`` of grades put together (a composite's, a group's): their sum, usage None
    when none of them asked a judge. Spread into ``Grade(...)``."""
    judged = [g for g in grades if g.usage is not None]
    return {"usage": sum((g.usage for g in judged), Usage()) if judged else None,  # type: ignore[misc]
            "cache_hits": sum(g.cache_hits for g in judged)}


def route_spent(reply: RouteReply) -> dict[str, Any]:
    """What a side route's reply (embeddings, a reward model's score) adds to a Grade: the requests it sent and
    its cache hit, as a run counts them (its summary, an error row's attempts column). Its prompt tokens are not
    the judge's, and the judge model's price does not apply to them. Spread into ``Grade(...)``."""
    return {"usage": Usage(requests=reply.attempts), "cache_hits": int(reply.cached)}


@runtime_checkable
class Grader(Protocol):
    """Anything awaitable as ``await grader(sample) -> Grade``."""

    async def __call__(self, sample: Sample) -> Grade: ...


async def aclose_grader(grader: Any) -> None:
    """Release what a grader holds (python workers, a judge it built); a no-op for plain functions."""
    close = getattr(grader, "aclose", None)
    if close is not None:
        await close()


class SyncGrader:
    """The sync façade: ``SyncGrader(grader)(sample) -> Grade`` from scripts or Jupyter.

    It runs on judge's SyncRunner (one private loop in a thread) so a judge's connection pool
    stays valid between calls.
    """

    def __init__(self, grader: Grader) -> None:
        self.grader = grader
        self._runner = SyncRunner()

    def __call__(self, sample: Sample | Mapping[str, Any]) -> Grade:
        if not isinstance(sample, Sample):
            sample = Sample.model_validate(sample)
        return self._runner.run(self.grader(sample))

    def close(self) -> None:
        self._runner.run(aclose_grader(self.grader))
        self._runner.close()

    def __enter__(self) -> SyncGrader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---- placeholders: {{references.key}}, {{response}}, ... ---------------------------------------

_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][\w.\-]*)\s*\}\}")


class PlaceholderError(KeyError):
    """A ``{{...}}`` placeholder names something the sample does not have."""

    def __str__(self) -> str:
        return str(self.args[0])


# What a placeholder path names: the sample part it reads (docs/graders.md). platforms/_standalone.py copies this
# table, path_part and follow into every exported file, so a path reads there what it reads here.
PATH_PARTS = {"prompt": "prompt", "question": "prompt", "response": "response", "sample.output_text": "response",
              "output_text": "response", "system_instruction": "system", "system": "system", "trajectory": "trajectory"}


def path_part(path: str) -> tuple[str, str] | None:
    """The part of a sample ``path`` reads and the dotted keys below it (``("references", "answer.0")``); None: no part.

    Parts: prompt, response, system, trajectory, references (``item.`` is OpenAI's name for it), metadata, and
    sample (OpenAI's sample namespace); the last three only with keys.
    """
    if path in PATH_PARTS:
        return PATH_PARTS[path], ""
    head, _, keys = path.partition(".")
    if keys and head in ("references", "item", "metadata", "sample"):
        return "references" if head == "item" else head, keys
    return None


def follow(value: Any, keys: str) -> Any:
    """The value dotted ``keys`` name inside ``value``: mapping keys, and list items by position; KeyError if none."""
    for key in keys.split("."):
        if isinstance(value, list) and key.isdigit() and int(key) < len(value):
            value = value[int(key)]
        elif isinstance(value, Mapping) and key in value:
            value = value[key]
        else:
            raise KeyError(key)
    return value


_PART_ATTRIBUTES = {"prompt": "prompt_text", "response": "response_text", "system": "system_text",
                    "trajectory": "conversation", "references": "references", "metadata": "metadata"}


def resolve_path(sample: Sample, path: str) -> Any:
    """The sample value a path names (:func:`path_part`).

    Paths: ``prompt`` (last user message), ``response`` (final answer text), ``system_instruction``,
    ``trajectory`` (the whole conversation as chat messages, tool calls and results included),
    ``references.<key>`` (also ``item.<key>``, OpenAI's name), ``metadata.<key>``,
    ``sample.output_text``. Dots go into nested dicts and, by position, lists (``item.choices.0``).
    """
    found = path_part(path)
    if found is not None:
        part, keys = found
        whole = to_openai_sample(sample) if part == "sample" else getattr(sample, _PART_ATTRIBUTES[part])
        try:
            return follow(whole, keys) if keys else whole
        except KeyError:
            raise PlaceholderError(f"{path!r}: the sample has no {keys!r}" if part == "sample" else
                                   f"{path!r}: the sample has no {part} key {keys!r}") from None
    raise PlaceholderError(
        f"unknown placeholder {path!r}; use prompt, response, trajectory, system_instruction, references.<key> or metadata.<key>"
    )


def value_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def fill_placeholders(template: str, sample: Sample, *, escape: Any = None, response: str | None = None) -> str:
    """Replace every ``{{path}}`` in a config string with the sample's value, in one pass.

    One pass over the template only: a response that contains ``{{references.answer}}`` is
    inserted as text, never expanded. ``escape`` (e.g. ``re.escape``) is applied to each value.
    """

    def sub(match: re.Match[str]) -> str:
        path = match.group(1)
        if response is not None and path in ("response", "sample.output_text", "output_text"):
            text = response
        else:
            text = value_text(resolve_path(sample, path))
        return escape(text) if escape is not None else text

    return _PLACEHOLDER.sub(sub, template)


def placeholders(template: str) -> list[str]:
    return _PLACEHOLDER.findall(template)


# ---- platform shapes ----------------------------------------------------------------------------


def _vertex_parts(message: Message) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    if message.role == "tool":
        try:
            payload = json.loads(message.text)
        except json.JSONDecodeError:
            payload = {"content": message.text}
        if not isinstance(payload, dict):
            payload = {"content": payload}
        return [{"functionResponse": {"name": message.name or "", "response": payload}}]
    if message.text:
        parts.append({"text": message.text})
    for call in message.tool_calls or []:
        try:
            args = json.loads(call.function.arguments or "{}")
        except json.JSONDecodeError:
            args = {"_raw": call.function.arguments}
        parts.append({"functionCall": {"name": call.function.name, "args": args}})
    return parts


def to_vertex_content(messages: Sequence[Message], role: str = "model") -> dict[str, Any]:
    """Messages as one Vertex ``Content`` (``{"role", "parts": [...]}``)."""
    return {"role": role, "parts": [part for m in messages for part in _vertex_parts(m)]}


def to_vertex_example(sample: Sample) -> dict[str, Any]:
    """The sample as a Vertex ReinforcementTuningExample (camelCase ProtoJSON)."""
    example: dict[str, Any] = {}
    system = [m for m in sample.messages if m.role in ("system", "developer")]
    if system:
        example["systemInstruction"] = {"parts": [{"text": m.text} for m in system]}
    example["contents"] = [
        {"role": "model" if m.role == "assistant" else "user", "parts": _vertex_parts(m)}
        for m in sample.messages
        if m.role not in ("system", "developer")
    ]
    if sample.references:
        example["references"] = dict(sample.references)
    return example


_AUDIO_FORMATS = {"audio/wav": "wav", "audio/x-wav": "wav", "audio/wave": "wav", "audio/mpeg": "mp3", "audio/mp3": "mp3"}


def _vertex_media(part: Mapping[str, Any]) -> dict[str, Any] | None:
    """A Vertex ``inlineData`` / ``fileData`` image or audio part as a chat content part (None: neither).

    inlineData becomes a ``data:`` URI; fileData keeps its ``fileUri`` (an https URL reaches the judge;
    a ``gs://`` one is named as an input error when an LLM grader needs it: a chat judge cannot fetch it).
    """
    inline, file = part.get("inlineData") or part.get("inline_data"), part.get("fileData") or part.get("file_data")
    source = inline if isinstance(inline, Mapping) else file if isinstance(file, Mapping) else None
    if source is None:
        return None
    mime = str(source.get("mimeType") or source.get("mime_type") or "")
    if inline is source:
        if mime.startswith("audio/") and mime in _AUDIO_FORMATS:
            return {"type": "input_audio", "input_audio": {"data": str(source.get("data") or ""), "format": _AUDIO_FORMATS[mime]}}
        url = data_uri(mime, str(source.get("data") or ""))
    else:
        url = str(source.get("fileUri") or source.get("file_uri") or "")
    return {"type": "image_url", "image_url": {"url": url}} if mime.startswith("image/") or not mime else None


def _from_vertex_content(content: Mapping[str, Any]) -> list[Message]:
    role = {"model": "assistant", "assistant": "assistant", "system": "system"}.get(str(content.get("role", "user")), "user")
    texts: list[str] = []
    media: list[dict[str, Any]] = []
    calls: list[ToolCall] = []
    out: list[Message] = []
    for part in content.get("parts") or []:
        if not isinstance(part, Mapping):
            continue
        found = _vertex_media(part)
        if found is not None:
            media.append(found)
        elif isinstance(part.get("text"), str) and not part.get("thought"):
            texts.append(part["text"])
        elif "functionCall" in part:
            call = part["functionCall"] or {}
            calls.append(ToolCall(id=call.get("id"), function=FunctionCall(name=call.get("name", ""), arguments=call.get("args", {}))))
        elif "functionResponse" in part:
            resp = part["functionResponse"] or {}
            out.append(Message(role="tool", name=resp.get("name"), content=value_text(resp.get("response"))))
    if texts or calls or media or not out:
        # With media the content is a part list (its text is the same, content_text joins the text parts).
        body: str | list[Any] = [{"type": "text", "text": "".join(texts)}, *media] if media else "".join(texts)
        out.insert(0, Message(role=role, content=body, tool_calls=calls or None))
    return out


def vertex_content_messages(content: Mapping[str, Any]) -> list[Message]:
    """A Vertex ``Content`` as chat messages (``model`` -> ``assistant``, functionCall -> tool call)."""
    return _from_vertex_content(content)


def sample_from_vertex(example: Mapping[str, Any], response: Mapping[str, Any] | None = None) -> Sample:
    """A Vertex dataset row (``contents``, ``systemInstruction``, ``references``) as a Sample."""
    messages: list[Message] = []
    system = example.get("systemInstruction") or example.get("system_instruction")
    if system:
        messages.append(Message(role="system", content=content_text((system or {}).get("parts"))))
    for content in example.get("contents") or []:
        messages.extend(_from_vertex_content(content))
    references = example.get("references") or {}
    if not isinstance(references, Mapping):
        raise ValueError(f"example references must be an object, got {type(references).__name__}")
    known = {"contents", "systemInstruction", "system_instruction", "references"}
    metadata = {k: v for k, v in example.items() if k not in known}
    sample = Sample(messages=messages, references=dict(references), metadata=metadata)
    return sample.with_response(vertex_content_messages(response)) if response is not None else sample


def to_openai_sample(sample: Sample) -> dict[str, Any]:
    """OpenAI's grader ``sample``: choices, output_text, output_json (when the text is JSON), output_tools."""
    final = sample.final_message
    message = final.model_dump(exclude_none=True) if final is not None else {"role": "assistant", "content": ""}
    text = sample.response_text
    try:
        output_json = json.loads(text)
    except (json.JSONDecodeError, ValueError):
        output_json = None
    tools = [c.model_dump(exclude_none=True) for c in (final.tool_calls or [])] if final is not None else []
    built = {
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if tools else "stop"}],
        "output_text": text,
        "output_json": output_json if isinstance(output_json, (dict, list)) else None,
        "output_tools": tools,
    }
    given = sample.metadata.get("sample")  # an Evals-API row's own sample wins over what is derived from the response
    return {**built, **{k: v for k, v in given.items() if v is not None}} if isinstance(given, Mapping) else built


def to_openai_item(sample: Sample) -> dict[str, Any]:
    """OpenAI's grader ``item``: the dataset row's keys, which gradekit keeps in ``references``."""
    return dict(sample.references)


def sample_from_row(row: Mapping[str, Any]) -> Sample:
    """A Vertex-style row or a gradekit sample, whichever the keys say it is."""
    if "contents" in row or "systemInstruction" in row:
        return sample_from_vertex(row)
    if "extra" in row and "references" not in row:  # an Ark ChatCompletionSample line
        known = {"messages", "extra", "tools"}
        return Sample.model_validate({"messages": row.get("messages"), "references": row.get("extra") or {}, "tools": row.get("tools"),
                                      "metadata": {k: v for k, v in row.items() if k not in known}})
    # A dataset row carries ids and other columns: they go to metadata rather than failing. Without a
    # references object they are the references too, as in a file run (``{{references.answer}}`` reads
    # column ``answer``); with one (``{"response": ..., "references": {"answer": "5"}}``) it alone is.
    known = set(Sample.model_fields)
    extra = {k: v for k, v in row.items() if k not in known}
    fields = {k: v for k, v in row.items() if k in known}
    if extra:
        fields["metadata"] = {**extra, **(fields.get("metadata") or {})}
        if "references" not in row:
            fields["references"] = dict(extra)
    return Sample.model_validate(fields)
