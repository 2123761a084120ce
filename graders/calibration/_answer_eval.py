"""Meta-evaluation of answer verifiers: the rules, a judge, and the hybrid, on human verdicts.

The suite is rows of (question, gold, response, human verdict, and the kind of answer): the shipped
``eval_sets/answer_verification`` (``--suite answer-verification``) or a JSONL file of the same
fields. Three modes are scored on the same rows:

==========  ===================================================================================
symbolic    the rules: ``verified_answer``'s check (``kind: auto``, the row's question): ``equal``
            is correct, ``different`` is incorrect; an unparseable gold answer or a check that
            failed (timeout, crash) is no decision. ``--mode rules`` names it too.
judge       the rubric asked in both orders (gold and response swapped), correct only when both
            say so (``require``, as the hybrid grader's).
hybrid      the symbolic check first (an equal answer is correct, an empty response incorrect, as in
            the hybrid grader); every other row goes to the judge as above.
            The judge's verdicts are the judge mode's own for those rows (the same requests), so
            a meta-eval costs two requests per row, not four.
==========  ===================================================================================

False positives (a verifier says correct, the human incorrect) and false negatives (the other way)
are reported apart, each a rate over the decided rows of that human verdict, with a Wilson score
interval: a false positive rewards a wrong answer, a false negative punishes a right one, and a
trainer weighs the two differently. Rows without a decision are counted apart, by kind, never
folded into either rate.

Per kind of answer (the row's ``kind``: number, expression, choice, string) each mode also gets
its **recall** (said correct over every human-correct row: an undecided row is not accepted) and
its **false positives** (said correct over every human-incorrect row), each with its interval:
what a reward by rule gains and what it costs, kind by kind.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist
from typing import Any, Literal

from pydantic import BaseModel, Field

from gradekit.judge import Rubric, Usage
from gradekit.judge._breaker import Breaker

from .._answer_judge import AnswerJudgement, Require, check_answer_rubric, judge_answer
from ..sandbox._answer_rules import KINDS
from ._llmbar import packaged_eval_sets
from ._judging import judge_all
from ._suites import SuiteError, read_suite_rows

ANSWER_SUITE = "answer-verification"
VERDICTS = ("correct", "incorrect")
ROW_KINDS = tuple(k for k in KINDS if k != "auto")  # a row's kind of answer ("" when a file does not say)
# symbolic outcome -> the decision it gives (None: no decision)
SYMBOLIC_DECISION = {"equal": "correct", "different": "incorrect", "invalid_gold": None, "error": None}

# One check by the rules: (gold, response, question) -> (outcome, error_kind); outcome is equal, different, invalid_gold or error.
SymbolicCheck = Callable[[str, str, str], Awaitable[tuple[str, str | None]]]


@dataclass(frozen=True)
class AnswerRow:
    id: str
    question: str
    gold: str
    response: str
    verdict: str  # the human's: correct or incorrect
    category: str = ""
    source: str = ""
    kind: str = ""  # number, expression, choice or string: what the figures per kind group by
    split: str = ""  # dev (the rules were tuned on it) or heldout (written first, never tuned on)


def answer_suite_path() -> Path:
    return packaged_eval_sets() / "answer_verification" / "data.jsonl"


def is_answer_suite(suite: str) -> bool:
    """``answer-verification``, or a JSONL file whose first row has gold, response and verdict."""
    if suite == ANSWER_SUITE:
        return True
    path = Path(suite)
    if path.suffix != ".jsonl" or not path.is_file():
        return False
    try:
        with path.open(encoding="utf-8") as handle:
            first = next((line for line in handle if line.strip()), "")
        row = json.loads(first)
    except (OSError, ValueError):
        return False
    return isinstance(row, dict) and {"gold", "response", "verdict"} <= set(row)


def load_answer_suite(suite: str = ANSWER_SUITE, *, limit: int | None = None) -> tuple[str, list[AnswerRow]]:
    """(name, rows) of the shipped set or a JSONL file; every malformed line is a SuiteError naming it."""
    if limit is not None and limit < 1:
        raise SuiteError(f"`limit` must be at least 1, not {limit}")
    path = answer_suite_path() if suite == ANSWER_SUITE else Path(suite)
    name = ANSWER_SUITE if suite == ANSWER_SUITE else path.stem
    rows = read_suite_rows(path, ("gold", "response", "verdict"), _answer_row)
    if not rows:
        raise SuiteError(f"{path}: no rows")
    return name, rows[:limit] if limit is not None else rows


def _answer_row(row_id: str, item: dict[str, Any], where: str) -> AnswerRow:
    verdict = str(item["verdict"]).strip().lower()
    if verdict not in VERDICTS:
        raise SuiteError(f"{where}: verdict must be correct or incorrect, not {item['verdict']!r}")
    kind = str(item.get("kind") or "").strip().lower()
    if kind and kind not in ROW_KINDS:
        raise SuiteError(f"{where}: kind must be one of {', '.join(ROW_KINDS)}, not {item['kind']!r}")
    return AnswerRow(id=row_id, question=str(item.get("question") or ""), gold=str(item["gold"]),
                     response=str(item["response"]), verdict=verdict, category=str(item.get("category") or ""),
                     source=str(item.get("source") or ""), kind=kind, split=str(item.get("split") or ""))


# ---- statistics ---------------------------------------------------------------------------------


class RateInterval(BaseModel):
    """A proportion ``count / n`` and its two-sided Wilson score interval (``None`` when n is 0)."""

    count: int
    n: int
    rate: float | None
    low: float | None
    high: float | None
    method: Literal["wilson"] = "wilson"
    confidence: float = 0.95


def wilson(count: int, n: int, confidence: float = 0.95) -> RateInterval:
    """The Wilson score interval: honest at 0 and n (where the normal interval collapses), clipped to [0, 1]."""
    if n <= 0:
        return RateInterval(count=count, n=n, rate=None, low=None, high=None, confidence=confidence)
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = count / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    low = 0.0 if count == 0 else max(0.0, centre - half)  # exact at the ends, not 1e-17 off
    high = 1.0 if count == n else min(1.0, centre + half)
    return RateInterval(count=count, n=n, rate=p, low=low, high=high, confidence=confidence)


def scripted_responder(rows: Sequence[AnswerRow], *, swapped_says_correct: bool = True) -> Callable[[dict[str, Any]], Any]:
    """A fake judge for :class:`gradekit.judge.testing.FakeProvider` that knows the human verdicts of ``rows``.

    Asked with the gold answer in the reference slot it gives the human verdict; asked the swapped
    way it says "correct" whatever the verdict (``swapped_says_correct``): a judge biased towards the
    answer it is shown as the reference, as real judges are. ``require: both`` cancels that bias,
    ``either`` keeps it, so the two rules give known, different figures. It reads the
    ``answer_verification_3way`` prompt; a row it does not know is "incorrect".
    """
    import re

    from gradekit.judge.testing import asked_reply

    # A row is known by its question too: two rows may trade gold and response (listen / silent).
    verdicts = {(r.question.strip(), r.gold.strip(), r.response.strip()): r.verdict for r in rows}
    for r in rows:  # a prompt that is not the row's question (a caller's own wording): known by the two answers
        verdicts.setdefault(("*", r.gold.strip(), r.response.strip()), r.verdict)

    def respond(body: dict[str, Any]) -> Any:
        user = str(body["messages"][-1]["content"])
        asked = re.search(r"<question>\n(.*?)\n</question>", user, re.S)
        gold = re.search(r"<gold_answer>\n- (.*?)\n</gold_answer>", user, re.S)
        shown = re.search(r"<response>\n(.*?)\n</response>", user, re.S)
        question = asked.group(1).strip() if asked else ""
        first, second = (gold.group(1).strip() if gold else ""), (shown.group(1).strip() if shown else "")
        if (question, first, second) not in verdicts and (question, second, first) not in verdicts:
            question = "*"
        if (question, first, second) in verdicts:
            label = verdicts[(question, first, second)]
        elif (question, second, first) in verdicts:
            label = "correct" if swapped_says_correct else verdicts[(question, second, first)]
        else:
            label = "incorrect"
        return asked_reply(body, {"rationale": "scripted", "judgement": label}, f"<judgement>{label}</judgement>")

    return respond


# ---- the report ---------------------------------------------------------------------------------


class KindFigures(BaseModel):
    """One mode's figures on the rows of one kind of answer: what it accepts of the right answers and of the wrong ones."""

    kind: str
    n: int
    recall: RateInterval  # said correct / every human-correct row of the kind (an undecided row is not accepted)
    false_positives: RateInterval  # said correct / every human-incorrect row of the kind
    undecided: int


