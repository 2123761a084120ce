"""``GET /metrics`` (Prometheus text format, ``prometheus-client``) and ``GET /stats`` (reward times).

Families, each on the app's own registry (two apps in one process never share counts):

====================================  =====================================================
``gradekit_requests_total``           HTTP requests by ``route`` and ``status`` code
``gradekit_request_seconds``          request latency histogram by ``route``
``gradekit_rewards_total``            rewards by ``status`` (success, fail) and ``error_kind``
``gradekit_reward_seconds``           per-sample reward time histogram (one per computed reward)
``gradekit_judge_requests_total``     judge requests by ``endpoint`` and ``outcome`` (ok, rate_limited, error)
``gradekit_limiter_wait_seconds_total``  seconds the judge's limiters held requests (Retry-After, pacing)
``gradekit_breaker_state``            per judge endpoint: 0 up, 1 probing, 2 down
``gradekit_in_flight``                requests admitted and not yet answered
``gradekit_judge_hedges_total``      hedged judge requests by ``endpoint`` (where the hedge went) and ``outcome``
                                      (sent; won: answered first; lost: cancelled or failed)
``gradekit_hedges_sent_total``,       hedges sent and won over every judge of the server
``gradekit_hedges_won_total``
``gradekit_canary_checks_total``      with ``canary:`` in the config: checks compared with the start
``gradekit_canary_agreement``         the canary's agreement with its known verdicts, by ``check`` (start, last)
``gradekit_canary_drift``             1 once a check saw the judge change, else 0
``gradekit_canary_failed_checks_total``  checks that could not run (no canary row got a verdict)
``gradekit_canary_last_check_timestamp_seconds``  when the last check ran (Unix time)
====================================  =====================================================

Route labels are the server's fixed routes (anything else is ``other``), so a scanner cannot grow
the label set; an endpoint label is its URL with any user-info, query and fragment removed, so a
key in a URL never reaches a metric.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.responses import JSONResponse, Response

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, float("inf"))
BREAKER = {"up": 0.0, "probing": 1.0, "down": 2.0}
SLOWEST = 10


def safe_endpoint(url: str) -> str:
    """The URL without user-info, query or fragment (no credential reaches a label)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "invalid-url"
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _judges(computer: Any) -> list[Any]:
    """The judges the computer's grader made (a config's judge is built on first need)."""
    found: list[Any] = []
    grader = getattr(computer, "grader", None)
    for candidate in (getattr(getattr(grader, "_builder", None), "made_judge", None), getattr(grader, "judge", None),
                      getattr(computer, "judge", None)):
        if candidate is not None and callable(getattr(candidate, "stats", None)) and all(candidate is not j for j in found):
            found.append(candidate)
    return found


class RewardTimes:
    """Per-sample reward times: all of them for p50/p99 (bounded: the newest 100,000), and the slowest ids."""

    def __init__(self, keep: int = 100_000) -> None:
        self.keep = keep
        self.seconds: list[float] = []
        self.slowest: list[tuple[float, str]] = []  # ascending by seconds, at most SLOWEST
        self.count = 0

    def add(self, seconds: float, sample_id: str) -> None:
        self.count += 1
        self.seconds.append(seconds)
        if len(self.seconds) > self.keep:
            del self.seconds[: len(self.seconds) - self.keep]
        bisect.insort(self.slowest, (seconds, sample_id))
        if len(self.slowest) > SLOWEST:
            del self.slowest[0]

    def quantile(self, q: float) -> float | None:
        if not self.seconds:
            return None
        ordered = sorted(self.seconds)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def report(self) -> dict[str, Any]:
        p50, p99 = self.quantile(0.5), self.quantile(0.99)
        return {"rewards": self.count, "reward_seconds_p50": p50, "reward_seconds_p99": p99,
                "slowest": [{"id": sid, "seconds": round(s, 4)} for s, sid in reversed(self.slowest)]}


def sample_id(request: Any, seq: int) -> str:
    """A sample's id as the platform sent it (DashScope's request_metadata, Gym's response id), else a sequence number."""
    meta = {**(getattr(request, "model_extra", None) or {}), **(getattr(request, "metadata", None) or {})}
    for key in ("sample_id", "rollout_id", "response_id", "request_id", "trace_id", "id"):
        value = meta.get(key)
        if value is not None and isinstance(value, (str, int)):
            return str(value)
    return f"#{seq}"


def hedge_totals(computer: Any) -> dict[str, int]:
    """Hedged judge requests over the server's judges: sent, won (answered first), lost."""
    totals = {"sent": 0, "won": 0, "lost": 0}
    for judge in _judges(computer):
        for stats in judge.stats().endpoints:
            for outcome in totals:
                totals[outcome] += getattr(stats.hedges, outcome)
    return totals


class _CanaryCollector:
    """The server's canary (_canary.ServedCanary) as gauges and counters, read when /metrics is asked."""

    def __init__(self, canary: Any) -> None:
        self.canary = canary

    def collect(self) -> Iterator[Any]:
        report = self.canary.report()
        checks = CounterMetricFamily("gradekit_canary_checks", "Canary checks compared with the server's start")
        checks.add_metric([], report["checks"])
        agreement = GaugeMetricFamily("gradekit_canary_agreement", "The canary's agreement with its known verdicts",
                                      labels=["check"])
        for which in ("start", "last"):
            if report[f"agreement_{which}"] is not None:
                agreement.add_metric([which], report[f"agreement_{which}"])
        drift = GaugeMetricFamily("gradekit_canary_drift", "1 once a canary check saw the judge change")
        drift.add_metric([], 1.0 if report["drift"] is not None else 0.0)
        failed = CounterMetricFamily("gradekit_canary_failed_checks", "Canary checks that could not run")
        failed.add_metric([], report["failed_checks"])
        yield from (checks, agreement, drift, failed)
        if report["last_check"] is not None:
            last = GaugeMetricFamily("gradekit_canary_last_check_timestamp_seconds", "When the last canary check ran")
            last.add_metric([], report["last_check"])
            yield last


