"""What a grader or a run needs of a judge, said once: a Judge, a Jury and a Cascade each implement it.

A run asks a judge five things: judge this row (``judge``), how many rows to keep in flight
(``concurrency``), which output columns its verdicts' ``panel`` fills (``panel_columns``), who it is for the checkpoint (``identity``: a resume with another judge or
another panel is refused), how its traffic went (``stats``: endpoints, limiter waits, pacing and a
panel's figures per member) and to let go of its connections (``aclose``). ``model`` names it in
summaries and errors. Nothing else is read off a judge, so a panel never poses as a Judge.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from ._fleet import EndpointStats
    from ._pacing import Pacing
    from ._rubric import Rubric
    from ._verdict import Verdict


class JudgeIdentity(BaseModel):
    """What a checkpoint records of a judge (the run redacts ``base_url``); a panel's names its members."""

    model_config = ConfigDict(frozen=True)

    model: str
    base_url: str | None = None  # a Jury's or a Cascade's: its members', space-separated
    sampling: dict[str, Any] = {}  # the judge parameters; a panel's: its members', its rule and settings
    logprobs: int | None = None


class MemberUsage:
    """Rows, requests and tokens per member of a Jury or a Cascade in this process, for the run's summary."""

    FIELDS = ("rows", "requests", "prompt_tokens", "completion_tokens", "cached_tokens", "cache_write_tokens", "cache_hits")

    def __init__(self) -> None:
        self.by_model: dict[str, dict[str, int]] = {}  # by member: its model, or "model #i" for a model two jurors share
        self.models: dict[str, str] = {}  # member name -> its model (for prices)

    def add(self, model: str, verdict: Verdict, member: str | None = None) -> None:
        member = member or model
        self.models[member] = model
        figures = self.by_model.setdefault(member, dict.fromkeys(self.FIELDS, 0))
        figures["rows"] += 1
        figures["requests"] += verdict.usage.requests
        figures["prompt_tokens"] += verdict.usage.prompt_tokens
        figures["completion_tokens"] += verdict.usage.completion_tokens
        figures["cached_tokens"] += verdict.usage.cached_tokens
        figures["cache_write_tokens"] += verdict.usage.cache_write_tokens
        figures["cache_hits"] += int(verdict.cached)


@dataclass(frozen=True)
class JudgeStats:
    """How a judge's traffic went so far in this process."""

    endpoints: list[EndpointStats] = field(default_factory=list)  # every endpoint, a panel's members' in order
    held_seconds: float = 0.0  # seconds its limiters held requests
    pacing: Pacing | None = None  # a Judge's (a fleet's: summed); None for a panel, whose members pace apart
    members: MemberUsage | None = None  # a Jury's or a Cascade's figures per member; None for a single Judge


class JudgeProtocol(Protocol):
    """What every grader and run takes: a :class:`~judge.Judge`, a :class:`~judge.Jury` or a :class:`~judge.Cascade`."""

    # The PanelInfo fields its verdicts fill, each an output column of a run: () for a single Judge.
    panel_columns: tuple[str, ...]

    @property
    def model(self) -> str: ...

    @property
    def concurrency(self) -> int: ...

    async def judge(self, rubric: Rubric, row: Mapping[str, Any]) -> Verdict: ...

    async def aclose(self) -> None: ...

    def identity(self) -> JudgeIdentity: ...

    def stats(self) -> JudgeStats: ...
