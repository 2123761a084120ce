"""A Cascade: Judges in order, each trusted only where its confidence meets a calibrated threshold.

"Trust or Escalate" (Jung, Brahman & Choi 2024, arXiv 2407.18370): a row goes to the first judge
whose confidence on it meets that judge's threshold (``decided_by``, ``confidence``); a row no
judge is confident on is ``abstained``: no score and not an error, a row for a human. The
thresholds come from ``gradekit cascade fit`` (graders/calibration/_cascade.py), which reads them
off a human-labelled set so the trusted rows agree with humans at a chosen level with a
guarantee; this module only applies them, and measures a confidence the same way the fit did:

====================  ==============================================================================
agreement             K sampled judgements (temperature 1, a seed per sample; the provider's default
                      temperature where it refuses one): the share agreeing with their majority,
                      whose label is the decision.
simulated-annotators  K in-context "annotators": each sees its own few human-labelled rows from the
                      calibration set as earlier turns, then the row; the share agreeing with the
                      majority (the paper's Simulated Annotators).
logprobs              one judgement with top logprobs: the probability mass of the chosen label at the
                      verdict token, 1 - |label score - probability-weighted score| / score range
                      (exactly the label's probability for a two-label rubric).
====================  ==============================================================================
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_serializer, model_validator

from ._aligned import Example
from ._digest import changed_fields, field_digest
from ._jury import Panel
from ._protocol import JudgeIdentity, JudgeProtocol, MemberUsage
from ._redact import redact_url
from ._rubric import Rubric
from ._spec import JudgeSpec
from ._verdict import PanelInfo, Usage, Verdict

ConfidenceMethod = Literal["agreement", "simulated-annotators", "logprobs"]
CONFIDENCE_METHODS: tuple[str, ...] = get_args(ConfidenceMethod)
CASCADE_VERSION = 1
LOGPROBS_TOP = 10  # top logprobs asked for per token with the logprobs confidence method


class ThresholdTest(BaseModel):
    """One step of the fixed-sequence test: the rows at or above ``threshold`` and their bound."""

    threshold: float
    n: int  # calibration rows reaching this judge with confidence >= threshold
    agree: int  # of those, rows whose decision is the human label
    lower_bound: float  # one-sided Clopper-Pearson lower bound on their agreement, at level 1 - delta
    passed: bool


class CascadeJudge(BaseModel):
    """One judge of a cascade.json: who it is and what the fit saw of it."""

    model_config = ConfigDict(extra="forbid")

    model: str
    base_url: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    threshold: float | None = Field(None, gt=0, le=1)  # a confidence in (0, 1]; None: never trusted, grading does not ask it
    calibration_rows: int = 0  # labelled rows that reached this judge in the fit
    trusted_rows: int = 0  # of those, rows at or above the threshold
    trusted_agreement: float | None = None  # their agreement with the human label
    lower_bound: float | None = None
    requests: int = 0  # requests the fit sent to this judge (cache hits not counted)
    tests: list[ThresholdTest] = Field(default_factory=list)

    @classmethod
    def fitted(cls, judge: JudgeProtocol) -> CascadeJudge:
        """The entry of a judge the fit asked: its model, endpoint and parameters as it sent them."""
        who = judge.identity()
        return cls(model=who.model, base_url=who.base_url, params=dict(who.sampling))


class CascadeSpec(BaseModel):
    """What ``gradekit cascade fit`` writes and ``grade --cascade`` reads (cascade.json)."""

    model_config = ConfigDict(extra="forbid")

    version: int = CASCADE_VERSION
    rubric: str  # the rubric's name or path as given to the fit
    rubric_fingerprint: str | None = None  # judge._rubric.rubric_fingerprint: grading with an edited rubric warns
    samples: int = Field(ge=1)  # K
    confidence: ConfidenceMethod = "agreement"
    target: float = Field(gt=0, lt=1)  # the agreement with humans guaranteed on trusted rows
    delta: float = Field(gt=0, lt=1)  # the guarantee holds with probability >= 1 - delta
    delta_per_judge: float = Field(gt=0, lt=1)  # the level each judge's test ran at (delta, or delta / judges with split_delta)
    human_column: str = "label"
    calibration_n: int = Field(ge=0)  # labelled rows the fit tested on (those used as demonstrations excluded)
    calibration_coverage: float | None = None  # share of those some judge was trusted with
    calibration_agreement: float | None = None  # agreement of the trusted ones with the human label
    judges: list[CascadeJudge] = Field(min_length=1)
    thresholds: list[float | None] = Field(default_factory=list)  # each judge's threshold, in order (a copy of judges[i].threshold)
    demonstrations: list[dict[str, Any]] = Field(default_factory=list)  # simulated-annotators: {"row": {...}, "label": ...}
    demonstrations_per_annotator: int = 0
    # What the guarantee was fitted on, one sha256 (16 hex) per field (see guarantee_fields), written by the fit:
    # a file whose thresholds, target, samples, judges... were edited after the fit no longer matches and is refused.
    digest: dict[str, str] | None = None

    @model_validator(mode="after")
    def _thresholds_follow_the_judges(self) -> CascadeSpec:
        """The judges' thresholds are the truth; the top-level list is kept equal to them for readers."""
        self.thresholds = [j.threshold for j in self.judges]
        return self

    @field_serializer("digest")
    def _digest_of_what_is_written(self, digest: dict[str, str] | None) -> dict[str, str]:
        """A spec built in Python and written carries the digest of its values, as the fit's does."""
        return digest if digest is not None else guarantee_digest(self)

    def seal(self) -> CascadeSpec:
        """Record the digest of what the guarantee was fitted on (the fit calls it last)."""
        self.digest = guarantee_digest(self)
        return self

    def judge_spec(self, i: int, over: JudgeSpec | None = None) -> JudgeSpec:
        """Judge ``i`` as fitted (model, endpoint, params) with what ``over`` gives put over it, asked the way
        the fit asked it (top logprobs with ``confidence: logprobs``)."""
        fitted = self.judges[i]
        spec = JudgeSpec.of(fitted.model, base_url=fitted.base_url, params=fitted.params)
        spec = spec if over is None else spec.merge(over)
        params = {k: v for k, v in (spec.params or {}).items() if k not in ("logprobs", "top_logprobs")}  # logprobs sets them again
        return replace(spec, params=params, logprobs=LOGPROBS_TOP if self.confidence == "logprobs" else None)

    @classmethod
    def read(cls, path: str | Path) -> CascadeSpec:
        """Load a cascade.json; ValueError naming the file (and the field) when it is not one, or not the one fitted."""
        try:
            raw = Path(path).read_bytes()
            spec = cls.model_validate_json(raw)
        except OSError as e:
            raise ValueError(f"{path}: cannot read the cascade: {e.strerror or e}") from e
        except ValueError as e:
            raise ValueError(f"{path}: not a cascade file (from `gradekit cascade fit`): {_first_problem(e)}") from e
        if spec.digest is None:
            logging.getLogger("gradekit.judge").warning(
                "%s: the cascade carries no digest of its fit (written by hand or by an older gradekit): "
                "its guarantee cannot be checked against what it was fitted on", path)
        else:
            changed = changed_fields(spec.digest, guarantee_fields(spec))
            if changed:
                raise ValueError(f"{path}: {', '.join(changed)} changed after the fit (the file's digest does not match): "
                                 "its guarantee was measured on other values; fit the cascade again (gradekit cascade fit) "
                                 "rather than edit the file")
        given = json.loads(raw).get("thresholds")
        if given and given != spec.thresholds:  # the copy edited: the judges' thresholds would silently win
            raise ValueError(f"{path}: thresholds {given} differ from the judges' thresholds {spec.thresholds}: "
                             "the file was edited after the fit; fit the cascade again (gradekit cascade fit)")
        return spec


