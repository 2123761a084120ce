"""Build any grader from a YAML or JSON file (or a dict).

Every grader node is a mapping with a ``type`` key and an optional ``name``; paths inside a file
(``file``, ``rubric`` ending in .yaml, ``prompt_file``) are relative to that file. ``parse`` is
``{type: IDENTITY}`` (the default) or ``{type: REGEX_EXTRACT, regex: "<answer>(.*?)</answer>"}``
(the last match counts). ``expression`` and ``prompt`` take ``{{references.key}}``,
``{{prompt}}``, ``{{response}}``, ``{{system_instruction}}`` and ``{{metadata.key}}``.

.. code-block:: yaml

    type: string_match          # Vertex stringMatchRewardScorer
    expression: "{{references.answer}}"
    operation: EXACT_MATCH      # or PARTIAL_MATCH, REGEX_CONTAINS
    parse: {type: REGEX_EXTRACT, regex: "<answer>(.*?)</answer>"}
    correct: 1                  # default 1
    wrong: -1                   # default -1

    type: json_match            # Vertex jsonMatchExpression
    key: answer                 # dots go into nested objects
    expression: "{{references.answer}}"

    type: normalized_match      # case, whitespace, punctuation, full-width and number spellings folded
    expression: "{{references.answer}}"
    normalization: {case: true, whitespace: true, punctuation: true, width: true, numbers: true}

    type: numeric_match
    expression: "{{references.answer}}"
    abs_tol: 0.01
    rel_tol: 0

    type: text_similarity       # OpenAI text_similarity: the metric in 0..1
    input: "{{ sample.output_text }}"
    reference: "{{ item.answer }}"
    evaluation_metric: cosine   # fuzzy_match, bleu, gleu, meteor (gradekit[meteor]), rouge_1..rouge_5, rouge_l, cosine
    embedding_model: text-embedding-3-large   # cosine only: embedded through the judge's endpoint
    pass_threshold: 0.8         # optional: metrics.passed

    type: string_check          # OpenAI string_check: 1 or 0
    input: "{{ sample.output_text }}"
    reference: "{{ item.answer }}"
    operation: ilike            # eq, ne, like, ilike

    type: score_model           # OpenAI score_model: the judge replies a number in range
    input: [{role: user, content: "Rate {{ sample.output_text }} from 1 to 7 against {{ item.answer }}."}]
    range: [1, 7]               # default [0, 1]; outside [-1, 1] the score is rescaled to 0..1 (metrics.raw_score keeps the number)
    sampling_params: {temperature: 0, seed: 1}
    model: gpt-4.1              # recorded and exported; the judge that runs it is judge:'s

    type: reward_model          # a served scalar reward model (vLLM /classify, /pooling; SGLang /v1/embeddings)
    route: /classify            # the judge block names its model and endpoint (base_url, or a fleet)
    mapping: sigmoid            # sigmoid (scale, center) | raw (clipped) | minmax, zscore (under type: group)

    type: llm                   # any rubric: a shipped name or a path to a .yaml spec
    rubric: semantic_equivalence_zh
    map: {question: prompt, references: references.answer, prediction: response}

    type: autorater             # Vertex autoraterScorer
    prompt: "Is this polite? {{response}} End with <answer>Yes</answer> or <answer>No</answer>."
    parse: {type: REGEX_EXTRACT, regex: "<answer>(.*?)</answer>"}
    expression: "Yes"           # exact match -> correct / wrong; omit to read the reply as a number
    correct: 1
    wrong: -1

    type: python                # a file defining evaluate(example, response) or grade(sample, item)
    file: reward.py             # or source: "def grade(sample, item): ..."
    timeout: 100                # seconds per call
    memory_mb: 1024
    workers: 2
    env: {MY_SETTING: "x"}      # the only variables the child sees beyond PATH, locale and TZ
    sandbox: auto               # auto (bubblewrap, else rlimits with a warning), strict (bubblewrap or exit 2), none
    network: false              # true: the code may use the network
    packages: [numpy]           # importable beyond the standard library (read-only in the sandbox)
    processes: 32               # RLIMIT_NPROC per call; file_mb: 64 (RLIMIT_FSIZE); cpus: 1 (affinity)

    type: code_tests            # run the response's program (last fenced block) against test cases
    tests: tests                # references key: [{input, output}], {inputs, outputs} or assert code
    scoring: fraction           # passed/total mapped to [-1, 1], or all_or_nothing
    timeout: 5                  # seconds per case
    memory_mb: 512              # per case; also workers, sandbox, network, packages, processes, file_mb, cpus

    type: verified_answer       # the final answer against the gold one, by rule (docs/graders.md); also: math_equivalence
    expression: "{{references.answer}}"
    kind: auto                  # told from the gold; or number, expression, choice, string ("{{references.kind}}" per row)
    options: "{{references.options}}"  # choice: the options (default: the row's options/choices, else the question's list)
    aliases: "{{references.aliases}}"  # string: more answers that count (a gold that is a JSON list is aliases too)
    timeout: 5                  # seconds per check: past it the check is status=error, error_kind=timeout, never wrong
    correct: 1
    wrong: -1
    parse: auto                 # the last \\boxed{}, a short answer as itself, then LaTeX, then a plain expression;
                                # or boxed, answer (the response is the answer: no extraction), latex, expr, a list
    max_chars: 1000000          # a longer response is cut to its last 1,000,000 characters (the answer is at its end)
    judge_fallback:             # the hybrid: rows the check did not accept go to the judge (judge:), asked in both orders
      rubric: answer_verification_3way   # any answer-equivalence rubric (references, prediction)
      require: both             # correct only when both orders say so; or either

    type: weighted              # Vertex composite: sum(w * r) / sum(w), up to 16 parts
    parts:
      exact: {weight: 0.7, type: string_match, expression: "{{references.answer}}"}
      tone: {weight: 0.3, type: llm, rubric: tone}

    type: formula               # OpenAI multi grader (also accepted: type: multi, calculate_output:)
    formula: "0.5 * exact + 0.5 * max(tone, 0)"
    graders:
      exact: {type: string_match, expression: "{{references.answer}}"}
      tone: {type: llm, rubric: tone}

    type: vertex                # a reinforcementTuningSpec, inline (spec:) or in a JSON file (file:)
    file: reward_spec.json

A file whose top level is a Vertex spec (``reinforcementTuningSpec``, ``singleRewardConfig`` or
``compositeRewardConfig``) loads as ``type: vertex`` unchanged. The top level may also carry
``judge: {model: ..., base_url: ..., timeout: ..., params: {reasoning_effort: low}}`` for its LLM
nodes (``params``: judge parameters sent with every request); the API key comes from the
environment (OPENAI_API_KEY). ``judge: {endpoints: [{base_url, api_key, weight, rps, tpm}, ...]}``
instead of ``base_url`` makes the judge a fleet (docs/fleets.md), which hedges stragglers unless
``hedge: false`` (``hedge: {max_extra: 0.05, ...}`` tunes it). A jury instead of one judge:
``judge: {jury: [{model, base_url, api_key, params}, ...], aggregate: majority, quorum: 2}``
(docs/juries.md). An endpoint's or a juror's ``api_key`` is best written ``$NAME`` (read from that
environment variable) rather than the key itself. A top-level ``$schema`` (an editor's pointer to the
JSON schema ``gradekit schema`` prints, generated from the node models in graders._config_nodes) is
ignored.

The group grader takes the same nodes: ``type: group`` with ``grader:`` (a node), ``checks:``
(TrajectoryChecks fields), ``sample_checks:``, ``on_judge_error:`` (FAILURE, RETRY, DISCARD or
a number), ``on_invalid:`` and ``pass_threshold:``, and for a failed or straggling member
``on_member_error:`` (renormalize, drop_group, retry), ``min_members:``, ``group_deadline_s:``
and ``member_retries:`` (graders._members); load it with :func:`load_group_grader`.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from gradekit.judge import JudgeProtocol, RubricError
from gradekit.judge._spec import JudgeSpec, JurySpec
from gradekit.judge._client import DEFAULT_MAX_PROMPT_TOKENS
from gradekit.judge._fleet import Endpoint, key_from_env
from gradekit.judge._files import read_data_file
from gradekit.judge._hedge import HedgePolicy

from ._composite import FormulaError
from ._config_nodes import NODE_MODELS, GraderNode, GroupNode, _Node
from ._evals import EvalDefinition, EvalGrader, criterion_name, criterion_node, is_eval_definition
from ._group import GroupGrader, group_grader
from ._members import GroupPolicy
from ._pairwise_group import pairwise_group_grader
from ._relative import relative_group_grader
from ._reward_model import GROUP_MAPPINGS
from ._sample import Grade, Grader, Sample, aclose_grader
from ._vertex import is_vertex_spec
from .sandbox import Isolation


class GraderConfigError(ValueError):
    """A grader config is wrong; the message names the file and the field at fault."""


class JurorSettings(BaseModel):
    """One juror of ``judge: {jury: [...]}``: its own model, endpoint, key and parameters."""

    model_config = ConfigDict(extra="forbid")

    model: str
    base_url: str | None = None  # default: the judge block's, else $OPENAI_BASE_URL
    # A juror on another provider needs its own key: "$NAME" / "${NAME}" reads the environment
    # variable NAME (keep keys out of files you share); anything else is the key itself.
    api_key: str | None = None
    timeout: float | None = None
    params: dict[str, Any] | None = None  # default: the judge block's params
    endpoints: list[Endpoint] | None = Field(None, min_length=1)  # a juror that is a fleet (not with base_url)

    @model_validator(mode="after")
    def _one_way_to_the_juror(self) -> JurorSettings:
        if self.base_url and self.endpoints:
            raise ValueError(f"juror {self.model}: give base_url or endpoints (a fleet), not both")
        return self

    def key(self) -> str | None:
        return key_from_env(self.api_key, f"juror {self.model}")


class JudgeSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    base_url: str | None = None
    endpoints: list[Endpoint] | None = Field(None, min_length=1)  # a fleet: one model, several endpoints (not with base_url)
    # Hedged requests over a fleet (judge._hedge): true/false or a mapping of knobs; default on for two endpoints or more.
    hedge: bool | HedgePolicy | None = None
    timeout: float = 60.0
    # Seconds one row's requests may spend on the wire in all (every attempt, retry, re-ask); default 3 x timeout.
    row_deadline: float | None = Field(None, gt=0)
    max_prompt_tokens: int | None = Field(DEFAULT_MAX_PROMPT_TOKENS, ge=1)  # estimated; above it a row is an input error
    context_window: int | None = Field(None, ge=1)  # the model's window in tokens (a trajectory is fitted into it) [learnt]
    params: dict[str, Any] = {}  # judge parameters sent with every request (reasoning_effort, enable_thinking, ...)
    api: Literal["chat", "responses", "anthropic"] | None = None  # how judgements are sent (docs/judges.md)
    service_tier: str | None = None  # flex: cheaper and slower; a row past flex_deadline_s goes at the standard tier
    flex_deadline_s: float | None = Field(None, ge=0)
    prompt_cache_key: bool | str | None = None  # the provider's prompt-cache routing key [OpenAI and Azure OpenAI]
    # A jury instead of one judge (judge._jury): every juror judges each row; see docs/juries.md.
    jury: list[JurorSettings] | None = Field(default=None, min_length=1)
    aggregate: Literal["majority", "mean", "min", "unanimous"] | None = None  # default: majority for labels, mean for scores
    quorum: int | None = Field(default=None, ge=1)  # default: a majority of the jury

    @model_validator(mode="after")
    def _jury_or_model(self) -> JudgeSettings:
        if self.jury is None and (self.aggregate is not None or self.quorum is not None):
            raise ValueError("aggregate and quorum configure a jury: give jury: [{model: ...}, ...]")
        if self.jury is not None and self.model is not None:
            raise ValueError("give model (one judge) or jury (several), not both")
        if self.jury is not None and self.quorum is not None and self.quorum > len(self.jury):
            raise ValueError(f"quorum {self.quorum} is more than the jury's {len(self.jury)} jurors")
        return self

    def spec(self) -> JudgeSpec | JurySpec:
        """The judge (or jury) this block describes, as a spec: only what the file gives is set."""
        if self.jury is None:
            return self._block()
        block = JudgeSpec.of(None, base_url=self.base_url, params=self.params, timeout=self.timeout,
                             max_prompt_tokens=self.max_prompt_tokens, hedge=self.hedge)
        # A juror's params replace the block's (not merged key by key): a juror on another provider may refuse them.
        jurors = [replace(block.merge(JudgeSpec.of(j.model, base_url=j.base_url, endpoints=j.endpoints,
                                                   api_key=None if j.endpoints else j.key(), timeout=j.timeout)),
                          params=self.params if j.params is None else j.params)
                  for j in self.jury]
        return JurySpec(tuple(jurors), aggregate=self.aggregate, quorum=self.quorum)

    def _block(self) -> JudgeSpec:
        """The block's own judge (its model, endpoint and params; no jurors)."""
        given = self.model_fields_set
        own: dict[str, Any] = {"timeout": self.timeout} if "timeout" in given else {}
        if "max_prompt_tokens" in given and self.max_prompt_tokens is not None:
            own["max_prompt_tokens"] = self.max_prompt_tokens
        if self.context_window is not None:
            own["context_window"] = self.context_window
        if self.hedge is not None:
            own["hedge"] = self.hedge
        for name in ("api", "service_tier", "flex_deadline_s", "prompt_cache_key"):
            if getattr(self, name) is not None:
                own[name] = getattr(self, name)
        if self.row_deadline is not None:
            own["row_deadline"] = self.row_deadline
        return JudgeSpec.of(self.model, base_url=self.base_url, endpoints=self.endpoints, params=self.params or None, **own)

    def build(self, **common: Any) -> Any:
        """The Judge, or the Jury, these settings describe (``common``: what every judge shares, e.g. the run's cache and budget)."""
        return self.spec().build(**common)

    def under(self, command_line: JudgeSpec, defaults: JudgeSpec | None = None) -> JudgeSpec | JurySpec:
        """This block beneath a command line's judge and over ``defaults`` (the environment's OPENAI_BASE_URL,
        GRADEKIT_MODEL, a flag's default): what the command line gives wins (its params key by key), what the file
        gives wins over a default.

        A file's jury stays the run's judge unless the command line names a model or an endpoint itself.
        """
        if self.jury is not None and command_line.model is None and not command_line.base_url:
            return self.spec()
        return JudgeSpec.merge(defaults or JudgeSpec(), self._block(), command_line)

    @model_validator(mode="after")
    def _one_way_to_the_judge(self) -> JudgeSettings:
        if self.base_url and self.endpoints:
            raise ValueError("give base_url or endpoints (a fleet), not both")
        return self


