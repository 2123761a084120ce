"""``gradekit align``: make a judge agree better with human labels, and prove it on labels it never saw.

The labelled rows are split once, stratified by label and seeded: **train** (what the optimiser
and the few-shot examples are drawn from), **dev** (where candidates are compared and one is
chosen) and **test** (judged twice at the end, with the original rubric and the chosen one, and
never before). Each round:

1. the judge's disagreements with the labels on train, under the best rubric so far, go to an
   optimiser model (it may differ from the judge), which writes guidelines and label definitions;
2. candidates are built from them and from few-shot examples drawn from train: guidelines,
   guidelines + examples, examples. A candidate changes only the instructions, the examples and
   the label definitions: the output schema, the labels and the score map are the original's;
3. every candidate is judged on dev; the best one becomes the next round's base if it agrees with
   the labels more than the base did, else the rounds stop.

The chosen rubric is then certified on test: each rubric's agreement (accuracy, Cohen's kappa)
with a bootstrap interval, and the difference of their accuracies on the same rows with a paired
bootstrap interval. It is written only when that interval's lower end is above ``margin`` (ship
only if better); otherwise nothing is written and the report says why. A verdict that failed
(an error, a refusal) counts as not agreeing with the label: a failure is never agreement.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from gradekit.judge import Rubric
from gradekit.judge._aligned import Agreement, Alignment, Certificate, Example, section_template, seal, spliced
from gradekit.judge._breaker import Breaker
from gradekit.judge._rubric import render_prompt, rubric_fingerprint, template_source
from gradekit.judge._specs import spec_path

from ._agreement import _bootstrap, as_label, calibrate, kappa_interval
from ._judging import Labelled, judge_all, stopped

MAX_CASES = 24  # disagreements shown to the optimiser per round: enough to see the kinds, short enough to read
MAX_GUIDELINES = 20  # guidelines an aligned rubric holds at most, over all rounds
FEW_TEST_ROWS = 30  # below this, the certificate's intervals are rough: the report says so


class AlignError(ValueError):
    """What keeps an alignment from starting (too few rows of a label, a rubric it cannot align); names the fix."""


class Stopped(RuntimeError):
    """The budget ran out before the test rows were judged: nothing certified, nothing written (the same command resumes)."""


class CandidateScore(BaseModel):
    """One candidate of a round, as scored on dev."""

    name: str  # guidelines, guidelines+examples, examples
    guidelines: int  # guidelines it holds (all rounds')
    examples: int
    label_definitions: bool
    dev_accuracy: float
    dev_kappa: float | None = None
    dev_failures: int = 0


class AlignRound(BaseModel):
    """One round of the report: what the optimiser saw and wrote, the candidates on dev, and what it cost."""

    round: int
    train_disagreements: int  # under the round's base rubric
    shown_to_optimiser: int
    new_guidelines: list[str] = Field(default_factory=list)
    optimiser_error: str | None = None
    candidates: list[CandidateScore] = Field(default_factory=list)
    chosen: str | None = None  # the candidate that beat the base on dev, or None (the rounds stop)
    dev_accuracy: float | None = None  # the base's after this round
    requests: int = 0
    cost_usd: float | None = None
    note: str | None = None


class AlignReport(BaseModel):
    """What ``gradekit align`` did and found (``--json``)."""

    rubric: str
    labels_file: dict[str, Any]
    label_policy: dict[str, Any]
    judge: dict[str, Any]
    optimiser: dict[str, Any]
    seed: int
    splits: dict[str, Any]
    original_dev_accuracy: float | None = None
    rounds: list[AlignRound] = Field(default_factory=list)
    chosen: dict[str, Any] | None = None  # the chosen rubric's changes (guidelines, label definitions, example row ids)
    certificate: Certificate | None = None
    written: bool = False
    reason: str = ""
    warnings: list[str] = Field(default_factory=list)
    requests: int = 0
    cost_usd: float | None = None


@dataclass(frozen=True)
class Candidate:
    """What a candidate changes: guidelines, label definitions and few-shot examples (row indices into the labelled rows)."""

    guidelines: tuple[str, ...] = ()
    definitions: tuple[tuple[str, str], ...] = ()
    examples: tuple[int, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.guidelines or self.definitions or self.examples)


@dataclass
class _Scored:
    candidate: Candidate
    rubric: Rubric
    verdicts: dict[int, Any] = field(default_factory=dict)  # row index -> Verdict


def stratified_split(labels: Sequence[str], fractions: tuple[float, float, float], seed: int) -> tuple[list[int], list[int], list[int]]:
    """(train, dev, test) row indices, each label split in the given fractions; seeded, so a re-run splits the same way.

    A label with at least three rows has at least one in each split.
    """
    by_label: dict[str, list[int]] = {}
    for i, label in enumerate(labels):
        by_label.setdefault(label, []).append(i)
    rng = random.Random(seed)
    train: list[int] = []
    dev: list[int] = []
    test: list[int] = []
    for label in sorted(by_label):
        group = by_label[label][:]
        rng.shuffle(group)
        n = len(group)
        n_test = max(1 if n >= 3 else 0, round(n * fractions[2]))
        n_dev = max(1 if n >= 3 else 0, round(n * fractions[1]))
        n_dev = min(n_dev, max(0, n - n_test - (1 if n >= 3 else 0)))
        test += group[:n_test]
        dev += group[n_test:n_test + n_dev]
        train += group[n_test + n_dev:]
    return sorted(train), sorted(dev), sorted(test)


def agreed(verdict: Any, human: str) -> bool:
    """A verdict agrees with a human label when it gave that label; a failed verdict never does."""
    label = as_label(verdict.label) if verdict.status == "ok" else None
    return label is not None and label.casefold() == human.casefold()


def parse_proposal(text: str | None, labels: Sequence[str], most: int) -> tuple[list[str], dict[str, str], str | None]:
    """(guidelines, label definitions, None) from the optimiser's reply, or ([], {}, why) when it holds none.

    Only strings are taken: at most ``most`` guidelines of at most 500 characters each, and definitions of offered labels.
    """
    if not text:
        return [], {}, "the optimiser gave no reply"
    body = text.strip()
    fenced = re.search(r"```(?:json)?\s*(\{.*\})\s*```", body, re.S)
    start, end = body.find("{"), body.rfind("}")
    try:
        data = json.loads(fenced.group(1) if fenced else body[start:end + 1] if 0 <= start < end else body)
    except ValueError:
        return [], {}, f"the optimiser's reply is not JSON: {body[:200]!r}"
    if not isinstance(data, dict):
        return [], {}, "the optimiser's reply is not a JSON object"
    given = data.get("guidelines")
    given = given if isinstance(given, list) else [given] if isinstance(given, str) else []
    guidelines = [g.strip() for g in given if isinstance(g, str) and g.strip() and len(g) <= 500][:most]
    offered = {lab.casefold(): lab for lab in labels}
    raw = data.get("label_definitions") if isinstance(data.get("label_definitions"), dict) else {}
    definitions = {offered[str(k).casefold()]: v.strip() for k, v in raw.items()
                   if str(k).casefold() in offered and isinstance(v, str) and v.strip() and len(v) <= 500}
    if not guidelines and not definitions:
        return [], {}, "the optimiser's reply holds no guideline and no label definition"
    return guidelines, definitions, None


def pick_examples(rows: Sequence[int], wrong: set[int], human: Sequence[str], labels: Sequence[str], per_label: int,
                  rng: random.Random) -> tuple[int, ...]:
    """Up to ``per_label`` train rows per label, those the base got wrong first: what the examples should teach."""
    chosen: list[int] = []
    for label in labels:
        mine = [i for i in rows if human[i].casefold() == label.casefold()]
        first = [i for i in mine if i in wrong]
        rest = [i for i in mine if i not in wrong]
        rng.shuffle(first)
        rng.shuffle(rest)
        chosen += (first + rest)[:per_label]
    return tuple(sorted(chosen))


class Aligner:
    """One alignment: the split, the rounds, the certificate (see the module docstring).

    ``judge`` and ``optimiser`` are Judges (the optimiser is asked through :meth:`Judge.generate`);
    ``rows`` are the rubric's variables per labelled row, ``human`` its label, ``ids`` how the
    report names it. ``on_round`` is told each round as it ends; ``on_judged(phase, done, total)``
    each judgement, for progress.
    """

    def __init__(self, judge: Any, optimiser: Any, rubric: Rubric, rows: Sequence[Mapping[str, Any]], human: Sequence[str],
                 ids: Sequence[str], *, report: AlignReport, fractions: tuple[float, float, float], seed: int, rounds: int,
                 examples: int, guidelines: int, margin: float, confidence: float, resamples: int, concurrency: int,
                 budget: Any = None, on_round: Callable[[AlignRound], None] | None = None,
                 on_judged: Callable[[str, int, int], None] | None = None) -> None:
        self.judge, self.optimiser, self.rubric = judge, optimiser, rubric
        self.rows, self.human, self.ids = rows, [str(as_label(h)) for h in human], list(ids)
        self.report, self.fractions, self.seed, self.rounds = report, fractions, seed, rounds
        self.per_label, self.max_new, self.margin = examples, guidelines, margin
        self.confidence, self.resamples, self.concurrency = confidence, resamples, concurrency
        self.budget, self.on_round, self.on_judged = budget, on_round, on_judged
        self.labels = list(rubric.labels)
        self.breaker = Breaker(endpoint=(judge.identity().base_url, judge.model))
        self.section = section_template(rubric.language)
        source = template_source(rubric)
        # An aligned rubric aligned again shows its section already: it is not spliced in twice.
        self.template = source if self.section.strip() in source else spliced(source, self.section)
        self.judgements = 0  # made so far (cache hits included): the unit the budget's reserve is counted in
        self.short_of_budget = False  # a round was not run (or not compared) for want of budget

    # ---- judging ---------------------------------------------------------------------------

    def variant(self, candidate: Candidate) -> Rubric:
        """The rubric a candidate is judged with: the original's spec and what it already shows (an aligned rubric's
        guidelines, definitions and examples), with the candidate's added, and its template with the section spliced in."""
        if not candidate.changed:
            return self.rubric
        rubric = self.rubric
        return rubric.model_copy(update={
            "guidelines": list(dict.fromkeys([*rubric.guidelines, *candidate.guidelines])),
            "label_definitions": {**rubric.label_definitions, **dict(candidate.definitions)},
            "examples": [*rubric.examples, *(Example(row=dict(self.rows[i]), label=self.human_label(i)) for i in candidate.examples)],
            "inline_template": self.template})

    def human_label(self, i: int) -> str:
        """The human label of row ``i`` as the rubric spells it."""
        return next((lab for lab in self.labels if lab.casefold() == self.human[i].casefold()), self.human[i])

    async def judged(self, phase: str, jobs: Sequence[tuple[_Scored, int]]) -> None:
        """Judge every (candidate, row) not judged yet, at once, under the alignment's breaker."""
        todo = [(s, i) for s, i in jobs if i not in s.verdicts]
        done = [0]

        def tick() -> None:
            done[0] += 1
            self.judgements += 1
            if self.on_judged is not None:
                self.on_judged(phase, done[0], len(todo))

        def call(s: _Scored, i: int) -> Any:
            return lambda: self.judge.judge(s.rubric, self.rows[i])

        found = await judge_all([call(s, i) for s, i in todo], self.breaker, verdict=lambda v: v,
                                concurrency=self.concurrency, on_done=tick)
        for (s, i), verdict in zip(todo, found):
            s.verdicts[i] = verdict

    def skipped(self, scored: _Scored, rows: Sequence[int]) -> bool:
        return any(scored.verdicts[i].status == "skipped" for i in rows)

    def accuracy(self, scored: _Scored, rows: Sequence[int]) -> float:
        return sum(agreed(scored.verdicts[i], self.human[i]) for i in rows) / len(rows) if rows else 0.0

    def agreement(self, scored: _Scored, rows: Sequence[int]) -> tuple[Agreement, list[float]]:
        """Accuracy over every row (a failure does not agree) with its interval; kappa over the rows judged, with its."""
        correct = [float(agreed(scored.verdicts[i], self.human[i])) for i in rows]
        import numpy as np

        interval = _bootstrap((np.array(correct),), np.mean, vectorized=True, resamples=self.resamples,
                              confidence=self.confidence, seed=self.seed)
        judge_labels = [scored.verdicts[i].label if scored.verdicts[i].status == "ok" else None for i in rows]
        report = calibrate([self.human_label(i) for i in rows], judge_labels, labels=self.labels, bootstrap=0)
        codes = {label: k for k, label in enumerate(self.labels)}
        both = [(codes[self.human_label(i)], codes[j]) for i, j in zip(rows, judge_labels) if j in codes]
        kappa = kappa_interval([h for h, _ in both], [j for _, j in both], len(self.labels), resamples=self.resamples,
                               confidence=self.confidence, seed=self.seed) if report.kappa is not None else None
        kappa_ci = (kappa.low, kappa.high) if kappa is not None else None
        return Agreement(accuracy=sum(correct) / len(correct), kappa=report.kappa, kappa_ci=kappa_ci, failures=report.failures,
                         accuracy_ci=(interval.low, interval.high) if interval is not None and interval.low is not None else None), correct

    # ---- the budget's reserve --------------------------------------------------------------

    def room_for(self, judgements: int) -> bool:
        """Whether the budget can pay for ``judgements`` more (estimated from what each has cost so far)."""
        budget = self.budget
        if budget is None or self.judgements == 0:
            return True
        if budget.max_cost_usd is not None and budget.spent_usd is not None:
            each = budget.spent_usd / self.judgements
            if budget.spent_usd + each * judgements > budget.max_cost_usd:
                return False
        if budget.max_tokens is not None:
            each_tokens = budget.spent_tokens / self.judgements
            if budget.spent_tokens + each_tokens * judgements > budget.max_tokens:
                return False
        return True

    def spent(self) -> tuple[int, float | None]:
        """Requests sent so far (the judge's and the optimiser's) and their cost, for the round's report."""
        judges = [self.judge] if self.optimiser is self.judge else [self.judge, self.optimiser]
        requests = sum(e.requests for j in judges for e in j.stats().endpoints)
        return requests, self.budget.spent_usd if self.budget is not None else None

    # ---- the alignment ---------------------------------------------------------------------

    async def run(self) -> tuple[Rubric | None, str | None]:
        """The aligned rubric and its template's source when certified better, else (None, None); the report is filled in."""
        train, dev, test = stratified_split(self.human, self.fractions, self.seed)
        self.report.splits.update({"train": [self.ids[i] for i in train], "dev": [self.ids[i] for i in dev],
                                   "test": [self.ids[i] for i in test]})
        if len(test) < FEW_TEST_ROWS:
            self.report.warnings.append(f"only {len(test)} test rows: the certificate's intervals are rough (a few hundred "
                                        "labelled rows give a useful one)")
        base = _Scored(Candidate(), self.rubric)
        await self.judged("original on train and dev", [(base, i) for i in train + dev])
        if self.skipped(base, train + dev):
            raise Stopped("the budget ran out while the original rubric was judged on train and dev")
        base_dev = self.accuracy(base, dev)
        self.report.original_dev_accuracy = base_dev
        for number in range(1, self.rounds + 1):
            step = await self.round(number, base, base_dev, train, dev, test)
            if step is None:
                break
            base, base_dev = step
        if not base.candidate.changed and self.short_of_budget:
            raise Stopped("the budget (`max_cost_usd` / `max_tokens`) leaves no room for a round and the certificate after it")
        if not base.candidate.changed:
            self.report.reason = ("no candidate agreed with the labels more than the original rubric on dev: nothing to certify, "
                                  "nothing written")
            return None, None
        self.report.chosen = {"guidelines": list(base.candidate.guidelines), "label_definitions": dict(base.candidate.definitions),
                              "examples": [self.ids[i] for i in base.candidate.examples], "dev_accuracy": base_dev}
        return await self.certify(base, test)

    async def round(self, number: int, base: _Scored, base_dev: float, train: list[int], dev: list[int],
                    test: list[int]) -> tuple[_Scored, float] | None:
        """One round; the new base and its dev accuracy, or None when the rounds stop."""
        before = self.spent()
        wrong = {i for i in train if not agreed(base.verdicts[i], self.human[i])}
        record = AlignRound(round=number, train_disagreements=len(wrong), shown_to_optimiser=0)
        try:
            if not wrong:
                record.note = "the base rubric agrees with every train label: nothing left to learn from"
                return None
            # Room for this round (candidates on dev, the winner on train) and for the certificate (two rubrics on test).
            if not self.room_for(3 * len(dev) + len(train) + 2 * len(test)):
                record.note = "stopped before this round: the budget keeps what the certificate on test needs"
                self.short_of_budget = True
                return None
            rng = random.Random(f"{self.seed}:{number}")
            cases = self.cases(sorted(wrong), rng)
            record.shown_to_optimiser = len(cases)
            new, definitions, problem = await self.propose(base, cases)
            record.new_guidelines, record.optimiser_error = new, problem
            merged = tuple(dict.fromkeys([*base.candidate.guidelines, *new]))[:MAX_GUIDELINES]
            defs = tuple(sorted(definitions.items())) if definitions else base.candidate.definitions
            examples = pick_examples(train, wrong, self.human, self.labels, self.per_label, rng) if self.per_label else ()
            named = {"guidelines": Candidate(merged, defs, base.candidate.examples),
                     "guidelines+examples": Candidate(merged, defs, examples),
                     "examples": Candidate(base.candidate.guidelines, base.candidate.definitions, examples)}
            unique: dict[Candidate, str] = {}
            for name, candidate in named.items():
                if candidate != base.candidate and candidate.changed and candidate not in unique:
                    unique[candidate] = name
            if not unique:
                record.note = "the optimiser proposed nothing new and no examples could be drawn"
                return None
            scored = [(_Scored(c, self.variant(c)), name) for c, name in unique.items()]
            await self.judged(f"round {number}: {len(scored)} candidates on dev", [(s, i) for s, _ in scored for i in dev])
            if any(self.skipped(s, dev) for s, _ in scored):
                record.note = "the budget ran out while the candidates were judged on dev: this round is not compared"
                self.short_of_budget = True
                return None
            for s, name in scored:
                kappa = calibrate([self.human_label(i) for i in dev],
                                  [s.verdicts[i].label if s.verdicts[i].status == "ok" else None for i in dev],
                                  labels=self.labels, bootstrap=0).kappa
                record.candidates.append(CandidateScore(
                    name=name, guidelines=len(s.candidate.guidelines), examples=len(s.candidate.examples),
                    label_definitions=bool(s.candidate.definitions), dev_accuracy=self.accuracy(s, dev), dev_kappa=kappa,
                    dev_failures=sum(s.verdicts[i].status != "ok" for i in dev)))
            # The best on dev; on a tie, the one that changes less (fewer examples, then fewer guidelines).
            best_index = max(range(len(scored)), key=lambda k: (record.candidates[k].dev_accuracy, -record.candidates[k].examples,
                                                                -record.candidates[k].guidelines))
            best, name = scored[best_index]
            best_dev = record.candidates[best_index].dev_accuracy
            if best_dev <= base_dev:
                record.note = f"no candidate beat the base on dev ({base_dev:.1%}): the rounds stop"
                record.dev_accuracy = base_dev
                return None
            record.chosen, record.dev_accuracy = name, best_dev
            if number < self.rounds:  # the next round learns from the new base's disagreements on train
                await self.judged(f"round {number}: the chosen rubric on train", [(best, i) for i in train])
                if self.skipped(best, train):
                    record.note = "the budget ran out while the chosen rubric was judged on train: no further round"
                    return None
            return best, best_dev
        finally:
            requests, cost = self.spent()
            record.requests = requests - before[0]
            record.cost_usd = None if cost is None or before[1] is None else cost - before[1]
            self.report.rounds.append(record)
            if self.on_round is not None:
                self.on_round(record)

    def cases(self, wrong: list[int], rng: random.Random) -> list[int]:
        """Up to MAX_CASES disagreements, spread over the human labels (each label's in turn), seeded."""
        by_label: dict[str, list[int]] = {}
        for i in wrong:
            by_label.setdefault(self.human[i], []).append(i)
        for group in by_label.values():
            rng.shuffle(group)
        picked: list[int] = []
        while len(picked) < MAX_CASES and any(by_label.values()):
            for label in sorted(by_label):
                if by_label[label] and len(picked) < MAX_CASES:
                    picked.append(by_label[label].pop())
        return sorted(picked)

    async def propose(self, base: _Scored, cases: list[int]) -> tuple[list[str], dict[str, str], str | None]:
        """The optimiser's guidelines and label definitions from the base's disagreements on ``cases`` (train rows only)."""
        system = next((m["content"] for m in self.rubric.render(self.rows[cases[0]]) if m["role"] == "system"), "")
        context = {
            "instructions": system if isinstance(system, str) else "",
            "labels": self.labels,
            "guidelines": list(base.candidate.guidelines),
            "max_guidelines": self.max_new,
            "cases": [{"row": {k: v for k, v in self.rows[i].items()}, "human": self.human_label(i),
                       "judge": base.verdicts[i].label if base.verdicts[i].status == "ok" else f"(no verdict: {base.verdicts[i].error_kind})",
                       "rationale": base.verdicts[i].rationale} for i in cases],
        }
        reply = await self.optimiser.generate(render_prompt("align_optimiser.j2", context), json_object=True)
        if reply.status != "ok":
            if reply.error_kind not in ("budget",):
                self.breaker.row("error", reply.error_kind, reply.error)
            if self.breaker.tripped is not None:
                raise stopped(self.breaker.tripped)
            return [], {}, f"the optimiser failed: {reply.error_kind}: {reply.error}"
        return parse_proposal(reply.text, self.labels, self.max_new)

    async def certify(self, chosen: _Scored, test: list[int]) -> tuple[Rubric | None, str | None]:
        """Both rubrics on the test rows (their first sight of them), the certificate, and the rubric if it is better."""
        original = _Scored(Candidate(), self.rubric)
        if not self.room_for(2 * len(test)):
            self.report.warnings.append("the budget may not cover the test rows; they are judged anyway until it runs out")
        await self.judged("certificate: both rubrics on test", [(s, i) for s in (original, chosen) for i in test])
        if self.skipped(original, test) or self.skipped(chosen, test):
            raise Stopped("the budget ran out while the test rows were judged: nothing certified")
        aligned_agreement, a = self.agreement(chosen, test)
        original_agreement, o = self.agreement(original, test)
        import numpy as np

        difference = np.array(a) - np.array(o)
        interval = _bootstrap((difference,), np.mean, vectorized=True, resamples=self.resamples, confidence=self.confidence,
                              seed=self.seed)
        mean = float(difference.mean())
        low, high = (interval.low, interval.high) if interval is not None and interval.low is not None else (mean, mean)
        certificate = Certificate(n=len(test), aligned=aligned_agreement, original=original_agreement, difference=mean,
                                  difference_ci=(float(low), float(high)), confidence=self.confidence, resamples=self.resamples,
                                  margin=self.margin)
        self.report.certificate = certificate
        shown = f"{mean:+.1%} [{low:+.1%}, {high:+.1%}]"
        if not low > self.margin:
            self.report.reason = (f"not written: on {len(test)} held-out test rows the aligned rubric's accuracy differs from the "
                                  f"original's by {shown} ({self.confidence:.0%} paired interval), whose lower end is not above "
                                  f"the margin {self.margin:+.1%}")
            return None, None
        self.report.reason = (f"written: on {len(test)} held-out test rows accuracy {aligned_agreement.accuracy:.1%} vs "
                              f"{original_agreement.accuracy:.1%}, difference {shown}, above the margin {self.margin:+.1%}")
        return chosen.rubric, self.template


