"""Images and audio in a judge prompt: chat content parts, known to the cache by digest only.

A media value reaches the judge as a URL or a ``data:`` URI (images) or base64 data with a format
(audio). :class:`Media` is what a rubric's ``media`` variable holds once prepared: its ``str()`` is
its digest, so the row-values cache key and anything that prints a prepared row carry the digest,
never the bytes; :func:`digest_media` does the same for a request's messages before they are hashed.

The one home of media conversion: a local file (inside its input's folder) or a Vertex ``inlineData``
becomes a ``data:`` URI here (:func:`local_media`, :func:`data_uri`), a cell or a part becomes Media.
"""

from __future__ import annotations

import hashlib
import math
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# OpenAI's documented image input requirements (platform.openai.com/docs/guides/images-vision, "Image input
# requirements"): PNG, JPEG, WEBP and non-animated GIF; up to 20 MB per image and 50 MB of image bytes per request.
# An image outside them is refused before any request: a 200 MB file must not become a 280 MB request body.
IMAGE_TYPES = ("image/png", "image/jpeg", "image/webp", "image/gif")
MAX_IMAGE_BYTES = 20 * 1024 * 1024
MAX_REQUEST_IMAGE_BYTES = 50 * 1024 * 1024
# Image tokens as OpenAI bills them (detail high/auto): 85 + 170 per 512 px tile of the image scaled to fit
# 2048 x 2048 and then to 768 px on its short side; low detail 85. An image whose size cannot be read (a URL)
# is counted at the most that formula gives (768 x 2048: 2 x 4 tiles), so a cost cap never counts it short.
IMAGE_BASE_TOKENS, IMAGE_TILE_TOKENS = 85, 170
IMAGE_MAX_TOKENS = IMAGE_BASE_TOKENS + IMAGE_TILE_TOKENS * 8


@dataclass(frozen=True)
class Media:
    """One image (``url``: https or data: URI) or audio clip (``data``: base64, ``format``: wav, mp3)."""

    kind: str  # "image" or "audio"
    value: str
    detail: str | None = None
    format: str | None = None

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.value.encode("utf-8")).hexdigest()

    def __str__(self) -> str:
        return f"{self.kind}:sha256:{self.digest}"

    def part(self) -> dict[str, Any]:
        """The chat completions content part."""
        if self.kind == "audio":
            return {"type": "input_audio", "input_audio": {"data": self.value, "format": self.format or "wav"}}
        image: dict[str, Any] = {"url": self.value}
        if self.detail:
            image["detail"] = self.detail
        return {"type": "image_url", "image_url": image}


def as_media(value: Any) -> list[Media]:
    """A cell or a part (a URL, a data: URI, an OpenAI ``input_image``/``input_audio`` or chat part, or a list) as Media.

    Raises:
        ValueError: a value that is neither (a local path must be read by the caller, which knows its folder).
    """
    if value is None or value == "":
        return []
    if isinstance(value, Media):
        return [value]
    if isinstance(value, (list, tuple)):
        return [m for v in value for m in as_media(v)]
    if isinstance(value, str):
        if value.startswith(("data:", "https://", "http://")):
            return [Media("image", _checked(value))]
        raise ValueError(f"a media value must be an http(s) URL or a data: URI, got {value[:60]!r}")
    if isinstance(value, Mapping):
        kind = value.get("type")
        if kind == "input_image":
            return [Media("image", _url(value.get("image_url"))[0], value.get("detail"))]
        if kind == "image_url":
            url, detail = _url(value.get("image_url"))
            return [Media("image", url, detail)]
        if kind == "input_audio":
            audio = value.get("input_audio") or {}
            if isinstance(audio, Mapping) and isinstance(audio.get("data"), str):
                _base64(audio["data"], "an input_audio's data")
                return [Media("audio", audio["data"], format=audio.get("format"))]
    raise ValueError(f"not a media part: {str(value)[:80]!r}")


def _url(image: Any) -> tuple[str, str | None]:
    if isinstance(image, Mapping):
        image, detail = image.get("url"), image.get("detail")
    else:
        detail = None
    if not isinstance(image, str) or not image.startswith(("data:", "https://", "http://")):
        raise ValueError(f"an image must be an http(s) URL or a data: URI, got {str(image)[:60]!r}")
    return _checked(image), detail


