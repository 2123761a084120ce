"""Which limiter a process uses: built from a URL, and the one process-wide limiter every Judge shares.

Kept apart from the limiter implementations so that each of them (in-process, Redis) imports
only what it needs and none imports another through this choice.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from typing import Any

from ._limiter import Limiter, RequestLimiter


def limiter_from_url(
    url: str | None,
    *,
    rps: float | None = None,
    tpm: float | None = None,
    concurrency: int = 16,
    burst: float = 2.0,
    key: str = "default",
    adapt: bool = True,
) -> RequestLimiter:
    """Build the limiter a URL names: in-process by default, shared through Redis or Ray on request.

    Args:
        url: None or ``memory://`` for the in-process :class:`Limiter`; ``redis://host:port/db``
            (also ``rediss://``, ``redis+unix://``) for a :class:`SharedLimiter`; ``ray`` for a
            :class:`RayLimiter`, one limiter actor for the Ray cluster this process is part of.
        rps: requests per second (for all processes together when shared).
        tpm: tokens per minute (likewise).
        concurrency: requests in flight at once, always per process.
        burst: per-process pacing bucket in requests.
        key: names the shared budget; processes share only when URL, key, rps and tpm agree.
            Ignored in memory.
        adapt: pace to the limit the provider's replies show (rate-limit headers, 429s) below
            ``rps``, or without it; False (``limits.adapt``) paces to ``rps``/``tpm`` only.
            Shared through Redis, the learnt rate is one for every process with the same key.

    Raises:
        ValueError: an unknown URL scheme or a bad limit.
        ConnectionError: Redis does not answer a PING; the message names the URL (password hidden).
            Or the Ray limiter actor cannot be reached. Checked here, when the limiter is built,
            so a run fails before its first request.
    """
    if url is None or url.strip() in ("", "memory://"):
        return Limiter(rps=rps, tpm=tpm, concurrency=concurrency, burst=burst, adapt=adapt)
    if url.strip() in ("ray", "ray://"):
        from ._ray_limiter import RayLimiter  # Ray loads only when asked for

        ray_limiter = RayLimiter(rps=rps, tpm=tpm, concurrency=concurrency, burst=burst, key=key, adapt=adapt)
        ray_limiter.check()
        return ray_limiter
    from ._shared_limiter import SharedLimiter  # Redis support loads only when asked for

    limiter = SharedLimiter(url, rps=rps, tpm=tpm, concurrency=concurrency, burst=burst, key=key, adapt=adapt)
    limiter.check()
    return limiter


_process_limiter: RequestLimiter | None = None


def configure_limiter(rps: float | None = None, tpm: float | None = None, concurrency: int = 16, *,
                      url: str | None = None, key: str = "default", adapt: bool = True) -> RequestLimiter:
    """Set the process-wide limiter that every Judge without an explicit one shares.

    ``url`` (``redis://host:port/db``) shares the rates with other processes through Redis, as
    ``gradekit grade --limiter`` does; ``url="ray"`` shares them with every process of the Ray
    cluster through one limiter actor; ``key`` names that shared budget. ``adapt=False`` keeps to
    the told rates only (see :func:`limiter_from_url`).
    """
    global _process_limiter
    if url is None:
        _process_limiter = Limiter(rps=rps, tpm=tpm, concurrency=concurrency, adapt=adapt)
    else:
        _process_limiter = limiter_from_url(url, rps=rps, tpm=tpm, concurrency=concurrency, key=key, adapt=adapt)
    return _process_limiter


def process_limiter() -> RequestLimiter:
    """The process-wide limiter (ARCHITECTURE: every request of a process passes one limiter).

    Unless configured, it is built from the environment the CLI reads too: ``GRADEKIT_LIMITER``
    (``redis://...`` or ``ray``), ``GRADEKIT_RPS``, ``GRADEKIT_TPM``, ``GRADEKIT_CONCURRENCY`` and
    ``GRADEKIT_LIMITER_KEY``. That is how reward workers a platform starts (verl, OpenRLHF on
    Ray) share one limit without a line of their own code.
    """
    global _process_limiter
    if _process_limiter is None:
        _process_limiter = _limiter_from_env()
    return _process_limiter


def _limiter_from_env() -> RequestLimiter:
    import os

    env = os.environ
    if not any(env.get(name) for name in ("GRADEKIT_LIMITER", "GRADEKIT_RPS", "GRADEKIT_TPM", "GRADEKIT_CONCURRENCY")):
        return Limiter()
    rps, tpm = env.get("GRADEKIT_RPS"), env.get("GRADEKIT_TPM")
    return limiter_from_url(env.get("GRADEKIT_LIMITER") or None, rps=float(rps) if rps else None, tpm=float(tpm) if tpm else None,
                            concurrency=int(env.get("GRADEKIT_CONCURRENCY") or 16), key=env.get("GRADEKIT_LIMITER_KEY") or "default")


_SIBLINGS: weakref.WeakKeyDictionary[Any, dict[tuple[str, float | None, float | None], RequestLimiter]] = weakref.WeakKeyDictionary()
_SIBLINGS_LOCK = threading.Lock()


def endpoint_limiter(template: RequestLimiter, endpoint: str, *, rps: float | None = None, tpm: float | None = None) -> RequestLimiter:
    """The limiter of one endpoint of a fleet, built like ``template`` (same backend, concurrency, burst, adapt).

    Each endpoint has its own: its own learnt rate, its own Retry-After holds, and (through Redis or
    Ray) its own shared budget, named ``{template key}@{endpoint}``, so every process learns one
    rate per endpoint. ``rps``/``tpm`` are the endpoint's told limits (default: the template's).
    Judges built on the same template share each endpoint's limiter, as they share the template.
    """
    from ._limiter import Limiter

    wanted = (endpoint, rps, tpm)
    with _SIBLINGS_LOCK:
        found = _SIBLINGS.setdefault(template, {}).get(wanted)
        if found is not None:
            return found
    rps = rps if rps is not None else getattr(template, "rps", None)
    tpm = tpm if tpm is not None else getattr(template, "tpm", None)
    pacer = getattr(template, "pacer", None)
    adapt = pacer.adapt if pacer is not None else True
    concurrency, burst = template.concurrency, getattr(template, "burst", 2.0)
    built: RequestLimiter
    if isinstance(template, Limiter):
        sleep = template._sleep if template._sleep is not asyncio.sleep else None
        built = Limiter(rps=rps, tpm=tpm, concurrency=concurrency, burst=burst, sleep=sleep, adapt=adapt, clock=template._clock)
    elif type(template).__name__ == "SharedLimiter":
        from ._shared_limiter import SharedLimiter

        built = SharedLimiter(template.url, rps=rps, tpm=tpm, concurrency=concurrency, burst=burst,  # type: ignore[attr-defined]
                              key=f"{template.key}@{endpoint}", adapt=adapt)  # type: ignore[attr-defined]
    elif type(template).__name__ == "RayLimiter":
        from ._ray_limiter import RayLimiter

        built = RayLimiter(rps=rps, tpm=tpm, concurrency=concurrency, burst=burst, key=f"{template.key}@{endpoint}",  # type: ignore[attr-defined]
                           lease_s=template.lease_s, actor_name=template.actor_name, namespace=template.namespace,  # type: ignore[attr-defined]
                           adapt=adapt)
    else:
        raise ValueError(f"a fleet needs one limiter per endpoint and cannot build one like {type(template).__name__}: "
                         "pass a Limiter, SharedLimiter or RayLimiter")
    with _SIBLINGS_LOCK:
        return _SIBLINGS[template].setdefault(wanted, built)
