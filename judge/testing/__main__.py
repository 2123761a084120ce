"""``python -m gradekit.judge.testing``: serve the fake provider in the foreground.

Prints the base URL as the first line of stdout, then serves until SIGTERM/SIGINT. Benchmarks
run it as a subprocess so that the fake's CPU time is not counted as the client's.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from gradekit.judge.testing._dialects import DIALECTS
from gradekit.judge.testing._fake_billing import CACHE_MODELS
from gradekit.judge.testing._fake_provider import FakeProvider, Reply


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m gradekit.judge.testing", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1", help="loopback address to bind")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds added to every answer")
    parser.add_argument("--rps", type=float, default=None, help="server-side rate limit (requests/s)")
    parser.add_argument("--burst", type=float, default=None, help="token-bucket capacity (default: rps)")
    parser.add_argument("--tpm", type=float, default=None, help="server-side token limit (tokens/minute)")
    parser.add_argument("--no-rate-headers", action="store_true",
                        help="send no x-ratelimit-* headers (429s still carry Retry-After)")
    parser.add_argument("--schedule", type=_schedule, default=[],
                        help="the limit changes over time: SECONDS:RPS,... counted from start, e.g. 8:10")
    parser.add_argument("--model", default="fake-judge")
    parser.add_argument("--reject-json-schema", action="store_true")
    parser.add_argument("--reject-json-object", action="store_true")
    parser.add_argument("--reject-tools", action="store_true")
    parser.add_argument("--reject-embeddings", action="store_true", help="answer /v1/embeddings with 404, as a chat-only server")
    parser.add_argument("--script", type=Path, default=None, help="JSONL file, one Reply per line")
    parser.add_argument("--population", type=Path, default=None,
                        help="JSON spec of judges of known reliability (gradekit.judge.testing.JudgePopulation.from_spec): models, truth, key_pattern")
    parser.add_argument("--lab", type=Path, default=None,
                        help="JSON spec of a judge whose agreement depends on what its prompt teaches it, and its optimiser "
                             "(gradekit.judge.testing.AlignmentLab.from_spec): truth, traits, lessons, key_pattern")
    parser.add_argument("--served-model", default=None, help="the model every reply says served it (default: the one asked for)")
    parser.add_argument("--system-fingerprint", default=None, help="the system_fingerprint every reply carries (default: none)")
    parser.add_argument("--dialect", choices=sorted(DIALECTS), default="openai",
                        help="answer as this provider does (see gradekit.judge.testing.DIALECTS)")
    parser.add_argument("--context-window", type=int, default=None,
                        help="the model's window in tokens: a longer prompt is refused in the dialect's wording")
    parser.add_argument("--cache-model", choices=sorted(CACHE_MODELS), default=None,
                        help="play this provider's prompt cache and bill (GET /v1/fake/billing reports what was billed)")
    parser.add_argument("--price", type=float, nargs=2, metavar=("INPUT", "OUTPUT"), default=None,
                        help="USD per 1M input and output tokens the fake bills [1 2]")
    parser.add_argument("--flex-full", action="store_true", help="answer every service_tier=flex request 429 (no capacity)")
    parser.add_argument("--responses-only", action="append", default=[], metavar="MODEL",
                        help="chat completions answers 404 for MODEL: it is served by the Responses API only (repeatable)")
    return parser.parse_args(argv)


def _schedule(text: str) -> list[tuple[float, float]]:
    try:
        return [(float(at), float(rps)) for at, rps in (part.split(":") for part in text.split(",") if part.strip())]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected SECONDS:RPS,..., e.g. 8:10, not {text!r}") from None


def main(argv: Sequence[str] | None = None) -> int:
    """Run until SIGTERM/SIGINT; returns the process exit code."""
    args = _parse(argv)
    script = []
    if args.script is not None:
        lines = args.script.read_text(encoding="utf-8").splitlines()
        script = [Reply.model_validate_json(line) for line in lines if line.strip()]
    fake = FakeProvider(script=script, latency=args.latency, rate_limit_rps=args.rps,
                        rate_limit_burst=args.burst, rate_limit_headers=not args.no_rate_headers,
                        rate_limit_schedule=args.schedule, rate_limit_tpm=args.tpm, reject_json_schema=args.reject_json_schema,
                        reject_json_object=args.reject_json_object, reject_tools=args.reject_tools,
                        reject_embeddings=args.reject_embeddings, model=args.model, host=args.host, port=args.port,
                        dialect=args.dialect, context_window=args.context_window, served_model=args.served_model,
                        system_fingerprint=args.system_fingerprint, cache_model=args.cache_model, flex_full=args.flex_full,
                        prices={"input": args.price[0], "output": args.price[1]} if args.price else None,
                        responses_only=args.responses_only)
    if args.population is not None or args.lab is not None:
        import json

        from gradekit.judge.testing._aligning import AlignmentLab
        from gradekit.judge.testing._population import JudgePopulation

        if args.population is not None:
            fake.set_responder(JudgePopulation.from_spec(json.loads(args.population.read_text(encoding="utf-8"))))
        else:
            fake.set_responder(AlignmentLab.from_spec(json.loads(args.lab.read_text(encoding="utf-8"))))
    stop = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    fake.start()
    print(fake.base_url, flush=True)
    try:
        while not stop.wait(0.2):
            pass
    finally:
        fake.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
