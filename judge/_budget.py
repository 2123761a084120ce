"""Spend caps for a run: a price table per model and an admission gate in front of every request.

A Judge with a Budget asks it before each request it would send (after a cache miss): the request
starts only while the money or tokens already spent plus the reservations of the requests in
flight are under the cap. When the in-flight reservations alone push past the cap, a new request
waits for them to settle rather than being refused, since the real usage often comes in below the
estimate; it is refused (a ``skipped`` Verdict, ``error_kind="budget"``) once spent alone has
reached the cap. The overshoot is therefore bounded by what was in flight when the cap was
reached: one request with one request in flight at a time.
"""

from __future__ import annotations

import asyncio
import os
import re
import threading
from collections import deque
from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ._files import read_data_file

PRICES_ENV = "GRADEKIT_PRICES"


class ModelPrice(BaseModel):
    """USD per one million tokens, as the provider's pricing page states them.

    ``cache_write`` prices prompt tokens written to the provider's prompt cache (Anthropic's and
    DashScope's explicit cache at 1.25x input, OpenAI's from GPT-5.6 on); ``reasoning`` prices a
    thinking model's reasoning tokens where the provider bills them apart from the answer (most bill
    them as output). ``tiers`` holds the prices of another service tier (``flex``), each field
    falling back to the standard price.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: float = Field(ge=0, description="USD per 1M prompt (input) tokens")
    output: float = Field(ge=0, description="USD per 1M completion (output) tokens, reasoning tokens included")
    cached_input: float | None = Field(None, ge=0, description="USD per 1M prompt tokens served from the provider's prompt cache [default: input]")
    cache_write: float | None = Field(None, ge=0, description="USD per 1M prompt tokens written to the provider's prompt cache [default: input]")
    reasoning: float | None = Field(None, ge=0, description="USD per 1M reasoning tokens [default: output]")
    tiers: dict[str, ModelPrice] = Field(default_factory=dict, description="prices of another service tier (flex), by tier name")

    def at(self, tier: str | None) -> ModelPrice:
        """The prices of ``tier`` (``flex``, ``priority``); the standard ones for None, ``default`` or a tier without prices."""
        return self.tiers.get(tier, self) if tier else self


# Prices for the judges the maintained source (genai-prices, below) does not carry: Alibaba Cloud Model
# Studio (DashScope, international, 0-32K input band: https://www.alibabacloud.com/help/en/model-studio/models,
# explicit cache writes 125% and reads 10% of input: .../model-studio/context-cache) and Volcengine Ark
# (https://www.volcengine.com/docs/82379/1544106, list prices in CNY at 7.1 CNY per USD, 0-32K band).
# Everything else is priced from genai-prices' bundled data. Prices change and differ by region and
# context length: check them before relying on a cap, and override or extend them with a YAML/JSON
# file (load_prices, $GRADEKIT_PRICES, gradekit --prices). A reservation made before the reply
# assumes no cache hit and the cache-write price, so a cap errs on the safe side.
DEFAULT_PRICES: dict[str, ModelPrice] = {
    "qwen3-max": ModelPrice(input=1.2, output=6.0, cached_input=0.12, cache_write=1.5),
    "qwen-max": ModelPrice(input=1.6, output=6.4, cached_input=0.16, cache_write=2.0),
    "qwen-plus": ModelPrice(input=0.4, output=1.2, cached_input=0.04, cache_write=0.5),
    "qwen-flash": ModelPrice(input=0.05, output=0.4, cached_input=0.005, cache_write=0.0625),
    "qwen-turbo": ModelPrice(input=0.05, output=0.2, cached_input=0.005, cache_write=0.0625),
    "doubao-seed-1-6": ModelPrice(input=0.11, output=1.13, cached_input=0.023),
    "doubao-seed-1-6-flash": ModelPrice(input=0.021, output=0.21, cached_input=0.0042),
    "doubao-seed-1-6-thinking": ModelPrice(input=0.11, output=1.13, cached_input=0.023),
}

# A snapshot name is its base name plus a release date: gpt-4o-mini-2024-07-18 -> gpt-4o-mini (Ark: -250615).
_SNAPSHOT = re.compile(r"-(?:\d{4}-\d{2}-\d{2}|\d{6})$")


def load_prices(path: str | Path | None = None) -> dict[str, ModelPrice]:
    """The price table: gradekit's defaults, then the file $GRADEKIT_PRICES names, then ``path``.

    A file is YAML or JSON, ``{model: {input: USD per 1M, output: USD per 1M, cached_input: ..,
    cache_write: .., reasoning: .., tiers: {flex: {input: .., output: ..}}}}``; each entry replaces
    or adds one model. A model in no table is priced from genai-prices' bundled data (:func:`price_of`).
    """
    prices = dict(DEFAULT_PRICES)
    for source in (os.environ.get(PRICES_ENV), path):
        if source:
            prices.update(_read_prices(Path(source)))
    return prices


def _read_prices(path: Path) -> dict[str, ModelPrice]:
    data = read_data_file(path, "price table")
    if not isinstance(data, Mapping):
        raise ValueError(f"{path}: a price table maps model names to {{input: USD per 1M tokens, output: USD per 1M tokens}}")
    table: dict[str, ModelPrice] = {}
    for model, entry in data.items():
        try:
            table[str(model).lower()] = ModelPrice.model_validate(entry)
        except ValidationError as e:
            problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'entry'}: {err['msg']}" for err in e.errors())
            raise ValueError(f"{path}: model {model!r}: {problems} (expected {{input: USD per 1M tokens, output: USD per 1M tokens}})") from None
    return table


def price_of(prices: Mapping[str, ModelPrice], model: str, *, base_url: str | None = None) -> ModelPrice | None:
    """The model's price: the table's (a dated snapshot falling back to its base name), else the maintained
    source's (genai-prices' bundled data, the provider told by ``base_url`` where it is a known API); None when unknown."""
    name = model.lower()
    found = prices.get(name)
    if found is None and _SNAPSHOT.search(name):
        found = prices.get(_SNAPSHOT.sub("", name))
    return found if found is not None else maintained_price(name, base_url)


_MAINTAINED: dict[tuple[str, str | None], ModelPrice | None] = {}


def maintained_price(model: str, base_url: str | None = None) -> ModelPrice | None:
    """The price genai-prices' bundled snapshot gives ``model`` today, as a ModelPrice (flex tier included).

    Only the data shipped in the installed package is read: never a network refresh at run time.
    Prices that grow with the prompt's length (above 200K or 272K tokens) are taken at their base
    rate, as a judge's prompt is far below those thresholds.
    """
    key = (model.lower(), base_url)
    if key in _MAINTAINED:
        return _MAINTAINED[key]
    _MAINTAINED[key] = found = _from_genai_prices(model.lower(), base_url)
    return found


_FIRST_PARTY = ["openai", "anthropic", "google", "deepseek", "mistral", "groq", "x-ai", "moonshotai", "zai", "cohere"]


def _from_genai_prices(model: str, base_url: str | None) -> ModelPrice | None:
    try:
        from datetime import datetime, timezone

        from genai_prices import data_snapshot
    except ImportError:  # not installed (a trimmed environment): only the tables price
        return None
    snapshot = data_snapshot.get_snapshot()
    info = None
    for url in ((base_url, None) if base_url else (None,)):
        try:
            _, info = snapshot.find_provider_model(model, None, None, url)
            break
        except LookupError:
            continue
    if info is None:  # a model served by a provider other than its maker (Groq's llama): its first-party host first
        for provider in sorted(snapshot.providers, key=lambda p: (p.id not in _FIRST_PARTY, _FIRST_PARTY.index(p.id) if p.id in _FIRST_PARTY else 0)):
            if provider.id in ("openrouter",) or provider.id.startswith("huggingface"):
                continue  # resellers' prices are not the provider's
            info = provider.find_model(model)
            if info is not None:
                break
    if info is None:
        return None
    now = datetime.now(timezone.utc)

    def convert(price: object, base: ModelPrice | None = None) -> ModelPrice | None:
        def rate(name: str) -> float | None:
            value = getattr(price, name, None)
            value = getattr(value, "base", value)  # TieredPrices: the rate below the first threshold
            return float(value) if value is not None else None

        fields = {"input": rate("input_mtok"), "output": rate("output_mtok"), "cached_input": rate("cache_read_mtok"),
                  "cache_write": rate("cache_write_mtok")}
        if base is None:
            if fields["input"] is None or fields["output"] is None:
                return None  # priced per image, second or request: not a token price a cap can keep
            return ModelPrice(**fields)  # type: ignore[arg-type]
        return ModelPrice(**{name: value if value is not None else getattr(base, name) for name, value in fields.items()})  # type: ignore[arg-type]

    standard = convert(info.get_prices(now))
    if standard is None:
        return None
    tiers = {}
    for tier in ("flex", "priority"):
        variant = info.get_prices(now, {"service_tier": tier})
        if variant.__dict__ != info.get_prices(now).__dict__:
            converted = convert(variant, standard)
            if converted is not None:
                tiers[tier] = converted
    return standard.model_copy(update={"tiers": tiers}) if tiers else standard


def _unknown(model: str) -> ValueError:
    return ValueError(
        f"no price for judge model {model!r}, so a cost cap cannot be kept; add it to a YAML or JSON file "
        f"{{{model}: {{input: USD per 1M tokens, output: USD per 1M tokens}}}} and pass `prices` FILE or set "
        f"{PRICES_ENV}=FILE (in Python: Budget(prices=load_prices(FILE))), or cap tokens with `max_tokens` instead"
    )


def _cost(price: ModelPrice, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0,
          cache_write_tokens: int = 0, reasoning_tokens: int = 0) -> Decimal:
    """What the tokens cost at ``price``: the prompt's cache reads and writes at their own prices, the reasoning
    tokens (counted in ``completion_tokens``, as providers report them) at ``reasoning`` where it is set."""
    # Decimal, not float: a cap of exactly N requests' cost must stop after exactly N requests.
    cached = min(max(cached_tokens, 0), prompt_tokens)
    written = min(max(cache_write_tokens, 0), prompt_tokens - cached)
    reasoning = min(max(reasoning_tokens, 0), completion_tokens) if price.reasoning is not None else 0
    d = lambda value: Decimal(str(value))  # noqa: E731
    read_price = price.cached_input if price.cached_input is not None else price.input
    write_price = price.cache_write if price.cache_write is not None else price.input
    return (d(prompt_tokens - cached - written) * d(price.input) + d(cached) * d(read_price) + d(written) * d(write_price)
            + d(completion_tokens - reasoning) * d(price.output) + d(reasoning) * d(price.reasoning or 0)) / 1_000_000


# What a provider's Batch API bills, as a share of the live price: half at OpenAI, Anthropic (Message Batches),
# Google (Gemini Batch Mode) and Alibaba (DashScope batch), the providers gradekit's --batch speaks to.
BATCH_PRICE_SHARE = 0.5


def cost_usd(prices: Mapping[str, ModelPrice], model: str, prompt_tokens: int, completion_tokens: int,
             cached_tokens: int = 0, *, cache_write_tokens: int = 0, reasoning_tokens: int = 0,
             tier: str | None = None, base_url: str | None = None) -> float:
    """What the tokens cost in USD at the table's price (``cached_tokens`` of the prompt at the cached
    price, ``cache_write_tokens`` at the cache-write price, ``tier``'s prices for a flex request);
    ValueError for a model without a price."""
    price = price_of(prices, model, base_url=base_url)
    if price is None:
        raise _unknown(model)
    return float(_cost(price.at(tier), prompt_tokens, completion_tokens, cached_tokens, cache_write_tokens, reasoning_tokens))


def usage_cost(prices: Mapping[str, ModelPrice], model: str, usage: object, *, base_url: str | None = None,
               tier: str | None = None) -> Decimal | None:
    """A :class:`~judge.Usage`'s cost (its flex part at the flex prices; ``tier="flex"``: that part alone);
    None when the model has no price."""
    price = price_of(prices, model, base_url=base_url)
    if price is None:
        return None
    return sum((_cost(price.at(part_tier), *parts) for part_tier, parts in tier_parts(usage)
                if tier is None or part_tier == tier), Decimal(0))


def prompt_cache_usd(price: ModelPrice, usage: object) -> Decimal:
    """What the provider's prompt cache saved on ``usage`` (reads below the input price) less what its writes
    cost above it, each tier at its own prices: negative when the cache cost more than it saved."""
    total = Decimal(0)
    for tier, (_, _, cached, written, _) in tier_parts(usage):
        p = price.at(tier)
        d = lambda value: Decimal(str(value))  # noqa: E731
        read = p.cached_input if p.cached_input is not None else p.input
        write = p.cache_write if p.cache_write is not None else p.input
        total += (d(cached) * (d(p.input) - d(read)) - d(written) * (d(write) - d(p.input))) / 1_000_000
    return total


def tier_parts(usage: object) -> list[tuple[str | None, tuple[int, int, int, int, int]]]:
    """A Usage split by service tier: (tier, (prompt, completion, cached, cache write, reasoning)) for the
    standard part and the flex part (the flex_* counts are included in the totals)."""
    get = lambda name: int(getattr(usage, name, 0) or 0)  # noqa: E731
    flex = (get("flex_prompt_tokens"), get("flex_completion_tokens"), get("flex_cached_tokens"),
            get("flex_cache_write_tokens"), get("flex_reasoning_tokens"))
    total = (get("prompt_tokens"), get("completion_tokens"), get("cached_tokens"), get("cache_write_tokens"), get("reasoning_tokens"))
    standard = tuple(t - f for t, f in zip(total, flex))
    return [(None, standard), ("flex", flex)]  # type: ignore[list-item]  # None: the standard tier


class Reservation:
    """What one admitted request is expected to cost until ``Budget.settle`` records what it did."""

    __slots__ = ("cost", "model", "settled", "tokens")

    def __init__(self, model: str, tokens: int, cost: Decimal) -> None:
        self.model, self.tokens, self.cost, self.settled = model, tokens, cost, False

    def __repr__(self) -> str:
        return f"Reservation(model={self.model!r}, tokens={self.tokens}, cost_usd={float(self.cost):.6f})"


class Budget:
    """A cap on the money and/or tokens a run may spend on judge requests.

    Share one Budget between every Judge of a run. It is safe across tasks, event loops and threads.

    Args:
        max_cost_usd: stop starting requests once this many USD are spent (None: no money cap).
        max_tokens: stop once this many prompt + completion tokens are spent (None: no token cap).
        prices: the price table; defaults to :func:`load_prices` (defaults + $GRADEKIT_PRICES).
        model: the model priced when a caller names none; a Judge names its own.

    Raises:
        ValueError: a money cap with a model that has no price (the message says how to add one).
    """

    def __init__(
        self,
        max_cost_usd: float | None = None,
        max_tokens: int | None = None,
        *,
        prices: Mapping[str, ModelPrice | Mapping[str, float]] | None = None,
        model: str | None = None,
    ) -> None:
        if max_cost_usd is not None and not max_cost_usd >= 0:
            raise ValueError(f"max_cost_usd must be zero or more USD, got {max_cost_usd}")
        if max_tokens is not None and max_tokens < 0:
            raise ValueError(f"max_tokens must be zero or more, got {max_tokens}")
        self.max_cost_usd = max_cost_usd
        self.max_tokens = max_tokens
        # Plain {input, output} dicts are accepted too; names match case-insensitively.
        self.prices = {str(k).lower(): ModelPrice.model_validate(v) for k, v in (load_prices() if prices is None else prices).items()}
        self.model = model
        self._cap_usd = Decimal(str(max_cost_usd)) if max_cost_usd is not None else None
        self._lock = threading.Lock()
        self._spent_usd = self._reserved_usd = self._saved_usd = Decimal(0)
        self._spent_tokens = self._reserved_tokens = self._saved_tokens = 0
        self._unpriced: set[str] = set()  # models spent on without a price: spent_usd is unknown
        self._in_flight = 0
        self.refused = 0
        self._queue: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = deque()  # requests waiting, in arrival order
        if model is not None:
            self.check_model(model)

    def check_model(self, model: str) -> None:
        """Fail now, not mid-run, when a money cap cannot price this model."""
        if self._cap_usd is not None and price_of(self.prices, model) is None:
            raise _unknown(model)

    # ---- admission ------------------------------------------------------------------------

    def _model(self, model: str | None) -> str:
        name = model or self.model
        if name is None:
            raise ValueError("the budget needs a model to price: pass model= to Budget or to the call")
        return name

    def _open(self) -> bool:
        """Whether spent plus in-flight reservations are under every cap (the lock is held)."""
        if self._cap_usd is not None and self._spent_usd + self._reserved_usd >= self._cap_usd:
            return False
        return self.max_tokens is None or self._spent_tokens + self._reserved_tokens < self.max_tokens

    def try_start(self, prompt_tokens: int, completion_tokens: int = 0, *, model: str | None = None) -> Reservation | None:
        """Admit one request estimated at these tokens, or None when the caps leave no room now."""
        name = self._model(model)
        name, cost = self._estimate(prompt_tokens, completion_tokens, model)
        with self._lock:
            if self._queue or not self._open():
                return None  # full, or others are waiting for the room first
            return self._reserve(name, prompt_tokens + completion_tokens, cost)

    def _estimate(self, prompt_tokens: int, completion_tokens: int, model: str | None) -> tuple[str, Decimal]:
        name = self._model(model)
        price = price_of(self.prices, name)
        if price is None:
            self.check_model(name)
        if price is None:
            return name, Decimal(0)
        # Before the reply nothing says what the cache will serve: every prompt token at the dearer of
        # the input and cache-write prices, so a cap errs on the safe side.
        worst = price.model_copy(update={"input": max(price.input, price.cache_write or 0)})
        return name, _cost(worst, prompt_tokens, completion_tokens)

    def _reserve(self, name: str, tokens: int, cost: Decimal) -> Reservation:
        """Book an admitted request (the lock is held)."""
        reservation = Reservation(name, tokens, cost)
        self._reserved_usd += cost
        self._reserved_tokens += tokens
        self._in_flight += 1
        return reservation

    async def start(self, prompt_tokens: int, completion_tokens: int = 0, *, model: str | None = None) -> Reservation | None:
        """Admit one request, waiting while in-flight requests may still leave room; None once spent reached a cap.

        First come, first served: a request that has to wait takes a place in a queue, and only
        the head of the queue is admitted, so the rows admitted before a cap is reached are the
        earliest ones. The refusal is counted in ``refused``.
        """
        name, cost = self._estimate(prompt_tokens, completion_tokens, model)
        place: asyncio.Future[None] | None = None
        loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                at_head = not self._queue or self._queue[0][1] is place
                if at_head and self._open():
                    if place is not None:
                        self._queue.popleft()
                    waiting = list(self._queue)
                    reservation = self._reserve(name, prompt_tokens + completion_tokens, cost)
                elif self._in_flight == 0 and not self._open():
                    # Nothing in flight can make room again: this one and every one waiting are refused.
                    self.refused += 1
                    if place is not None:
                        self._queue.remove((loop, place))
                    waiting, reservation = list(self._queue), None
                else:
                    if place is None:  # a newcomer joins at the end
                        place = loop.create_future()
                        self._queue.append((loop, place))
                    else:  # a woken waiter that still does not fit keeps its position
                        index = self._queue.index((loop, place))
                        place = loop.create_future()
                        self._queue[index] = (loop, place)
                    waiting = None
            if waiting is not None:
                _wake_all(waiting)  # the next head may fit too, or must learn it is refused
                return reservation
            try:
                await place
            except asyncio.CancelledError:  # a cancelled run must not leave a place that blocks the queue
                with self._lock:
                    if (loop, place) in self._queue:
                        self._queue.remove((loop, place))
                    waiting = list(self._queue)
                _wake_all(waiting)
                raise

    def settle(self, reservation: Reservation, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0, *,
               cache_write_tokens: int = 0, reasoning_tokens: int = 0, flex: tuple[int, int, int, int, int] | None = None) -> None:
        """Replace the reservation with what the request really used (0, 0 when nothing was billed).

        Cache writes are priced at the cache-write price, reads at the cached price; ``flex`` is the part of
        those counts (prompt, completion, cached, cache write, reasoning) billed at the flex tier.
        """
        price = price_of(self.prices, reservation.model)
        with self._lock:
            if reservation.settled:
                raise ValueError(f"{reservation!r} is already settled")
            reservation.settled = True
            self._reserved_usd -= reservation.cost
            self._reserved_tokens -= reservation.tokens
            self._in_flight -= 1
            self._spent_tokens += prompt_tokens + completion_tokens
            if price is not None:
                total = (prompt_tokens, completion_tokens, cached_tokens, cache_write_tokens, reasoning_tokens)
                part = flex or (0, 0, 0, 0, 0)
                self._spent_usd += _cost(price, *(t - f for t, f in zip(total, part)))
                if flex:
                    self._spent_usd += _cost(price.at("flex"), *part)
            elif prompt_tokens or completion_tokens:
                self._unpriced.add(reservation.model)
            waiting = list(self._queue)
        _wake_all(waiting)  # each re-checks the caps; only the head of the queue may start

    def record_cache_hit(self, prompt_tokens: int, completion_tokens: int, *, model: str | None = None) -> None:
        """Tally what a cached reply saved (its stored usage); it costs nothing and is never refused."""
        price = price_of(self.prices, self._model(model))
        with self._lock:
            self._saved_tokens += prompt_tokens + completion_tokens
            if price is not None:
                self._saved_usd += _cost(price, prompt_tokens, completion_tokens)

    # ---- what happened ----------------------------------------------------------------------

    @property
    def spent_usd(self) -> float | None:
        """USD spent so far at the table's prices; None when a model without a price was used."""
        return None if self._unpriced else float(self._spent_usd)

    @property
    def spent_tokens(self) -> int:
        return self._spent_tokens

    @property
    def saved_usd(self) -> float:
        """USD the cache saved (replies served from it, at their stored usage); models without a price count 0."""
        return float(self._saved_usd)

    @property
    def saved_tokens(self) -> int:
        return self._saved_tokens

    @property
    def exhausted(self) -> bool:
        """True once spent (in-flight requests aside) has reached a cap: no request will start again."""
        if self._cap_usd is not None and self._spent_usd >= self._cap_usd:
            return True
        return self.max_tokens is not None and self._spent_tokens >= self.max_tokens

    def reason(self) -> str:
        """Why a request is refused, with the numbers, for the skipped Verdict's error."""
        parts = []
        if self._cap_usd is not None:
            parts.append(f"spent ${float(self._spent_usd):.4f} of ${self.max_cost_usd:g} (max cost)")
        if self.max_tokens is not None:
            parts.append(f"spent {self._spent_tokens} of {self.max_tokens} tokens (max tokens)")
        return "budget reached: " + "; ".join(parts)

    def __repr__(self) -> str:
        return (f"Budget(max_cost_usd={self.max_cost_usd}, max_tokens={self.max_tokens}, spent_usd={self.spent_usd}, "
                f"spent_tokens={self.spent_tokens}, refused={self.refused})")


def _wake_all(waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]]) -> None:
    for loop, waiter in waiters:  # every waiter on its own loop
        if not loop.is_closed():
            loop.call_soon_threadsafe(_wake, waiter)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
