"""The fake provider's prompt cache and bill: each provider's caching model, and what each request cost.

A :class:`CacheModel` says where a provider caches a prompt's prefix, from what length, and how it
bills the write and the read; :class:`Billing` plays it for the fake provider and keeps the bill,
so a test can compare what gradekit reports with what the provider charged. The rules, per model:

- ``openai``: automatic prefix caching (OpenAI's prompt-caching guide). A breakpoint sits at the
  end of the message before the latest user message (the managed breakpoint GPT-5.6 places near the
  latest user message: a judge's fixed system block) and at every content part marked
  ``prompt_cache_breakpoint``; ``prompt_cache_key`` is part of the cache's address. From 1,024
  tokens on. Writes 1.25x input (GPT-5.6 and later), reads 0.1x; usage reports
  ``prompt_tokens_details.cached_tokens`` and ``cache_write_tokens``.
- ``openai-free-writes``: the same before GPT-5.6, where writes cost the input price.
- ``anthropic``: caching only at ``cache_control`` breakpoints (Anthropic's prompt-caching guide),
  from the model's minimum (1,024 tokens by default), writes 1.25x (5-minute TTL), reads 0.1x; the
  Messages API reports ``input_tokens`` (after the last breakpoint), ``cache_creation_input_tokens``
  and ``cache_read_input_tokens``.
- ``dashscope``: DashScope's explicit cache (Alibaba Model Studio, "Context cache"): ``cache_control``
  on a content part of the chat request, from 1,024 tokens, writes 1.25x, reads 0.1x, usage in
  ``prompt_tokens_details.cached_tokens`` and ``cache_creation_input_tokens``.
- ``none``: no cache at all (Anthropic's OpenAI-compatible endpoint).

Every model fills its cache only when a request *completes*: requests sent together with one cold
prefix each miss and each pay the write. A flex request (``service_tier: flex``) is billed at
``flex_factor`` of the standard prices. Tokens are the fake's own count: four characters each. Each
request is billed what its reply reports (a scripted ``Reply.usage`` included); errors, dropped
connections and streamed chat replies are not billed and fill no cache.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
import time
from collections.abc import Mapping
from decimal import Decimal
from typing import Any, Literal

Breakpoints = Literal["implicit", "explicit", "none"]


@dataclasses.dataclass(frozen=True)
class CacheModel:
    """One provider's prompt caching and its prices (multipliers of the input price)."""

    name: str
    breakpoints: Breakpoints = "implicit"
    minimum_tokens: int = 1024
    write: float = 1.25
    read: float = 0.1
    ttl_s: float = 300.0
    usage: Literal["openai", "dashscope"] = "openai"


CACHE_MODELS: dict[str, CacheModel] = {m.name: m for m in (
    CacheModel("openai"),
    CacheModel("openai-free-writes", write=1.0),
    CacheModel("anthropic", breakpoints="explicit"),
    CacheModel("dashscope", breakpoints="explicit", usage="dashscope"),
    CacheModel("none", breakpoints="none"),
)}


def tokens_of(text: str) -> int:
    return len(text) // 4


@dataclasses.dataclass
class Charge:
    """One request's bill."""

    model: str
    tier: str
    prompt_tokens: int
    cached_tokens: int
    cache_write_tokens: int
    completion_tokens: int
    usd: Decimal


@dataclasses.dataclass
class Segments:
    """A prompt as the cache sees it: its text in order, the character offsets of its breakpoints, and the
    part of its address that is not text (model, tools, output format, prompt_cache_key)."""

    text: str
    breakpoints: list[int]
    address: str


def chat_segments(body: Mapping[str, Any], model: CacheModel) -> Segments:
    """A chat-completions or Responses body (``messages`` or ``input``) as the cache sees it."""
    messages = body.get("messages") if body.get("messages") is not None else body.get("input")
    messages = messages if isinstance(messages, list) else [{"role": "user", "content": str(messages or "")}]
    text, marks = "", []
    last_user = max((i for i, m in enumerate(messages) if isinstance(m, Mapping) and m.get("role") == "user"), default=-1)
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, Mapping) else None
        parts = [{"text": content}] if isinstance(content, str) else [p for p in content or () if isinstance(p, Mapping)]
        for part in parts:
            text += str(part.get("text") or "")
            if part.get("prompt_cache_breakpoint") or part.get("cache_control"):
                marks.append(len(text))
        if model.breakpoints == "implicit" and i == last_user - 1:
            marks.append(len(text))
    fixed = {k: body.get(k) for k in ("model", "tools", "response_format", "text", "prompt_cache_key") if body.get(k) is not None}
    return Segments(text, marks, json.dumps(fixed, sort_keys=True, default=str))


def messages_segments(body: Mapping[str, Any]) -> Segments:
    """A Messages API body as Anthropic's cache sees it: tools, then system, then messages; breakpoints
    only where a block carries ``cache_control``."""
    text, marks = "", []
    system = body.get("system")
    blocks = [{"text": system}] if isinstance(system, str) else [b for b in system or () if isinstance(b, Mapping)]
    for message in body.get("messages") or ():
        content = message.get("content") if isinstance(message, Mapping) else None
        blocks += [{"text": content}] if isinstance(content, str) else [b for b in content or () if isinstance(b, Mapping)]
    for block in blocks:
        text += str(block.get("text") or "")
        if block.get("cache_control"):
            marks.append(len(text))
    fixed = {k: body.get(k) for k in ("model", "tools", "output_config") if body.get(k) is not None}
    return Segments(text, marks, json.dumps(fixed, sort_keys=True, default=str))