def _checked(url: str) -> str:
    """A data: URI the judge can decode (``data:<type>;base64,<payload>``) holding an image type and size the provider
    takes (IMAGE_TYPES, MAX_IMAGE_BYTES): anything else is the row's input error here, before any request, not a
    400 from the provider that fails the row as a judge error (or every row of a run)."""
    if url.startswith("data:"):
        head, comma, payload = url.partition(",")
        if not comma or not head.endswith(";base64"):
            raise ValueError(f"a data: URI must be data:<type>;base64,<data>, got {url[:60]!r}")
        kind = head[len("data:"):-len(";base64")].split(";")[0].strip().lower()
        if kind not in IMAGE_TYPES:
            raise ValueError(f"a data: URI of type {kind or '(none)'!r} is not an image the judge takes "
                             f"({', '.join(IMAGE_TYPES)})")
        if not payload.strip():
            raise ValueError("the data: URI is empty (no image bytes after the comma)")
        size = len(payload) * 3 // 4  # the decoded size, known before decoding a 200 MB payload
        if size > MAX_IMAGE_BYTES:
            raise ValueError(f"the image is {size / 2**20:.1f} MB, over the provider's {MAX_IMAGE_BYTES // 2**20} MB per image: "
                             "downscale it before grading")
        _base64(payload, "the data: URI")
    return url


def check_image_file(path: Any, kind: str | None) -> None:
    """A local image a grader is about to read: its type and size against the provider's limits, before reading it."""
    if kind not in IMAGE_TYPES:
        raise ValueError(f"image {str(path)[-80:]!r}: type {kind or 'unknown'!r} is not an image the judge takes "
                         f"({', '.join(IMAGE_TYPES)})")
    size = path.stat().st_size
    if size == 0:
        raise ValueError(f"image {str(path)[-80:]!r} is empty")
    if size > MAX_IMAGE_BYTES:
        raise ValueError(f"image {str(path)[-80:]!r} is {size / 2**20:.1f} MB, over the provider's "
                         f"{MAX_IMAGE_BYTES // 2**20} MB per image: downscale it before grading")


