"""OpenAI reinforcement fine-tuning: a grader config as OpenAI grader JSON.

Which OpenAI grader each gradekit grader becomes:

- ``string_check`` -> ``string_check`` (it is OpenAI's own grader; templates are rewritten to
  ``{{ sample.output_text }}`` and ``{{ item.<key> }}``).
- string/JSON/normalised/numeric match, python graders -> ``python``: the exported
  ``grade(sample, item)``, which runs gradekit's own parse and match code. (No native grader
  matches exactly: ``string_check`` cannot extract with a regex, strip whitespace, fold numbers.)
- a Vertex-style autorater that replies with a number -> ``score_model`` with ``range`` [-1, 1];
  ``score_model`` and ``label_model`` -> themselves (content parts and images kept).
- ``weighted`` and ``formula`` -> ``multi`` with ``calculate_output`` (weights become the formula);
  nested weighted composites are flattened; other nested composites become one ``python`` part.

Score range: OpenAI means rewards to lie in 0..1; gradekit scores lie in [-1, 1]. By default the
reward is the gradekit score unchanged, and the export is refused (naming ``--rescale``) unless
the grader's range is known to lie in 0..1: a part that can score below 0 (a ``wrong: -1``, an
autorater's [-1, 1]) is named; a python grader counts as known only when it declares
``range: [low, high]``; weighted and formula composites are bounded from their parts. ``rescale=True`` maps every score as
``(score + 1) / 2`` instead (in the python source, or as ``calculate_output``), so -1 -> 0, 0 -> 0.5,
1 -> 1.
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gradekit.judge._client import DEFAULT_MODEL

from .._composite import formula_text
from ._nodes import ExportError, Node, read_tree
from ._standalone import DETERMINISTIC, expressible, standalone_source

TARGET = "an OpenAI grader"
IMAGE_TAG = "2025-05-08"
MAX_SOURCE_BYTES = 256 * 1024
_FUNCTIONS = {"min", "max", "abs", "floor", "ceil", "exp", "sqrt", "log"}
ConfigSource = str | Path | Mapping[str, Any]


# ---- the documented shapes (fine_tuning/alpha/graders) --------------------------------------------


class _Shape(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StringCheckGrader(_Shape):
    type: Literal["string_check"] = "string_check"
    name: str
    input: str
    reference: str
    operation: Literal["eq", "ne", "like", "ilike"]


class PythonSourceGrader(_Shape):
    type: Literal["python"] = "python"
    name: str
    source: str
    image_tag: str = IMAGE_TAG


class ModelMessage(_Shape):
    """One message of a model grader's prompt (score_model and label_model take the same shape):
    a string, or a list of ``input_text`` / ``input_image`` / ``input_audio`` parts."""

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[dict[str, Any]]


class ScoreModelGrader(_Shape):
    type: Literal["score_model"] = "score_model"
    name: str
    model: str
    input: list[ModelMessage]
    range: tuple[float, float] = (0.0, 1.0)
    sampling_params: dict[str, Any] = Field(default_factory=dict)
    pass_threshold: float | None = None  # an eval's testing criterion (Foundry's evals) takes it; RFT ignores it


class LabelModelGrader(_Shape):
    """OpenAI's label_model (for evals; RFT takes it inside a multi grader only as the SDK types allow)."""

    type: Literal["label_model"] = "label_model"
    name: str
    model: str
    input: list[ModelMessage]
    labels: list[str]
    passing_labels: list[str]


class TextSimilarityGrader(_Shape):
    """No ``pass_threshold``: the grader type has none (openai.types.graders); it belongs to an
    eval's testing criterion, so it is read from such JSON but not exported."""

    type: Literal["text_similarity"] = "text_similarity"
    name: str
    input: str
    reference: str
    evaluation_metric: str
    pass_threshold: float | None = None  # Foundry's (its graders page); never set by the OpenAI export


