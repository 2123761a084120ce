"""A grader file's node types: one pydantic model per ``type``, each building its own grader.

The models form :data:`GraderNode`, a union told apart by ``type``; it is what the loader validates a
node with (graders._config) and what the shipped JSON schema is generated from (graders._schema), so a
key an editor completes is a key the loader takes. Every field carries a description: the schema
shows it on hover and in completion lists.

A node that holds other nodes (``weighted``'s parts, ``formula``'s graders, ``group``'s grader) keeps
them as plain mappings (:class:`AsNode`): they are validated one by one as the builder reaches them,
so an error names its place in the file (``parts.exact.expression``) exactly as before the schema.
The schema still describes them as nodes.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Protocol, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, WrapValidator, create_model, field_validator, model_validator

from gradekit.judge import RubricError

from ._code_tests import DEFAULT_CASE_MEMORY_MB, DEFAULT_CASE_TIMEOUT, Scoring, code_tests_grader
from ._composite import formula_grader, weighted_grader
from ._group import Policy, SampleChecks, TrajectoryChecks
from ._llm import TRAJECTORY_SETTINGS, autorater_grader, label_model_grader, llm_grader, score_model_grader
from ._math_equivalence import math_equivalence_grader
from ._math_hybrid import JudgeFallback, hybrid_grader
from ._math_verify import DEFAULT_MAX_CHARS as MATH_MAX_CHARS
from ._math_verify import DEFAULT_MEMORY_MB as MATH_MEMORY_MB
from ._math_verify import DEFAULT_TIMEOUT as MATH_TIMEOUT
from ._math_verify import check_kind, parse_modes
from ._members import MemberPolicy
from ._python import DEFAULT_MEMORY_MB, DEFAULT_TIMEOUT, python_grader
from ._reward_model import GROUP_MAPPINGS, reward_model_grader
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
from ._vertex import parse_vertex_spec, vertex_grader
from .sandbox import DEFAULT_CPUS, DEFAULT_FILE_MB, DEFAULT_PROCESSES
from .sandbox import Policy as SandboxPolicy

if TYPE_CHECKING:
    from gradekit.judge import JudgeProtocol

    from ._sample import Grader
    from .sandbox import Isolation


class BuildContext(Protocol):
    """What a node needs from the walk that builds it (graders._config's builder): the judge, made once on
    first need; the file's folder for relative paths; where to record sandboxes; errors that name the file."""

    source: str
    sandboxes: dict[str, Isolation]
    media_root: Path | None
    in_group: bool

    def judge(self) -> JudgeProtocol: ...

    def fail(self, where: str, message: str) -> Exception: ...

    def path(self, value: str) -> Path: ...

    def node(self, data: Any, where: str, default_name: str | None = None) -> Grader: ...


class AsNode:
    """A nested node's annotation, ``AsNode[GraderNode]``: validated as a plain mapping here (the builder validates
    it as a node when it reaches it, naming its place in the file), described in the JSON schema as the node."""

    def __class_getitem__(cls, described: Any) -> Any:
        # A wrap validator that never calls the node's own: the node stays in the schema, the value stays the mapping.
        return Annotated[described, WrapValidator(lambda value, _node: _MAPPING.validate_python(value))]


_MAPPING = TypeAdapter(dict[str, Any])


def _dot(where: str) -> str:
    return f"{where}." if where else ""


def _rubric(ctx: BuildContext, rubric: str) -> str | Path:
    """A shipped rubric's name as it is; a .yaml path relative to the grader file."""
    return ctx.path(rubric) if rubric.endswith((".yaml", ".yml")) else rubric


class _Node(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: str = Field(description="The grader type.")
    name: str | None = Field(None, description="The grade's name in outputs; default: its key in a parent node, else its type.")

    def build(self, ctx: BuildContext, where: str, name: str | None) -> Grader:
        """This node's grader; ``where`` is its place in the file ("" at the top), ``name`` its given or parent-given name."""
        return self._build(ctx, where, name or self.type)

    def _build(self, ctx: BuildContext, where: str, name: str) -> Grader:
        raise NotImplementedError


_PARSE_WAYS = "{type: IDENTITY} (the default) or {type: REGEX_EXTRACT, regex: ...} (the last match counts)."
_PARSE = f"How the answer is cut out of the response first: {_PARSE_WAYS}"
_EXPRESSION = "The expected answer, a template: \"{{references.answer}}\" (also {{prompt}}, {{response}}, {{metadata.key}})."


class _Rewards(_Node):
    parse: ParseConfig = Field(ParseConfig(), description=_PARSE)
    correct: float = Field(1.0, description="The score of a match.")
    wrong: float = Field(-1.0, description="The score of a mismatch.")


class StringMatchNode(_Rewards):
    """Vertex's stringMatchRewardScorer: the parsed response against a template, exactly, in part, or by regex."""

    type: Literal["string_match"] = Field(description="string_match: compare strings.")
    expression: str = Field(description=_EXPRESSION)
    operation: MatchOperation = Field("EXACT_MATCH", description="EXACT_MATCH, PARTIAL_MATCH (the expected text inside the response) "
                                                                 "or REGEX_CONTAINS (the expression is a regex).")

    def _build(self, ctx: BuildContext, where: str, name: str) -> Grader:
        return string_match_grader(self.expression, self.operation, parse=self.parse, correct=self.correct, wrong=self.wrong, name=name)


class JsonMatchNode(_Rewards):
    """Vertex's jsonMatchExpression: one key of the JSON response against a template."""

    type: Literal["json_match"] = Field(description="json_match: compare one key of a JSON response.")
    key: str = Field(description="The key to read; dots go into nested objects (a.b.c).")
    expression: str = Field(description=_EXPRESSION)
    operation: MatchOperation = Field("EXACT_MATCH", description="EXACT_MATCH, PARTIAL_MATCH or REGEX_CONTAINS.")

    def _build(self, ctx: BuildContext, where: str, name: str) -> Grader:
        return json_match_grader(self.key, self.expression, self.operation, parse=self.parse, correct=self.correct, wrong=self.wrong,
                                 name=name)


class NormalizedMatchNode(_Rewards):
    """A string match that folds case, whitespace, punctuation, full-width forms and number spellings first."""

    type: Literal["normalized_match"] = Field(description="normalized_match: compare strings after normalising both.")
    expression: str = Field(description=_EXPRESSION)
    operation: Literal["EXACT_MATCH", "PARTIAL_MATCH"] = Field("EXACT_MATCH", description="EXACT_MATCH or PARTIAL_MATCH.")
    normalization: Normalization = Field(Normalization(), description="Which differences are ignored (all by default).")

    def _build(self, ctx: BuildContext, where: str, name: str) -> Grader:
        return normalized_match_grader(self.expression, operation=self.operation, parse=self.parse, normalization=self.normalization,
                                       correct=self.correct, wrong=self.wrong, name=name)


class NumericMatchNode(_Rewards):
    """The last number in the parsed response against the expected one, within a tolerance (1,000 == 1000.0 == 1e3)."""

    type: Literal["numeric_match"] = Field(description="numeric_match: compare numbers.")
    expression: str = Field(description=_EXPRESSION)
    abs_tol: float = Field(0.0, description="Absolute tolerance.")
    rel_tol: float = Field(1e-9, description="Relative tolerance.")

    def _build(self, ctx: BuildContext, where: str, name: str) -> Grader:
        return numeric_match_grader(self.expression, abs_tol=self.abs_tol, rel_tol=self.rel_tol, parse=self.parse,
                                    correct=self.correct, wrong=self.wrong, name=name)


class StringCheckNode(_Node):
    """OpenAI's string_check grader: 1 or 0."""

    type: Literal["string_check"] = Field(description="string_check: OpenAI's string comparison, 1 or 0.")
    input: str = Field(description="A template: \"{{ sample.output_text }}\".")
    reference: str = Field(description="A template: \"{{ item.answer }}\".")
    operation: Literal["eq", "ne", "like", "ilike"] = Field("eq", description="eq, ne, like (contains) or ilike (contains, any case).")

    def _build(self, ctx: BuildContext, where: str, name: str) -> Grader:
        return string_check_grader(self.input, self.reference, self.operation, name=name)


class LlmNode(_Node):
    """Any rubric, judged by the file's judge: a shipped rubric's name (`gradekit rubrics`) or a path to a .yaml spec."""

    type: Literal["llm"] = Field(description="llm: a rubric judged by an LLM.")
    rubric: str = Field(description="A shipped rubric's name, or a .yaml rubric file (relative to this file).")
    map: dict[str, str] = Field(default_factory=dict, description="Rubric variable -> sample field "
                                                                  "({question: prompt, references: references.answer}).")
    # Over the rubric's trajectory settings (judge._rubric).
    granularity: Literal["whole", "step"] | None = Field(None, description="whole: one verdict per trajectory; step: one per step.")
    step_aggregate: Literal["mean", "min", "last", "product"] | None = Field(None, description="How step verdicts make the score.")
    navigate: bool | None = Field(None, description="The judge reads the trace with tools instead of all at once.")
    navigate_rounds: int | None = Field(None, ge=1, le=32, description="Tool rounds the navigating judge may take.")
    trajectory_budget: int | None = Field(None, ge=1, description="The trajectory's token budget in the prompt.")
    truncation: Literal["middle_out", "keep_recent", "none"] | None = Field(None, description="What stays when a trajectory is cut.")
    trajectory_reasoning: Literal["keep", "drop"] | None = Field(None, description="Keep or drop the model's reasoning in the trace.")

    def build(self, ctx: BuildContext, where: str, name: str | None) -> Grader:
        # Named after its rubric unless the file names it.
        return llm_grader(ctx.judge(), _rubric(ctx, self.rubric), self.map, name=name,
                          settings=self.model_dump(include=set(TRAJECTORY_SETTINGS), exclude_none=True))


class AutoraterNode(_Node):
    """Vertex's autoraterScorer: the judge answers a prompt; the reply is matched against an expression, or read as a number."""

    type: Literal["autorater"] = Field(description="autorater: ask the judge a prompt of your own.")
    prompt: str | None = Field(None, description="The prompt, a template ({{response}}, {{references.key}}); or prompt_file.")
    prompt_file: str | None = Field(None, description="A file holding the prompt (relative to this file); or prompt.")
    parse: ParseConfig = Field(ParseConfig(), description=f"How the judge's reply is read: {_PARSE_WAYS}")
    response_parse: ParseConfig = Field(ParseConfig(), description="How the response is cut before it goes into the prompt.")
    expression: str | None = Field(None, description="Exact match of the parsed reply -> correct/wrong; omit to read it as a number.")
    correct: float = Field(1.0, description="The score when the reply matches expression.")
    wrong: float = Field(-1.0, description="The score when it does not.")

    def _build(self, ctx: BuildContext, where: str, name: str) -> Grader:
        if (self.prompt is None) == (self.prompt_file is None):
            raise ctx.fail(where or name, "give exactly one of prompt and prompt_file")
        prompt = self.prompt if self.prompt is not None else ctx.path(self.prompt_file or "").read_text(encoding="utf-8")
        return autorater_grader(ctx.judge(), prompt, parse=self.parse, response_parse=self.response_parse,
                                expression=self.expression, correct=self.correct, wrong=self.wrong, name=name)


class TextSimilarityNode(_Node):
    """OpenAI's text_similarity grader JSON. ``embedding_model`` is gradekit's: the model ``cosine``
    asks the judge's endpoint for (OpenAI's grader always uses text-embedding-3-large)."""

    type: Literal["text_similarity"] = Field(description="text_similarity: OpenAI's similarity metrics, in 0..1.")
    input: str = Field(description="A template: \"{{ sample.output_text }}\".")
    reference: str = Field(description="A template: \"{{ item.answer }}\".")
    evaluation_metric: str = Field(description="fuzzy_match, bleu, gleu, meteor (gradekit[meteor]), rouge_1..rouge_5, rouge_l or cosine.")
    pass_threshold: float | None = Field(None, description="The metric at or above which metrics.passed is true.")
    embedding_model: str | None = Field(None, description="cosine only: the embedding model, asked through the judge's endpoint.")

    def _build(self, ctx: BuildContext, where: str, name: str) -> Grader:
        return text_similarity_grader(self.input, self.reference, self.evaluation_metric,  # type: ignore[arg-type]
                                      pass_threshold=self.pass_threshold, name=name, embedding_model=self.embedding_model,
                                      judge=ctx.judge() if self.evaluation_metric == "cosine" else None)


class LabelModelNode(_Node):
    """OpenAI's label_model grader JSON: ``model`` is recorded (and exported back); the judge that
    runs it locally is gradekit's (``judge:``), so validate and a run use your endpoint."""

    type: Literal["label_model"] = Field(description="label_model: the judge picks a label.")
    model: str | None = Field(None, description="Recorded and exported; the judge that runs it is the file's judge:.")
    input: list[dict[str, Any]] = Field(description="The messages: [{role: user, content: \"...{{ sample.output_text }}...\"}].")
    labels: list[str] = Field(description="The labels the judge chooses from.")
    passing_labels: list[str] = Field(description="The labels that pass (score 1).")

    def _build(self, ctx: BuildContext, where: str, name: str) -> Grader:
        return label_model_grader(ctx.judge(), self.input, self.labels, self.passing_labels, name=name, media_root=ctx.media_root)


class ScoreModelNode(_Node):
    """OpenAI's score_model grader JSON: the judge gives a number in ``range``; ``model`` is recorded
    (and exported back) as label_model's is, the judge that runs it is gradekit's."""

    type: Literal["score_model"] = Field(description="score_model: the judge replies a number in range.")
    model: str | None = Field(None, description="Recorded and exported; the judge that runs it is the file's judge:.")
    input: list[dict[str, Any]] = Field(description="The messages: [{role: user, content: \"Rate {{ sample.output_text }}...\"}].")
    range: tuple[float, float] = Field((0.0, 1.0), description="[low, high]; outside [-1, 1] the score is rescaled to 0..1.")
    sampling_params: dict[str, Any] | None = Field(None, description="Sent with the request: {temperature: 0, seed: 1}.")
    pass_threshold: float | None = Field(None, description="An eval criterion's pass mark, in the range's units.")

    @model_validator(mode="after")
    def _range(self) -> ScoreModelNode:
        if not self.range[0] < self.range[1]:
            raise ValueError(f"range must be [low, high] with low < high, got {list(self.range)}")
        return self

    def _build(self, ctx: BuildContext, where: str, name: str) -> Grader:
        return score_model_grader(ctx.judge(), self.input, range=self.range, sampling_params=self.sampling_params, name=name,
                                  media_root=ctx.media_root)


class RewardModelNode(_Node):
    """A served reward model's score (graders._reward_model): the judge block names its model and endpoint."""

    type: Literal["reward_model"] = Field(description="reward_model: a served scalar reward model (vLLM, SGLang).")
    route: Literal["/classify", "/pooling", "/v1/classify", "/v1/embeddings"] = Field(
        "/classify", description="The server's route: vLLM /classify or /pooling, SGLang /v1/embeddings.")
    mapping: Literal["sigmoid", "raw", "minmax", "zscore"] = Field(
        "sigmoid", description="Score -> reward: sigmoid (scale, center), raw (clipped), minmax or zscore (under type: group only).")
    scale: float | None = Field(None, gt=0, description="sigmoid: the score's scale.")
    center: float = Field(0.0, description="sigmoid: the score mapped to 0.")
    use_activation: bool = Field(False, description="Ask the server to apply the model's activation.")
    task: str | None = Field(None, description="vLLM /pooling's task (e.g. token_classify); the server's default otherwise.")
    chat_template: str | None = Field(None, description="SGLang's routes: the reward model's Jinja chat template.")
    chat_template_file: str | None = Field(None, description="Or the file holding it (relative to this file).")

    def _build(self, ctx: BuildContext, where: str, name: str) -> Grader:
        if self.mapping in GROUP_MAPPINGS and not ctx.in_group:
            raise ctx.fail(where or name, f"mapping {self.mapping} maps scores within a group: put this node under "
                           f"type: group (grader: {{type: reward_model, mapping: {self.mapping}}}), or use sigmoid or raw")
        if self.chat_template is not None and self.chat_template_file is not None:
            raise ctx.fail(where or name, "give chat_template or chat_template_file, not both")
        template = self.chat_template
        if self.chat_template_file is not None:
            template = ctx.path(self.chat_template_file).read_text(encoding="utf-8")
        return reward_model_grader(ctx.judge(), route=self.route, mapping=self.mapping, scale=self.scale, center=self.center,
                                   use_activation=self.use_activation, task=self.task, chat_template=template, name=name)


class _Sandboxed(_Node):
    workers: int | None = Field(None, description="Worker processes (default: one per CPU, up to 4).")
    sandbox: SandboxPolicy = Field("auto", description="auto (bubblewrap, else rlimits with a warning), strict (bubblewrap or fail) "
                                                       "or none (docs/sandbox.md).")
    network: bool = Field(False, description="true: the code may use the network.")
    packages: list[str] = Field(default_factory=list, description="Packages importable beyond the standard library (read-only).")
    processes: int = Field(DEFAULT_PROCESSES, description="RLIMIT_NPROC per call.")
    file_mb: int = Field(DEFAULT_FILE_MB, description="The largest file a call may write, in MB (RLIMIT_FSIZE).")
    cpus: int = Field(DEFAULT_CPUS, description="CPUs per call (affinity).")


class PythonNode(_Sandboxed):
    """Your code, in a sandboxed worker: a file defining evaluate(example, response) (Vertex) or grade(sample, item) (OpenAI)."""

    type: Literal["python"] = Field(description="python: run your grading function.")
    file: str | None = Field(None, description="The .py file (relative to this file); or source.")
    source: str | None = Field(None, description="The code itself; or file.")
    flavour: Literal["vertex", "openai"] | None = Field(None, description="Which signature the code has; default: told from the code.")
    entry: str | None = Field(None, description="The function's name; default: evaluate or grade.")
    timeout: float = Field(DEFAULT_TIMEOUT, description="Seconds per call.")
    memory_mb: int | None = Field(DEFAULT_MEMORY_MB, description="Memory per worker, in MB.")
    env: dict[str, str] = Field(default_factory=dict, description="The only variables the code sees beyond PATH, locale and TZ.")
    image_tag: str | None = Field(None, description="OpenAI's field, accepted so its grader JSON loads; unused.")
    pass_threshold: float | None = Field(None, description="OpenAI's field; unused by the grade itself.")
    # A python grader's range cannot be read from its source, and `gradekit export --to openai` exports
    # without --rescale only a range in 0..1.
    range: tuple[float, float] | None = Field(None, description="The scores this code gives, as its author states them: [low, high] "
                                                                "within [-1, 1].")

    @model_validator(mode="after")
    def _range(self) -> PythonNode:
        if self.range is not None and not -1.0 <= self.range[0] <= self.range[1] <= 1.0:
            raise ValueError(f"range must be [low, high] with -1 <= low <= high <= 1, got {list(self.range)}")
        return self

    def _build(self, ctx: BuildContext, where: str, name: str) -> Grader:
        if (self.file is None) == (self.source is None):
            raise ctx.fail(where or name, "give exactly one of file and source")
        python = python_grader(self.source, file=ctx.path(self.file) if self.file else None, flavour=self.flavour, entry=self.entry,
                               timeout=self.timeout, memory_mb=self.memory_mb, workers=self.workers, env=self.env, name=name,
                               sandbox=self.sandbox, network=self.network, packages=self.packages, processes=self.processes,
                               file_mb=self.file_mb, cpus=self.cpus)
        ctx.sandboxes[where or name] = python.isolation
        return python


class CodeTestsNode(_Sandboxed):
    """Run the response's program (its last fenced block) against test cases, in the sandbox."""

    type: Literal["code_tests"] = Field(description="code_tests: run the response's code against tests.")
    tests: str = Field("tests", description="The references key holding the cases: [{input, output}], {inputs, outputs} or assert code.")
    scoring: Scoring = Field("fraction", description="fraction (passed/total mapped to [-1, 1]) or all_or_nothing.")
    timeout: float = Field(DEFAULT_CASE_TIMEOUT, description="Seconds per case.")
    memory_mb: int | None = Field(DEFAULT_CASE_MEMORY_MB, description="Memory per case, in MB.")

    def _build(self, ctx: BuildContext, where: str, name: str) -> Grader:
        code = code_tests_grader(tests=self.tests, scoring=self.scoring, timeout=self.timeout, memory_mb=self.memory_mb,
                                 workers=self.workers, sandbox=self.sandbox, network=self.network, packages=self.packages,
                                 processes=self.processes, file_mb=self.file_mb, cpus=self.cpus, name=name)
        ctx.sandboxes[where or name] = code.isolation
        return code


class MathEquivalenceNode(_Node):
    """``type: verified_answer`` (or ``math_equivalence``, its first name): the response's final answer
    against the gold one, by rule, for every kind of answer, in sandboxed workers (graders._math_verify);
    a check that cannot finish is an error, never wrong."""

    type: Literal["math_equivalence", "verified_answer"] = Field(description="verified_answer (or math_equivalence): check the "
                                                                              "final answer by rule.")
    expression: str = Field(description="The gold answer, a template: \"{{references.answer}}\".")
    kind: str = Field("auto", description="auto (told from the gold), number, expression, choice, string, or a template per row.")
    options: str | list[Any] | dict[str, Any] | None = Field(None, description="choice: the options (default: the row's options/choices, "
                                                                                "else the question's list).")
    aliases: str | None = Field(None, description="A template of more answers that count (a JSON list or one string).")
    timeout: float = Field(MATH_TIMEOUT, gt=0, description="Seconds per check; past it the row is an error (timeout), never wrong.")
    correct: float = Field(1.0, description="The score of a right answer.")
    wrong: float = Field(-1.0, description="The score of a wrong one.")
    parse: str | list[str] = Field("auto", description="How the response is read: auto (the last \\boxed{}, then LaTeX, then a plain "
                                                       "expression), boxed, answer, latex, expr, or a list of them.")
    max_chars: int | None = Field(MATH_MAX_CHARS, ge=1, description="A longer response is cut to its last max_chars characters.")
    workers: int | None = Field(None, ge=1, description="Checker processes (default: one per CPU, up to 4).")
    memory_mb: int | None = Field(MATH_MEMORY_MB, ge=256, description="Memory per checker, in MB.")
    sandbox: SandboxPolicy = Field("auto", description="auto, strict or none (docs/sandbox.md).")
    judge_fallback: JudgeFallback | None = Field(None, description="The hybrid: rows the check did not accept go to the judge, "
                                                                   "asked in both orders with this rubric.")

    @model_validator(mode="after")
    def _modes(self) -> MathEquivalenceNode:
        parse_modes(self.parse)
        return self

    @field_validator("kind")
    @classmethod
    def _kind(cls, kind: str) -> str:
        return kind if "{{" in kind else check_kind(kind)

    def _build(self, ctx: BuildContext, where: str, name: str) -> Grader:
        math = math_equivalence_grader(self.expression, kind=self.kind, options=self.options, aliases=self.aliases, timeout=self.timeout,
                                       correct=self.correct, wrong=self.wrong, parse=self.parse, max_chars=self.max_chars,
                                       workers=self.workers, memory_mb=self.memory_mb, sandbox=self.sandbox, name=name)
        ctx.sandboxes[where or name] = math.isolation
        fallback = self.judge_fallback
        if fallback is None:
            return math
        try:
            return hybrid_grader(math, ctx.judge(), fallback, rubric=_rubric(ctx, fallback.rubric))
        except (ValueError, RubricError):
            math.close()  # its workers are started: a config that fails after them must not leave them behind
            raise


class WeightedNode(_Node):
    """Vertex's composite: sum(weight * reward) / sum(weight) over its parts."""

    type: Literal["weighted"] = Field(description="weighted: a weighted mean of parts.")
    parts: dict[str, AsNode[WeightedPart]] = Field(description="Part name -> a grader node with a weight.")

    def _build(self, ctx: BuildContext, where: str, name: str) -> Grader:
        parts = []
        for part_name, part in self.parts.items():
            part = dict(part)
            if "weight" not in part:
                raise ctx.fail(f"{_dot(where)}parts.{part_name}", "needs a weight")
            weight = part.pop("weight")
            if isinstance(weight, bool) or not isinstance(weight, (int, float)):
                raise ctx.fail(f"{_dot(where)}parts.{part_name}.weight", f"must be a number, got {weight!r}")
            parts.append((part_name, ctx.node(part, f"{_dot(where)}parts.{part_name}", part_name), float(weight)))
        return weighted_grader(parts, name=name)


class FormulaNode(_Node):
    """OpenAI's multi grader: a formula over named graders (+ - * / ** min max abs floor ceil exp sqrt log)."""

    type: Literal["formula", "multi"] = Field(description="formula (or OpenAI's multi): a formula over named graders.")
    formula: str | None = Field(None, description="The formula over the graders' names: \"0.5 * exact + 0.5 * max(tone, 0)\".")
    calculate_output: str | None = Field(None, description="OpenAI multi grader's name for formula.")
    graders: dict[str, AsNode[GraderNode]] = Field(description="Name -> a grader node; the formula reads these names.")

    def _build(self, ctx: BuildContext, where: str, name: str) -> Grader:
        formula = self.formula or self.calculate_output
        if formula is None or (self.formula is not None and self.calculate_output is not None):
            raise ctx.fail(where or name, "give exactly one of formula and calculate_output")
        graders = {k: ctx.node(v, f"{_dot(where)}graders.{k}", k) for k, v in self.graders.items()}
        return formula_grader(graders, formula, name=name)


class VertexNode(_Node):
    """A Vertex reinforcementTuningSpec, inline or in a JSON file (a file that is a bare spec loads as this)."""

    type: Literal["vertex"] = Field(description="vertex: a Vertex reinforcementTuningSpec.")
    spec: dict[str, Any] | None = Field(None, description="The spec itself; or file.")
    file: str | None = Field(None, description="A JSON file holding the spec (relative to this file); or spec.")

    def _build(self, ctx: BuildContext, where: str, name: str) -> Grader:
        if (self.spec is None) == (self.file is None):
            raise ctx.fail(where or name, "give exactly one of spec and file")
        if self.spec is not None:
            spec = parse_vertex_spec(self.spec, source=ctx.source, path_prefix=f"{_dot(where)}spec")
        else:
            spec = parse_vertex_spec(ctx.path(self.file or ""))
        return vertex_grader(spec, judge=ctx.judge)


class RelativeSettings(BaseModel):
    """``relative:`` of a group config: one judge call ranks all trajectories (graders._relative)."""

    model_config = ConfigDict(extra="forbid")

    criteria: str | None = Field(None, description="What the ranking judges, in words.")
    shuffles: Literal[1, 2] = Field(2, description="Judge calls per group, each with the members in another order.")
    seed: int = Field(0, description="Seed of the shuffles.")
    rubric: str = Field("group_rank", description="A shipped ranking rubric, or a .yaml rubric file.")


class PairwiseSettings(BaseModel):
    """``pairwise:`` of a group config: members compared in pairs, fitted with Bradley-Terry (graders._pairwise_group)."""

    model_config = ConfigDict(extra="forbid")

    rubric: str = Field("arena_hard_pairwise", description="A shipped pairwise rubric, or a .yaml rubric file.")
    pairing: Literal["circular", "all_pairs", "anchor"] = Field("circular", description="Which pairs are compared.")
    anchor: int = Field(0, ge=0, description="pairing: anchor: the member every other one is compared with.")
    seed: int = Field(0, description="Seed of the pairs' order.")
    alpha: float = Field(0.01, gt=0, description="The Bradley-Terry fit's regularisation.")


class GroupNode(_Node):
    """Ark's group grader: all of a prompt's trajectories graded together, with trajectory and sample checks.
    Only at a file's top level (graders.load_group_grader)."""

    type: Literal["group"] = Field(description="group: grade a group of trajectories (top level only).")
    grader: AsNode[GraderNode] | None = Field(None, description="The node each trajectory is graded with alone; or relative, "
                                                                        "or pairwise.")
    relative: RelativeSettings | None = Field(None, description="One judge call ranks the whole group.")
    pairwise: PairwiseSettings | None = Field(None, description="Members compared in pairs.")
    checks: TrajectoryChecks = Field(TrajectoryChecks(), description="Trajectory checks that score before (or instead of) the judge.")
    sample_checks: SampleChecks = Field(SampleChecks(), description="When a sample is unusable (its group is DISCARDed).")
    on_judge_error: Policy = Field("RETRY", description="FAILURE, RETRY, DISCARD, or a number: the score of a judge failure.")
    on_invalid: Policy = Field("DISCARD", description="FAILURE, RETRY, DISCARD or a number, for an invalid sample.")
    pass_threshold: float = Field(0.5, description="The reward at or above which a trajectory passes.")
    on_member_error: MemberPolicy = Field("renormalize", description="A failed member: renormalize, drop_group or retry (graders._members).")
    min_members: int = Field(2, ge=1, description="Fewer graded members than this fails the group.")
    group_deadline_s: float | None = Field(None, gt=0, description="Seconds the group may take; stragglers count as failed members.")
    member_retries: int = Field(1, ge=0, le=5, description="Retries of a failed member (on_member_error: retry).")


# Every node type a grader file may use anywhere, in the order an unknown type's message lists them; group only at the top.
NODE_MODELS: tuple[type[_Node], ...] = (
    StringMatchNode, JsonMatchNode, NormalizedMatchNode, NumericMatchNode, StringCheckNode, LlmNode, AutoraterNode, LabelModelNode,
    ScoreModelNode, RewardModelNode, TextSimilarityNode, PythonNode, CodeTestsNode, MathEquivalenceNode, WeightedNode, FormulaNode,
    VertexNode,
)
GraderNode = Annotated[Union[NODE_MODELS], Field(discriminator="type")]  # type: ignore[valid-type]


def with_keys(model: type[BaseModel], suffix: str, **fields: Any) -> type[BaseModel]:
    """``model`` with more keys, for the schema only: a node as a weighted part (``weight``) or as a whole
    file (``judge``, ``$schema``). The loader reads those keys off before it validates the node with ``model``."""
    return create_model(f"{model.__name__}{suffix}", __base__=model, __doc__=model.__doc__, **fields)  # type: ignore[call-overload]


_WEIGHT = (float, Field(description="The part's weight: the grade is sum(weight * part) / sum(weight)."))
_PARTS = tuple(with_keys(model, "Part", weight=_WEIGHT) for model in NODE_MODELS)
WeightedPart = Annotated[Union[_PARTS], Field(discriminator="type")]  # type: ignore[valid-type]

for _model in (WeightedNode, FormulaNode, GroupNode):  # their nested nodes name the unions defined after them
    _model.model_rebuild()
