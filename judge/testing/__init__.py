"""Test seam for code that calls an LLM judge: a loopback OpenAI-compatible fake provider.

Use :class:`FakeProvider` in your own tests the way you would use ``httpx.MockTransport``:
point a real ``openai`` client at ``fake.base_url`` and script what the "model" answers,
including rate limits, server errors, broken bodies and dropped connections.
:class:`DownJudge` is a judge that is down and counts the connections tried.
``FakeProvider(dialect=NAME)`` answers as a given provider does (OpenAI reasoning models, DashScope
and Ark thinking models, vLLM with and without a reasoning parser, DeepSeek's reasoner, Gemini,
Anthropic); :data:`DIALECTS` is the table of them, with their sources.
:class:`JudgePopulation` is a responder whose models judge rows of known truth with known accuracy
(for juries and cascades). :class:`AlignmentLab` is a judge whose agreement with labels depends on what its prompt teaches it, and an
optimiser that reads its disagreements (for ``gradekit align``). ``FakeProvider(cache_model=NAME)`` plays a provider's prompt cache and bill
(:data:`CACHE_MODELS`: openai, anthropic, dashscope, none; ``fake.billing`` holds what it charged), and the
fake also speaks Anthropic's Messages API (``/v1/messages``) and the Responses API (``/v1/responses``). :class:`Lognormal` is a heavy-tailed latency (``FakeProvider(latency=...)``
takes a number or a function of the request body).
``python -m gradekit.judge.testing`` serves the same fake as a separate process (``--dialect NAME``).
"""

import sys

try:
    from gradekit.judge.testing._aligning import AlignmentLab
    from gradekit.judge.testing._dialects import DIALECTS, Dialect, Refusal
    from gradekit.judge.testing._down import DownJudge
    from gradekit.judge.testing._fake_batch import BatchFault
    from gradekit.judge.testing._fake_billing import CACHE_MODELS, Billing, CacheModel, write_long_rubric
    from gradekit.judge.testing._fake_provider import FakeProvider, RecordedRequest, Reply, asked_reply, auto_reply
    from gradekit.judge.testing._latency import Lognormal
    from gradekit.judge.testing._population import JudgePopulation, labelled_reply
except ImportError as missing:
    if sys.argv[:1] != ["-m"]:  # imported by code: its ImportError is that code's to handle
        raise
    # Run as a program (python -m ...): what is missing, in one line, instead of a traceback.
    if missing.name == "gradekit" or (missing.name or "").startswith("gradekit."):
        said = (f"python -m {__name__}: gradekit is not installed for {sys.executable}; run python -m gradekit.judge.testing "
                "with the Python of the environment gradekit is installed in (e.g. .venv/bin/python), or pip install gradekit")
    else:
        said = (f"python -m gradekit.judge.testing: the fake provider runs on uvicorn and starlette, and {missing.name or missing} "
                f"cannot be imported for {sys.executable}: pip install uvicorn starlette (in that environment)")
    print(said, file=sys.stderr)
    raise SystemExit(2) from None

__all__ = ["CACHE_MODELS", "DIALECTS", "AlignmentLab", "BatchFault", "Billing", "CacheModel", "Dialect", "DownJudge", "FakeProvider",
           "JudgePopulation", "Lognormal", "RecordedRequest", "Refusal", "Reply", "asked_reply", "auto_reply", "labelled_reply", "write_long_rubric"]