LeafGrader = StringCheckGrader | PythonSourceGrader | ScoreModelGrader | LabelModelGrader | TextSimilarityGrader


class MultiGrader(_Shape):
    type: Literal["multi"] = "multi"
    name: str
    graders: dict[str, LeafGrader]
    calculate_output: str


# ---- export -------------------------------------------------------------------------------------


def export_openai_grader(config: ConfigSource, *, rescale: bool = False, model: str | None = None,
                         on_invalid: float | None = None) -> dict[str, Any]:
    """A grader config as an OpenAI RFT grader (``string_check``, ``python``, ``score_model`` or ``multi``).

    Args:
        config: a grader config file or mapping.
        rescale: map gradekit's [-1, 1] onto OpenAI's 0..1 as ``(score + 1) / 2``; without it
            the score is passed through and a grader that can score below 0 is refused.
        model: the ``score_model`` model; default: the config's ``judge.model``, else gradekit's default.
        on_invalid: in python graders, the gradekit score to give a sample that cannot be graded;
            None raises, and OpenAI marks the sample invalid (scored 0).

    Raises:
        ExportError: with one reason per part that has no OpenAI form.
    """
    tree = read_tree(config, TARGET)
    exporter = _Exporter(model or tree.judge_model or DEFAULT_MODEL, on_invalid, rescale)
    root = tree.root
    if root.kind in ("weighted", "formula"):
        graders, formula = exporter.composite(root)
        if rescale:
            formula = f"(({formula}) + 1) / 2"
        result: BaseModel = MultiGrader(name=root.name, graders=graders, calculate_output=formula)
    else:
        leaf = exporter.leaf(root, top=True)
        if rescale and not isinstance(leaf, PythonSourceGrader):  # python maps inside its source
            key = _identifier(root.name)
            result = MultiGrader(name=root.name, graders={key: leaf}, calculate_output=f"({key} + 1) / 2")
        else:
            result = leaf
    if not rescale:
        exporter.check_range(root)
    if exporter.reasons:
        raise ExportError(TARGET, exporter.reasons)
    return result.model_dump(mode="json", exclude_none=True)


def _identifier(name: str) -> str:
    key = re.sub(r"\W", "_", name)
    return key if key.isidentifier() and key not in _FUNCTIONS else f"g_{key}"


