"""Vertex AI exports: a standalone ``evaluate(example, response)`` file, and a ``reinforcementTuningSpec``.

The spec uses Vertex's own scorers where they compute exactly what the gradekit grader does
(string match, JSON match, the autorater, Cloud Run, a python ``evaluate`` as is) and a
code-execution reward holding the exported ``evaluate`` for the other deterministic graders
(normalised and numeric match, OpenAI's string_check and ``grade``, formulas). A weighted
composite becomes ``compositeRewardConfig``; a weighted composite inside one is flattened (the
weighted mean is linear, so the total is unchanged). A config read from a Vertex spec exports
that spec unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._composite import MAX_PARTS
from .._vertex import dump_vertex_spec, parse_vertex_spec
from ._nodes import ExportError, Node, read_tree
from ._standalone import DETERMINISTIC, expressible, standalone_source

EVALUATE_TARGET = "a Vertex code-execution reward (evaluate)"
SPEC_TARGET = "a Vertex reinforcementTuningSpec"
ConfigSource = str | Path | Mapping[str, Any]


def export_vertex_evaluate(config: ConfigSource, *, on_invalid: float | None = None) -> str:
    """A deterministic grader config as the source of a self-contained ``evaluate(example, response)``.

    Paste it into a ``codeExecutionRewardScorer`` (or the console's python editor). It imports
    only the standard library and gives the grader's scores on Vertex's example and response.

    Args:
        config: a grader config file or mapping (string/JSON/normalised/numeric match,
            string_check, python, weighted, formula, or a Vertex spec of those).
        on_invalid: the score to return for an example the grader cannot grade; None (the
            default) raises, so Vertex leaves that call unscored rather than scoring it.

    Raises:
        ExportError: a part needs a judge model or the network (llm, autorater, Cloud Run).
    """
    tree = read_tree(config, EVALUATE_TARGET)
    return standalone_source(tree.root, entry="evaluate", target=EVALUATE_TARGET, on_invalid=on_invalid,
                             title=f"Vertex reward: {tree.root.name} (from {tree.source}).")


def export_vertex_spec(config: ConfigSource, *, wrap: bool = True) -> dict[str, Any]:
    """A grader config as Vertex's ``reinforcementTuningSpec`` JSON (``{"reinforcementTuningSpec": ...}``
    when ``wrap``), validated by the same models :func:`graders.parse_vertex_spec` uses.

    Raises:
        ExportError: a part has no Vertex form (a gradekit LLM rubric, a formula over an LLM
            part, a composite of more than 16 rewards), with the reason for each.
    """
    tree = read_tree(config, SPEC_TARGET)
    root = tree.root
    if root.vertex_spec is not None:
        return dump_vertex_spec(root.vertex_spec, wrap=wrap)
    reasons: list[str] = []
    if root.kind == "weighted":
        leaves = _leaves(root, 1.0, "")
        if len(leaves) > MAX_PARTS:
            reasons.append(f"{root.where}: {len(leaves)} rewards after flattening nested composites; Vertex allows at most {MAX_PARTS}")
        configs = [{"rewardConfig": _single(node, name, reasons), "weight": weight} for name, weight, node in leaves]
        body: dict[str, Any] = {"compositeRewardConfig": {"weightedRewardConfigs": configs}}
    else:
        body = {"singleRewardConfig": _single(root, root.name, reasons)}
    if reasons:
        raise ExportError(SPEC_TARGET, reasons)
    return dump_vertex_spec(parse_vertex_spec(body, source=f"the spec exported from {tree.source}"), wrap=wrap)


def _leaves(node: Node, scale: float, prefix: str) -> list[tuple[str, float, Node]]:
    """A weighted composite's rewards with nested weighted composites flattened (weights multiplied)."""
    if node.kind != "weighted":
        return [(prefix or node.name, scale, node)]
    total = sum(w or 0.0 for _, w, _ in node.parts)
    out: list[tuple[str, float, Node]] = []
    for name, weight, part in node.parts:
        share = scale * (weight or 0.0) / total if prefix else (weight or 0.0)
        out.extend(_leaves(part, share, f"{prefix}.{name}" if prefix else name))
    return out


def _parse(parse: Any) -> dict[str, Any] | None:
    if parse.type == "REGEX_EXTRACT":
        return {"parseType": "REGEX_EXTRACT", "regexExtractExpression": parse.regex}
    return None


def _single(node: Node, name: str, reasons: list[str]) -> dict[str, Any]:
    """One reward: Vertex's own scorer where it is exact, else the exported evaluate()."""
    if node.vertex is not None:  # read from a Vertex spec: give it back as it was, under this part's name
        body = node.vertex.model_dump(mode="json", by_alias=True, exclude_unset=True)
        return {"rewardName": name, **{k: v for k, v in body.items() if k != "rewardName"}}
    cfg: Any = node.cfg
    body = {"rewardName": name}
    if node.kind in ("string_match", "json_match"):
        expression = {"matchOperation": cfg.operation, "expression": cfg.expression}
        scorer: dict[str, Any] = ({"stringMatchExpression": expression} if node.kind == "string_match"
                                  else {"jsonMatchExpression": {"keyName": cfg.key, "valueStringMatchExpression": expression}})
        parse = _parse(cfg.parse)
        if parse:
            body["parseResponseConfig"] = parse
        body["stringMatchRewardScorer"] = {**scorer, "correctAnswerReward": cfg.correct, "wrongAnswerReward": cfg.wrong}
        return body
    if node.kind == "autorater":
        scorer = {"autoraterPrompt": cfg.prompt}
        reply = _parse(cfg.parse)
        if reply:
            scorer["autoraterResponseParseConfig"] = reply
        if cfg.expression is None:
            scorer["parsedResponseConversionScorer"] = {}
        else:
            scorer["exactMatchScorer"] = {"expression": cfg.expression, "correctAnswerReward": cfg.correct, "wrongAnswerReward": cfg.wrong}
        parse = _parse(cfg.response_parse)
        if parse:
            body["parseResponseConfig"] = parse
        body["autoraterScorer"] = scorer
        return body
    if node.kind == "python" and node.flavour == "vertex":
        body["codeExecutionRewardScorer"] = {"pythonCodeSnippet": node.source}
        return body
    if node.kind == "llm":
        reasons.append(f"{node.where}: a gradekit rubric renders a Jinja template into chat messages and maps the judge's label "
                       "to a score; Vertex's autorater takes one prompt string. Use type: autorater for a Vertex-portable LLM reward")
        return body
    if node.kind in DETERMINISTIC:
        gaps = expressible(node, "evaluate")
        if gaps:
            reasons.extend(gaps)
            return body
        source = standalone_source(node, entry="evaluate", target=SPEC_TARGET, title=f"Vertex reward: {name} (exported by gradekit).")
        body["codeExecutionRewardScorer"] = {"pythonCodeSnippet": source}
        return body
    reasons.append(f"{node.where}: no Vertex form")
    return body
