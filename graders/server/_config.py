"""``configs/config.yaml``: seed 001's keys plus gradekit's ``reward.grader``.

.. code-block:: yaml

    server:
      port: 8000                 # default 8000; 0 picks a free port
      host: 127.0.0.1            # default loopback; 0.0.0.0 to serve other machines
      auth_token: null           # or env GRADEKIT_SERVER_TOKEN: bearer token on every route but /health
      graceful_timeout: 30       # seconds SIGTERM waits for in-flight requests
      max_body_bytes: 10485760   # a larger body is 413, refused before it is read (10 MiB)
      body_timeout_s: 10         # a body that has not arrived by then is 408; no worker is held meanwhile
      request_timeout_s: 120     # a reward not ready by then is 504 with no reward, so a training step never hangs
      header_timeout_s: 10       # a connection whose request headers are not in by then is closed (slow clients)
      max_connections: 512       # open connections; past it the longest-waiting idle one is closed, else 503
    openrlhf:
      end_tokens: [...]          # special tokens cut off the end of /get_reward's response (default: the
                                 # common chat templates' end-of-turn/end-of-text tokens); [] keeps them
    reward:
      class: "implementations.default_reward:DefaultRewardComputer"   # or "path/file.py:Class"; the seed's
                                 # core.base_reward / core.models imports work unchanged; without class
                                 # and grader: DefaultRewardComputer (exact match against extra_params.answer)
      # grader: grader.yaml      # instead of class: any gradekit grader file (relative to this file)
      # invalid: fail            # with grader: what an invalid sample answers (fail | zero)
    health_check:
      function: "custom_module:custom_health_check"   # optional; else the computer's health_check()
    logging:
      enable: true               # one log line per request: route, status, outcome, latency
    thread_pool:
      max_workers: 64            # computations at once (threads, or a semaphore for async computers)
      queue_size: 256            # requests allowed to wait; beyond it: 503 with Retry-After
      isolation: null            # a reward.class's plain def: process (default; a hung call is killed) | thread
    group:                       # the group routes (DashScope group_reward, OpenRLHF's batch by prompt)
      on_member_error: renormalize   # renormalize | drop_group | retry (graders._members)
      min_members: 2
      group_deadline_s: null     # members not graded by then fail as timeout
    canary:                      # optional: rows with known verdicts, asked every every_s seconds (docs/align.md)
      file: canary.jsonl         # the rubric's variables and a label column (relative to this file)
      rubric: semantic_equivalence_en   # or a .yaml path relative to this file
      every_s: 300               # alpha: 0.05; on_drift: report (only /metrics, /stats, a log line) | fail
    hedge: null                  # true | false | {max_extra: 0.1, min_samples: 20, quantile: 0.95, median_factor: 2}:
                                 # hedged judge requests over a fleet (the grader file's judge.endpoints); overrides
                                 # the grader file's judge.hedge (default: on for a fleet); --hedge/--no-hedge win
    limiter:                     # the process's judge limiter (gradekit's own, not in the seed)
      rps: null
      tpm: null
      concurrency: null          # default: thread_pool.max_workers
      url: null                  # redis://host:port/db: replicas share rps/tpm (default: $GRADEKIT_LIMITER, else this process)
      key: default               # the shared budget's name in Redis

A key set to nothing (every line under it commented out, as in the seed's file) means its defaults.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from gradekit.judge import configure_limiter
from gradekit.judge._hedge import HedgePolicy
from gradekit.judge._files import read_data_file
from gradekit.judge._spec import JudgeSpec

from .._config import FileJudge, GraderConfigError, JudgeSettings, load_grader, load_group_members
from .._members import GroupPolicy
from ._computers import (
    BaseRewardComputer,
    DefaultRewardComputer,
    GraderRewardComputer,
    load_object,
)
from ._models import END_TOKENS


class ServerConfigError(ValueError):
    """The server config is wrong; the message names the file and the key at fault."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class ServerSection(_Section):
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    auth_token: str | None = None
    graceful_timeout: float = Field(30.0, gt=0)
    max_body_bytes: int = Field(10 * 1024 * 1024, ge=1)
    body_timeout_s: float = Field(10.0, gt=0)
    request_timeout_s: float = Field(120.0, gt=0)
    header_timeout_s: float = Field(10.0, gt=0)
    max_connections: int = Field(512, ge=1)


