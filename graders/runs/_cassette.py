"""Record and replay judge traffic with vcrpy, so a graded run can be reproduced in CI offline."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

# Requests are matched on what decides the reply (method, path, JSON body), not on host or port:
# a cassette recorded against one address replays under any base URL with the same API path.
MATCH_ON = ("method", "path", "body")


def _media_as_digests(request):  # -> vcr Request
    """Images and audio go into a cassette as their digests: vcrpy filters a request so both when it
    records it and when it matches a live one, so replay still tells two images apart."""
    body = request.body
    if isinstance(body, str):
        body = body.encode("utf-8")
    if not body or (b"data:" not in body and b"input_audio" not in body):
        return request
    import json

    from gradekit.judge._media import digest_media

    try:
        data = json.loads(body)
    except ValueError:
        return request
    if isinstance(data, dict) and "messages" in data:
        request.body = json.dumps({**data, "messages": digest_media(data["messages"])}, ensure_ascii=False).encode("utf-8")
    return request


@contextlib.contextmanager
def cassette(path: Path, mode: str) -> Iterator[None]:
    """``mode`` "record" writes every interaction afresh; "replay" answers only from the cassette."""
    import vcr
    if mode == "replay" and not path.exists():
        raise FileNotFoundError(f"{path}: no such cassette to replay")
    recorder = vcr.VCR(
        record_mode="all" if mode == "record" else "none",
        match_on=MATCH_ON,
        filter_headers=["authorization", "api-key", "x-api-key", "cookie", "openai-organization"],
        decode_compressed_response=True,
        before_record_request=_media_as_digests,
    )
    if mode == "record":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
    with recorder.use_cassette(str(path)):
        yield