def guarantee_fields(spec: CascadeSpec) -> dict[str, Any]:
    """What a cascade's guarantee depends on, by field name: the fit's settings, its sample and each judge as fitted."""
    fields: dict[str, Any] = {name: getattr(spec, name) for name in (
        "rubric", "rubric_fingerprint", "samples", "confidence", "target", "delta", "delta_per_judge", "human_column",
        "calibration_n", "calibration_coverage", "calibration_agreement", "demonstrations", "demonstrations_per_annotator")}
    fields["judges"] = len(spec.judges)
    for i, judge in enumerate(spec.judges):
        for name in ("model", "params", "threshold"):
            fields[f"judges[{i}].{name}"] = getattr(judge, name)
    return fields


def guarantee_digest(spec: CascadeSpec) -> dict[str, str]:
    return field_digest(guarantee_fields(spec))


def _first_problem(e: ValueError) -> str:
    """What is wrong with a file that is not a cascade, in one line: the first field and what it is not."""
    errors = getattr(e, "errors", None)
    if callable(errors):
        found = errors()
        if found:
            first = found[0]
            where = ".".join(str(part) for part in first.get("loc") or ()) or "the file"
            more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
            return f"{where}: {first.get('msg')}{more}"
    return str(e).splitlines()[0]


def sampled(rubric: Rubric, index: int) -> Rubric:
    """The rubric for sample ``index``: temperature 1 and a seed of its own, as rubric defaults.

    As rubric defaults (not judge parameters) an endpoint that refuses temperature or seed drops
    them once and answers at its own default; a seed per sample gives each sample its own request,
    so the cache neither merges the samples nor loses them on a re-run.
    """
    return rubric.model_copy(update={"sampling": {**rubric.sampling, "temperature": 1.0, "seed": index}})