@dataclass(frozen=True)
class FileJudge:
    """A judge made from the grader file's ``judge:`` block, on first need: how a front door puts its own layers of
    judge settings over (and beneath) the file's (``make(settings)``; called bare, with no file: ``make(None)``).

    The typed way to say "this factory reads the file's block": a bare Judge, or a plain ``() -> Judge``, is used as
    it is and the block is not read.
    """

    make: Callable[[JudgeSettings | None], JudgeProtocol]

    def __call__(self) -> JudgeProtocol:
        return self.make(None)


def problems(error: ValidationError, prefix: str = "", model: type[BaseModel] | None = None, *, tagged: bool = False) -> str:
    """A validation error as one line, each problem at its place in the file (after ``prefix``); a key ``model``
    (or a model inside it) does not take names the keys it does. ``tagged``: each place starts with the union's
    tag (the node's type), which the file does not show."""
    lines = []
    for err in error.errors():
        loc = err["loc"][1:] if tagged else err["loc"]
        message = err["msg"]
        if err["type"] == "extra_forbidden" and model is not None:
            message += _allowed(model, loc)
        lines.append(f"{prefix}{'.'.join(map(str, loc))}: {message}")
    return "; ".join(lines)


def _allowed(model: type[BaseModel], loc: tuple[Any, ...]) -> str:
    """What to say after "Extra inputs are not permitted": the key it was likely meant as, else the keys there are."""
    at: type[BaseModel] | None = model
    for key in loc[:-1]:  # down the loc to the model holding the unknown key (an int is a list's index: same model)
        if at is None or isinstance(key, int):
            continue
        field = at.model_fields.get(str(key))
        at = _model_in(field.annotation) if field is not None else None
    if at is None:
        return ""
    keys = [field.alias or name for name, field in at.model_fields.items()]
    close = difflib.get_close_matches(str(loc[-1]), keys, n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else f"; allowed keys: {', '.join(keys)}"


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((found for arg in get_args(annotation) if (found := _model_in(arg)) is not None), None)


# The node model of each type a file may name, from the union's members (in the order an unknown type's message lists them).
NODES: dict[str, type[_Node]] = {kind: model for model in NODE_MODELS for kind in get_args(model.model_fields["type"].annotation)}
_NODE = TypeAdapter(GraderNode)


def validate_node(data: Any, where: str, source: str) -> tuple[str, _Node]:
    """One grader mapping as its typed node (a bare Vertex spec is ``type: vertex``).

    Raises GraderConfigError naming the file and the place in it. Shared by the builder and by
    ``gradekit export``, which reads the same files without building graders.
    """
    def fail(message: str) -> GraderConfigError:
        return GraderConfigError(f"{source}: {where}: {message}" if where else f"{source}: {message}")

    if not isinstance(data, Mapping):
        raise fail(f"a grader must be a mapping with a 'type', got {type(data).__name__}")
    if is_vertex_spec(data):
        data = {"type": "vertex", "spec": dict(data)}
    kind = data.get("type")
    model = NODES.get(kind) if isinstance(kind, str) else None
    if model is None:
        raise fail(f"unknown grader type {kind!r}; known types: {', '.join(NODES)}")
    try:
        return kind, _NODE.validate_python(data)
    except ValidationError as e:
        prefix = f"{where}." if where else ""
        raise GraderConfigError(f"{source}: {problems(e, prefix, model, tagged=True)}") from None


class _Builder:
    """Walks a config tree; builds the judge once, on first need, for all LLM nodes."""

    def __init__(self, source: str, base: Path, judge: JudgeProtocol | Callable[[], JudgeProtocol] | None, settings: JudgeSettings) -> None:
        self.source, self.base, self._judge, self.settings = source, base, judge, settings
        self.made_judge: JudgeProtocol | None = None
        self.sandboxes: dict[str, Isolation] = {}  # where each code-running grader runs, for validate
        self.media_root: Path | None = None  # the folder local image paths are read from: the input's
        self.in_group = False  # building a type: group's grader node (a reward model may map within the group)

    def judge(self) -> JudgeProtocol:
        if self._judge is not None and not callable(self._judge):  # a Judge, a Jury or a Cascade, not a factory of one
            return self._judge  # type: ignore[return-value]
        if self.made_judge is None:
            try:
                if self._judge is not None:
                    # A factory that reads the file's judge settings (the CLI's: a fleet declared in the file) gets them.
                    self.made_judge = self._judge.make(self.settings) if isinstance(self._judge, FileJudge) else self._judge()
                else:
                    self.made_judge = self.settings.build()
            except ValueError as e:
                raise GraderConfigError(f"{self.source}: an LLM grader needs a judge: {e}") from e
        return self.made_judge

    def fail(self, where: str, message: str) -> GraderConfigError:
        return GraderConfigError(f"{self.source}: {where}: {message}" if where else f"{self.source}: {message}")

    def path(self, value: str) -> Path:
        path = Path(value)
        return path if path.is_absolute() else self.base / path

    def node(self, data: Any, where: str, default_name: str | None = None) -> Grader:
        kind, node = validate_node(data, where, self.source)
        name = node.name or default_name or kind
        try:
            return node.build(self, where, node.name or default_name)
        except GraderConfigError:
            raise
        except (ValueError, RubricError, FormulaError, OSError) as e:
            message = str(e)
            if message.startswith(f"{self.source}: "):  # already names the file and the field
                raise GraderConfigError(message) from e
            raise self.fail(where or name, message) from e


def _read(source: str | Path | Mapping[str, Any]) -> tuple[dict[str, Any], str, Path]:
    """A grader config as a mapping, the name its errors give and the folder its paths are relative to.

    A top-level ``$schema`` (an editor's pointer to the JSON schema, docs/graders.md) is dropped here, so every
    reader of a grader file takes one."""
    if isinstance(source, Mapping):
        data, where, base = dict(source), "grader config", Path.cwd()
    else:
        path = Path(source)
        try:
            read = read_data_file(path, "grader config")
        except ValueError as e:
            raise GraderConfigError(str(e)) from e
        if not isinstance(read, dict):
            raise GraderConfigError(f"{path}: a grader config must be a mapping")
        data, where, base = read, str(path), path.parent
    data.pop("$schema", None)
    return data, where, base


class ConfiguredGrader:
    """A grader built from a config; closing it closes its parts and the judge it made."""

    def __init__(self, grader: Grader, builder: _Builder) -> None:
        self.grader = grader
        self._builder = builder
        self.sandboxes = builder.sandboxes
        self.__name__ = getattr(grader, "__name__", "grader")
        self.output_columns: tuple[str, ...] = tuple(getattr(grader, "output_columns", ()))

    async def __call__(self, sample: Sample) -> Grade:
        return await self.grader(sample)

    async def aclose(self) -> None:
        await aclose_grader(self.grader)
        if self._builder.made_judge is not None:
            await self._builder.made_judge.aclose()


def _builder(data: dict[str, Any], source: str, base: Path, judge: JudgeProtocol | Callable[[], JudgeProtocol] | None) -> _Builder:
    settings = data.pop("judge", None) or {}
    try:
        parsed = JudgeSettings.model_validate(settings)
    except ValidationError as e:
        raise GraderConfigError(f"{source}: {problems(e, 'judge.', JudgeSettings)}") from None
    return _Builder(source, base, judge, parsed)


def load_grader(source: str | Path | Mapping[str, Any], *, judge: JudgeProtocol | Callable[[], JudgeProtocol] | None = None,
                media_root: Path | None = None) -> ConfiguredGrader:
    """Build a grader from a YAML/JSON file or a dict (schema in this module's docstring).

    Args:
        source: the file, or the config itself.
        judge: the Judge for LLM nodes (or a function making one on first need; a :class:`FileJudge`
            to make it from the file's ``judge:`` block); by default one is built from that block and the environment.
        media_root: the folder a label_model's local image paths are read from (a run's input
            folder); a path outside it is refused, and without it a local path is.
    """
    data, where, base = _read(source)
    builder = _builder(data, where, base, judge)
    builder.media_root = media_root
    if is_eval_definition(data):
        return ConfiguredGrader(_eval_grader(builder, data, where), builder)
    return ConfiguredGrader(builder.node(data, ""), builder)


def _eval_grader(builder: _Builder, data: dict[str, Any], where: str) -> EvalGrader:
    """An Evals-API definition (or what ``evals.retrieve()`` returned): one part per testing criterion."""
    try:
        definition = EvalDefinition.model_validate(data)
    except ValidationError as e:
        raise GraderConfigError(f"{where}: {problems(e)}") from None
    if not definition.testing_criteria:
        raise GraderConfigError(f"{where}: testing_criteria is empty: an eval needs at least one criterion")
    criteria = []
    for index, criterion in enumerate(definition.testing_criteria):
        name = criterion_name(definition.name, index, criterion)
        if any(name == known for known, _, _ in criteria):
            raise GraderConfigError(f"{where}: testing_criteria.{index}: a second criterion named {name!r}")
        node = criterion_node(criterion)
        # A multi's pass_threshold decides its pass/fail in the eval (graders._evals.passes); the multi grader itself
        # (OpenAI's MultiGrader) has no such field: build it without.
        built = {k: v for k, v in node.items() if k != "pass_threshold"} if node.get("type") == "multi" else node
        criteria.append((name, node, builder.node(built, f"testing_criteria.{index}", str(criterion.get("name") or name))))
    return EvalGrader(criteria, definition.name or "eval")


def _group_config(source: str | Path | Mapping[str, Any], judge: JudgeProtocol | Callable[[], JudgeProtocol] | None
                  ) -> tuple[GroupNode, _Builder, str]:
    """A ``type: group`` config read and checked, with the builder of its nodes and the name its errors give."""
    data, where, base = _read(source)
    builder = _builder(data, where, base, judge)
    if data.get("type") != "group":
        raise GraderConfigError(f"{where}: a group grader config needs type: group")
    try:
        return GroupNode.model_validate(data), builder, where
    except ValidationError as e:
        raise GraderConfigError(f"{where}: {problems(e, '', GroupNode)}") from None


def load_group_grader(source: str | Path | Mapping[str, Any], *, judge: JudgeProtocol | Callable[[], JudgeProtocol] | None = None) -> GroupGrader:
    """Build a group grader from a ``type: group`` config."""
    node, builder, where = _group_config(source, judge)
    if sum(x is not None for x in (node.grader, node.relative, node.pairwise)) != 1:
        raise GraderConfigError(f"{where}: give one of grader (each trajectory graded alone), relative (one judge call ranks them all) "
                                "and pairwise (members compared in pairs)")
    if node.pairwise is not None:
        pw = node.pairwise
        rubric = str(builder.path(pw.rubric)) if pw.rubric.endswith((".yaml", ".yml")) else pw.rubric
        try:
            return pairwise_group_grader(builder.judge(), rubric=rubric, pairing=pw.pairing, anchor=pw.anchor, seed=pw.seed,
                                         alpha=pw.alpha, on_judge_error=node.on_judge_error, on_member_error=node.on_member_error,
                                         min_members=node.min_members, group_deadline_s=node.group_deadline_s)
        except (ValueError, RubricError) as e:
            raise GraderConfigError(f"{where}: pairwise: {e}") from e
    if node.relative is not None:
        r = node.relative
        rubric = str(builder.path(r.rubric)) if r.rubric.endswith((".yaml", ".yml")) else r.rubric
        try:
            return relative_group_grader(builder.judge(), criteria=r.criteria, shuffles=r.shuffles, seed=r.seed,
                                         on_judge_error=node.on_judge_error, rubric=rubric, on_member_error=node.on_member_error,
                                         group_deadline_s=node.group_deadline_s)
        except (ValueError, RubricError) as e:
            raise GraderConfigError(f"{where}: relative: {e}") from e
    builder.in_group = True  # a reward model's minmax/zscore maps the group's members together
    inner = builder.node(node.grader, "grader")
    return group_grader(inner, checks=node.checks, sample_checks=node.sample_checks, on_judge_error=node.on_judge_error,
                        on_invalid=node.on_invalid, pass_threshold=node.pass_threshold, on_member_error=node.on_member_error,
                        min_members=node.min_members, group_deadline_s=node.group_deadline_s, member_retries=node.member_retries)


def load_group_members(source: str | Path | Mapping[str, Any], *, judge: JudgeProtocol | Callable[[], JudgeProtocol] | None = None
                       ) -> tuple[ConfiguredGrader, GroupPolicy]:
    """A ``type: group`` config (with ``grader:``) as its per-member grader and its group keys, for the
    doors that grade a group's members one request at a time (the reward server's group routes)."""
    node, builder, where = _group_config(source, judge)
    if node.grader is None:
        raise GraderConfigError(f"{where}: serving a group config needs its grader: node (each member graded alone)")
    if node.grader.get("type") == "reward_model" and node.grader.get("mapping") in GROUP_MAPPINGS:
        raise GraderConfigError(f"{where}: grader.mapping: {node.grader['mapping']} maps within a group, and the server's group "
                                "routes grade each member in its own request: use sigmoid or raw to serve it")
    policy = GroupPolicy(on_member_error=node.on_member_error, min_members=node.min_members,
                         group_deadline_s=node.group_deadline_s, member_retries=node.member_retries)
    return ConfiguredGrader(builder.node(node.grader, "grader"), builder), policy
