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
environment variable) rather than the key itself.

The group grader takes the same nodes: ``type: group`` with ``grader:`` (a node), ``checks:``
(TrajectoryChecks fields), ``sample_checks:``, ``on_judge_error:`` (FAILURE, RETRY, DISCARD or
a number), ``on_invalid:`` and ``pass_threshold:``, and for a failed or straggling member
``on_member_error:`` (renormalize, drop_group, retry), ``min_members:``, ``group_deadline_s:``
and ``member_retries:`` (graders._members); load it with :func:`load_group_grader`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gradekit.judge import JudgeProtocol, RubricError
from gradekit.judge._spec import JudgeSpec, JurySpec
from gradekit.judge._client import DEFAULT_MAX_PROMPT_TOKENS
from gradekit.judge._fleet import Endpoint, key_from_env
from gradekit.judge._files import read_data_file
from gradekit.judge._hedge import HedgePolicy

from ._code_tests import DEFAULT_CASE_MEMORY_MB, DEFAULT_CASE_TIMEOUT, Scoring, code_tests_grader
from ._composite import FormulaError, formula_grader, weighted_grader
from ._evals import EvalDefinition, EvalGrader, criterion_name, criterion_node, is_eval_definition
from ._group import GroupGrader, Policy, SampleChecks, TrajectoryChecks, group_grader
from ._math_equivalence import math_equivalence_grader
from ._math_hybrid import JudgeFallback, hybrid_grader
from ._math_verify import DEFAULT_MAX_CHARS as MATH_MAX_CHARS
from ._math_verify import DEFAULT_MEMORY_MB as MATH_MEMORY_MB
from ._math_verify import DEFAULT_TIMEOUT as MATH_TIMEOUT
from ._math_verify import check_kind, parse_modes
from ._members import GroupPolicy, MemberPolicy
from ._llm import TRAJECTORY_SETTINGS, autorater_grader, label_model_grader, llm_grader, score_model_grader
from ._python import DEFAULT_MEMORY_MB, DEFAULT_TIMEOUT, python_grader
from ._pairwise_group import pairwise_group_grader
from ._relative import relative_group_grader
from ._reward_model import GROUP_MAPPINGS, reward_model_grader

from ._sample import Grade, Grader, Sample, aclose_grader
from ._string_match import (
    MatchOperation,
    Normalization,
    ParseConfig,
    json_match_grader,
    normalized_match_grader,
    numeric_match_grader,
    string_check_grader,
    string_match_grader,
)
from ._text_similarity import text_similarity_grader
from ._vertex import is_vertex_spec, parse_vertex_spec, vertex_grader
from .sandbox import DEFAULT_CPUS, DEFAULT_FILE_MB, DEFAULT_PROCESSES, Isolation
from .sandbox import Policy as SandboxPolicy


class GraderConfigError(ValueError):
    """A grader config is wrong; the message names the file and the field at fault."""


