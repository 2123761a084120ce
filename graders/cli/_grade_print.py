"""How `gradekit grade` shows a run: its progress, its record on the terminal or as --json, and its exit status.

The run and its record are the library's (``runs.grade``); this module only says them, as flags where
the library names fields.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table

from .._flags import in_flags, said_as_flags
from ._common import print_json

if TYPE_CHECKING:
    from gradekit.judge._protocol import JudgeStats

    from ..runs._pairwise import PairwiseRunSummary
    from ..runs._record import RunSummary
    from ..grading._grade import GradeRun
    from ..runs._io import RunInput


def report(run: GradeRun, output: Path, what: dict[str, str], json_output: bool, name: str) -> typer.Exit:
    """The record on the terminal or as --json (``name``: a panel block's, jury or cascade), then the exit status:
    1 when some rows carry an error or were skipped."""
    from ..runs._record import RunSummary
    from ._panel import print_panel

    s, block = run.summary, run.panel
    if json_output:
        tail = {"ray": run.ray.model_dump()} if run.ray is not None else {
            "pacing": run.pacing.model_dump(), "endpoints": endpoints(run.endpoints), "hedges": run.hedges,
            **({name: block} if block is not None else {}),
            # a cascade's headline figures at the top too, beside rows/ok/abstained
            **({k: block[k] for k in ("coverage", "guarantee")} if block is not None and name == "cascade" else {})}
        print_json({"output": str(output), **what, "model": run.model, **s.model_dump(), **tail})
    elif not isinstance(s, RunSummary):
        print_pairwise(s, output, Console(highlight=False))
    else:
        print_summary(s, output, Console(), endpoints(run.endpoints), run.hedges)
        print_panel(block, Console(highlight=False))
        if run.ray is not None:
            Console(highlight=False).print(f"ray: {run.ray.workers} workers on {run.ray.nodes} nodes of {run.ray.address}")
    return typer.Exit(1 if run.failed_rows else 0)


def breaker_exit(e: Any, output: Path, json_output: bool, err: Console) -> typer.Exit:
    """Exit 3: nothing is wrong with the rows; the judge is. The same command resumes once it is fixed."""
    from ..runs._record import RunSummary

    if json_output:
        partial = e.summary.model_dump() if isinstance(e.summary, RunSummary) else {}
        print_json({"output": str(output), "model": e.trip.model, "stopped": "drift" if e.trip.kind == "drift" else "breaker",
                    "message": in_flags(str(e)),
                    "base_url": e.trip.base_url, "error_kind": e.trip.kind, "example": in_flags(e.trip.example), "summary": partial,
                    "endpoints": endpoints(getattr(e, "endpoints", []))})
    err.print(f"error: {in_flags(str(e))}", style="red", highlight=False, markup=False, soft_wrap=True)
    return typer.Exit(3)


def endpoints(listed: list[dict]) -> list[dict]:
    """A fleet's endpoints for --json, each one's reason for being out said in flags."""
    return [{**e, "reason": said_as_flags(e.get("reason"))} for e in listed]


class Show:
    """How the command shows a live run: a bar on a terminal, else a line every ``every`` seconds."""

    def __init__(self, err: Console, *, bar: bool, every: float, done: int) -> None:
        self.err, self.bar, self.every, self.done = err, bar, every, done

    def progress(self, source: RunInput, stats: Callable[[], JudgeStats | None]):  # -> RunProgress
        from ._progress import RunProgress

        # Counting is a pass over the input: a bar needs it now, the lines only once the first is due.
        return RunProgress(source.count_rows() if self.bar else source.count_rows, self.err, every=self.every, bar=self.bar, done=self.done,
                           fleet=lambda: fleet_text(stats()))


def fleet_text(stats: JudgeStats | None) -> str:
    """A progress line's part for a fleet: its rate and each endpoint's ("" for one endpoint)."""
    listed = stats.endpoints if stats is not None else []
    if len(listed) < 2:
        return ""
    parts = ", ".join(f"{e.base_url} {e.rps:.1f}/s" + ("" if e.state == "up" else f" {e.state}") for e in listed)
    return f"; fleet {sum(e.rps for e in listed if e.state == 'up'):.1f} req/s ({parts})"


def print_summary(s: RunSummary, output: Path, console: Console, endpoints: list[dict] | None = None,
                   hedges: dict | None = None) -> None:
    r, st = s.results, s.stats
    u, m = st.usage, st.money
    if s.already_complete:
        console.print(f"{output} is already complete ({r.rows} rows); nothing to do. Use --restart to grade again.", highlight=False)
    elif s.resumed_from:
        console.print(f"resumed: {s.resumed_from} rows were already in {output} from an interrupted run", highlight=False)
    table = Table(show_header=False, box=None, pad_edge=False)
    skipped = f", {r.skipped} skipped" if r.skipped else ""
    skipped += f", {r.abstained} abstained" if r.abstained else ""
    table.add_row("rows", f"{r.rows} ({r.ok} judged, {r.errors} errors{skipped}) -> {output}")
    table.add_row("mean score", "n/a" if r.mean_score is None else f"{r.mean_score:.4f}")
    table.add_row("labels", ", ".join(f"{k}: {v}" for k, v in r.label_counts.items()) or "-")
    table.add_row("parse failures", f"{r.parse_failure_rate:.1%}")
    table.add_row("errors by kind", ", ".join(f"{k}: {v}" for k, v in r.errors_by_kind.items()) or "-")
    table.add_row("tokens", f"{u.prompt_tokens} prompt + {u.completion_tokens} completion"
                  + (f" ({u.reasoning_tokens} reasoning)" if u.reasoning_tokens else "")
                  + (f"; {u.cached_tokens} prompt tokens from the provider's cache" if u.cached_tokens else ""))
    if u.cached_tokens or u.cache_write_tokens:
        money = "" if m.cache_saved_usd is None else \
            (f", saved ${m.cache_saved_usd:.4f}" if m.cache_saved_usd >= 0 else f", cost ${-m.cache_saved_usd:.4f} more")
        table.add_row("prompt cache", f"{m.cache_hit_ratio:.1%} of prompt tokens read, {m.cache_write_ratio:.1%} written{money}")
    cost = "n/a (no price for the model: --prices FILE)" if m.cost_usd is None else f"${m.cost_usd:.4f} estimated"
    if m.cost_by_tier:
        cost += " (" + ", ".join(f"{tier} ${usd:.4f}" for tier, usd in m.cost_by_tier.items()) + ")"
    if m.cost_basis and m.cost_usd is not None:
        cost += f" ({m.cost_basis})"
    saved = f"; cache hits saved {m.saved_tokens} tokens" + (f", ${m.saved_usd:.4f}" if m.saved_usd is not None else "") if m.saved_tokens else ""
    table.add_row("cost", cost + saved)
    table.add_row("requests", f"{u.requests} sent, {st.cache_hits} cache hits")
    if st.judge_calls_saved is not None:  # a hybrid grader (math_equivalence with judge_fallback)
        table.add_row("decided by", ", ".join(f"{k} {v}" for k, v in r.decided_by.items()) or "-")
        table.add_row("judge calls saved", f"{st.judge_calls_saved} (two per row the symbolic check decided)")
    table.add_row("wall time", f"{st.wall_s:.2f} s ({st.judgements_per_s:.1f} judgements/s)")
    times = st.reward_times
    if times.p50 is not None:
        slow = ", ".join(f"{t['id'] if t['id'] is not None else 'row ' + str(t['row'])} {t['seconds']:.2f} s" for t in times.slowest_rows[:3])
        table.add_row("reward time", f"p50 {times.p50:.3f} s, p99 {times.p99:.3f} s; slowest: {slow}")
    if st.pacing is not None:
        held = "no limit" if st.pacing.rps is None else f"{st.pacing.rps:g} requests/s at the end"
        table.add_row("pacing", f"{st.pacing.mode}: {held}")
    if endpoints and len(endpoints) > 1:  # a fleet: each endpoint's part (one endpoint is the run itself)
        table.add_row("endpoints", "; ".join(
            f"{e['base_url']} {e['state']}: {e['requests']} requests ({e['ok']} ok, {e['rate_limited']} rate limited, "
            f"{e['errors']} errors), {e['rps']:g}/s" for e in endpoints))
    if hedges and hedges.get("sent"):
        table.add_row("hedges", f"{hedges['sent']} sent ({hedges['sent'] / max(1, u.requests):.1%} of {u.requests} requests), "
                      f"{hedges['won']} answered first")
    if r.spread is not None and r.spread.rewards:
        sp = r.spread
        equal = "n/a" if sp.all_equal_share is None else f"{sp.all_equal_share:.1%}"
        table.add_row("reward spread", f"{sp.groups} groups; all-equal {equal} ({sp.all_equal_groups}); mean {sp.mean:.4f}, "
                      f"variance {sp.variance:.4f}; pass rate {sp.pass_rate:.1%}")
        table.add_row("", f"too easy (all max): {sp.too_easy_groups} groups; too hard (all min): {sp.too_hard_groups} groups")
        for advice in sp.advice:
            table.add_row("", f"[yellow]{advice}[/yellow]")
    if st.served.groups:
        table.add_row("served", served_text(s))
    if st.canary is not None:
        table.add_row("canary", canary_text(st.canary))
    if r.evals is not None and r.evals.result_counts is not None:
        c = r.evals.result_counts
        table.add_row("eval results", f"{c['passed']} passed, {c['failed']} failed, {c['errored']} errored of {c['total']}")
        for e in r.evals.per_testing_criteria_results or []:
            table.add_row("", f"{e['testing_criteria']}: {e['passed']} passed, {e['failed']} failed")
    console.print(table)
    if st.served.note:
        console.print(st.served.note, style="yellow", highlight=False, markup=False, soft_wrap=True)
    if m.budget:
        console.print(f"[yellow]{r.skipped} rows skipped: {m.budget}. Run the same command with a larger cap to grade them;"
                      " the rows already judged come from the cache.[/yellow]", highlight=False)
    for example in r.error_examples:
        console.print(f"  [red]{example}[/red]", markup=True, highlight=False)


def served_text(s: RunSummary) -> str:
    """Who answered the rows (model and system_fingerprint, as the provider says), and where that changed mid-run."""
    def who(model: str | None, fingerprint: str | None) -> str:
        return f"{model or '?'}" + (f" {fingerprint}" if fingerprint else "")

    served = s.stats.served
    groups = "; ".join(f"{who(g['model'], g['system_fingerprint'])}: {g['rows']} rows ({g['first_row']}-{g['last_row']})"
                       for g in served.groups)
    if not served.changes_total:
        return groups
    first = served.changes[0]
    was = first["was"]
    return (f"{groups}; changed mid-run {served.changes_total} time{'s' if served.changes_total > 1 else ''}, first at row "
            f"{first['row']} ({who(was['model'], was['system_fingerprint'])} -> {who(first['model'], first['system_fingerprint'])})")


def canary_text(c: dict) -> str:
    """The canary's part of the summary: its checks, its agreement at the start and last, and the drift it saw."""
    def pct(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.0%}"

    text = (f"{c['rows']} rows, {c['checks']} checks after the start; agreement with its verdicts {pct(c['agreement_start'])} at "
            f"the start, {pct(c['agreement_last'])} at the last check")
    d = c.get("drift")
    if d:
        text += (f"; the judge changed at check {d['check']} ({pct(d['agreement_start'])} -> {pct(d['agreement_now'])}, "
                 f"p = {d['p']:.2g})" + (f", {c['flagged_rows']} rows flagged drift" if c["on_drift"] == "flag" else ""))
    if c.get("cached_other_judge"):
        text += f"; {c['cached_other_judge']} cached rows were served by another model or fingerprint than the canary's"
    return text


def print_pairwise(s: PairwiseRunSummary, output: Path, console: Console) -> None:
    r, st = s.results, s.stats
    u = st.usage
    console.print(f"pairs {r.rows} ({r.ok} judged, {r.errors} errors) -> {output}")
    console.print("winners " + (", ".join(f"{k}: {v}" for k, v in r.winners.items()) or "-")
                  + "; decided by " + (", ".join(f"{k} {v}" for k, v in r.decided_by.items()) or "-")
                  + (f"; {r.one_order} scored from one readable order" if r.one_order else ""))
    if r.agreement is not None:
        console.print(f"orders agree on {r.agreement:.1%} of pairs")
    report = r.report
    if report is not None and report.acc is not None and report.agr is not None:
        console.print(f"Acc {report.acc * 100:.1f} / Agr {report.agr * 100:.1f}  (against column {r.label_column!r}, LLMBar's convention)")
    console.print(f"parse failures {r.parse_failure_rate:.1%}; requests {u.requests} sent, {st.cache_hits} cache hits; "
                  f"tokens {u.prompt_tokens} prompt + {u.completion_tokens} completion"
                  + (f" ({u.reasoning_tokens} reasoning)" if u.reasoning_tokens else "") + f"; {st.wall_s:.2f} s")
    for example in r.error_examples:
        console.print(f"  {example}", style="red", markup=False)