def aligned_rubric(variant: Rubric, template_name: str, directory: Any, alignment: Alignment, template: str) -> Rubric:
    """The rubric to write: the chosen variant under its own name and template file, with its alignment block sealed."""
    rubric = variant.model_copy(update={"name": f"{variant.name}_aligned", "template": template_name, "inline_template": None,
                                        "directory": directory, "alignment": alignment,
                                        "description": (variant.description + " " if variant.description else "")
                                        + "Aligned by gradekit align to human labels; see its alignment block."})
    alignment.digest = seal(rubric, template)
    return rubric


def spec_of(rubric: Rubric) -> dict[str, Any]:
    """The YAML mapping of a rubric (what load_rubric reads back into the same model)."""
    data = rubric.model_dump(mode="json", by_alias=True, exclude={"directory", "inline_template"})
    defaults = {"criteria": None, "pairwise": None, "invalid_labels": [], "sampling": {}}
    return {k: v for k, v in data.items() if not (k in defaults and v == defaults[k])}


def check_alignable(rubric: Rubric) -> None:
    """What align can work on: a label rubric (a verdict is one of its labels), not a pair, a checklist or a number."""
    if rubric.pairwise is not None:
        raise AlignError(f"rubric {rubric.name!r} is pairwise: align works on single-answer label rubrics")
    if rubric.is_checklist:
        raise AlignError(f"rubric {rubric.name!r} is a checklist (a verdict per criterion): align works on one label per row")
    if rubric.output.mode == "number" or not rubric.labels:
        raise AlignError(f"rubric {rubric.name!r} scores with a number: align compares labels")
    if re.search(r"\{%-?\s*(include|extends|import|from)\b", template_source(rubric)):
        raise AlignError(f"rubric {rubric.name!r}: its template includes or extends other templates; align writes a "
                         "self-contained template beside the aligned rubric, so inline them first")


