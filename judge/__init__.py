"""gradekit's judge core: rubric -> render -> judge model -> parse -> Verdict.

It knows nothing about datasets, trajectories or platforms; graders/ builds on it.
"""

from ._budget import Budget, ModelPrice, cost_usd, load_prices
from ._cache import JudgeCache, cache_key, default_cache_path
from ._client import Judge, build_request
from ._limiter import Limiter, configure_limiter, estimate_tokens, process_limiter
from ._normalize import normalize_label
from ._parse import ParseFailure, Parsed, match_label, parse_reply
from ._retry import RetryPolicy, is_transient, retry_after_seconds
from ._rubric import AskMode, Rubric, RubricError, RubricInputError, list_rubrics, load_rubric
from ._shared_limiter import SharedLimiter, limiter_from_url
from ._sync import SyncRunner
from ._verdict import ErrorKind, Verdict, clamp

__all__ = [
    "AskMode",
    "Budget",
    "ErrorKind",
    "Judge",
    "JudgeCache",
    "Limiter",
    "ModelPrice",
    "ParseFailure",
    "Parsed",
    "RetryPolicy",
    "Rubric",
    "RubricError",
    "RubricInputError",
    "SharedLimiter",
    "SyncRunner",
    "Verdict",
    "build_request",
    "cache_key",
    "clamp",
    "configure_limiter",
    "cost_usd",
    "default_cache_path",
    "estimate_tokens",
    "is_transient",
    "limiter_from_url",
    "list_rubrics",
    "load_prices",
    "load_rubric",
    "match_label",
    "normalize_label",
    "parse_reply",
    "process_limiter",
    "retry_after_seconds",
]