class _Exporter:
    def __init__(self, model: str, on_invalid: float | None, rescale: bool) -> None:
        self.model, self.on_invalid, self.rescale = model, on_invalid, rescale
        self.reasons: list[str] = []

    # A stand-in leaf where a reason was recorded, so the walk goes on and reports every part.
    def _refuse(self, node: Node, reason: str) -> LeafGrader:
        self.reasons.append(f"{node.where}: {reason}")
        return PythonSourceGrader(name=node.name, source="")

    def leaf(self, node: Node, *, top: bool = False) -> LeafGrader:
        cfg: Any = node.cfg
        if node.kind == "string_check":
            return StringCheckGrader(name=node.name, input=self.template(node, cfg.input), reference=self.template(node, cfg.reference),
                                     operation=cfg.operation)
        if node.kind == "autorater":
            prompt = self.template(node, cfg.prompt)
            if cfg.expression is not None:
                return self._refuse(node, "an autorater that matches the judge's reply against an expression has no RFT form "
                                          "(score_model reads a number; label_model is for evals only)")
            if cfg.parse.type != "IDENTITY" or cfg.response_parse.type != "IDENTITY":
                return self._refuse(node, "score_model cannot extract with a regex (from the judge's reply or the response)")
            return ScoreModelGrader(name=node.name, model=self.model, input=[ModelMessage(role="user", content=prompt)],
                                    range=(-1.0, 1.0), sampling_params={"temperature": 0})
        if node.kind == "text_similarity":
            return TextSimilarityGrader(name=node.name, input=self.template(node, cfg.input), reference=self.template(node, cfg.reference),
                                        evaluation_metric=cfg.evaluation_metric)
        if node.kind == "label_model":
            return LabelModelGrader(name=node.name, model=cfg.model or self.model, labels=list(cfg.labels),
                                    passing_labels=list(cfg.passing_labels), input=self.messages(node, cfg.input))
        if node.kind == "score_model":
            return ScoreModelGrader(name=node.name, model=cfg.model or self.model, input=self.messages(node, cfg.input),
                                    range=(float(cfg.range[0]), float(cfg.range[1])), sampling_params=dict(cfg.sampling_params or {}),
                                    pass_threshold=cfg.pass_threshold)
        if node.kind == "llm":
            return self._refuse(node, "a gradekit rubric maps the judge's label to a score; score_model reads a number, and label_model "
                                      "is for evals only")
        if node.kind == "cloud_run":
            return self._refuse(node, "a Cloud Run reward is an HTTP call; OpenAI's python grader has no network")
        if node.kind in DETERMINISTIC:
            gaps = expressible(node, "grade")
            if gaps:
                self.reasons.extend(gaps)
                return PythonSourceGrader(name=node.name, source="")
            source = standalone_source(node, entry="grade", target=TARGET, on_invalid=self.on_invalid, rescale=self.rescale and top,
                                       title=f"OpenAI python grader: {node.name} (exported by gradekit).")
            if len(source.encode("utf-8")) > MAX_SOURCE_BYTES:
                return self._refuse(node, f"the python source is {len(source.encode('utf-8'))} bytes; OpenAI allows under 256 kB")
            return PythonSourceGrader(name=node.name, source=source)
        return self._refuse(node, "no OpenAI form")

    def messages(self, node: Node, messages: list[dict[str, Any]]) -> list[ModelMessage]:
        """A model grader's ``input`` with its templates rewritten; content parts keep their shape."""
        out = []
        for message in messages:
            content = message.get("content")
            if isinstance(content, list):
                parts = []
                for part in content:
                    part = dict(part) if isinstance(part, Mapping) else {"type": "input_text", "text": str(part)}
                    for key in ("text", "image_url"):
                        if isinstance(part.get(key), str):
                            part[key] = self.template(node, part[key])
                    parts.append(part)
                out.append(ModelMessage(role=message.get("role", "user"), content=parts))
            else:
                out.append(ModelMessage(role=message.get("role", "user"), content=self.template(node, str(content or ""))))
        return out

    def template(self, node: Node, text: str) -> str:
        """gradekit placeholders as OpenAI's: the response -> sample.output_text, references -> item."""

        def sub(found: re.Match[str]) -> str:
            path = found.group(1)
            head, _, rest = path.partition(".")
            if path in ("response", "sample.output_text", "output_text"):
                return "{{ sample.output_text }}"
            if head in ("references", "item") and rest:
                return "{{ item." + rest + " }}"
            self.reasons.append(f"{node.where}: uses {{{{{path}}}}}, but OpenAI's templates see only the sample and the item "
                                "(the dataset row without its messages)")
            return found.group(0)

        return re.sub(r"\{\{\s*([A-Za-z_][\w.\-]*)\s*\}\}", sub, text)

    def composite(self, node: Node) -> tuple[dict[str, LeafGrader], str]:
        """A multi grader's parts and formula: weights become ``(w1 * a + w2 * b) / W``."""
        graders: dict[str, LeafGrader] = {}
        if node.kind == "weighted":
            terms = []
            total = 0.0
            for name, weight, part in _flatten(node):
                key = self._key(name, graders, node)
                graders[key] = self._part(part)
                terms.append(f"{weight!r} * {key}")
                total += weight
            return graders, f"({' + '.join(terms)}) / {total!r}"
        keys = {}
        for name, _, part in node.parts:
            keys[name] = self._key(name, graders, node)
            graders[keys[name]] = self._part(part)
        return graders, openai_formula(node.formula or "", keys)

    def _key(self, name: str, taken: Mapping[str, Any], node: Node) -> str:
        key = _identifier(name)
        if key in taken:
            self.reasons.append(f"{node.where}: two parts are both named {key!r} in the multi grader")
        return key

    def _part(self, part: Node) -> LeafGrader:
        # A multi grader cannot hold another multi grader: a nested composite is one python part.
        if part.kind in ("weighted", "formula") and expressible(part, "grade"):
            return self._refuse(part, "a composite inside a composite must be one python grader on OpenAI (a multi grader "
                                      "cannot contain another), and this one has a part that cannot run in python")
        return self.leaf(part)

    def check_range(self, root: Node) -> None:
        """Without rescale, the reward must be known to lie in OpenAI's 0..1: every part whose scores
        can go below 0 is named, with the fix; else the whole grader's range, when it is unknown
        (a python grader that does not declare ``range``) or outside 0..1, is refused naming --rescale."""
        before = len(self.reasons)
        for node in _outside_formulas(root):
            low = _lowest(node)
            if low is not None and low < 0:
                self.reasons.append(f"{node.where}: can score {low:g}, below OpenAI's 0..1; set its wrong score to 0 or export "
                                    "with rescale (`rescale`) to map gradekit's [-1, 1] onto 0..1 as (score + 1) / 2")
        if len(self.reasons) > before:
            return
        span = score_range(root)
        fix = "export with `rescale` to map gradekit's [-1, 1] onto 0..1 as (score + 1) / 2"
        if span is None:
            unknown = [n.where for n in root.walk() if n.kind == "python" and getattr(n.cfg, "range", None) is None]
            why = f" ({', '.join(unknown)} cannot be read for its range: declare it as range: [0, 1] if it scores within 0..1)" if unknown else ""
            self.reasons.append(f"{root.where}: its scores are not known to lie in OpenAI's 0..1{why}; {fix}")
        elif span[0] < 0 or span[1] > 1:
            self.reasons.append(f"{root.where}: can score {span[0]:g}..{span[1]:g}, outside OpenAI's 0..1; {fix}")