def label_counts_problem(human: Sequence[str], fractions: tuple[float, float, float]) -> str | None:
    """Why the labels cannot be split usefully (too few rows in all, or of one label), or None."""
    counts = Counter(human)
    small = sorted(label for label, n in counts.items() if n < 3)
    if small:
        return (f"labels {', '.join(map(repr, small))} have fewer than 3 rows: each label needs a row in train, dev and test; "
                "label more rows")
    if sum(max(1, round(n * fractions[2])) for n in counts.values()) < 2:
        return "too few rows for a test split"
    return None


async def align(judge: Any, optimiser: Any, rubric: Rubric, labelled: Labelled, output: Path, *, rubric_name: str,
                label_policy: tuple[str | None, str | None] = (None, None), fractions: tuple[float, float, float] = (0.4, 0.2, 0.4),
                seed: int = 0, rounds: int = 3, examples: int = 2, guidelines: int = 6, margin: float = 0.0,
                confidence: float = 0.95, resamples: int = 2000, concurrency: int = 64, budget: Any = None,
                on_round: Callable[[AlignRound], None] | None = None,
                on_judged: Callable[[str, int, int], None] | None = None) -> AlignReport:
    """Align ``rubric`` to ``labelled`` with ``judge`` (guidelines written by ``optimiser``) and write ``output`` (YAML) and its
    template beside it when the test rows certify it better; the report says what happened either way.

    Raises AlignError before any request when the rubric or the labels cannot be aligned, BreakerTripped when the judge is
    broken and :class:`Stopped` when the budget runs out before the test rows are judged (nothing written in either case).
    """
    check_alignable(rubric)
    human = [str(as_label(h)) if as_label(h) is not None else "" for h in labelled.human]
    keep = [i for i, h in enumerate(human) if h]
    if len(keep) < len(human):  # a row without a label teaches and certifies nothing
        labelled = Labelled([labelled.rows[i] for i in keep], [labelled.human[i] for i in keep], [labelled.ids[i] for i in keep],
                            labelled.name, labelled.sha256)
        human = [human[i] for i in keep]
    problem = label_counts_problem([h.casefold() for h in human], fractions)
    if problem is not None:
        raise AlignError(f"{labelled.name}: {problem}")
    template_path = output.with_suffix(".j2")
    originals = {Path(rubric.directory, rubric.template).resolve(), spec_path(rubric_name).resolve()}
    if output.suffix.lower() not in (".yaml", ".yml"):
        raise AlignError(f"{output}: an aligned rubric is a YAML spec (and its template beside it): name it .yaml")
    if output.resolve() in originals or template_path.resolve() in originals:
        raise AlignError(f"{output}: that would overwrite the original rubric's own files; write the aligned rubric under another name")
    who = judge.identity()
    report = AlignReport(
        rubric=rubric_name, labels_file={"name": labelled.name, "sha256": labelled.sha256, "rows": len(labelled.rows)},
        label_policy={"name": label_policy[0] or Path(labelled.name).stem, "version": label_policy[1] or labelled.sha256[:12]},
        judge={"model": who.model, "params": dict(who.sampling)}, optimiser={"model": optimiser.model}, seed=seed,
        splits={"stratified_by": "label", "fractions": list(fractions)})
    aligner = Aligner(judge, optimiser, rubric, labelled.rows, human, labelled.ids, report=report, fractions=fractions,
                      seed=seed, rounds=rounds, examples=examples, guidelines=guidelines, margin=margin, confidence=confidence,
                      resamples=resamples, concurrency=concurrency, budget=budget, on_round=on_round, on_judged=on_judged)
    try:
        variant, template = await aligner.run()
    finally:
        report.requests, report.cost_usd = aligner.spent()
    if variant is None or template is None:
        return report
    assert report.certificate is not None
    alignment = Alignment(original={"rubric": rubric_name, "fingerprint": rubric_fingerprint(rubric)},
                          labels_file=report.labels_file, label_policy=report.label_policy, seed=seed, splits=report.splits,
                          judge=report.judge, optimiser=report.optimiser, certificate=report.certificate)
    aligned = aligned_rubric(variant, template_path.name, output.resolve().parent, alignment, template)
    write_aligned(aligned, template, output)
    report.written = True
    return report


def write_aligned(rubric: Rubric, template: str, output: Path) -> None:
    """The YAML and its template, each written whole (a temp file renamed), then read back as any rubric is (a self-check)."""
    import os

    import yaml

    from gradekit.judge import RubricError, load_rubric

    template_path = output.with_suffix(".j2")
    written: list[Path] = []
    try:
        for path, text in ((template_path, template), (output, yaml.safe_dump(spec_of(rubric), sort_keys=False, allow_unicode=True,
                                                                            width=120))):
            temporary = path.with_name(path.name + ".tmp")
            temporary.write_text(text, encoding="utf-8")
            os.replace(temporary, path)
            written.append(path)
        load_rubric(output)
    except (OSError, RubricError) as e:
        for path in written:
            path.unlink(missing_ok=True)
        raise AlignError(f"cannot write {output}: {getattr(e, 'strerror', None) or e}") from e