class _Node(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: str
    name: str | None = None


class _Rewards(_Node):
    parse: ParseConfig = ParseConfig()
    correct: float = 1.0
    wrong: float = -1.0


class StringMatchNode(_Rewards):
    expression: str
    operation: MatchOperation = "EXACT_MATCH"


class JsonMatchNode(_Rewards):
    key: str
    expression: str
    operation: MatchOperation = "EXACT_MATCH"


class NormalizedMatchNode(_Rewards):
    expression: str
    operation: Literal["EXACT_MATCH", "PARTIAL_MATCH"] = "EXACT_MATCH"
    normalization: Normalization = Normalization()


class NumericMatchNode(_Rewards):
    expression: str
    abs_tol: float = 0.0
    rel_tol: float = 1e-9


class StringCheckNode(_Node):
    input: str
    reference: str
    operation: Literal["eq", "ne", "like", "ilike"] = "eq"


class LlmNode(_Node):
    rubric: str
    map: dict[str, str] = Field(default_factory=dict)
    # Over the rubric's trajectory settings (judge._rubric): one verdict per step, how steps aggregate,
    # the judge reading the trace with tools, the trajectory's token budget and what stays when it is cut.
    granularity: Literal["whole", "step"] | None = None
    step_aggregate: Literal["mean", "min", "last", "product"] | None = None
    navigate: bool | None = None
    navigate_rounds: int | None = Field(None, ge=1, le=32)
    trajectory_budget: int | None = Field(None, ge=1)
    truncation: Literal["middle_out", "keep_recent", "none"] | None = None
    trajectory_reasoning: Literal["keep", "drop"] | None = None


class AutoraterNode(_Node):
    prompt: str | None = None
    prompt_file: str | None = None
    parse: ParseConfig = ParseConfig()
    response_parse: ParseConfig = ParseConfig()
    expression: str | None = None
    correct: float = 1.0
    wrong: float = -1.0


class TextSimilarityNode(_Node):
    """OpenAI's text_similarity grader JSON. ``embedding_model`` is gradekit's: the model ``cosine``
    asks the judge's endpoint for (OpenAI's grader always uses text-embedding-3-large)."""

    input: str
    reference: str
    evaluation_metric: str
    pass_threshold: float | None = None
    embedding_model: str | None = None


class LabelModelNode(_Node):
    """OpenAI's label_model grader JSON: ``model`` is recorded (and exported back); the judge that
    runs it locally is gradekit's (``judge:``), so validate and a run use your endpoint."""

    model: str | None = None
    input: list[dict[str, Any]]
    labels: list[str]
    passing_labels: list[str]


class ScoreModelNode(_Node):
    """OpenAI's score_model grader JSON: the judge gives a number in ``range``; ``model`` is recorded
    (and exported back) as label_model's is, the judge that runs it is gradekit's."""

    model: str | None = None
    input: list[dict[str, Any]]
    range: tuple[float, float] = (0.0, 1.0)
    sampling_params: dict[str, Any] | None = None
    pass_threshold: float | None = None  # an eval criterion's pass/fail, in the range's units

    @model_validator(mode="after")
    def _range(self) -> ScoreModelNode:
        if not self.range[0] < self.range[1]:
            raise ValueError(f"range must be [low, high] with low < high, got {list(self.range)}")
        return self


class RewardModelNode(_Node):
    """A served reward model's score (graders._reward_model): the judge block names its model and endpoint."""

    route: Literal["/classify", "/pooling", "/v1/classify", "/v1/embeddings"] = "/classify"
    mapping: Literal["sigmoid", "raw", "minmax", "zscore"] = "sigmoid"
    scale: float | None = Field(None, gt=0)
    center: float = 0.0
    use_activation: bool = False
    task: str | None = None  # vLLM /pooling's task (e.g. token_classify); the server's default otherwise
    chat_template: str | None = None  # SGLang's routes: the reward model's Jinja chat template ...
    chat_template_file: str | None = None  # ... or the file holding it (relative to this config)


class _Sandboxed(_Node):
    workers: int | None = None
    sandbox: SandboxPolicy = "auto"
    network: bool = False
    packages: list[str] = Field(default_factory=list)
    processes: int = DEFAULT_PROCESSES
    file_mb: int = DEFAULT_FILE_MB
    cpus: int = DEFAULT_CPUS


class PythonNode(_Sandboxed):
    file: str | None = None
    source: str | None = None
    flavour: Literal["vertex", "openai"] | None = None
    entry: str | None = None
    timeout: float = DEFAULT_TIMEOUT
    memory_mb: int | None = DEFAULT_MEMORY_MB
    env: dict[str, str] = Field(default_factory=dict)
    image_tag: str | None = None  # OpenAI's field, accepted so its grader JSON loads; unused
    pass_threshold: float | None = None  # OpenAI's field; unused by the grade itself
    # The scores this code gives, as its author states them: a python grader's range cannot be read
    # from its source, and `gradekit export --to openai` exports without --rescale only a range in 0..1.
    range: tuple[float, float] | None = None

    @model_validator(mode="after")
    def _range(self) -> PythonNode:
        if self.range is not None and not -1.0 <= self.range[0] <= self.range[1] <= 1.0:
            raise ValueError(f"range must be [low, high] with -1 <= low <= high <= 1, got {list(self.range)}")
        return self


class CodeTestsNode(_Sandboxed):
    tests: str = "tests"
    scoring: Scoring = "fraction"
    timeout: float = DEFAULT_CASE_TIMEOUT
    memory_mb: int | None = DEFAULT_CASE_MEMORY_MB


class MathEquivalenceNode(_Node):
    """``type: verified_answer`` (or ``math_equivalence``, its first name): the response's final answer
    against the gold one, by rule, for every kind of answer, in sandboxed workers (graders._math_verify);
    a check that cannot finish is an error, never wrong."""

    expression: str  # the gold answer: "{{references.answer}}"
    # What the answers are: auto (told from the gold), number, expression, choice, string, or a template per row.
    kind: str = "auto"
    options: str | list[Any] | dict[str, Any] | None = None  # choice: the options (default: references options/choices, else the question)
    aliases: str | None = None  # a template of more answers that count (a JSON list or one string)
    timeout: float = Field(MATH_TIMEOUT, gt=0)  # seconds per check, enforced from outside the worker
    correct: float = 1.0
    wrong: float = -1.0
    # How the response is read: auto (the last \boxed{}, then LaTeX, then a plain expression), boxed, latex, expr, or a list.
    parse: str | list[str] = "auto"
    max_chars: int | None = Field(MATH_MAX_CHARS, ge=1)  # a longer response is cut to its last max_chars characters
    workers: int | None = Field(None, ge=1)  # checker processes (default: one per CPU, up to 4)
    memory_mb: int | None = Field(MATH_MEMORY_MB, ge=256)
    sandbox: SandboxPolicy = "auto"
    # The hybrid: rows the symbolic check did not accept go to the judge (the config's judge:, or the command
    # line's), asked in both orders with this rubric (graders._math_hybrid).
    judge_fallback: JudgeFallback | None = None

    @model_validator(mode="after")
    def _modes(self) -> MathEquivalenceNode:
        parse_modes(self.parse)
        return self

    @field_validator("kind")
    @classmethod
    def _kind(cls, kind: str) -> str:
        return kind if "{{" in kind else check_kind(kind)


class WeightedNode(_Node):
    parts: dict[str, dict[str, Any]]


class FormulaNode(_Node):
    formula: str | None = None
    calculate_output: str | None = None  # OpenAI multi grader's name for the formula
    graders: dict[str, dict[str, Any]]


class VertexNode(_Node):
    spec: dict[str, Any] | None = None
    file: str | None = None


class RelativeSettings(BaseModel):
    """``relative:`` of a group config: one judge call ranks all trajectories (graders._relative)."""

    model_config = ConfigDict(extra="forbid")

    criteria: str | None = None
    shuffles: Literal[1, 2] = 2
    seed: int = 0
    rubric: str = "group_rank"


class PairwiseSettings(BaseModel):
    """``pairwise:`` of a group config: members compared in pairs, fitted with Bradley-Terry (graders._pairwise_group)."""

    model_config = ConfigDict(extra="forbid")

    rubric: str = "arena_hard_pairwise"
    pairing: Literal["circular", "all_pairs", "anchor"] = "circular"
    anchor: int = Field(0, ge=0)
    seed: int = 0
    alpha: float = Field(0.01, gt=0)


class GroupNode(_Node):
    grader: dict[str, Any] | None = None
    relative: RelativeSettings | None = None
    pairwise: PairwiseSettings | None = None
    checks: TrajectoryChecks = TrajectoryChecks()
    sample_checks: SampleChecks = SampleChecks()
    on_judge_error: Policy = "RETRY"
    on_invalid: Policy = "DISCARD"
    pass_threshold: float = 0.5
    on_member_error: MemberPolicy = "renormalize"  # graders._members: a group with a failed member
    min_members: int = Field(2, ge=1)
    group_deadline_s: float | None = Field(None, gt=0)
    member_retries: int = Field(1, ge=0, le=5)


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


NODES: dict[str, type[_Node]] = {
    "string_match": StringMatchNode,
    "json_match": JsonMatchNode,
    "normalized_match": NormalizedMatchNode,
    "numeric_match": NumericMatchNode,
    "string_check": StringCheckNode,
    "llm": LlmNode,
    "autorater": AutoraterNode,
    "label_model": LabelModelNode,
    "score_model": ScoreModelNode,
    "reward_model": RewardModelNode,
    "text_similarity": TextSimilarityNode,
    "python": PythonNode,
    "code_tests": CodeTestsNode,
    "math_equivalence": MathEquivalenceNode,
    "verified_answer": MathEquivalenceNode,  # the same grader under the name that fits every kind of answer
    "weighted": WeightedNode,
    "formula": FormulaNode,
    "multi": FormulaNode,
    "vertex": VertexNode,
}


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
        return kind, model.model_validate(data)
    except ValidationError as e:
        prefix = f"{where}." if where else ""
        problems = "; ".join(f"{prefix}{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        raise GraderConfigError(f"{source}: {problems}") from None


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
            if isinstance(node, LlmNode):  # named after its rubric unless the config names it
                rubric: str | Path = self.path(node.rubric) if node.rubric.endswith((".yaml", ".yml")) else node.rubric
                return llm_grader(self.judge(), rubric, node.map, name=node.name or default_name,
                                  settings=node.model_dump(include=set(TRAJECTORY_SETTINGS), exclude_none=True))
            return self._build(node, where, name)
        except GraderConfigError:
            raise
        except (ValueError, RubricError, FormulaError, OSError) as e:
            message = str(e)
            if message.startswith(f"{self.source}: "):  # already names the file and the field
                raise GraderConfigError(message) from e
            raise self.fail(where or name, message) from e

    def _build(self, node: _Node, where: str, name: str) -> Grader:
        dot = f"{where}." if where else ""
        if isinstance(node, JsonMatchNode):
            return json_match_grader(node.key, node.expression, node.operation, parse=node.parse, correct=node.correct, wrong=node.wrong, name=name)
        if isinstance(node, StringMatchNode):
            return string_match_grader(node.expression, node.operation, parse=node.parse, correct=node.correct, wrong=node.wrong, name=name)
        if isinstance(node, NormalizedMatchNode):
            return normalized_match_grader(node.expression, operation=node.operation, parse=node.parse, normalization=node.normalization,
                                           correct=node.correct, wrong=node.wrong, name=name)
        if isinstance(node, NumericMatchNode):
            return numeric_match_grader(node.expression, abs_tol=node.abs_tol, rel_tol=node.rel_tol, parse=node.parse,
                                        correct=node.correct, wrong=node.wrong, name=name)
        if isinstance(node, StringCheckNode):
            return string_check_grader(node.input, node.reference, node.operation, name=name)
        if isinstance(node, AutoraterNode):
            if (node.prompt is None) == (node.prompt_file is None):
                raise self.fail(where or name, "give exactly one of prompt and prompt_file")
            prompt = node.prompt if node.prompt is not None else self.path(node.prompt_file or "").read_text(encoding="utf-8")
            return autorater_grader(self.judge(), prompt, parse=node.parse, response_parse=node.response_parse,
                                    expression=node.expression, correct=node.correct, wrong=node.wrong, name=name)
        if isinstance(node, TextSimilarityNode):
            return text_similarity_grader(node.input, node.reference, node.evaluation_metric,  # type: ignore[arg-type]
                                          pass_threshold=node.pass_threshold, name=name, embedding_model=node.embedding_model,
                                          judge=self.judge() if node.evaluation_metric == "cosine" else None)
        if isinstance(node, LabelModelNode):
            return label_model_grader(self.judge(), node.input, node.labels, node.passing_labels, name=name, media_root=self.media_root)
        if isinstance(node, ScoreModelNode):
            return score_model_grader(self.judge(), node.input, range=node.range, sampling_params=node.sampling_params, name=name,
                                      media_root=self.media_root)
        if isinstance(node, RewardModelNode):
            if node.mapping in GROUP_MAPPINGS and not self.in_group:
                raise self.fail(where or name, f"mapping {node.mapping} maps scores within a group: put this node under "
                                f"type: group (grader: {{type: reward_model, mapping: {node.mapping}}}), or use sigmoid or raw")
            if node.chat_template is not None and node.chat_template_file is not None:
                raise self.fail(where or name, "give chat_template or chat_template_file, not both")
            template = node.chat_template
            if node.chat_template_file is not None:
                template = self.path(node.chat_template_file).read_text(encoding="utf-8")
            return reward_model_grader(self.judge(), route=node.route, mapping=node.mapping, scale=node.scale, center=node.center,
                                       use_activation=node.use_activation, task=node.task, chat_template=template, name=name)
        if isinstance(node, PythonNode):
            if (node.file is None) == (node.source is None):
                raise self.fail(where or name, "give exactly one of file and source")
            python = python_grader(node.source, file=self.path(node.file) if node.file else None, flavour=node.flavour, entry=node.entry,
                                   timeout=node.timeout, memory_mb=node.memory_mb, workers=node.workers, env=node.env, name=name,
                                   sandbox=node.sandbox, network=node.network, packages=node.packages, processes=node.processes,
                                   file_mb=node.file_mb, cpus=node.cpus)
            self.sandboxes[where or name] = python.isolation
            return python
        if isinstance(node, CodeTestsNode):
            code = code_tests_grader(tests=node.tests, scoring=node.scoring, timeout=node.timeout, memory_mb=node.memory_mb,
                                     workers=node.workers, sandbox=node.sandbox, network=node.network, packages=node.packages,
                                     processes=node.processes, file_mb=node.file_mb, cpus=node.cpus, name=name)
            self.sandboxes[where or name] = code.isolation
            return code
        if isinstance(node, MathEquivalenceNode):
            math = math_equivalence_grader(node.expression, kind=node.kind, options=node.options, aliases=node.aliases, timeout=node.timeout,
                                           correct=node.correct, wrong=node.wrong, parse=node.parse, max_chars=node.max_chars,
                                           workers=node.workers, memory_mb=node.memory_mb, sandbox=node.sandbox, name=name)
            self.sandboxes[where or name] = math.isolation
            fallback = node.judge_fallback
            if fallback is None:
                return math
            rubric = self.path(fallback.rubric) if fallback.rubric.endswith((".yaml", ".yml")) else fallback.rubric
            try:
                return hybrid_grader(math, self.judge(), fallback, rubric=rubric)
            except (ValueError, RubricError):
                math.close()  # its workers are started: a config that fails after them must not leave them behind
                raise
        if isinstance(node, WeightedNode):
            parts = []
            for part_name, part in node.parts.items():
                part = dict(part)
                if "weight" not in part:
                    raise self.fail(f"{dot}parts.{part_name}", "needs a weight")
                weight = part.pop("weight")
                if isinstance(weight, bool) or not isinstance(weight, (int, float)):
                    raise self.fail(f"{dot}parts.{part_name}.weight", f"must be a number, got {weight!r}")
                parts.append((part_name, self.node(part, f"{dot}parts.{part_name}", part_name), float(weight)))
            return weighted_grader(parts, name=name)
        if isinstance(node, FormulaNode):
            formula = node.formula or node.calculate_output
            if formula is None or (node.formula is not None and node.calculate_output is not None):
                raise self.fail(where or name, "give exactly one of formula and calculate_output")
            graders = {k: self.node(v, f"{dot}graders.{k}", k) for k, v in node.graders.items()}
            return formula_grader(graders, formula, name=name)
        if isinstance(node, VertexNode):
            if (node.spec is None) == (node.file is None):
                raise self.fail(where or name, "give exactly one of spec and file")
            if node.spec is not None:
                spec = parse_vertex_spec(node.spec, source=self.source, path_prefix=f"{dot}spec")
            else:
                spec = parse_vertex_spec(self.path(node.file or ""))
            return vertex_grader(spec, judge=self.judge)
        raise AssertionError(node)


def _read(source: str | Path | Mapping[str, Any]) -> tuple[dict[str, Any], str, Path]:
    if isinstance(source, Mapping):
        return dict(source), "grader config", Path.cwd()
    path = Path(source)
    try:
        data = read_data_file(path, "grader config")
    except ValueError as e:
        raise GraderConfigError(str(e)) from e
    if not isinstance(data, dict):
        raise GraderConfigError(f"{path}: a grader config must be a mapping")
    return data, str(path), path.parent


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
        problems = "; ".join(f"judge.{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        raise GraderConfigError(f"{source}: {problems}") from None
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
        problems = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        raise GraderConfigError(f"{where}: {problems}") from None
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


def load_group_grader(source: str | Path | Mapping[str, Any], *, judge: JudgeProtocol | Callable[[], JudgeProtocol] | None = None) -> GroupGrader:
    """Build a group grader from a ``type: group`` config."""
    data, where, base = _read(source)
    builder = _builder(data, where, base, judge)
    if data.get("type") != "group":
        raise GraderConfigError(f"{where}: a group grader config needs type: group")
    try:
        node = GroupNode.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        raise GraderConfigError(f"{where}: {problems}") from None
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
    data, where, base = _read(source)
    builder = _builder(data, where, base, judge)
    try:
        node = GroupNode.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        raise GraderConfigError(f"{where}: {problems}") from None
    if node.grader is None:
        raise GraderConfigError(f"{where}: serving a group config needs its grader: node (each member graded alone)")
    if node.grader.get("type") == "reward_model" and node.grader.get("mapping") in GROUP_MAPPINGS:
        raise GraderConfigError(f"{where}: grader.mapping: {node.grader['mapping']} maps within a group, and the server's group "
                                "routes grade each member in its own request: use sigmoid or raw to serve it")
    policy = GroupPolicy(on_member_error=node.on_member_error, min_members=node.min_members,
                         group_deadline_s=node.group_deadline_s, member_retries=node.member_retries)
    return ConfiguredGrader(builder.node(node.grader, "grader"), builder), policy
