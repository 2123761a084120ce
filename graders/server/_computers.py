"""Reward computers: the seed's BaseRewardComputer, and GraderRewardComputer serving any grader.

A computer answers one RewardRequest with one RewardResponse. ``compute_reward`` may be a plain
``def`` (the server runs it on its thread pool, so blocking code is fine) or an ``async def``
(run on the event loop, bounded by a semaphore; it must not block).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import sys
import types
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from .._atif import TrajectoryError, split_conversation, trajectory_messages
from .._sample import Grade, Grader, Message, Sample, aclose_grader
from ._models import RewardRequest, RewardResponse

InvalidPolicy = Literal["fail", "zero"]


class BaseRewardComputer(ABC):
    """Bailian's reward computer base class (seed 001); subclass it and name it in ``reward.class``."""

    @abstractmethod
    def compute_reward(self, request: RewardRequest) -> RewardResponse | Awaitable[RewardResponse]:
        """Score one request; a failure is ``status="fail"`` with a ``detail``, never a made-up score."""

    def health_check(self) -> dict[str, Any]:
        """What ``GET /health`` reports; ``status`` other than ``healthy`` answers 503."""
        return {"status": "healthy"}


class GraderRewardComputer(BaseRewardComputer):
    """Serves a gradekit grader: request -> Sample -> Grade -> response.

    Subclass it to change one step (``to_sample``, ``to_response``) or to build the grader in
    ``__init__``; ``compute_reward`` is async because graders are.

    Args:
        grader: any ``async (Sample) -> Grade``.
        invalid: what an ``invalid`` grade (the sample cannot be graded this way: a missing
            reference, a python grader that raised) answers. ``fail`` (default): a failure,
            like a judge error, so a broken row or grader shows up at the first step instead
            of training on a number nobody chose; ``zero``: success with score 0 (OpenAI's
            choice for invalid samples), for datasets where some rows knowingly lack a reference.
        name: reported by the health check; the grader's ``__name__`` by default.
    """

    def __init__(self, grader: Grader, *, invalid: InvalidPolicy = "fail", name: str | None = None) -> None:
        if invalid not in ("fail", "zero"):
            raise ValueError(f"invalid must be 'fail' or 'zero', got {invalid!r}")
        self.grader = grader
        self.invalid: InvalidPolicy = invalid
        self.name = name or getattr(grader, "__name__", type(grader).__name__)

    def to_sample(self, request: RewardRequest) -> Sample:
        """messages (or the prompt as one user message) + response + references = extra_params;
        ``metadata`` and unknown request fields become sample metadata."""
        prompt = request.prompt
        messages: list[Message] | str = request.messages if request.messages is not None else (prompt if prompt is not None else [])
        extra = dict(request.model_extra or {})
        rollout = extra.pop("trajectory", None)
        metadata = {**extra, **(request.metadata or {})}
        response = request.response_messages if request.response_messages else request.response
        if rollout is not None:  # a whole rollout (chat messages with tool calls, or an ATIF document): prompt and response from it
            conversation = [Message.model_validate(m) for m in trajectory_messages(rollout)]
            head, tail = split_conversation(conversation)
            messages = [*(messages if isinstance(messages, list) else []), *head] if head or not messages else messages
            response = tail or response
        return Sample(messages=messages, response=response, references=dict(request.extra_params), metadata=metadata)

    def to_response(self, grade: Grade, request: RewardRequest) -> RewardResponse:
        """ok -> success with the score; invalid -> the ``invalid`` policy; error -> fail."""
        info: dict[str, Any] = {"grade_status": grade.status}
        if grade.metrics:
            info["metrics"] = dict(grade.metrics)
        if grade.parts:
            info["parts"] = {name: part.score for name, part in grade.parts.items()}
        if grade.error_kind:
            info["error_kind"] = grade.error_kind
        if grade.columns.get("decided_by"):  # a hybrid grader: the symbolic check or the judge
            info["decided_by"] = grade.columns["decided_by"]
        if grade.status == "ok":
            assert grade.score is not None
            return RewardResponse(score=grade.score, status="success", extra_info=info)
        if grade.status == "invalid" and self.invalid == "zero":
            return RewardResponse(score=0.0, status="success", detail=f"invalid sample scored 0: {grade.error}", extra_info=info)
        return RewardResponse(score=0.0, status="fail", detail=grade.error or f"grade status {grade.status}", extra_info=info)

    async def compute_reward(self, request: RewardRequest) -> RewardResponse:
        try:
            sample = self.to_sample(request)
        except (TrajectoryError, ValidationError) as e:  # a trajectory that cannot be read: that request's failure, said
            grade = Grade.failed("invalid", f"the request's trajectory cannot be read: {e}", error_kind="input")
            return self.to_response(grade, request)
        grade = await self.grader(sample)
        return self.to_response(grade, request)

    def health_check(self) -> dict[str, Any]:
        return {"status": "healthy", "grader": self.name}

    async def aclose(self) -> None:
        """Release the grader's resources (its judge, python workers)."""
        await aclose_grader(self.grader)