class _JudgeCollector:
    def __init__(self, computer: Any, pool: Any) -> None:
        self.computer, self.pool = computer, pool

    def collect(self) -> Iterator[Any]:
        requests = CounterMetricFamily("gradekit_judge_requests", "Judge requests by endpoint and outcome",
                                       labels=["endpoint", "outcome"])
        breaker = GaugeMetricFamily("gradekit_breaker_state", "Judge endpoint breaker: 0 up, 1 probing, 2 down", labels=["endpoint"])
        waits = CounterMetricFamily("gradekit_limiter_wait_seconds", "Seconds the judge limiters held requests")
        hedges = CounterMetricFamily("gradekit_judge_hedges", "Hedged judge requests by the endpoint they went to and outcome",
                                     labels=["endpoint", "outcome"])
        sent = won = 0
        held = 0.0
        for judge in _judges(self.computer):
            seen = judge.stats()
            for stats in seen.endpoints:
                endpoint = safe_endpoint(stats.base_url)
                requests.add_metric([endpoint, "ok"], stats.ok)
                requests.add_metric([endpoint, "rate_limited"], stats.rate_limited)
                requests.add_metric([endpoint, "error"], stats.errors)
                breaker.add_metric([endpoint], BREAKER.get(stats.state, 2.0))
                for outcome in ("sent", "won", "lost"):
                    hedges.add_metric([endpoint, outcome], getattr(stats.hedges, outcome))
                sent, won = sent + stats.hedges.sent, won + stats.hedges.won
            held += seen.held_seconds  # a Jury's or a Cascade's: its members' sum
        waits.add_metric([], held)
        yield requests
        yield breaker
        yield waits
        yield hedges
        total_sent = CounterMetricFamily("gradekit_hedges_sent", "Hedged judge requests sent")
        total_sent.add_metric([], sent)
        total_won = CounterMetricFamily("gradekit_hedges_won", "Hedged judge requests that answered first")
        total_won.add_metric([], won)
        yield total_sent
        yield total_won
        in_flight = GaugeMetricFamily("gradekit_in_flight", "Requests admitted and not yet answered")
        in_flight.add_metric([], float(self.pool.admitted))
        yield in_flight


def install_metrics(app: Any, engine: Any, computer: Any, canary: Any = None) -> RewardTimes:
    """``GET /metrics`` and ``GET /stats`` on the app; every reward the engine computes is counted and timed; a ``canary``
    (_canary.ServedCanary) is reported in both."""
    registry = CollectorRegistry(auto_describe=True)
    requests = Counter("gradekit_requests", "HTTP requests by route and status code", ["route", "status"], registry=registry)
    latency = Histogram("gradekit_request_seconds", "HTTP request latency by route", ["route"], buckets=BUCKETS, registry=registry)
    rewards = Counter("gradekit_rewards", "Rewards by status and error kind", ["status", "error_kind"], registry=registry)
    reward_seconds = Histogram("gradekit_reward_seconds", "Per-sample reward time", buckets=BUCKETS, registry=registry)
    registry.register(_JudgeCollector(computer, engine.pool))
    if canary is not None:
        registry.register(_CanaryCollector(canary))
    times = RewardTimes()
    compute = engine.compute
    seq = [0]

    async def metered(request: Any) -> Any:
        seq[0] += 1
        number = seq[0]
        started = time.perf_counter()
        try:
            response = await compute(request)
        except BaseException as e:
            from .._members import cut_at_deadline

            # A member cut at group_deadline_s is failed as a timeout (its route answers so), not a grader that raised.
            cut = cut_at_deadline(e)
            rewards.labels("timeout" if cut else "exception", "timeout" if cut else "exception").inc()
            raise
        seconds = time.perf_counter() - started
        reward_seconds.observe(seconds)
        times.add(seconds, sample_id(request, number))
        kind = "none" if response.status == "success" else str(response.extra_info.get("error_kind")
                                                              or response.extra_info.get("grade_status") or "unknown")
        rewards.labels(response.status, kind).inc()
        return response

    engine.compute = metered  # every route calls engine.compute; compute_all goes through it too

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/stats")
    async def stats() -> Response:
        return JSONResponse({**times.report(), "hedges": hedge_totals(computer),
                             **({"canary": canary.report()} if canary is not None else {})})

    # The app's own routes (every contract's, /health, these two) label themselves; any other path is "other", so a
    # scan of random paths cannot grow the label set.
    known = frozenset(path for route in app.router.routes if isinstance(path := getattr(route, "path", None), str))

    def observe(path: str, status: int, seconds: float) -> None:
        """One HTTP request, told by the server's outermost middleware (so a 503, 413 or 401 counts too)."""
        route = path if path in known else "other"
        latency.labels(route).observe(seconds)
        requests.labels(route, str(status or 500)).inc()  # no response started: the app raised

    app.state.observe_request = observe
    app.state.reward_times = times
    return times
