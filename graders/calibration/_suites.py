"""Meta-evaluation suites: labelled pairs a judge is scored on, shipped or from a user's JSONL file.

A suite is a list of :class:`SuitePair` (instruction, two outputs, the better one) grouped into
subsets. Shipped suites are read from the LLMBar copy inside the package; any other pairwise
benchmark converted to the documented JSONL format (one pair a line: ``instruction``,
``output_1``, ``output_2``, ``label`` 1 or 2, optional ``category`` and ``id``) runs the same way.
Published rows (LLMBar's GPT-4 and ChatGPT strategies) come with the shipped suites.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TypeVar

from pydantic import BaseModel

from ._llmbar import LLMBarError, list_runs, llmbar_root, load_llmbar, published_statistics

# name -> (LLMBar directory, subset name reported)
SHIPPED_SUITES: dict[str, list[tuple[str, str]]] = {
    "llmbar": [("LLMBar__Natural", "Natural"), ("LLMBar__Adversarial__Neighbor", "Neighbor"),
               ("LLMBar__Adversarial__GPTInst", "GPTInst"), ("LLMBar__Adversarial__GPTOut", "GPTOut"),
               ("LLMBar__Adversarial__Manual", "Manual")],
    "mtbench-human": [("Processed__MT-Bench", "MT-Bench")],
    "llmeval2": [("Processed__LLMEval2", "LLMEval2")],
    "faireval": [("Processed__FairEval", "FairEval")],
}
OVERALL = "overall"
UNCATEGORISED = "(no category)"
T = TypeVar("T")


class SuiteError(ValueError):
    """A suite that cannot be read; the message names the suite, file and line."""


@dataclass(frozen=True)
class SuitePair:
    """One labelled pair; ``label`` is "1" or "2", the better output."""

    id: str
    instruction: str
    output_1: str
    output_2: str
    label: str
    subset: str = OVERALL

    def row(self) -> dict[str, str]:
        return {"instruction": self.instruction, "output_1": self.output_1, "output_2": self.output_2}


class PublishedRow(BaseModel):
    """A published judge's figures on one subset (percent), e.g. LLMBar's GPT-4 / Vanilla_NoRules."""

    suite: str
    subset: str
    judge: str  # "GPT-4/Vanilla_NoRules"
    n: int
    accuracy: float
    agreement: float


@dataclass
class Suite:
    name: str
    pairs: list[SuitePair]
    subsets: list[str]  # in report order; OVERALL is added by the report when there are several
    published: list[PublishedRow] = field(default_factory=list)


def _share(text: str) -> tuple[int, int]:
    """ "47 / 100 = 47.0%" -> (47, 100)."""
    m = re.match(r"\s*(\d+)\s*/\s*(\d+)", text)
    if m is None:
        raise LLMBarError(f"manifest.json: unreadable statistic {text!r}")
    return int(m[1]), int(m[2])


def _published(name: str, parts: list[tuple[str, str]], root: str | Path | None) -> list[PublishedRow]:
    """Each recorded strategy's published Acc / Agr per subset, and pooled over the suite's subsets."""
    rows: list[PublishedRow] = []
    pooled: dict[str, list[tuple[int, int, int, int]]] = {}
    directories = dict(parts)
    for run in list_runs(root):
        if run.subset not in directories:
            continue
        stats = published_statistics(run, root)
        ab, n = _share(stats["correct_False"])
        ba, _ = _share(stats["correct_True"])
        agree, _ = _share(stats["equal"])
        judge = f"{run.judge}/{run.strategy}"
        rows.append(PublishedRow(suite=name, subset=directories[run.subset], judge=judge, n=n,
                                 accuracy=(ab + ba) / 2 / n * 100, agreement=agree / n * 100))
        pooled.setdefault(judge, []).append((ab, ba, agree, n))
    if len(parts) > 1:
        for judge, counts in pooled.items():
            if len(counts) == len(parts):  # pooled only over the whole suite
                n = sum(c[3] for c in counts)
                rows.append(PublishedRow(suite=name, subset=OVERALL, judge=judge, n=n,
                                         accuracy=sum(c[0] + c[1] for c in counts) / 2 / n * 100,
                                         agreement=sum(c[2] for c in counts) / n * 100))
    return rows


def _limited(pairs: list[SuitePair], subsets: list[str], limit: int | None) -> list[SuitePair]:
    if limit is None:
        return pairs
    kept: list[SuitePair] = []
    for subset in subsets:
        kept += [p for p in pairs if p.subset == subset][:limit]
    return kept


def load_suite(suite: str, *, limit: int | None = None, root: str | Path | None = None) -> Suite:
    """A shipped suite by name (``llmbar``, ``mtbench-human``, ``llmeval2``, ``faireval``) or a JSONL path.

    ``limit`` keeps the first N pairs of each subset, so a quick run still covers every subset.
    """
    if limit is not None and limit < 1:
        raise SuiteError(f"`limit` must be at least 1, not {limit}")
    if suite in SHIPPED_SUITES:
        parts = SHIPPED_SUITES[suite]
        llmbar_root(root)  # a clear error when the data are missing
        pairs = [SuitePair(id=f"{subset}/{x.idx}", instruction=x.input, output_1=x.output_1, output_2=x.output_2,
                           label=str(x.label), subset=subset)
                 for directory, subset in parts for x in load_llmbar(directory, root)]
        subsets = [subset for _, subset in parts]
        return Suite(suite, _limited(pairs, subsets, limit), subsets, _published(suite, parts, root))
    path = Path(suite)
    if not path.is_file():
        raise SuiteError(f"{suite!r} is neither a shipped suite ({', '.join(SHIPPED_SUITES)}) nor a JSONL file")
    pairs = read_pairs(path)
    subsets = list(dict.fromkeys(p.subset for p in pairs))
    return Suite(path.stem, _limited(pairs, subsets, limit), subsets)


def read_suite_rows(path: Path, required: tuple[str, ...], build: Callable[[str, dict[str, Any], str], T]) -> list[T]:
    """Every row of a JSONL suite file through ``build(id, item, where)``; the one reader of both suite kinds.

    Each line must be a JSON object holding every ``required`` key; ``id`` (the line number when absent) must
    be unique. ``build`` raises :class:`SuiteError` for a bad value; nothing is skipped but blank lines.
    """
    rows: list[T] = []
    seen: set[str] = set()
    try:
        handle = path.open(encoding="utf-8")
    except OSError as e:
        raise SuiteError(f"{path}: cannot read: {e}") from e
    with handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path} line {number}"
            try:
                item = json.loads(line)
            except json.JSONDecodeError as e:
                raise SuiteError(f"{where}: not valid JSON ({e.msg})") from e
            if not isinstance(item, dict):
                raise SuiteError(f"{where}: expected a JSON object with {', '.join(required)}")
            missing = [k for k in required if item.get(k) is None]
            if missing:
                raise SuiteError(f"{where}: missing {', '.join(missing)}")
            row_id = str(item.get("id", number))
            row = build(row_id, item, where)  # a bad value is named before a repeated id, as it always was
            if row_id in seen:
                raise SuiteError(f"{where}: id {row_id!r} occurs twice")
            seen.add(row_id)
            rows.append(row)
    return rows


def _pair(pair_id: str, item: dict[str, Any], where: str) -> SuitePair:
    texts = [item[k] for k in ("instruction", "output_1", "output_2")]
    if not all(isinstance(t, str) for t in texts):
        raise SuiteError(f"{where}: instruction, output_1 and output_2 must be strings")
    label = str(item["label"]).strip()
    if label not in ("1", "2"):
        raise SuiteError(f"{where}: label must be 1 or 2 (the better output), not {item['label']!r}")
    category = item.get("category")
    subset = str(category) if category not in (None, "") else UNCATEGORISED
    if subset == OVERALL:
        raise SuiteError(f"{where}: category {OVERALL!r} is reserved for the whole suite's row")
    return SuitePair(id=pair_id, instruction=texts[0], output_1=texts[1], output_2=texts[2], label=label, subset=subset)


def read_pairs(path: Path) -> list[SuitePair]:
    """Read a suite file; every malformed line is a :class:`SuiteError` naming the line, nothing is skipped."""
    pairs = read_suite_rows(path, ("instruction", "output_1", "output_2", "label"), _pair)
    if not pairs:
        raise SuiteError(f"{path}: no pairs")
    if all(p.subset == UNCATEGORISED for p in pairs):  # no categories at all: the suite is one subset
        pairs = [SuitePair(p.id, p.instruction, p.output_1, p.output_2, p.label, OVERALL) for p in pairs]
    return pairs