class OpenRLHFSection(_Section):
    end_tokens: list[str] = Field(default_factory=lambda: list(END_TOKENS))


class RewardSection(_Section):
    class_: str | None = Field(None, alias="class")
    grader: str | None = None
    invalid: Literal["fail", "zero"] | None = None

    @model_validator(mode="after")
    def _one(self) -> RewardSection:
        if self.class_ is not None and self.grader is not None:
            raise ValueError("give one of reward.class (a BaseRewardComputer) and reward.grader (a grader file), not both")
        if self.invalid is not None and self.grader is None:
            raise ValueError("reward.invalid applies to reward.grader; a reward.class sets its own policy")
        return self


class HealthCheckSection(_Section):
    function: str | None = None


class LoggingSection(_Section):
    enable: bool = True


class ThreadPoolSection(_Section):
    # A judge-backed grader mostly waits on the network, so 64 concurrent grades cost little.
    max_workers: int = Field(64, gt=0)
    queue_size: int = Field(256, ge=0)
    # Where a plain ``def compute_reward`` runs: ``process`` (a forked worker per slot, killed and replaced
    # when its call passes server.request_timeout_s) or ``thread``. Default: process for a reward.class.
    isolation: Literal["process", "thread"] | None = None


class LimiterSection(_Section):
    rps: float | None = Field(None, gt=0)
    tpm: float | None = Field(None, gt=0)
    concurrency: int | None = Field(None, ge=1)
    url: str | None = None  # redis://host:port/db: replicas share rps/tpm (else $GRADEKIT_LIMITER, else in-process)
    key: str = "default"  # the shared budget's name in Redis


class CanarySection(_Section):
    """A canary (docs/align.md#a-canary): rows with known verdicts the grader's judge is asked on a schedule."""

    file: str  # rows with the rubric's variables and a known verdict (relative to this file)
    rubric: str  # the rubric they are asked with: a shipped name or a .yaml path (relative to this file)
    label_column: str = "label"
    map: dict[str, str] = Field(default_factory=dict)  # rubric variable -> column
    every_s: float = Field(300.0, gt=0)
    alpha: float = Field(0.05, gt=0, lt=1)  # the chance a judge that did not change is reported changed, over every check
    on_drift: Literal["report", "fail"] = "report"  # fail: every reward after the change answers fail, error_kind drift


class ServerConfig(_Section):
    """The whole file; every section is optional except ``reward`` when serving from a file."""

    server: ServerSection = ServerSection()
    reward: RewardSection | None = None
    health_check: HealthCheckSection = HealthCheckSection()
    logging: LoggingSection = LoggingSection()
    thread_pool: ThreadPoolSection = ThreadPoolSection()
    limiter: LimiterSection = LimiterSection()
    openrlhf: OpenRLHFSection = OpenRLHFSection()
    # The group routes' keys (graders._members); a reward.grader of type: group brings its own.
    group: GroupPolicy = GroupPolicy()
    # Hedged judge requests (judge._hedge) for the grader file's judge when it is a fleet; None: the file's judge.hedge.
    hedge: bool | HedgePolicy | None = None
    canary: CanarySection | None = None  # the grader's judge asked a canary on a schedule; its drift in /metrics
    _source: Path | None = PrivateAttr(default=None)

    @field_validator("server", "health_check", "logging", "thread_pool", "limiter", "openrlhf", "group", mode="before")
    @classmethod
    def _empty_section(cls, v: Any) -> Any:
        return {} if v is None else v

    @field_validator("reward", mode="before")
    @classmethod
    def _empty_reward(cls, v: Any) -> Any:
        return {} if v is None else v

    @property
    def source(self) -> str:
        return str(self._source) if self._source else "server config"

    @property
    def base(self) -> Path | None:
        """The folder relative paths in the file are read from."""
        return self._source.parent if self._source else None