def _flatten(node: Node, scale: float = 1.0, prefix: str = "") -> list[tuple[str, float, Node]]:
    total = sum(w or 0.0 for _, w, _ in node.parts)
    out: list[tuple[str, float, Node]] = []
    for name, weight, part in node.parts:
        share = scale * (weight or 0.0) / total if prefix else (weight or 0.0)
        label = f"{prefix}_{name}" if prefix else name
        out.extend(_flatten(part, share, label) if part.kind == "weighted" else [(label, share, part)])
    return out


def _outside_formulas(node: Node) -> list[Node]:
    """Leaves whose score reaches the reward linearly (a formula may legitimately clip a negative part)."""
    if node.kind == "formula":
        return []
    if node.kind == "weighted":
        return [leaf for _, _, part in node.parts for leaf in _outside_formulas(part)]
    return [node]


Span = tuple[float, float]


def score_range(node: Node) -> Span | None:
    """The lowest and highest reward a grader can give, where its config says (None: unknown)."""
    cfg: Any = node.cfg
    if node.kind in ("string_match", "json_match", "normalized_match", "numeric_match", "math_equivalence", "verified_answer") or (node.kind == "autorater" and cfg.expression):
        low, high = sorted((float(cfg.correct), float(cfg.wrong)))
        return max(-1.0, low), min(1.0, high)
    if node.kind in ("string_check", "label_model", "text_similarity"):
        return 0.0, 1.0
    if node.kind == "score_model":
        low, high = float(cfg.range[0]), float(cfg.range[1])
        return (low, high) if -1.0 <= low and high <= 1.0 else (0.0, 1.0)  # gradekit rescales a wider range to 0..1
    if node.kind == "autorater":
        return -1.0, 1.0
    if node.kind == "python":
        declared = getattr(cfg, "range", None)
        return (float(declared[0]), float(declared[1])) if declared is not None else None
    if node.kind == "weighted":
        spans = [(w or 0.0, score_range(part)) for _, w, part in node.parts]
        total = sum(w for w, _ in spans)
        if total <= 0 or any(span is None for _, span in spans):
            return None
        return (sum(w * span[0] for w, span in spans) / total, sum(w * span[1] for w, span in spans) / total)  # type: ignore[index]
    if node.kind == "formula" and node.formula:
        names = {name: score_range(part) for name, _, part in node.parts}
        try:
            return _interval(ast.parse(node.formula.replace("^", "**").strip(), mode="eval").body, names)
        except (_Unknown, SyntaxError):
            return None
    return None