class Billing:
    """The cache and the ledger of one fake provider.

    ``prices``: USD per 1M tokens, ``{"input": .., "output": ..}``, for every model (or per model name
    under ``models``). ``flex_factor``: what flex costs of the standard price.
    """

    def __init__(self, model: CacheModel, prices: Mapping[str, Any] | None = None, *, flex_factor: float = 0.5) -> None:
        self.model = model
        prices = dict(prices or {"input": 1.0, "output": 2.0})
        self._per_model = {str(k).lower(): v for k, v in (prices.pop("models", None) or {}).items()}
        self._default = prices
        self.flex_factor = flex_factor
        self._lock = threading.Lock()
        self._cache: dict[str, float] = {}  # prefix address -> expiry (time.monotonic)
        self.charges: list[Charge] = []

    def price(self, model: str) -> tuple[Decimal, Decimal]:
        entry = self._per_model.get(model.lower(), self._default)
        return Decimal(str(entry["input"])), Decimal(str(entry["output"]))

    def lookup(self, segments: Segments) -> tuple[int, int, list[str]]:
        """At a request's arrival: (prompt tokens, tokens read from the cache, the prefixes it will write).

        The longest breakpoint prefix in the cache is read; every longer breakpoint prefix of at least the
        minimum is written (billed now, cached once the request completes).
        """
        total = tokens_of(segments.text)
        if self.model.breakpoints == "none":
            return total, 0, []
        now = time.monotonic()
        read, writes = 0, []
        with self._lock:
            for offset in sorted(set(segments.breakpoints)):
                size = tokens_of(segments.text[:offset])
                if size < self.model.minimum_tokens:
                    continue
                key = self._key(segments, offset)
                expiry = self._cache.get(key)
                if expiry is not None and expiry > now:
                    read = size
                    self._cache[key] = now + self.model.ttl_s  # a hit refreshes the entry
                else:
                    writes.append(key)
            largest_write = max((tokens_of(segments.text[:o]) for o in segments.breakpoints
                                 if self._key(segments, o) in writes), default=0)
        return total, read, writes if largest_write > read else []

    def written_tokens(self, segments: Segments, writes: list[str], read: int) -> int:
        sizes = [tokens_of(segments.text[:o]) for o in segments.breakpoints if self._key(segments, o) in writes]
        return max(sizes, default=read) - read if sizes else 0

    def completed(self, writes: list[str]) -> None:
        """The request completed: what it wrote is in the cache from now on."""
        with self._lock:
            for key in writes:
                self._cache[key] = time.monotonic() + self.model.ttl_s

    def charge(self, model: str, tier: str, prompt: int, cached: int, written: int, completion: int) -> Charge:
        price_in, price_out = self.price(model)
        plain = prompt - cached - written
        usd = (Decimal(plain) * price_in + Decimal(cached) * price_in * Decimal(str(self.model.read))
               + Decimal(written) * price_in * Decimal(str(self.model.write)) + Decimal(completion) * price_out) / 1_000_000
        if tier == "flex":
            usd *= Decimal(str(self.flex_factor))
        charge = Charge(model, tier, prompt, cached, written, completion, usd)
        with self._lock:
            self.charges.append(charge)
        return charge

    @property
    def billed_usd(self) -> float:
        with self._lock:
            return float(sum((c.usd for c in self.charges), Decimal(0)))

    def billed_by_tier(self) -> dict[str, float]:
        with self._lock:
            tiers: dict[str, Decimal] = {}
            for c in self.charges:
                tiers[c.tier] = tiers.get(c.tier, Decimal(0)) + c.usd
        return {tier: float(usd) for tier, usd in tiers.items()}

    @property
    def cache_writes(self) -> int:
        """Requests that wrote a prefix to the cache (each paid the write)."""
        with self._lock:
            return sum(1 for c in self.charges if c.cache_write_tokens)

    @staticmethod
    def _key(segments: Segments, offset: int) -> str:
        return hashlib.sha256(f"{segments.address}\0{segments.text[:offset]}".encode()).hexdigest()


_FILLER = ("Weigh the prediction against every gold answer; a number matches to the precision the gold answer gives; "
           "harmless extra detail, wording and order do not matter; a hedge among candidates is incorrect. ")


def write_long_rubric(directory: Any, tokens: int = 2000, name: str = "long_rubric") -> Any:
    """A copy of the shipped ``correctness_3way`` rubric whose fixed system block is about ``tokens`` long (the
    fake's count), written into ``directory``; returns the path of its spec. For cache and cost tests and benchmarks."""
    from pathlib import Path

    from gradekit.judge._specs import read_spec, spec_path

    source = spec_path("correctness_3way")
    spec = read_spec(source)
    template = (source.parent / spec["template"]).read_text(encoding="utf-8")
    filler = (_FILLER * (tokens * 4 // len(_FILLER) + 1))[: tokens * 4]
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.j2").write_text(template.replace("{% block system %}", "{% block system %}\n" + filler + "\n", 1), encoding="utf-8")
    lines = source.read_text(encoding="utf-8").splitlines()
    lines = [f"name: {name}" if line.startswith("name:") else f"template: {name}.j2" if line.startswith("template:") else line
             for line in lines]
    (folder / f"{name}.yaml").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder / f"{name}.yaml"
