"""gradekit's judge core: rubric -> render -> judge model -> parse -> Verdict.

It knows nothing about datasets, files or platforms; a trajectory is prompt material it renders
(numbered steps fitted into the judge's window). graders/ builds on it. Names load
on first use (``gradekit.judge._lazy``), so importing ``judge`` alone does not import openai.
"""

from ._lazy import lazy_names

__all__, __getattr__, __dir__ = lazy_names(__name__, {
    "._breaker": ["Breaker", "BreakerTripped"],
    "._budget": ["Budget", "ModelPrice", "cost_usd", "load_prices"],
    "._cache": ["JudgeCache", "cache_key", "default_cache_path"],
    "._cascade": ["Cascade", "CascadeSpec"],
    "._client": ["Judge", "build_request"],
    "._fleet": ["Endpoint", "EndpointStats"],
    "._hedge": ["HedgePolicy", "HedgeStats"],
    "._jury": ["Jury"],
    "._limiter": ["Limiter", "estimate_tokens"],
    "._limiters": ["configure_limiter", "endpoint_limiter", "limiter_from_url", "process_limiter"],
    "._normalize": ["normalize_label"],
    "._pacing": ["Pacer", "Pacing"],
    "._ray_limiter": ["RayLimiter"],
    "._redis_cache": ["RedisJudgeCache", "open_cache"],
    "._parse": ["ParseFailure", "Parsed", "match_label", "parse_reply"],
    "._protocol": ["JudgeIdentity", "JudgeProtocol", "JudgeStats", "MemberUsage"],
    "._retry": ["RetryPolicy", "is_transient", "retry_after_seconds"],
    "._rubric": ["AskMode", "Rubric", "RubricInputError", "list_rubrics", "load_rubric"],
    "._shared_limiter": ["SharedLimiter"],
    "._spec": ["JudgeSpec", "JurySpec", "Limits"],
    "._specs": ["RubricError"],  # without pydantic: a CLI catching it need not load the model
    "._sync": ["SyncRunner"],
    "._trajectory": ["TrajectoryCoverage"],
    "._verdict": ["ErrorKind", "PanelInfo", "ReadInfo", "StepVerdict", "Usage", "Verdict", "clamp"],
})