class _Unknown(Exception):
    """A formula whose range interval arithmetic cannot bound."""


def _interval(node: ast.AST, names: Mapping[str, Span | None]) -> Span:
    """Interval arithmetic over a formula's AST: a bound that holds for every value of the parts."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return float(node.value), float(node.value)
    if isinstance(node, ast.Name):
        span = names.get(node.id)
        if span is None:
            raise _Unknown
        return span
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        lo, hi = _interval(node.operand, names)
        return (-hi, -lo) if isinstance(node.op, ast.USub) else (lo, hi)
    if isinstance(node, ast.BinOp):
        (a, b), (c, d) = _interval(node.left, names), _interval(node.right, names)
        if isinstance(node.op, ast.Add):
            return a + c, b + d
        if isinstance(node.op, ast.Sub):
            return a - d, b - c
        if isinstance(node.op, ast.Mult):
            products = (a * c, a * d, b * c, b * d)
            return min(products), max(products)
        if isinstance(node.op, ast.Div) and (c > 0 or d < 0):
            quotients = (a / c, a / d, b / c, b / d)
            return min(quotients), max(quotients)
        if isinstance(node.op, ast.Pow) and c == d and float(c).is_integer() and c >= 0:
            n = int(c)
            ends = (a ** n, b ** n)
            low = 0.0 if n % 2 == 0 and a < 0 < b else min(ends)
            return low, max(ends)
        raise _Unknown
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        spans = [_interval(arg, names) for arg in node.args]
        name = node.func.id
        if name == "min" and spans:
            return min(s[0] for s in spans), min(s[1] for s in spans)
        if name == "max" and spans:
            return max(s[0] for s in spans), max(s[1] for s in spans)
        if len(spans) == 1:
            lo, hi = spans[0]
            if name == "abs":
                return (0.0 if lo < 0 < hi else min(abs(lo), abs(hi))), max(abs(lo), abs(hi))
            if name in ("floor", "ceil"):
                fn = math.floor if name == "floor" else math.ceil
                return float(fn(lo)), float(fn(hi))
            if name == "exp":
                return math.exp(lo), math.exp(hi)
            if name == "sqrt" and lo >= 0:
                return math.sqrt(lo), math.sqrt(hi)
            if name == "log" and lo > 0:
                return math.log(lo), math.log(hi)
    raise _Unknown


def _lowest(node: Node) -> float | None:
    """The lowest score a leaf can give, when its config says (None: only known at run time)."""
    cfg: Any = node.cfg
    if node.kind in ("string_match", "json_match", "normalized_match", "numeric_match"):
        return max(-1.0, min(float(cfg.correct), float(cfg.wrong)))
    if node.kind in ("string_check", "label_model", "text_similarity"):
        return 0.0
    if node.kind == "autorater":
        return -1.0 if cfg.expression is None else max(-1.0, min(float(cfg.correct), float(cfg.wrong)))
    return None


def openai_formula(formula: str, keys: Mapping[str, str]) -> str:
    """A gradekit formula in OpenAI's calculate_output syntax, fully parenthesised (``^`` for power)."""
    symbols = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.Pow: "^"}
    return formula_text(formula, variable=keys.__getitem__, binary=lambda op, left, right: f"({left} {symbols[op]} {right})",
                        negate=lambda x: f"(0 - {x})", call=lambda fn, args: f"{fn}({', '.join(args)})")