def annotators(rubric: Rubric, spec: CascadeSpec) -> list[Rubric]:
    """The K simulated annotators of a cascade: each with its slice of the stored demonstrations."""
    per = spec.demonstrations_per_annotator
    out: list[Rubric] = []
    for i in range(spec.samples):
        demos = spec.demonstrations[i * per:(i + 1) * per]
        out.append(rubric.model_copy(update={"examples": [*rubric.examples, *(Example(row=d["row"], label=d["label"]) for d in demos)]}))
    return out


class Opinion(BaseModel):
    """One judge's decision on one row and how sure it is."""

    verdict: Verdict  # the decision as a Verdict (usage summed over the samples); status error: no sample answered
    confidence: float | None = None


def asked(rubric: Rubric, *, samples: int, method: ConfidenceMethod, spec: CascadeSpec | None = None) -> list[Rubric]:
    """The K rubrics one row is judged with: sampled copies, or the simulated annotators (built once per run)."""
    if method == "logprobs":
        return [rubric]
    if method == "simulated-annotators":
        if spec is None:
            raise ValueError("simulated-annotators needs the cascade's demonstrations")
        return annotators(rubric, spec)
    return [sampled(rubric, i) for i in range(samples)]


async def opinion(judge: JudgeProtocol, rubric: Rubric, row: Mapping[str, Any], *, method: ConfidenceMethod,
                  rubrics: Sequence[Rubric]) -> Opinion:
    """A judge's decision on ``row`` and its confidence, measured by ``method`` over ``rubrics`` (see :func:`asked`)."""
    if method == "logprobs":
        verdict = await judge.judge(rubric, row)
        if verdict.status != "ok":
            return Opinion(verdict=verdict)
        if verdict.read.score_source != "logprobs":
            return Opinion(verdict=verdict, confidence=0.0)  # no logprobs came back: nothing to be sure with
        scores = list(rubric.labels.values())
        span = (max(scores) - min(scores)) or 1.0
        labelled = rubric.labels.get(verdict.label or "", verdict.score or 0.0)
        return Opinion(verdict=verdict, confidence=max(0.0, 1.0 - abs(labelled - (verdict.score or 0.0)) / span))
    verdicts = await asyncio.gather(*(judge.judge(r, row) for r in rubrics))
    return Opinion.model_validate(majority_of(verdicts, len(rubrics)))


def majority_of(verdicts: Sequence[Verdict], samples: int) -> dict[str, Any]:
    """The samples' majority label as one Verdict and the share of all K samples that gave it.

    A failed sample counts against the confidence (it did not agree); with no sample answered the
    Verdict is the first failure. Ties go to the label sampled first.
    """
    usage: dict[str, Any] = {"usage": sum((v.usage for v in verdicts), Usage()),
                             "latency_s": max((v.latency_s for v in verdicts), default=0.0)}
    usage["cached"] = bool(verdicts) and all(v.cached for v in verdicts)
    ok = [v for v in verdicts if v.status == "ok"]
    if not ok:
        first = verdicts[0]
        return {"verdict": first.model_copy(update=usage)}
    counts = Counter(v.label for v in ok)
    top = max(counts.values())
    label = next(v.label for v in ok if counts[v.label] == top)
    chosen = next(v for v in ok if v.label == label)
    return {"verdict": chosen.model_copy(update=usage), "confidence": top / samples}


