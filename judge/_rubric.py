"""Rubrics are data: a YAML spec plus a Jinja template, found through prompts/index.yaml."""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, ValidationInfo, field_validator, model_validator

from ._tokens import ESTIMATE, TokenCounter
from ._trajectory import TrajectoryCoverage
from ._aligned import Alignment, Example, check_alignment
from ._criteria import Criterion, check_criteria, checklist_context, checklist_defaults, literal_cell
from ._specs import RubricError, read_spec, rubric_index, spec_path

if TYPE_CHECKING:  # Jinja loads on the first render: listing or loading rubrics does not need it
    from jinja2.sandbox import SandboxedEnvironment

OutputMode = Literal["json_schema", "tags", "regex", "text", "number"]
# How a request asks for the verdict. A json_schema rubric can fall back along this chain;
# the other rubrics are always asked in plain text.
AskMode = Literal["json_schema", "tool", "json_object", "tags", "text"]
JSON_FALLBACK_CHAIN: tuple[AskMode, ...] = ("json_schema", "tool", "json_object", "tags")


MIN_CRITERIA_READ = 0.5  # a checklist's default: at least half its criteria read, or the row is an error


class PromptOverflow(ValueError):
    """The prompt does not fit the room the judge's window leaves, even with its trajectory cut (a ``context_overflow``)."""


@dataclass(frozen=True)
class Room:
    """The prompt tokens a judge has room for (its context window less the output budget; None: unknown)
    and how tokens are counted for it."""

    tokens: int | None
    counter: TokenCounter


class RubricInputError(ValueError):
    """A row does not give a rubric what it needs; the message names the variable."""

    def __init__(self, message: str, variable: str | None = None) -> None:
        super().__init__(message)
        self.variable = variable


class VariableSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # media: images/audio attached to the user message as content parts; criteria: a checklist's
    # criteria given per row (judge._criteria.criteria_from_cell), shown to the template as ``checklist``;
    # trajectory: an agent rollout (chat messages with tool calls and results), rendered as numbered,
    # delimited steps within the judge's window (judge._trajectory)
    type: Literal["str", "list", "media", "criteria", "trajectory"] = "str"
    description: str = ""
    required: bool = True