class AnswerModeRow(BaseModel):
    """One mode's figures on the suite. Rates are fractions (0-1); counts are rows."""

    suite: str
    mode: Literal["symbolic", "judge", "hybrid"]
    judge: str | None  # the judge's model (judge and hybrid), None for symbolic
    n: int
    decided: int
    accuracy: float | None  # over the decided rows
    false_positives: RateInterval  # said correct / human incorrect, over decided human-incorrect rows
    false_negatives: RateInterval  # said incorrect / human correct, over decided human-correct rows
    undecided: int
    undecided_by_kind: dict[str, int] = Field(default_factory=dict)
    decided_by: dict[str, int] = Field(default_factory=dict)  # hybrid: rows per path (symbolic, judge)
    judge_rows: int = 0  # rows sent to the judge (two requests each)
    judge_calls_saved: int = 0  # hybrid: requests the symbolic path made needless (two per accepted row)
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    false_positive_ids: list[str] = Field(default_factory=list)
    false_negative_ids: list[str] = Field(default_factory=list)
    by_kind: dict[str, KindFigures] = Field(default_factory=dict)  # per kind of answer: recall and false positives


class AnswerMetaEvalReport(BaseModel):
    suite: str
    rubric: str | None
    require: str
    judges: list[str]
    n: int
    human: dict[str, int]  # rows per human verdict
    results: list[AnswerModeRow]
    wall_s: float = 0.0


