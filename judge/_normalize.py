"""Label normalisation applied to both the judge's text and the offered labels before exact match."""

from __future__ import annotations

import functools
import re
import unicodedata

# Zero-width and bidi marks that a model (or an attacker) can slip inside a verdict word.
_INVISIBLE = dict.fromkeys(
    map(ord, "\u200b\u200c\u200d\u200e\u200f\u2060\u2061\u2062\u2063\u2064\ufeff\u00ad\u202a\u202b\u202c\u202d\u202e"),
    None,
)
# Markdown emphasis / code markers around or inside a verdict ("**Yes**", "`correct`", "~~x~~").
_MARKDOWN = re.compile(r"[*_`~]+")
_SPACE = re.compile(r"\s+")
# Punctuation and quotes that may wrap a verdict: ASCII and the CJK forms NFKC leaves alone.
_EDGE = " \t\r\n.,;:!?'\"()[]{}<>-=|/\\#。，；：！？、“”‘’「」『』【】《》〈〉（）…·"


@functools.lru_cache(maxsize=4096)  # judges repeat a handful of verdict words; a warm re-run asks for them a million times
def normalize_label(text: str) -> str:
    """Fold the surface forms of a verdict word to one key.

    NFKC maps full-width Latin letters and digits (Ｙｅｓ) to ASCII; casefold only changes Latin and
    other cased scripts, so 正确 is untouched.
    """
    text = unicodedata.normalize("NFKC", text).translate(_INVISIBLE)
    text = _MARKDOWN.sub("", text)
    text = _SPACE.sub(" ", text).strip(_EDGE)
    return text.casefold()