class OutputSpec(BaseModel):
    """Where the label is in the judge's reply."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    mode: OutputMode
    field: str | None = None  # json_schema: the key holding the label (also the tag name on fallback)
    rationale_field: str | None = "rationale"
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    tag: str | None = None  # tags: <tag>label</tag>; two different verdicts are a parse failure (ambiguous_verdict)
    pattern: str | None = None  # regex: group "label", else group 1, else the whole match; two different matches are ambiguous
    # number: the verdict is a number, not a label (an OpenAI score_model, a Vertex autorater's parsed
    # reply). Asked as JSON when ``field`` and ``schema`` are given (the number is ``field``), read by
    # ``pattern`` when given, else the whole reply is the number. A number outside ``range`` is a
    # parse_failure; inside, it is the score when the range lies in [-1, 1], else rescaled to 0..1.
    range: tuple[float, float] | None = None
    noun: str = "reply"  # number: what an error calls the number ("the score_model's result 9 is outside ...")

    @model_validator(mode="after")
    def _needs(self) -> OutputSpec:
        need = {"json_schema": ("field", "json_schema"), "tags": ("tag",), "regex": ("pattern",), "text": (), "number": ()}
        missing = [k for k in need[self.mode] if getattr(self, k) is None]
        if missing:
            raise ValueError(f"output mode {self.mode!r} needs {', '.join(m.replace('json_', '') for m in missing)}")
        if self.mode == "number" and (self.field is None) != (self.json_schema is None):
            raise ValueError("output mode 'number' asks for JSON with both field and schema, or for text with neither")
        if self.range is not None:
            low, high = self.range
            if self.mode != "number":
                raise ValueError("range is for output mode 'number'")
            if not (math.isfinite(low) and math.isfinite(high) and low < high):
                raise ValueError(f"range must be [low, high] with low < high, got {list(self.range)}")
        if self.pattern is not None:
            try:
                re.compile(self.pattern)
            except re.error as e:
                raise ValueError(f"pattern {self.pattern!r} is not a valid regex: {e}") from e
        return self


class PairwiseSpec(BaseModel):
    """A pairwise rubric shows two outputs; these two variables trade places when the order is swapped.

    Label scores read from the side of the output shown first: > 0 it wins, < 0 the second one
    wins, 0 is a tie. That one convention lets a swapped verdict be mapped back without a table.
    """

    model_config = ConfigDict(extra="forbid")

    first: str
    second: str


class Rubric(BaseModel):
    """What to ask the judge and how to read its answer."""

    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    language: str = "en"
    template: str
    # The template's source itself, for a rubric built in code (an OpenAI label_model, a Vertex
    # autorater): ``template`` is then only its name, and no file is read or written.
    inline_template: str | None = None
    variables: dict[str, VariableSpec]
    output: OutputSpec
    labels: dict[str, float]
    # Score for an extracted answer that is not an offered label (Vertex's wrongAnswerReward);
    # "error" makes it a parse failure instead.
    unmatched: float | Literal["error"] = "error"
    # Labels that say the sample cannot be graded at all (a broken question or reference, a response
    # cut off mid-answer: CompassVerifier's INVALID). A grader turns them into status=invalid, never
    # a score; each must be an offered label scored 0, so a reader that ignores this field sees neutral.
    invalid_labels: list[str] = Field(default_factory=list)
    sampling: dict[str, Any] = Field(default_factory=dict)  # e.g. max_tokens; temperature stays 0 unless set
    pairwise: PairwiseSpec | None = None  # set for "which of two outputs is better" rubrics
    # A checklist: one request, one verdict per criterion (judge._checklist). ``labels`` are then the
    # labels of a criterion that names none; a variable of type ``criteria`` gives them per row instead.
    criteria: list[Criterion] | None = None
    # A trajectory variable (judge._trajectory): its token budget (default: the judge's context window
    # minus the rest of the prompt and the output budget), what stays when it does not fit, and whether
    # the policy's reasoning is shown.
    trajectory_budget: int | None = Field(default=None, ge=1)
    truncation: Literal["middle_out", "keep_recent", "none"] = "middle_out"
    trajectory_reasoning: Literal["keep", "drop"] = "drop"
    # whole: one verdict for the trajectory; step: one per assistant step, with the steps before it as
    # context, aggregated into the row's score by step_aggregate (judge._steps).
    granularity: Literal["whole", "step"] = "whole"
    step_aggregate: Literal["mean", "min", "last", "product"] = "mean"
    # The judge reads the trace itself: the budgeted overview plus read_steps/search tools, for at most
    # navigate_rounds requests (judge._navigate); an endpoint without tools gets the budgeted view.
    navigate: bool = False
    navigate_rounds: int = Field(default=6, ge=1, le=32)
    # What `gradekit align` may change (judge._aligned), or a user may write: guidelines and label definitions, shown
    # to a template that asks for them (``guidelines``, ``label_definitions``; an aligned rubric's template does), and
    # few-shot examples, shown as earlier turns (a labelled row, then the reply naming its label).
    guidelines: list[str] = Field(default_factory=list)
    label_definitions: dict[str, str] = Field(default_factory=dict)
    examples: list[Example] = Field(default_factory=list)
    alignment: Alignment | None = None  # an aligned rubric's certificate and digest (checked by load_rubric)
    # A checklist: the share of its criteria a reply must give readable verdicts for; below it the row is a
    # parse_failure (a judge that answered 1 of 10 has not judged the row), never the mean of the few read.
    min_criteria_read: float = Field(MIN_CRITERIA_READ, gt=0.0, le=1.0)
    directory: Path = Field(default=Path("."), exclude=True)
    _unbound: Rubric | None = PrivateAttr(default=None)  # a per-row checklist bound to one row's criteria: the rubric it came from

    @model_validator(mode="before")
    @classmethod
    def _checklist_defaults(cls, data: Any) -> Any:
        return checklist_defaults(data) if isinstance(data, Mapping) else data

    @model_validator(mode="before")
    @classmethod
    def _number_offers_no_labels(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "labels" not in data and _mode_of(data.get("output")) == "number":
            return {**data, "labels": {}}
        return data

    @field_validator("labels")
    @classmethod
    def _scores_in_range(cls, v: dict[str, float], info: ValidationInfo) -> dict[str, float]:
        if not v and _mode_of(info.data.get("output")) != "number":
            raise ValueError("labels must name at least one label")
        bad = {k: s for k, s in v.items() if not -1.0 <= s <= 1.0}
        if bad:
            raise ValueError(f"label scores must lie in [-1, 1]: {bad}")
        return v

    @field_validator("unmatched")
    @classmethod
    def _unmatched_in_range(cls, v: float | str) -> float | str:
        if isinstance(v, float) and not -1.0 <= v <= 1.0:
            raise ValueError(f"unmatched score must lie in [-1, 1], got {v}")
        return v

    @model_validator(mode="after")
    def _invalid_labels_offered(self) -> Rubric:
        wrong = [label for label in self.invalid_labels if self.labels.get(label) != 0]
        if wrong:
            raise ValueError(f"invalid_labels must be offered labels scored 0: {', '.join(map(repr, wrong))}")
        return self

    def is_invalid(self, label: str | None) -> bool:
        """Whether ``label`` (a Verdict's) says the sample cannot be graded: see ``invalid_labels``."""
        return label is not None and label in self.invalid_labels

    @model_validator(mode="after")
    def _pairwise_variables(self) -> Rubric:
        if self.pairwise is None:
            return self
        pair = self.pairwise
        missing = [v for v in (pair.first, pair.second) if v not in self.variables]
        if missing or pair.first == pair.second:
            raise ValueError(f"pairwise: first and second must be two distinct variables of the rubric, got {pair.first!r}, {pair.second!r}")
        scores = self.labels.values()
        if not (any(s > 0 for s in scores) and any(s < 0 for s in scores)):
            raise ValueError("pairwise: labels need a positive score (first output wins) and a negative one (second wins)")
        return self

    @model_validator(mode="after")
    def _alignment_speaks_the_labels(self) -> Rubric:
        """Definitions and examples name offered labels: alignment changes what the judge is told, never what it may answer."""
        offered = set(self.labels)
        unknown = sorted({lab for lab in self.label_definitions if lab not in offered}
                         | {e.label for e in self.examples if e.label not in offered})
        if unknown:
            raise ValueError(f"label_definitions and examples must name offered labels ({', '.join(self.labels)}), not "
                             f"{', '.join(map(repr, unknown))}")
        if self.examples and self.is_checklist:
            raise ValueError("examples show one label per row; a checklist has one per criterion")
        return self

    @model_validator(mode="after")
    def _checklist_shape(self) -> Rubric:
        per_row = [var for var, spec in self.variables.items() if spec.type == "criteria"]
        if len(per_row) > 1 or (per_row and self.criteria is not None):
            raise ValueError("a checklist takes its criteria from criteria: or from one variable of type criteria, not both")
        if self.criteria is not None:
            check_criteria(self.criteria)
        if self.is_checklist:
            if self.output.mode not in ("json_schema", "tags"):
                raise ValueError(f"a checklist is read as JSON (falling back to tags) or tags, not {self.output.mode!r}")
            if self.pairwise is not None:
                raise ValueError("a checklist rubric cannot be pairwise")
        return self

    @model_validator(mode="after")
    def _trajectory_settings(self) -> Rubric:
        if not self.trajectory_variables and (self.granularity == "step" or self.navigate):
            what = "granularity: step" if self.granularity == "step" else "navigate: true"
            raise ValueError(f"{what} needs a variable of type trajectory")
        if self.granularity == "step" and (self.is_checklist or self.pairwise is not None or len(self.trajectory_variables) > 1):
            raise ValueError("granularity: step judges the steps of one trajectory; not with a checklist, a pairwise rubric "
                             "or several trajectory variables")
        if self.navigate and len(self.trajectory_variables) > 1:
            raise ValueError("navigate: true reads one trajectory; the rubric has several trajectory variables")
        return self

    @model_validator(mode="after")
    def _min_criteria_read_is_a_checklists(self) -> Rubric:
        if self.min_criteria_read != MIN_CRITERIA_READ and not self.is_checklist:
            raise ValueError("min_criteria_read applies to a checklist rubric (criteria:, or a variable of type criteria)")
        return self

    @property
    def is_checklist(self) -> bool:
        """One verdict per criterion (criteria in the spec, or a variable of type ``criteria``)."""
        return self.criteria is not None or self.criteria_variable is not None

    @property
    def criteria_variable(self) -> str | None:
        """The variable a per-row checklist reads its criteria from (None: fixed criteria, or no checklist)."""
        return next((var for var, spec in self.variables.items() if spec.type == "criteria"), None)

    @property
    def asks_json(self) -> bool:
        """Whether the verdict is asked for as JSON (json_schema, or a number with a field and schema)."""
        return self.output.mode == "json_schema" or (self.output.mode == "number" and self.output.field is not None)

    @property
    def ask_modes(self) -> tuple[AskMode, ...]:
        return JSON_FALLBACK_CHAIN if self.asks_json else ("text",)

    @property
    def verdict_tag(self) -> str:
        """The tag a reply in tags mode carries its label in."""
        return self.output.tag or self.output.field or "answer"

    def prepare(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """Validate and coerce a row's values into the rubric's variables."""
        values: dict[str, Any] = {}
        for var, spec in self.variables.items():
            value = row.get(var)
            if value is None or (isinstance(value, float) and value != value):  # None or NaN
                if spec.required:
                    raise RubricInputError(f"rubric {self.name!r} needs variable {var!r}, which is missing", var)
                value = [] if spec.type in ("list", "media", "trajectory") else ""
            values[var] = _coerce(value, spec.type, self.name, var)
        return values

    @property
    def trajectory_variables(self) -> list[str]:
        """The variables of type ``trajectory`` (rendered within the judge's window)."""
        return [var for var, spec in self.variables.items() if spec.type == "trajectory"]

    def render(self, row: Mapping[str, Any], ask_mode: AskMode | None = None, *, room: Room | None = None) -> list[dict[str, str]]:
        """Render chat messages. Row values are only ever template variables, never template source.

        ``room``: the prompt tokens the judge has room for (its window less the output budget), which
        a trajectory variable is fitted into; see :meth:`render_fitted`.
        """
        return self.render_fitted(row, ask_mode, room=room)[0]

    def render_fitted(self, row: Mapping[str, Any], ask_mode: AskMode | None = None, *,
                      room: Room | None = None) -> tuple[list[dict[str, Any]], TrajectoryCoverage | None]:
        """The messages and what the judge is shown of the trajectory (None: the rubric has no trajectory variable).

        A trajectory variable is rendered last: the template is rendered once with a placeholder in
        its place, the rest of the prompt is counted, and the trajectory gets what is left of
        ``room`` (and at most ``trajectory_budget``), cut by ``truncation`` with every cut said.

        Raises:
            PromptOverflow: the parts never cut (the rest of the prompt, the task, the final answer) do not fit.
        """
        values = self.prepare(row)
        trajectories = self.trajectory_variables
        turns = self._example_turns(ask_mode)
        if not trajectories:
            return turns + self._render_values(values, ask_mode, first=not turns), None
        from ._trajectory import TrajectoryOverflow, fit

        placeholders = {var: _Placeholder(values[var]) for var in trajectories}
        messages = self._render_values({**values, **placeholders}, ask_mode, first=not turns)
        counter = room.counter if room is not None else ESTIMATE
        budget = self.trajectory_budget
        if room is not None and room.tokens is not None:
            rest = sum(counter.count(_strip(m, placeholders)) + 4 for m in [*turns, *messages])
            left = room.tokens - rest
            if left <= 0:
                raise PromptOverflow(f"rubric {self.name!r}: the prompt without its trajectory is about {rest:,} tokens, "
                                     f"over the {room.tokens:,} the judge's window leaves")
            budget = left if budget is None else min(budget, left)
        share = None if budget is None else max(1, budget // len(trajectories))
        coverage = None
        texts: dict[str, str] = {}
        for var in trajectories:
            try:
                rendered = fit(values[var], share, strategy=self.truncation, counter=counter,
                               keep_reasoning=self.trajectory_reasoning == "keep")
            except TrajectoryOverflow as e:
                raise PromptOverflow(f"rubric {self.name!r}: variable {var!r}: {e}") from None
            texts[placeholders[var].nonce] = rendered.text
            coverage = coverage or rendered.coverage
        return turns + [_substitute(m, texts) for m in messages], coverage

    def _example_turns(self, ask_mode: AskMode | None) -> list[dict[str, Any]]:
        """The few-shot examples as earlier turns: each rendered as a row would be (whole), answered with its label (one
        system message, the first)."""
        if not self.examples:
            return []
        mode = ask_mode or self.ask_modes[0]
        plain = self.model_copy(update={"examples": []})
        turns: list[dict[str, Any]] = []
        for example in self.examples:
            turns += [m for m in plain.render(example.row, mode) if m["role"] != "system" or not turns]
            turns.append({"role": "assistant", "content": example_reply(self, mode, example.label)})
        return turns

    def _render_values(self, values: Mapping[str, Any], ask_mode: AskMode | None, first: bool = True) -> list[dict[str, Any]]:
        """The row's messages; ``first=False`` (after example turns): without the system message, which they hold."""
        from jinja2 import TemplateError, UndefinedError

        mode = ask_mode or self.ask_modes[0]
        context = {
            **values,
            "output_mode": mode,
            "offered_labels": list(self.labels),
            "verdict_tag": self.verdict_tag,
            "rationale_field": self.output.rationale_field,
            "guidelines": self.guidelines,
            "label_definitions": self.label_definitions,
        }
        if self.is_checklist:
            context["checklist"] = checklist_context(self, context)
        template = _inline(self.inline_template) if self.inline_template is not None else \
            _environment(self.directory).get_template(self.template)
        try:
            messages = _blocks(template, context)
        except UndefinedError as e:
            raise RubricInputError(f"rubric {self.name!r}: template uses an undefined variable: {e.message}") from e
        except TemplateError as e:
            raise RubricError(f"rubric {self.name!r}: template {self.template!r} failed: {e}") from e
        if not messages or messages[-1]["role"] != "user":
            raise RubricError(f"rubric {self.name!r}: template {self.template!r} must define a non-empty user block")
        media = [m for var, spec in self.variables.items() if spec.type == "media" for m in context[var]]
        if len(media) > 1:
            from ._media import check_request_images

            try:
                check_request_images(media)
            except ValueError as e:
                raise RubricInputError(f"rubric {self.name!r}: {e}", next(v for v, s in self.variables.items() if s.type == "media")) from None
        if media:  # the chat API's content parts: the rendered text first, then each image or clip in order
            messages[-1] = {"role": "user", "content": [{"type": "text", "text": messages[-1]["content"]}, *(m.part() for m in media)]}
        return messages if first else [m for m in messages if m["role"] != "system"]


class _Placeholder:
    """A trajectory's stand-in while the rest of the prompt is rendered and counted: ``str()`` is a
    random marker replaced by the fitted trajectory, and the parts shown whole are its attributes."""

    def __init__(self, steps: Any) -> None:
        self.nonce = f"\x00trajectory-{secrets.token_hex(8)}\x00"
        self.task, self.final_answer, self.system = steps.task, steps.final_answer, steps.system
        self.steps_total, self.ends_in_tool_call, self.judged_step = len(steps.steps), steps.ends_in_tool_call, steps.judged

    def __str__(self) -> str:
        return self.nonce


def _strip(message: Mapping[str, Any], placeholders: Mapping[str, _Placeholder]) -> str:
    content = message.get("content")
    text = content if isinstance(content, str) else "".join(p.get("text") or "" for p in content or [] if isinstance(p, Mapping))
    for placeholder in placeholders.values():
        text = text.replace(placeholder.nonce, "")
    return text


def _substitute(message: dict[str, Any], texts: Mapping[str, str]) -> dict[str, Any]:
    content = message.get("content")
    if isinstance(content, str):
        for nonce, text in texts.items():
            content = content.replace(nonce, text)
        return {**message, "content": content}
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                text = part["text"]
                for nonce, value in texts.items():
                    text = text.replace(nonce, value)
                part = {**part, "text": text}
            parts.append(part)
        return {**message, "content": parts}
    return message


def _blocks(template: Any, context: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A template's ``system`` and ``user`` blocks rendered with ``context``, as chat messages (empty ones left out)."""
    messages = []
    # One context for both blocks, as Template.render passes its one to every block: building a context
    # copies the environment's globals (a ChainMap walked key by key), most of a render's own time.
    shared = template.new_context(context)
    for role in ("system", "user"):
        block = template.blocks.get(role)
        if block is None:
            continue
        text = "".join(block(shared)).strip()
        if text:
            messages.append({"role": role, "content": text})
    return messages


def render_prompt(name: str, context: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A shipped prompt that is not a rubric (``gradekit align``'s optimiser, prompts/<name>), rendered in the same sandbox:
    whatever ``context`` holds stays a variable, never template source."""
    from ._specs import packaged_prompts

    return _blocks(_environment(packaged_prompts()).get_template(name), context)


def _mode_of(output: Any) -> str | None:
    return output.mode if isinstance(output, OutputSpec) else output.get("mode") if isinstance(output, Mapping) else None


def example_reply(rubric: Rubric, mode: AskMode, label: str) -> str:
    """The reply an example (or a simulated annotator's demonstration) shows for ``label``, in the form the ask mode reads."""
    if mode in ("json_schema", "tool", "json_object"):
        return json.dumps({rubric.output.field or "label": label}, ensure_ascii=False)
    if mode == "tags":
        return f"<{rubric.verdict_tag}>{label}</{rubric.verdict_tag}>"
    return label


def template_source(rubric: Rubric) -> str:
    """The source of the rubric's template ("" when its file is gone)."""
    if rubric.inline_template is not None:
        return rubric.inline_template
    template = rubric.directory / rubric.template
    return template.read_text(encoding="utf-8") if template.exists() else ""


def rubric_fingerprint(rubric: Rubric) -> str:
    """A hash of everything that decides a rubric's messages: its spec and its template's source."""
    source = template_source(rubric)
    # A field added since (left at its default) is not in the hash, so every cache key and checkpoint stays. An aligned
    # rubric's certificate decides no message: it is never in the hash.
    unset = {name for name in ("invalid_labels", "inline_template", "criteria", "guidelines", "label_definitions", "examples")
             if not getattr(rubric, name)}
    unset |= {name for name, default in _TRAJECTORY_DEFAULTS.items() if getattr(rubric, name) == default}
    if rubric.min_criteria_read == MIN_CRITERIA_READ:
        unset.add("min_criteria_read")
    spec = rubric.model_dump_json(exclude={"directory", "alignment", *unset})
    return hashlib.sha256(f"{spec}\0{source}".encode()).hexdigest()


_TRAJECTORY_DEFAULTS = {"trajectory_budget": None, "truncation": "middle_out", "trajectory_reasoning": "drop",
                        "granularity": "whole", "step_aggregate": "mean", "navigate": False, "navigate_rounds": 6}


def _coerce(value: Any, kind: str, rubric: str, var: str) -> Any:
    if kind == "criteria":
        from ._criteria import criteria_from_cell

        try:
            return criteria_from_cell(value)
        except ValueError as e:
            raise RubricInputError(f"rubric {rubric!r}: variable {var!r}: {e}", var) from None
    if kind == "trajectory":
        from ._trajectory import TrajectoryInputError, read_steps

        try:
            return read_steps(value)
        except TrajectoryInputError as e:
            raise RubricInputError(f"rubric {rubric!r}: variable {var!r}: {e}", var) from None
    if kind == "media":
        from ._media import as_media

        try:
            return as_media(value)
        except ValueError as e:
            raise RubricInputError(f"rubric {rubric!r}: variable {var!r}: {e}", var) from None
    try:
        if kind == "str":
            if isinstance(value, (list, dict)):
                return json.dumps(value, ensure_ascii=False)
            return str(value)
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):  # a CSV cell holding a JSON list, or the Python repr pandas' to_csv writes
                parsed = literal_cell(text)
                if isinstance(parsed, list):
                    return [str(x) for x in parsed]
            return [value]
        if isinstance(value, (list, tuple)):
            return [str(x) for x in value]
    except RecursionError:  # a value nested deeper than Python can write out: this row's error
        raise RubricInputError(f"rubric {rubric!r}: variable {var!r}: the value nests lists or objects too deeply to read", var) from None
    except ValueError as e:
        raise RubricInputError(f"rubric {rubric!r}: variable {var!r}: {e}", var) from None
    if hasattr(value, "tolist"):  # numpy / pyarrow arrays from pandas
        return [str(x) for x in value.tolist()]
    raise RubricInputError(f"rubric {rubric!r}: variable {var!r} must be a list or a string, got {type(value).__name__}", var)


def _guard(value: Any, tag: str) -> str:
    """Neutralise a closing delimiter inside data so a graded answer cannot end its own fence."""
    text = str(value)
    return re.sub(rf"<(/?)\s*{re.escape(tag)}\s*>", rf"<\\\1{tag}>", text, flags=re.IGNORECASE)


@functools.lru_cache(maxsize=64)
def _environment(directory: Path | None) -> SandboxedEnvironment:
    """The sandboxed Jinja environment of a rubric folder (None: no folder, for inline templates)."""
    from jinja2 import FileSystemLoader, StrictUndefined
    from jinja2.sandbox import SandboxedEnvironment

    env = SandboxedEnvironment(
        loader=FileSystemLoader(str(directory)) if directory is not None else None,
        undefined=StrictUndefined,
        autoescape=False,
        keep_trailing_newline=False,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["guard"] = _guard
    env.filters["tojson_u"] = lambda v: json.dumps(v, ensure_ascii=False)
    return env


@functools.lru_cache(maxsize=64)
def _inline(source: str) -> Any:
    """An inline template, compiled once per source (the same environment and options as a file's)."""
    return _environment(None).from_string(source)


def list_rubrics() -> list[Rubric]:
    """Every rubric shipped with gradekit, in index order."""
    return [load_rubric(name) for name in rubric_index()]


def load_rubric(name_or_path: str | Path) -> Rubric:
    """Load a shipped rubric by name, or a user's rubric from the path of its YAML spec."""
    path = spec_path(name_or_path)
    data = read_spec(path)
    try:
        rubric = Rubric.model_validate({**data, "directory": path.parent.resolve()})
    except ValidationError as e:
        where = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        raise RubricError(f"rubric {data.get('name', path.stem)!r} ({path}): {where}") from e
    if not (rubric.directory / rubric.template).exists():
        raise RubricError(f"rubric {rubric.name!r}: template {rubric.template!r} not found beside {path}")
    if rubric.alignment is not None:  # an aligned rubric is what was certified, or it is refused (naming the field)
        try:
            check_alignment(rubric, template_source(rubric), str(path))
        except ValueError as e:
            raise RubricError(str(e)) from None
    return rubric
