"""`gradekit grade`'s command line as a run's plan: the options' rules (exit 2), the rubric, the mapping, the GradePlan.

Everything here fails before any request; the run itself is the library's ``runs.grade``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from ._common import fail
from ._judge_options import JudgeOptions

if TYPE_CHECKING:
    from ..grading._grade import GradePlan
    from ..runs._io import RunInput


@dataclass
class GradeArgs:
    """``grade``'s parameters, by name, as typer parsed them."""

    input: Path
    rubric: str | None
    grader_file: Path | None
    output: Path
    mapping: list[str]
    json_output: bool
    no_swap: bool
    on_conflict: str
    tiebreak_model: str | None
    restart: bool
    batch: bool
    batch_poll: float
    group_by: str | None
    keep_going: bool
    retry_errors: bool
    progress_every: float
    encoding: str | None
    ray_address: str | None
    ray_workers: int | None
    jury: str | None
    quorum: int | None
    cascade: Path | None
    keep_reasoning: bool
    canary: Path | None
    canary_every: list[str]
    on_drift: str
    opts: JudgeOptions


@dataclass
class Command:
    """What the command line asks, checked: the rubric (``spec``; None with --grader) and the mapping."""

    args: GradeArgs
    spec: Any
    variables: dict[str, str]
    cascade_spec: Any  # a --cascade file's CascadeSpec
    panel: bool  # a jury (--model given several times) or a cascade
    model: str | None  # the one --model, else None


def parse(args: GradeArgs) -> Command:
    """The options' own rules, then the rubric and the mapping: everything that fails without the input."""
    from gradekit.judge import RubricError, load_rubric

    from ..runs._file import resolve_mapping
    from ..runs._io import InputError
    from ._panel import check_panel

    opts, rubric = args.opts, args.rubric
    opts.check()
    cascade_spec = check_panel(opts, args.jury, args.quorum, args.cascade)
    if rubric is None and args.grader_file is None and cascade_spec is not None:
        rubric = cascade_spec.rubric  # the rubric the cascade was fitted with
    if (rubric is None) == (args.grader_file is None):
        raise fail("give a rubric (-r/--rubric) or a grader config (--grader), one of the two")
    panel = len(opts.model) > 1 or cascade_spec is not None
    if cascade_spec is not None and args.grader_file is not None:
        raise fail("--cascade grades with a rubric (-r): its thresholds were fitted on that rubric's verdicts")
    if len(opts.model) > 1:
        opts.per_member(len(opts.model), "jury")  # --base-url: one for every juror or one per --model (exit 2 otherwise)
    model = opts.model[0] if len(opts.model) == 1 else None
    try:
        spec = load_rubric(rubric) if rubric is not None else None
        variables = resolve_mapping(spec, args.mapping) if spec is not None else sample_mapping(args.mapping)
    except (RubricError, InputError) as e:
        raise fail(str(e)) from e
    certified = spec.alignment.judge.get("model") if spec is not None and spec.alignment is not None else None
    if certified and not panel:
        from gradekit.judge._client import DEFAULT_MODEL

        if (model or DEFAULT_MODEL) != certified:
            typer.echo(f"warning: {rubric}: its certificate holds for judge {certified}, not {model or DEFAULT_MODEL}: it says "
                       "nothing about this one; align it for this judge (gradekit align)", err=True)
    return Command(args, spec, variables, cascade_spec, panel, model)


def sample_mapping(pairs: list[str]) -> dict[str, str]:
    """``PATH=COLUMN`` pairs for a grader: the sample path (response, references.answer, ...) a column fills."""
    from ..runs._io import InputError

    out: dict[str, str] = {}
    for pair in pairs:
        path, sep, column = pair.partition("=")
        if not sep or not path or not column:
            raise InputError(f"--map {pair!r}: expected PATH=COLUMN, e.g. response=model_output or references.answer=gold")
        out[path] = column
    return out


def resolve(command: Command) -> RunInput:
    """The input, once for the whole run (exit 2 for an empty or mixed folder, an output that is the input, ...)."""
    from ..grading._grade import resolve_input
    from ..runs._io import InputError

    try:
        return resolve_input(command.args.input, command.args.output, command.args.encoding)
    except InputError as e:
        raise fail(str(e)) from e


