"""A grader config read as a tree the exporters walk, without building any grader.

Export works from the configuration (a YAML/JSON file, a mapping, or a Vertex spec), because a
built grader is a closure that keeps no record of its settings. Every node is validated with
the same models :func:`graders.load_grader` uses, so a config that loads also reads here, with
the same error messages; python files are read relative to the config file; a Vertex spec is
kept next to its converted nodes so that exporting it back to Vertex gives it back unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from .._composite import FormulaError, compile_formula
from .._config import GraderConfigError, _read, validate_node
from .._config_nodes import AutoraterNode, FormulaNode, JsonMatchNode, PythonNode, StringMatchNode, VertexNode, WeightedNode
from .._python import ENTRY, detect_flavour
from .._string_match import ParseConfig
from .._vertex import SingleRewardConfig, VertexSpec, parse_vertex_spec


class ExportError(ValueError):
    """The grader cannot be expressed on the target platform; ``reasons`` says why, per node."""

    def __init__(self, target: str, reasons: list[str]) -> None:
        self.target, self.reasons = target, reasons
        listed = "\n".join(f"  - {r}" for r in reasons)
        super().__init__(f"cannot export to {target}:\n{listed}")


@dataclass
class Node:
    """One grader of the tree. ``cfg`` is the validated config model of its type."""

    kind: str
    name: str
    path: str  # where it sits in the config, for messages ("" is the top)
    cfg: BaseModel | None = None
    parts: list[tuple[str, float | None, Node]] = field(default_factory=list)  # weighted: weights; formula: None
    formula: str | None = None
    source: str | None = None  # python
    flavour: str | None = None
    entry: str | None = None
    uri: str | None = None  # Vertex cloud run
    vertex: SingleRewardConfig | None = None  # the Vertex reward this node was read from
    vertex_spec: VertexSpec | None = None  # the whole Vertex spec this (composite) node was read from

    @property
    def where(self) -> str:
        return f"{self.path} ({self.kind} {self.name!r})" if self.path else f"the grader ({self.kind} {self.name!r})"

    def walk(self) -> Iterator[Node]:
        yield self
        for _, _, part in self.parts:
            yield from part.walk()


@dataclass
class Tree:
    root: Node
    source: str  # the file name, or "grader config"
    judge_model: str | None = None


def read_tree(config: str | Path | Mapping[str, Any], target: str) -> Tree:
    """Read a grader config (file or mapping) into a tree; config mistakes raise GraderConfigError."""
    data, where, base = _read(config)
    if "testing_criteria" in data and "type" not in data:
        raise GraderConfigError(f"{where}: an Evals-API eval definition (testing_criteria), not one grader: export it with "
                                "`export_foundry_grader`, or grade it with `gradekit grade --grader`")
    judge = data.pop("judge", None) or {}
    reader = _Reader(where, base, target)
    return Tree(reader.node(data, "", None), where, judge.get("model") if isinstance(judge, Mapping) else None)


class _Reader:
    def __init__(self, source: str, base: Path, target: str) -> None:
        self.source, self.base, self.target = source, base, target

    def fail(self, where: str, message: str) -> GraderConfigError:
        return GraderConfigError(f"{self.source}: {where}: {message}" if where else f"{self.source}: {message}")

    def node(self, data: Any, where: str, default_name: str | None) -> Node:
        if isinstance(data, Mapping) and data.get("type") == "group":
            reason = f"{where or 'the grader'}: a group grader (type: group) is Ark's shape; export its inner grader: instead"
            raise ExportError(self.target, [reason])
        kind, cfg = validate_node(data, where, self.source)
        name = cfg.name or default_name or kind  # type: ignore[attr-defined]
        kind = "formula" if kind == "multi" else kind
        dot = f"{where}." if where else ""
        if isinstance(cfg, PythonNode):
            return self._python(cfg, where, name)
        if isinstance(cfg, AutoraterNode) and cfg.prompt_file is not None:
            if cfg.prompt is not None:
                raise self.fail(where or name, "give exactly one of prompt and prompt_file")
            cfg = cfg.model_copy(update={"prompt": self._path(cfg.prompt_file).read_text(encoding="utf-8"), "prompt_file": None})
        if isinstance(cfg, WeightedNode):
            parts: list[tuple[str, float | None, Node]] = []
            for part_name, part in cfg.parts.items():
                part = dict(part)
                weight = part.pop("weight", None)
                if isinstance(weight, bool) or not isinstance(weight, (int, float)):
                    raise self.fail(f"{dot}parts.{part_name}.weight", f"must be a number, got {weight!r}")
                parts.append((part_name, float(weight), self.node(part, f"{dot}parts.{part_name}", part_name)))
            return Node("weighted", name, where, cfg, parts=parts)
        if isinstance(cfg, FormulaNode):
            formula = cfg.formula or cfg.calculate_output
            if formula is None or (cfg.formula is not None and cfg.calculate_output is not None):
                raise self.fail(where or name, "give exactly one of formula and calculate_output")
            parts = [(k, None, self.node(v, f"{dot}graders.{k}", k)) for k, v in cfg.graders.items()]
            try:
                compile_formula(formula, [k for k, _, _ in parts])
            except FormulaError as e:
                raise self.fail(where or name, str(e)) from None
            return Node("formula", name, where, cfg, parts=parts, formula=formula.strip())
        if isinstance(cfg, VertexNode):
            if (cfg.spec is None) == (cfg.file is None):
                raise self.fail(where or name, "give exactly one of spec and file")
            try:
                spec = (parse_vertex_spec(cfg.spec, source=self.source, path_prefix=f"{dot}spec") if cfg.spec is not None
                        else parse_vertex_spec(self._path(cfg.file or "")))
            except ValueError as e:
                raise GraderConfigError(str(e)) from None
            return vertex_tree(spec, where)
        return Node(kind, name, where, cfg)

    def _path(self, value: str) -> Path:
        path = Path(value)
        return path if path.is_absolute() else self.base / path

    def _python(self, cfg: PythonNode, where: str, name: str) -> Node:
        if (cfg.file is None) == (cfg.source is None):
            raise self.fail(where or name, "give exactly one of file and source")
        if cfg.file is not None:
            path = self._path(cfg.file)
            try:
                source = path.read_text(encoding="utf-8")
            except OSError as e:
                raise self.fail(where or name, f"python grader file {path}: {e.strerror or e}") from None
            filename = str(path)
        else:
            source, filename = cfg.source or "", f"<{name}>"
        try:
            flavour = cfg.flavour or detect_flavour(source, filename)
        except ValueError as e:
            raise self.fail(where or name, str(e)) from None
        return Node("python", name, where, cfg, source=source, flavour=flavour, entry=cfg.entry or ENTRY[flavour])


def _vertex_single(config: SingleRewardConfig, where: str, name: str | None) -> Node:
    label = name or config.rewardName or config.scorer.removesuffix("RewardScorer").removesuffix("Scorer")
    parse = config.parseResponseConfig.to_parse() if config.parseResponseConfig else ParseConfig()
    if config.stringMatchRewardScorer is not None:
        s = config.stringMatchRewardScorer
        rewards = {"correct": s.correctAnswerReward, "wrong": s.wrongAnswerReward, "parse": parse, "name": label}
        if s.stringMatchExpression is not None:
            e = s.stringMatchExpression
            cfg: BaseModel = StringMatchNode(type="string_match", expression=e.expression, operation=e.matchOperation, **rewards)
            return Node("string_match", label, where, cfg, vertex=config)
        assert s.jsonMatchExpression is not None
        v = s.jsonMatchExpression.valueStringMatchExpression
        cfg = JsonMatchNode(type="json_match", key=s.jsonMatchExpression.keyName, expression=v.expression, operation=v.matchOperation,
                            **rewards)
        return Node("json_match", label, where, cfg, vertex=config)
    if config.autoraterScorer is not None:
        a = config.autoraterScorer
        exact = a.exactMatchScorer
        cfg = AutoraterNode(type="autorater", name=label, prompt=a.autoraterPrompt,
                            parse=a.autoraterResponseParseConfig.to_parse() if a.autoraterResponseParseConfig else ParseConfig(),
                            response_parse=parse, expression=exact.expression if exact else None,
                            correct=exact.correctAnswerReward if exact else 1.0, wrong=exact.wrongAnswerReward if exact else -1.0)
        return Node("autorater", label, where, cfg, vertex=config)
    if config.codeExecutionRewardScorer is not None:
        return Node("python", label, where, None, source=config.codeExecutionRewardScorer.pythonCodeSnippet, flavour="vertex",
                    entry="evaluate", vertex=config)
    assert config.cloudRunRewardScorer is not None
    return Node("cloud_run", label, where, None, uri=config.cloudRunRewardScorer.cloudRunUri, vertex=config)


def vertex_tree(spec: VertexSpec, where: str = "") -> Node:
    """A Vertex spec as nodes: the same graders :func:`graders.vertex_grader` builds."""
    if spec.singleRewardConfig is not None:
        node = _vertex_single(spec.singleRewardConfig, where, None)
        node.vertex_spec = spec
        return node
    assert spec.compositeRewardConfig is not None
    dot = f"{where}." if where else ""
    parts: list[tuple[str, float | None, Node]] = []
    for i, weighted in enumerate(spec.compositeRewardConfig.weightedRewardConfigs, start=1):
        part_name = weighted.rewardConfig.rewardName or f"reward_{i}"
        parts.append((part_name, weighted.weight, _vertex_single(weighted.rewardConfig, f"{dot}weightedRewardConfigs[{i - 1}]", part_name)))
    return Node("weighted", "composite", where, None, parts=parts, vertex_spec=spec)
