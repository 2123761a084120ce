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
    """USD per one million tokens, as OpenAI's pricing page states them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: float = Field(ge=0, description="USD per 1M prompt (input) tokens")
    output: float = Field(ge=0, description="USD per 1M completion (output) tokens, reasoning tokens included")
    cached_input: float | None = Field(None, ge=0, description="USD per 1M prompt tokens served from the provider's prompt cache [default: input]")


# Standard-tier prices per 1M tokens from OpenAI's pricing page
# (https://developers.openai.com/api/docs/pricing and each model's page, e.g. .../docs/models/gpt-5-nano),
# as published in 2025 (o3 after its June 2025 price cut). Prices change and differ by tier (Batch,
# Flex, Priority) and region: check them before relying on a cap, and override or extend the table
# with a YAML/JSON file (load_prices, $GRADEKIT_PRICES, gradekit --prices). Cached prompt tokens
# (usage.prompt_tokens_details.cached_tokens) are priced at ``cached_input`` once a reply reports
# them; a reservation made before the reply assumes none are cached, so a cap errs on the safe side.
DEFAULT_PRICES: dict[str, ModelPrice] = {
    "gpt-4o": ModelPrice(input=2.50, output=10.00, cached_input=1.25),
    "gpt-4o-mini": ModelPrice(input=0.15, output=0.60, cached_input=0.075),
    "gpt-4.1": ModelPrice(input=2.00, output=8.00, cached_input=0.5),
    "gpt-4.1-mini": ModelPrice(input=0.40, output=1.60, cached_input=0.1),
    "gpt-4.1-nano": ModelPrice(input=0.10, output=0.40, cached_input=0.025),
    "o3": ModelPrice(input=2.00, output=8.00, cached_input=0.5),
    "o4-mini": ModelPrice(input=1.10, output=4.40, cached_input=0.275),
    "gpt-5": ModelPrice(input=1.25, output=10.00, cached_input=0.125),
    "gpt-5-mini": ModelPrice(input=0.25, output=2.00, cached_input=0.025),
    "gpt-5-nano": ModelPrice(input=0.05, output=0.40, cached_input=0.005),
}

# A snapshot name is its base name plus a release date: gpt-4o-mini-2024-07-18 -> gpt-4o-mini.
_SNAPSHOT = re.compile(r"-\d{4}-\d{2}-\d{2}$")


def load_prices(path: str | Path | None = None) -> dict[str, ModelPrice]:
    """The price table: the defaults, then the file $GRADEKIT_PRICES names, then ``path``.

    A file is YAML or JSON, ``{model: {input: USD per 1M, output: USD per 1M}}``; each entry
    replaces or adds one model, the rest keep their defaults.
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


def price_of(prices: Mapping[str, ModelPrice], model: str) -> ModelPrice | None:
    """The model's price, a dated snapshot falling back to its base name; None when unknown."""
    name = model.lower()
    found = prices.get(name)
    if found is None and _SNAPSHOT.search(name):
        found = prices.get(_SNAPSHOT.sub("", name))
    return found


def _unknown(model: str) -> ValueError:
    return ValueError(
        f"no price for judge model {model!r}, so a cost cap cannot be kept; add it to a YAML or JSON file "
        f"{{{model}: {{input: USD per 1M tokens, output: USD per 1M tokens}}}} and pass `prices` FILE or set "
        f"{PRICES_ENV}=FILE (in Python: Budget(prices=load_prices(FILE))), or cap tokens with `max_tokens` instead"
    )


def _cost(price: ModelPrice, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> Decimal:
    # Decimal, not float: a cap of exactly N requests' cost must stop after exactly N requests.
    cached = min(max(cached_tokens, 0), prompt_tokens) if price.cached_input is not None else 0
    return (Decimal(prompt_tokens - cached) * Decimal(str(price.input)) + Decimal(cached) * Decimal(str(price.cached_input or 0))
            + Decimal(completion_tokens) * Decimal(str(price.output))) / 1_000_000


def cost_usd(prices: Mapping[str, ModelPrice], model: str, prompt_tokens: int, completion_tokens: int,
             cached_tokens: int = 0) -> float:
    """What the tokens cost in USD at the table's price (``cached_tokens`` of the prompt at the cached
    price); ValueError for a model without a price."""
    price = price_of(prices, model)
    if price is None:
        raise _unknown(model)
    return float(_cost(price, prompt_tokens, completion_tokens, cached_tokens))


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
        return name, (_cost(price, prompt_tokens, completion_tokens) if price is not None else Decimal(0))

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

    def settle(self, reservation: Reservation, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> None:
        """Replace the reservation with what the request really used (0, 0 when nothing was billed)."""
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
                self._spent_usd += _cost(price, prompt_tokens, completion_tokens, cached_tokens)
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