def _problems(e: ValidationError) -> str:
    parts = []
    for err in e.errors():
        loc = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts)


def parse_server_config(data: Any, source: Path | None = None) -> ServerConfig:
    where = str(source) if source else "server config"
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ServerConfigError(f"{where}: the config must be a mapping of sections, got {type(data).__name__}")
    try:
        config = ServerConfig.model_validate(data)
    except ValidationError as e:
        raise ServerConfigError(f"{where}: {_problems(e)}") from None
    config._source = source.resolve() if source else None
    return config


def load_server_config(path: str | Path) -> ServerConfig:
    """Read and validate a server config file (without ``reward.class`` or ``reward.grader`` it
    serves the default computer, as Bailian's service does)."""
    path = Path(path)
    try:
        data = read_data_file(path, "server config")
    except ValueError as e:
        raise ServerConfigError(str(e)) from e
    return parse_server_config(data, path)


def build_computer(config: ServerConfig) -> BaseRewardComputer:
    """The computer ``reward`` names, built after the process's judge limiter is configured
    (every judge of the process shares it; its concurrency defaults to the worker count)."""
    reward = config.reward or RewardSection()
    lim = config.limiter
    try:
        configure_limiter(rps=lim.rps, tpm=lim.tpm, concurrency=lim.concurrency or config.thread_pool.max_workers,
                          url=lim.url or os.environ.get("GRADEKIT_LIMITER") or None, key=lim.key)
    except (ValueError, ConnectionError) as e:  # a bad URL or a Redis that does not answer: before serving
        raise ServerConfigError(f"{config.source}: limiter: {e}") from e
    if reward.grader is not None:
        path = Path(reward.grader)
        if not path.is_absolute() and config.base is not None:
            path = config.base / path
        judge = None
        if config.hedge is not None:
            server = JudgeSpec(hedge=config.hedge)  # the server config's layer, over the grader file's judge (and every juror)

            def made(settings: JudgeSettings | None) -> Any:
                return (server if settings is None else settings.spec().merge(server)).build()

            judge = FileJudge(made)
        try:
            if _is_group_file(path):
                grader, policy = load_group_members(path, judge=judge)
                if "group" not in config.model_fields_set:
                    config.group = policy
            else:
                grader = load_grader(path, judge=judge)
        except (GraderConfigError, ValueError, OSError) as e:
            raise ServerConfigError(f"{config.source}: reward.grader: {e}") from e
        return GraderRewardComputer(grader, invalid=reward.invalid or "fail", name=path.stem)
    if reward.class_ is None:
        return DefaultRewardComputer()
    try:
        factory = load_object(reward.class_, base=config.base)
    except ValueError as e:
        raise ServerConfigError(f"{config.source}: reward.class: {e}") from e
    if not callable(factory):
        raise ServerConfigError(f"{config.source}: reward.class: {reward.class_!r} is not a class")
    try:
        computer = factory()
    except Exception as e:
        raise ServerConfigError(f"{config.source}: reward.class: {reward.class_}() raised {type(e).__name__}: {e}") from e
    if not callable(getattr(computer, "compute_reward", None)):
        raise ServerConfigError(f"{config.source}: reward.class: {reward.class_!r} has no compute_reward method; "
                                "subclass graders.BaseRewardComputer")
    return computer  # type: ignore[no-any-return]


def _is_group_file(path: Path) -> bool:
    """A ``type: group`` grader file: its ``grader:`` node grades each member, its keys decide the groups."""
    try:
        data = read_data_file(path, "grader config")
    except ValueError:
        return False  # load_grader says what is wrong with it
    return isinstance(data, dict) and data.get("type") == "group"


def load_health_check(config: ServerConfig) -> Any:
    """The ``health_check.function`` callable, or None."""
    spec = config.health_check.function
    if spec is None:
        return None
    try:
        fn = load_object(spec, base=config.base)
    except ValueError as e:
        raise ServerConfigError(f"{config.source}: health_check.function: {e}") from e
    if not callable(fn):
        raise ServerConfigError(f"{config.source}: health_check.function: {spec!r} is not callable")
    return fn