def mode_row(suite: str, mode: Literal["symbolic", "judge", "hybrid"], judge: str | None, rows: Sequence[AnswerRow],
             decisions: Sequence[str | None], kinds: Sequence[str | None], *, judge_rows: int = 0, judged: Sequence[AnswerJudgement] = (),
             decided_by: dict[str, int] | None = None, saved: int = 0) -> AnswerModeRow:
    """A mode's row from its decision per row ("correct", "incorrect" or None) and why a row had none."""
    fp = [r.id for r, d in zip(rows, decisions) if d == "correct" and r.verdict == "incorrect"]
    fn = [r.id for r, d in zip(rows, decisions) if d == "incorrect" and r.verdict == "correct"]
    negatives = sum(d is not None and r.verdict == "incorrect" for r, d in zip(rows, decisions))
    positives = sum(d is not None and r.verdict == "correct" for r, d in zip(rows, decisions))
    decided = negatives + positives
    usage = sum((v.usage for j in judged for v in j.verdicts), Usage())
    return AnswerModeRow(by_kind=kind_figures(rows, decisions),
        suite=suite, mode=mode, judge=judge, n=len(rows), decided=decided,
        accuracy=(decided - len(fp) - len(fn)) / decided if decided else None,
        false_positives=wilson(len(fp), negatives), false_negatives=wilson(len(fn), positives),
        undecided=len(rows) - decided,
        undecided_by_kind=dict(Counter(k or "unknown" for d, k in zip(decisions, kinds) if d is None).most_common()),
        decided_by=dict(decided_by or {}), judge_rows=judge_rows, judge_calls_saved=saved,
        requests=usage.requests, prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens, false_positive_ids=fp, false_negative_ids=fn,
    )


def kind_figures(rows: Sequence[AnswerRow], decisions: Sequence[str | None]) -> dict[str, KindFigures]:
    """Recall and false positives per kind of answer, over every row of the kind (rows of no kind: ``unknown``)."""
    out: dict[str, KindFigures] = {}
    for kind in dict.fromkeys(r.kind or "unknown" for r in rows):
        mine = [(r, d) for r, d in zip(rows, decisions) if (r.kind or "unknown") == kind]
        right = [d for r, d in mine if r.verdict == "correct"]
        wrong = [d for r, d in mine if r.verdict == "incorrect"]
        out[kind] = KindFigures(kind=kind, n=len(mine), recall=wilson(right.count("correct"), len(right)),
                                false_positives=wilson(wrong.count("correct"), len(wrong)), undecided=sum(d is None for _, d in mine))
    return out