def check_request_images(media: list[Media]) -> None:
    """One request's images together against the provider's per-request limit (MAX_REQUEST_IMAGE_BYTES)."""
    total = sum(len(m.value.partition(",")[2]) * 3 // 4 for m in media if m.kind == "image" and m.value.startswith("data:"))
    if total > MAX_REQUEST_IMAGE_BYTES:
        raise ValueError(f"the row's images are {total / 2**20:.1f} MB together, over the provider's "
                         f"{MAX_REQUEST_IMAGE_BYTES // 2**20} MB of images per request")


def image_size(url: str) -> tuple[int, int] | None:
    """(width, height) read off a data: URI's PNG, GIF, WEBP or JPEG header; None when it cannot be read."""
    import base64
    import binascii

    if not url.startswith("data:"):
        return None
    payload = url.partition(",")[2]
    try:
        head = base64.b64decode(payload[:87380])  # the first 64 KB (a multiple of 4 characters): where the size is
    except (binascii.Error, ValueError):
        return None
    try:
        if head[:8] == b"\x89PNG\r\n\x1a\n":
            return struct.unpack(">II", head[16:24])
        if head[:6] in (b"GIF87a", b"GIF89a"):
            return struct.unpack("<HH", head[6:10])
        if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
            chunk = head[12:16]
            if chunk == b"VP8X":
                return 1 + int.from_bytes(head[24:27], "little"), 1 + int.from_bytes(head[27:30], "little")
            if chunk == b"VP8 ":
                w, h = struct.unpack("<HH", head[26:30])
                return w & 0x3FFF, h & 0x3FFF
            if chunk == b"VP8L":
                bits = int.from_bytes(head[21:25], "little")
                return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
        if head[:2] == b"\xff\xd8":
            i = 2
            while i + 9 < len(head):
                if head[i] != 0xFF:
                    return None
                marker, length = head[i + 1], struct.unpack(">H", head[i + 2:i + 4])[0]
                if marker in (0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF):
                    h, w = struct.unpack(">HH", head[i + 5:i + 9])
                    return w, h
                i += 2 + length
    except struct.error:
        return None
    return None


def image_tokens(url: str, detail: str | None = None) -> int:
    """The prompt tokens one image costs (OpenAI's tile formula; see IMAGE_MAX_TOKENS for an unreadable size)."""
    if detail == "low":
        return IMAGE_BASE_TOKENS
    size = image_size(url)
    if size is None or min(size) <= 0:
        return IMAGE_MAX_TOKENS
    w, h = size
    scale = min(1.0, 2048 / max(w, h))
    w, h = w * scale, h * scale
    scale = min(1.0, 768 / min(w, h))
    w, h = w * scale, h * scale
    return IMAGE_BASE_TOKENS + IMAGE_TILE_TOKENS * math.ceil(w / 512) * math.ceil(h / 512)


def _base64(payload: str, what: str) -> None:
    import base64
    import binascii

    try:
        base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ValueError(f"{what} is not valid base64 ({e})") from None


def digest_media(messages: Any) -> Any:
    """Messages with every data: URI and audio payload replaced by its digest (for hashing and for logs)."""
    if not isinstance(messages, list) or all(isinstance(m, Mapping) and not isinstance(m.get("content"), list) for m in messages):
        return messages
    out = []
    for message in messages:
        content = message.get("content") if isinstance(message, Mapping) else None
        if not isinstance(content, list):
            out.append(message)
            continue
        parts = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") == "image_url" and isinstance(part.get("image_url"), Mapping):
                url = str(part["image_url"].get("url") or "")
                # Idempotent: a digest already in place (a cassette's stored request, filtered again on load) stays.
                shown = f"data:sha256:{hashlib.sha256(url.encode()).hexdigest()}" if url.startswith("data:") and not url.startswith("data:sha256:") else url
                part = {**part, "image_url": {**part["image_url"], "url": shown}}
            elif isinstance(part, Mapping) and part.get("type") == "input_audio" and isinstance(part.get("input_audio"), Mapping):
                data = str(part["input_audio"].get("data") or "")
                if not data.startswith("sha256:"):
                    part = {**part, "input_audio": {**part["input_audio"], "data": f"sha256:{hashlib.sha256(data.encode()).hexdigest()}"}}
            parts.append(part)
        out.append({**message, "content": parts})
    return out

def data_uri(mime: str | None, payload: str) -> str:
    """A ``data:`` URI of base64 ``payload`` (a file's bytes, a Vertex ``inlineData``); no type: octet-stream."""
    return f"data:{mime or 'application/octet-stream'};base64,{payload}"


def local_media(value: str, root: Path | None) -> str:
    """An image cell (an OpenAI grader's ``input_image``) as the judge takes it: a URL or data: URI as it is, a local path (inside ``root``, the input's folder) as a data: URI.

    Raises:
        ValueError: a path outside ``root`` (after links are resolved), no ``root`` to read it from, or no such file.
    """
    if value.startswith(("data:", "https://", "http://")):
        return value
    if value.startswith("file://"):  # a file URL is a local path like any other: the same folder rule applies
        from urllib.parse import unquote, urlparse

        value = unquote(urlparse(value).path)
    elif re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", value):
        raise ValueError(f"image {value[:80]!r}: a {value.split(':', 1)[0]}:// URL is not one the judge can fetch; give an "
                         "http(s) URL, a data: URI or a path inside the input's folder")
    if root is None:
        raise ValueError(f"image {value[:80]!r} is a local path, and this grader has no input folder to read it from")
    base = root.resolve()
    path = (base / value).resolve()
    if not path.is_relative_to(base):
        raise ValueError(f"image {value[:80]!r} is outside the input's folder {str(base)!r}: refused")
    if not path.is_file():
        raise ValueError(f"image {value[:80]!r}: no such file in {str(base)!r}")
    import base64
    import mimetypes

    kind = mimetypes.guess_type(path.name)[0]
    check_image_file(path, kind)  # type and size before the bytes are read: a 200 MB file is refused, not sent
    return data_uri(kind, base64.b64encode(path.read_bytes()).decode("ascii"))