def check(command: Command) -> None:
    """The rules between the options, the rubric and the kind of run (batch, pairwise, jury, Ray): exit 2 before any request."""
    from .._pairwise import CONFLICT_RULES
    from ._panel import check_cascade_rubric

    a, spec, opts, panel, cascade_spec = command.args, command.spec, command.args.opts, command.panel, command.cascade_spec
    record, replay, max_cost, max_tokens = opts.record, opts.replay, opts.max_cost, opts.max_tokens
    batch, ray_address = a.batch, a.ray_address
    if a.on_conflict not in CONFLICT_RULES or (a.on_conflict == "third") != bool(a.tiebreak_model):
        raise fail("--on-conflict is tie, first, vote, or third together with --tiebreak-model")
    if panel and (batch or ray_address is not None):
        raise fail("a jury (--model given several times) or a --cascade judges live: it excludes --batch and --ray")
    if spec is not None and spec.is_checklist and panel:
        raise fail(f"rubric {spec.name!r} is a checklist: a jury or a --cascade votes over one label, so grade it with one --model")
    if spec is not None and spec.criteria_variable is not None and batch:
        raise fail(f"rubric {spec.name!r} takes its criteria per row ({spec.criteria_variable!r}): --batch reads replies "
                   "without their rows, so grade it live (a checklist with fixed criteria takes --batch)")
    if spec is not None and spec.trajectory_variables and batch:
        raise fail(f"rubric {spec.name!r} reads a trajectory: --batch does not yet write trajectory_coverage, learn the "
                   "window or judge steps and navigation rounds, so grade it live")
    if cascade_spec is not None and spec is not None:
        if spec.pairwise is not None:
            raise fail("--cascade grades single-answer rubrics; for a pairwise rubric use a jury (--model several times)")
        check_cascade_rubric(a.cascade, cascade_spec, spec)  # type: ignore[arg-type]
    if batch and a.encoding:
        raise fail("--batch reads UTF-8 input; convert the file first (iconv -f ENCODING -t UTF-8)")
    if batch and len(opts.base_url) > 1:
        raise fail("--batch submits to one endpoint's Batch API: give one --base-url (a fleet sends live requests)")
    if batch and (record or replay):
        raise fail("--batch sends no live requests: it excludes --record and --replay")
    if batch and (max_cost is not None or max_tokens is not None):
        raise fail("--max-cost and --max-tokens cap live requests; a --batch run is priced by the provider when it is submitted")
    if batch and (opts.service_tier or (opts.api or "chat") != "chat"):
        raise fail("--batch submits chat requests at the Batch API's own price: it excludes --service-tier and --api")
    if spec is None and (batch or a.tiebreak_model):
        raise fail("--batch and --tiebreak-model work with a rubric (-r), not with --grader")
    if a.retry_errors and (a.restart or batch or (spec is not None and spec.pairwise is not None)):
        raise fail("--retry-errors grades again the error rows of an earlier live run: it excludes --restart, --batch and pairwise rubrics")
    if a.progress_every < 0:
        raise fail("--progress-every takes seconds >= 0 (0: no progress lines)")
    if a.ray_workers is not None and ray_address is None:
        raise fail("--ray-workers needs --ray ADDRESS")
    if a.canary is None and (a.canary_every or a.on_drift != "stop"):
        raise fail("--canary-every and --on-drift go with --canary FILE")
    if a.on_drift not in ("stop", "flag"):
        raise fail(f"--on-drift is stop or flag, not {a.on_drift!r}")
    if a.canary is not None and (spec is None or spec.pairwise is not None or batch or ray_address is not None or a.retry_errors):
        raise fail("--canary watches a live run of a single-answer rubric (-r): it excludes --grader, pairwise rubrics, --batch, "
                   "--ray and --retry-errors")
    if a.ray_workers is not None and not 1 <= a.ray_workers <= 1024:
        raise fail("--ray-workers is a number of actors from 1 to 1024")
    if ray_address is not None:
        if batch or record or replay or max_cost is not None or max_tokens is not None or a.tiebreak_model or a.group_by:
            raise fail("--ray works without --batch, --record/--replay, --max-cost/--max-tokens, --tiebreak-model and --group-by")
        if spec is not None and spec.pairwise is not None:
            raise fail("--ray grades single-answer rubrics and graders; a pairwise rubric runs without --ray")
        from ..runs._ray import RayMissing, import_ray

        try:
            import_ray()
        except RayMissing as e:
            raise fail(str(e)) from e


def plan_of(command: Command) -> GradePlan:
    """The run's plan: the judge spec as the judge options give it (over and beneath a grader file's judge:), or the
    jury's or cascade's, and the run's options as the flags say them."""
    from ..grading._grade import GradePlan
    from ._panel import panel_spec

    a, opts = command.args, command.args.opts
    if a.keep_reasoning and (command.spec is None or command.spec.pairwise is not None or a.batch):
        raise fail("--keep-reasoning works with a single-answer rubric (-r), not with --grader, pairwise rubrics or --batch")
    panel = panel_spec(opts, jury=a.jury, quorum=a.quorum, spec=command.cascade_spec)
    beneath, over = opts.layers(command.model)
    # A cassette must see every request, so record/replay bypass the cache unless --cache is explicit.
    no_cache = opts.no_cache or ((opts.record or opts.replay) and opts.resolved_cache_path() is None)
    return GradePlan(
        rubric=command.spec, grader=a.grader_file, mapping=command.variables, judge=panel or over,
        judge_defaults=None if panel else beneath, tiebreak=opts.spec(a.tiebreak_model) if a.tiebreak_model else None,
        cache=False if no_cache else opts.resolved_cache_path(),
        # --concurrency is per endpoint: a fleet on the command line keeps each of them as busy.
        concurrency=opts.in_flight * max(1, len(opts.base_url)), resume=not a.restart, keep_going=a.keep_going,
        retry_errors=a.retry_errors, group_by=a.group_by, encoding=a.encoding, keep_reasoning=a.keep_reasoning,
        swap=not a.no_swap, on_conflict=a.on_conflict, batch=a.batch, batch_poll=a.batch_poll, ray=a.ray_address,
        ray_workers=a.ray_workers, canary=a.canary, canary_every=a.canary_every, on_drift=a.on_drift)  # type: ignore[arg-type]