class Cascade(Panel):
    """Judges in order with calibrated thresholds; a :class:`~judge._protocol.JudgeProtocol` like a Judge (see the module docstring).

    Args:
        judges: the Judges, cheapest first, one per entry of ``spec.judges``.
        spec: the fitted cascade (``CascadeSpec.read("cascade.json")``).
    """

    panel_columns = ("decided_by", "confidence")

    def __init__(self, judges: Sequence[JudgeProtocol], spec: CascadeSpec) -> None:
        if len(judges) != len(spec.judges):
            raise ValueError(f"the cascade has {len(spec.judges)} judges, {len(judges)} given")
        self.judges = self.members = list(judges)
        self.spec = spec
        self.usage = MemberUsage()
        self._rubrics: dict[int, tuple[Rubric, list[Rubric]]] = {}

    @property
    def model(self) -> str:
        return "cascade(" + " -> ".join(j.model for j in self.judges) + ")"

    def identity(self) -> JudgeIdentity:
        """The judges' endpoints and the fitted cascade (its demonstrations counted): a resume with another cascade is refused."""
        fitted = self.spec.model_dump(exclude={"demonstrations"})
        for entry in fitted.get("judges") or []:  # a checkpoint holds no URL credentials (the run redacts base_url itself)
            entry["base_url"] = redact_url(entry.get("base_url"))
        return JudgeIdentity(model=self.model, base_url=" ".join(j.identity().base_url or "" for j in self.judges),
                             sampling={"cascade": fitted, "demonstrations": len(self.spec.demonstrations)})

    @property
    def concurrency(self) -> int:
        """Rows a run keeps in flight: every row goes to the first judge, so its cap bounds them."""
        return self.judges[0].concurrency

    def rubrics(self, rubric: Rubric) -> list[Rubric]:
        """The K rubrics of a row, built once per rubric (their cache shells are kept per rubric object)."""
        held = self._rubrics.get(id(rubric))
        if held is None or held[0] is not rubric:
            held = self._rubrics[id(rubric)] = (rubric, asked(rubric, samples=self.spec.samples, method=self.spec.confidence,
                                                              spec=self.spec))
        return held[1]

    async def judge(self, rubric: Rubric, row: Mapping[str, Any]) -> Verdict:
        """The first trusted judge's decision, else ``abstained`` (else an error when every judge failed)."""
        if rubric.is_checklist:  # votes and confidences are over one label; a checklist has one per criterion
            return Verdict(status="error", error_kind="input", error=f"rubric {rubric.name!r} is a checklist: "
                           f"a {type(self).__name__.lower()} over a checklist is not supported; grade it with one judge")
        usage = Usage()
        failures: list[Verdict] = []
        best: float | None = None
        for judge, fitted in zip(self.judges, self.spec.judges):
            if fitted.threshold is None:
                continue  # the fit trusted it with nothing: asking it would only cost
            found = await opinion(judge, rubric, row, method=self.spec.confidence, rubrics=self.rubrics(rubric))
            v = found.verdict
            self.usage.add(judge.model, v)
            usage += v.usage
            if v.status != "ok" or found.confidence is None:
                if v.error_kind == "input":  # the row cannot be judged by any judge
                    return v.model_copy(update={"usage": usage})
                failures.append(v.model_copy(update={"error": f"{judge.model}: {v.error_kind}: {v.error}"}))
                continue
            best = found.confidence if best is None else max(best, found.confidence)
            if found.confidence >= fitted.threshold:
                return v.model_copy(update={"usage": usage, "panel": PanelInfo(decided_by=judge.model, confidence=found.confidence)})
        named = "; ".join(f.error or "" for f in failures)
        if best is None and failures and all(f.status == "skipped" for f in failures):  # the budget ran out: not asked
            return Verdict(status="skipped", error_kind="budget", error=failures[0].error, usage=usage)
        if best is None and failures:  # every judge asked failed: not a row for a human, a row to judge again
            return Verdict(status="error", error_kind=failures[0].error_kind, error=f"cascade: no judge answered: {named}", usage=usage)
        why = "no judge's confidence met its threshold" if best is not None else "the fit trusted no judge of the cascade with any row"
        return Verdict(status="abstained", error_kind="abstained", panel=PanelInfo(confidence=best),
                       error=why + (f" ({named})" if named else ""), usage=usage)