async def answer_meta_eval(suite: str, rows: Sequence[AnswerRow], *, symbolic: SymbolicCheck | None, rubric: Rubric | None,
                           judges: Sequence[Any] = (), require: Require = "both", concurrency: int = 16,
                           on_row: Callable[[], None] | None = None) -> AnswerMetaEvalReport:
    """Score the symbolic check, each judge and each hybrid on ``rows`` (see the module docstring).

    Args:
        symbolic: the check (None: no symbolic or hybrid rows).
        rubric: an answer-equivalence rubric for the judges (None: no judge rows).
        judges: Judges, Juries or Cascades; each gets a judge row and, with ``symbolic``, a hybrid row.
        concurrency: rows in flight at once per judge (two requests each); the judges' limiter still caps requests.
    """
    if judges and rubric is None:
        raise ValueError("judges need a rubric")
    if rubric is not None:
        check_answer_rubric(rubric)
    started = time.perf_counter()
    gate = asyncio.Semaphore(max(1, concurrency))

    async def check(row: AnswerRow) -> tuple[str, str | None]:
        assert symbolic is not None
        async with gate:
            return await symbolic(row.gold, row.response, row.question)

    async def ask(judge: Any, row: AnswerRow) -> AnswerJudgement:
        assert rubric is not None
        async with gate:
            judged = await judge_answer(judge, rubric, gold=row.gold, response=row.response, question=row.question, require=require)
        if on_row is not None:
            on_row()
        return judged

    results: list[AnswerModeRow] = []
    checks: list[tuple[str, str | None]] = []
    if symbolic is not None:
        checks = list(await asyncio.gather(*(check(r) for r in rows)))
        decisions = [SYMBOLIC_DECISION.get(outcome) for outcome, _ in checks]
        kinds = [(kind or outcome) if SYMBOLIC_DECISION.get(outcome) is None else None for outcome, kind in checks]
        results.append(mode_row(suite, "symbolic", None, rows, decisions, kinds))
    names = [str(getattr(j, "model", "judge")) for j in judges]
    for judge, name in zip(judges, names):
        # Under a run breaker: a judge that is down or never answers in the rubric's format stops the run (BreakerTripped).
        who = judge.identity()
        judged = await judge_all([functools.partial(ask, judge, r) for r in rows], Breaker(endpoint=(who.base_url, who.model)),
                                 verdict=lambda j: next((v for v in j.verdicts if v.status != "ok"), j.verdicts[0]),
                                 concurrency=concurrency)
        decisions = [j.decision if j.decision in VERDICTS else None for j in judged]
        kinds = [None if d is not None else j.error_kind for d, j in zip(decisions, judged)]
        results.append(mode_row(suite, "judge", name, rows, decisions, kinds, judge_rows=len(rows), judged=judged))
        if symbolic is not None:
            # As the hybrid grader: the rules decide an equal answer (correct) and an empty response (incorrect).
            empty = [not r.response.strip() for r in rows]
            accepted = [outcome == "equal" or blank for (outcome, _), blank in zip(checks, empty)]
            hybrid = [("incorrect" if blank else "correct") if ok else d for ok, blank, d in zip(accepted, empty, decisions)]
            hybrid_kinds = [None if ok else k for ok, k in zip(accepted, kinds)]
            sent = [j for ok, j in zip(accepted, judged) if not ok]
            results.append(mode_row(suite, "hybrid", name, rows, hybrid, hybrid_kinds, judge_rows=len(sent), judged=sent,
                                    decided_by={"symbolic": sum(accepted), "judge": len(sent)}, saved=2 * sum(accepted)))
    human = dict(Counter(r.verdict for r in rows))
    return AnswerMetaEvalReport(suite=suite, rubric=rubric.name if rubric is not None else None, require=require, judges=names,
                                n=len(rows), human={v: human.get(v, 0) for v in VERDICTS}, results=results,
                                wall_s=time.perf_counter() - started)
