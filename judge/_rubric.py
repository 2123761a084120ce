"""Rubrics are data: a YAML spec plus a Jinja template, found through prompts/index.yaml."""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, ValidationInfo, field_validator, model_validator

from ._criteria import Criterion, check_criteria, checklist_context, checklist_defaults, literal_cell
from ._specs import RubricError, read_spec, rubric_index, spec_path

if TYPE_CHECKING:  # Jinja loads on the first render: listing or loading rubrics does not need it
    from jinja2.sandbox import SandboxedEnvironment

OutputMode = Literal["json_schema", "tags", "regex", "text", "number"]
# How a request asks for the verdict. A json_schema rubric can fall back along this chain;
# the other rubrics are always asked in plain text.
AskMode = Literal["json_schema", "tool", "json_object", "tags", "text"]
JSON_FALLBACK_CHAIN: tuple[AskMode, ...] = ("json_schema", "tool", "json_object", "tags")


class RubricInputError(ValueError):
    """A row does not give a rubric what it needs; the message names the variable."""

    def __init__(self, message: str, variable: str | None = None) -> None:
        super().__init__(message)
        self.variable = variable


class VariableSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # media: images/audio attached to the user message as content parts; criteria: a checklist's
    # criteria given per row (judge._criteria.criteria_from_cell), shown to the template as ``checklist``
    type: Literal["str", "list", "media", "criteria"] = "str"
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
                value = [] if spec.type in ("list", "media") else ""
            values[var] = _coerce(value, spec.type, self.name, var)
        return values

    def render(self, row: Mapping[str, Any], ask_mode: AskMode | None = None) -> list[dict[str, str]]:
        """Render chat messages. Row values are only ever template variables, never template source."""
        from jinja2 import TemplateError, UndefinedError

        mode = ask_mode or self.ask_modes[0]
        context = {
            **self.prepare(row),
            "output_mode": mode,
            "offered_labels": list(self.labels),
            "verdict_tag": self.verdict_tag,
            "rationale_field": self.output.rationale_field,
        }
        if self.is_checklist:
            context["checklist"] = checklist_context(self, context)
        template = _inline(self.inline_template) if self.inline_template is not None else \
            _environment(self.directory).get_template(self.template)
        messages = []
        try:
            for role in ("system", "user"):
                block = template.blocks.get(role)
                if block is None:
                    continue
                text = "".join(block(template.new_context(context))).strip()
                if text:
                    messages.append({"role": role, "content": text})
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
        return messages


def _mode_of(output: Any) -> str | None:
    return output.mode if isinstance(output, OutputSpec) else output.get("mode") if isinstance(output, Mapping) else None


def rubric_fingerprint(rubric: Rubric) -> str:
    """A hash of everything that decides a rubric's messages: its spec and its template's source."""
    if rubric.inline_template is not None:
        source = rubric.inline_template
    else:
        template = rubric.directory / rubric.template
        source = template.read_text(encoding="utf-8") if template.exists() else ""
    # A field added since (left at its default) is not in the hash, so every cache key and checkpoint stays.
    unset = {name for name in ("invalid_labels", "inline_template", "criteria") if not getattr(rubric, name)}
    spec = rubric.model_dump_json(exclude={"directory", *unset})
    return hashlib.sha256(f"{spec}\0{source}".encode()).hexdigest()


def _coerce(value: Any, kind: str, rubric: str, var: str) -> Any:
    if kind == "criteria":
        from ._criteria import criteria_from_cell

        try:
            return criteria_from_cell(value)
        except ValueError as e:
            raise RubricInputError(f"rubric {rubric!r}: variable {var!r}: {e}", var) from None
    if kind == "media":
        from ._media import as_media

        try:
            return as_media(value)
        except ValueError as e:
            raise RubricInputError(f"rubric {rubric!r}: variable {var!r}: {e}", var) from None
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
    return rubric