class DefaultRewardComputer(BaseRewardComputer):
    """What a config without ``reward.class`` serves, as Bailian's service does: 1.0 when the
    response, trimmed, equals the row's reference (``extra_params`` key ``answer``, else
    ``solution``, ``ground_truth`` or ``label``), else 0.0; a row without one fails, naming the keys."""

    KEYS = ("answer", "solution", "ground_truth", "label")

    def compute_reward(self, request: RewardRequest) -> RewardResponse:
        key = next((k for k in self.KEYS if request.extra_params.get(k) is not None), None)
        if key is None:
            return RewardResponse(status="fail", detail=f"extra_params has none of {', '.join(self.KEYS)}: nothing to compare the response with",
                                  extra_info={"grade_status": "invalid"})
        match = request.response.strip() == str(request.extra_params[key]).strip()
        return RewardResponse(score=1.0 if match else 0.0, status="success", extra_info={"reference_key": key})

    def health_check(self) -> dict[str, Any]:
        return {"status": "healthy", "message": "default reward computer (exact match against extra_params)"}


# ---- "module.path:Name", "pkg.mod.Name" and "path/file.py:Name" ---------------------------------


@contextlib.contextmanager
def seed_modules() -> Iterator[None]:
    """Bailian's ``core.base_reward`` and ``core.models`` while a user's file is imported.

    Seed 001's reward classes start with ``from core.base_reward import BaseRewardComputer`` and
    ``from core.models import RewardRequest, RewardResponse``: the modules of Bailian's own
    service. They are provided for the import only and removed after it, so no top-level ``core``
    package is installed; a project that has its own importable ``core`` keeps it.
    """
    if "core" in sys.modules or importlib.util.find_spec("core") is not None:
        yield
        return
    core = types.ModuleType("core", "Bailian's reward service modules, as gradekit provides them while importing a reward class.")
    core.__path__ = []  # a package, so that its submodules import
    base = types.ModuleType("core.base_reward")
    base.BaseRewardComputer = BaseRewardComputer  # type: ignore[attr-defined]
    models = types.ModuleType("core.models")
    models.RewardRequest, models.RewardResponse = RewardRequest, RewardResponse  # type: ignore[attr-defined]
    core.base_reward, core.models = base, models  # type: ignore[attr-defined]
    added = {"core": core, "core.base_reward": base, "core.models": models}
    sys.modules.update(added)
    try:
        yield
    finally:
        for name, module in added.items():
            if sys.modules.get(name) is module:
                del sys.modules[name]


def _import_file(path: Path) -> Any:
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:8]
    name = f"gradekit_user_{path.stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    # The file's own folder goes on sys.path so it can import its siblings, as when run as a script.
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def load_object(spec: str, *, base: Path | None = None) -> Any:
    """The object a class path names: ``module.path:Name`` (seed 001), ``pkg.mod.Name`` or
    ``path/file.py:Name`` (DashScope). Modules are found from the current directory, ``base`` (the
    config file's folder) and its parent (the seed keeps ``configs/`` beside the code); files
    relative to ``base`` first, then its parent, then the current directory. A seed-001 file's
    ``from core.base_reward import ...`` / ``from core.models import ...`` work (:func:`seed_modules`).

    Raises:
        ValueError: the path is malformed, or names nothing importable (the message says which).
    """
    where, sep, attr = spec.rpartition(":")
    if not sep or "/" in attr or "\\" in attr:  # no colon (or only a drive letter's): dotted form
        where, _, attr = spec.rpartition(".")
    if not where or not attr or not attr.isidentifier():
        raise ValueError(f"{spec!r} is not 'module.path:Name', 'pkg.module.Name' or 'path/file.py:Name'")
    is_file = where.endswith(".py") or "/" in where or "\\" in where
    if not is_file:
        for folder in [Path.cwd(), *((base, base.parent) if base else ())]:
            if str(folder) not in sys.path:
                sys.path.append(str(folder))
    try:
        with seed_modules():
            module = _import_path(spec, where, base) if is_file else importlib.import_module(where)
    except ValueError:
        raise
    except Exception as e:  # the user's module may raise anything while importing
        raise ValueError(f"{spec!r}: cannot import {where}: {type(e).__name__}: {e}") from e
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ValueError(f"{spec!r}: {where} has no {attr!r}") from None


def _import_path(spec: str, where: str, base: Path | None) -> Any:
    folders = (base, base.parent, Path.cwd()) if base else (Path.cwd(),)  # the seed keeps configs/ beside the code
    candidates = [Path(where)] if Path(where).is_absolute() else [p / where for p in folders]
    path = next((c.resolve() for c in candidates if c.is_file()), None)
    if path is None:
        raise ValueError(f"{spec!r}: no file {where} (looked in {', '.join(str(c.parent) for c in candidates)})")
    return _import_file(path)
