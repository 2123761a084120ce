"""The math checker: a long-lived worker with math_verify loaded, answering one check per line.

This file is not imported by gradekit: like the zygote, its text is the ``-c`` program of a
worker started under the sandbox's isolation (:mod:`gradekit.graders.sandbox._policy`), with nothing but
the standard library and the declared packages (math_verify, sympy, ...) on its path.

Why no fork per check: parsing the library costs ~0.4 s once, and a check costs a
millisecond or two; a fork and its copy-on-write faults would double that. A check writes
nothing but sympy's caches, so one warm process answers them in order, pipelined: the host
sends the next lines while this one works, and reads one reply line per request line.

Who stops what: the host holds each check's hard deadline and kills this process (its whole
group) when it passes; that is the only stop for a loop in C (a huge power) or for a
``str()`` that never returns. Inside, the main thread runs every check under its own
``setitimer`` alarm, which raises math_verify's ``TimeoutException`` (a BaseException, so the
library's ``except Exception`` does not swallow it) and keeps raising every 50 ms, in case
some ``except:`` does. A flag set by the alarm makes the check ``timeout`` whatever it
returned: an answer that ran out of time is never ``different``. The library's own timeouts
(which return False) are switched off.

Protocol: the first argument is the settings JSON (limits, CPUs, the parent's pid). The worker
writes ``{"ready": true}`` (or ``{"ready": false, "error": ...}``) once loaded, then for each
request line ``{"id", "gold", "response", "parse", "timeout"}`` one reply line
``{"id", "outcome", "error_kind", "detail", "gold_parsed", "answer_parsed"}``.
"""

import json
import os
import re
import resource
import signal
import sys
import time

SHOWN = 200  # characters of what was parsed that a reply carries
GOLD_CACHE = 1024  # parsed gold answers kept: a prompt's rollouts share their gold


# ---- look-alikes ------------------------------------------------------------------------------
# Characters a model writes that look like ASCII math but that math_verify's plain-text reader
# does not know (U+2212 MINUS SIGN is read inside LaTeX only). Mapped before anything is parsed.

def _table():
    table = {0x2212: "-", 0x2010: "-", 0x2011: "-", 0x2012: "-", 0x2013: "-", 0x2014: "-", 0xFE63: "-", 0xFF0D: "-",
             0x2215: "/", 0x2044: "/", 0x00F7: "/", 0x00D7: "*", 0x2217: "*", 0x22C5: "*", 0x00B7: "*", 0x2219: "*",
             0x2796: "-", 0x2795: "+", 0x2797: "/", 0x2716: "*", 0xFF0E: ".", 0x3002: ".", 0xFF0C: ",", 0x3001: ",",
             0x2024: ".", 0x2032: "'", 0x2033: "''"}
    for code in range(0xFF01, 0xFF5F):  # fullwidth ASCII (digits, letters, signs, brackets)
        table.setdefault(code, chr(code - 0xFEE0))
    for code in (0x00A0, 0x1680, 0x202F, 0x205F, 0x3000, *range(0x2000, 0x200B)):  # spaces of every width
        table[code] = " "
    for code in (0x200B, 0x200C, 0x200D, 0x2060, 0xFEFF, 0x00AD):  # invisible: zero-width, soft hyphen, BOM
        table[code] = None
    return table


LOOKALIKES = _table()
SUPERSCRIPTS = {"\u2070": "0", "\u00b9": "1", "\u00b2": "2", "\u00b3": "3", "\u2074": "4", "\u2075": "5",
                "\u2076": "6", "\u2077": "7", "\u2078": "8", "\u2079": "9", "\u207b": "-"}
_SUPERSCRIPT_RUN = re.compile("[" + "".join(SUPERSCRIPTS) + "]+")


def normalise(text):
    """Look-alike characters as the ASCII math they stand for; ``x²`` as ``x^2``, ``x¹²`` as ``x^(12)``
    (plain-text forms: a superscript digit is almost never inside ``$...$``)."""
    if text.isascii():
        return text
    text = text.translate(LOOKALIKES)

    def power(match):
        digits = "".join(SUPERSCRIPTS[c] for c in match.group(0))
        return "^" + digits if len(digits) == 1 else "^(" + digits + ")"

    return _SUPERSCRIPT_RUN.sub(power, text)


# ---- the last \boxed{} --------------------------------------------------------------------------

_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
GAP = 60  # characters between two boxes that can still join them into one answer
# Between boxes of one answer ("\boxed{2} and \boxed{3}", "\boxed{(3, 3)} \text{ for part (a) and } \boxed{(1, 1)}"):
# no line break, no sentence end, none of the words of a revision ("wait", "no", "so the answer is").
_BREAK = re.compile(r"\n|[.!?](?:\s|$)|\b(?:wait|actually|hmm+|no|not|mistake|instead|correct\w*|however|but|re-?check\w*|check\w*|"
                    r"again|final\w*|therefore|so|thus|hence|then|answer\w*|oops|sorry|wrong|recomput\w*|redo|revis\w*)\b", re.I)


def _boxes(text):
    """Every ``\\boxed{...}`` with balanced braces, as (start, end) spans."""
    spans = []
    for match in _BOX.finditer(text):
        depth, i = 1, match.end()
        while i < len(text) and depth:
            c = text[i]
            if c == "\\":
                i += 2
                continue
            depth += (c == "{") - (c == "}")
            i += 1
        if depth == 0:
            spans.append((match.start(), i))
    return spans


_LEAD_BREAK = re.compile(r"\n|[.!?](?=\s)")


def last_boxed(text):
    """Where the last boxed answer is: (lead, start, end). ``start:end`` is the last box, with the
    boxes just before it that are parts of the same answer (a short gap, no sentence end or
    revision word between them); ``lead`` goes back to the start of its sentence (at most GAP
    characters, never into an earlier box), so ``\\(y_1 = \\boxed{..}\\) and \\(y_2 = \\boxed{..}\\)``
    keeps its delimiters. A draft box followed by prose and another box is not part of it.
    None: no box."""
    spans = _boxes(text)
    if not spans:
        return None
    start, end = spans[-1]
    floor = 0
    for prev_start, prev_end in reversed(spans[:-1]):
        gap = text[prev_end:start]
        if prev_end > start or len(gap) > GAP or _BREAK.search(gap):
            floor = min(prev_end, start)
            break
        start = prev_start
    low = max(floor, start - GAP)
    lead = low
    for lead_match in _LEAD_BREAK.finditer(text, low, start):
        lead = lead_match.end()
    return lead, start, end


# ---- the check ----------------------------------------------------------------------------------


class Checker:
    def __init__(self, mv):
        self.mv = mv
        self.latex = mv.LatexExtractionConfig()
        self.expr = mv.ExprExtractionConfig()
        self.gold_cache = {}
        self.exhausted = None  # a RecursionError or MemoryError the library caught and swallowed during this check
        self._watch()

    def _watch(self):
        """Wrap the library's parse and compare steps so that a RecursionError or MemoryError it
        swallows (``except Exception`` around each step, then a fallback reading) is still seen:
        ``1+1+...+1`` would otherwise be read as its last ``1`` and scored wrong."""
        import math_verify.grader as grader
        import math_verify.parser as parser

        def watched(fn):
            def call(*args, **kwargs):
                try:
                    return fn(*args, **kwargs)
                except (RecursionError, MemoryError) as e:
                    self.exhausted = self.exhausted or type(e).__name__
                    raise
            return call

        for module, names in ((parser, ("parse_expr_cached", "parse_latex_cached")),
                              (grader, [n for n in dir(grader) if n.startswith("sympy_") and callable(getattr(grader, n))])):
            for name in names:
                setattr(module, name, watched(getattr(module, name)))

    def _parse(self, text, configs):
        return self.mv.parse(text, configs, parsing_timeout=None, raise_on_error=True)

    def extract(self, text, modes):
        """What the text answers, as math_verify's parse gives it, and which reading found it."""
        configs = [c for mode, c in (("latex", self.latex), ("expr", self.expr)) if mode in modes]
        how = "+".join(m for m in ("latex", "expr") if m in modes)
        if "boxed" in modes:
            box = last_boxed(text)
            if box is not None:
                if "latex" in modes:
                    # The last boxed answer and what follows it, read as math_verify reads a text (its
                    # "final answer is ..." after the box still wins); drafts before it are not read.
                    return self._parse(text[box[0]:], configs), "the last \\boxed{} on, " + how
                found = self._parse(text[box[1]:box[2]], [self.latex])
                if found or not configs:
                    return found, "the last \\boxed{}"
        if not configs:
            return [], ""
        return self._parse(text, configs), how

    def gold(self, text):
        hit = self.gold_cache.get(text)
        if hit is not None:
            return hit
        found, how = self.extract(text, ("boxed", "latex", "expr"))
        if not found and text.strip() and "$" not in text and "\\(" not in text:
            found, how = self._parse("$" + text + "$", [self.latex]), "latex"  # bare LaTeX: \frac12 without $...$
        hit = (found, how)
        if len(self.gold_cache) >= GOLD_CACHE:
            self.gold_cache.pop(next(iter(self.gold_cache)))
        self.gold_cache[text] = hit
        return hit

    @staticmethod
    def shown(found):
        """A short text of what was parsed: the extracted string math_verify returns beside the
        sympy value (never ``str()`` of the value: that can take forever)."""
        texts = [x for x in found if isinstance(x, str)]
        text = texts[-1] if texts else ("<parsed>" if found else "")
        return text if len(text) <= SHOWN else text[:SHOWN] + "..."

    def check(self, gold, response, modes):
        self.exhausted = None
        reply = self._check(gold, response, modes)
        if self.exhausted and reply["outcome"] != "equal":
            # The library ran out of stack or memory on some reading and fell back to another: not a verdict.
            what = "Python's recursion limit (the expression nests too deep)" if self.exhausted == "RecursionError" else "the memory cap"
            reply = {"outcome": "error", "error_kind": "verifier_error", "gold_parsed": reply.get("gold_parsed"),
                     "answer_parsed": reply.get("answer_parsed"),
                     "detail": f"math_verify hit {what} and fell back to another reading; it would have said {reply['outcome']}"}
        return reply

    def _check(self, gold, response, modes):
        gold, response = normalise(gold), normalise(response)
        if not gold.strip():
            return {"outcome": "invalid_gold", "detail": "the gold answer is empty"}
        g, g_how = self.gold(gold)
        if not g:
            return {"outcome": "invalid_gold", "detail": "math_verify found no answer in the gold text"}
        if all(isinstance(x, str) for x in g) and not any(c.isalnum() for x in g for c in x):
            # Only the text fallback, and no letter or digit in it ("???"): nothing an answer could equal.
            return {"outcome": "invalid_gold", "detail": f"the gold text {self.shown(g)!r} holds no math and no words"}
        gold_shown = self.shown(g)
        if not response.strip():
            return {"outcome": "different", "detail": "the response is empty", "gold_parsed": gold_shown}
        a, a_how = self.extract(response, modes)
        answer_shown = self.shown(a)
        if not a:
            return {"outcome": "different", "detail": f"no answer found in the response (parse: {'+'.join(modes)})",
                    "gold_parsed": gold_shown, "answer_parsed": None}
        error = None
        for gv in g:
            for av in a:
                try:
                    if self.mv.verify(gv, av, timeout_seconds=None, raise_on_error=True):
                        return {"outcome": "equal", "detail": f"gold read as {g_how}, answer as {a_how}",
                                "gold_parsed": gold_shown, "answer_parsed": answer_shown}
                except Exception as e:  # noqa: BLE001 - the library raised for this pair; another may still match
                    error = error or e
        if error is not None:
            return {"outcome": "error", "error_kind": "verifier_error", "gold_parsed": gold_shown, "answer_parsed": answer_shown,
                    "detail": f"math_verify raised {type(error).__name__}: {str(error)[:SHOWN]}"}
        return {"outcome": "different", "detail": f"gold read as {g_how}, answer as {a_how}",
                "gold_parsed": gold_shown, "answer_parsed": answer_shown}


def _limits(settings):
    memory = settings.get("memory") or 0
    if memory:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if settings.get("cpus") and hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(0, settings["cpus"])
        except OSError:
            pass
    if not settings.get("isolated"):
        try:
            import ctypes
            ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG SIGKILL: never outlive the grading process
        except Exception:  # noqa: BLE001
            pass
        if os.getppid() != settings.get("parent"):
            os._exit(0)


def main():
    settings = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 1)  # whatever the library prints goes nowhere, never into the reply stream
    os.dup2(null, 2)
    requests = os.fdopen(os.dup(0), "rb")
    os.dup2(null, 0)

    def send(reply):
        out.write((json.dumps(reply, ensure_ascii=False) + "\n").encode("utf-8"))

    try:
        _limits(settings)
        import logging
        logging.disable(logging.CRITICAL)  # math_verify logs every timeout and parse failure
        import math_verify
        from math_verify.errors import TimeoutException
        checker = Checker(math_verify)
        checker.check("1", "1", ("boxed", "latex", "expr"))  # warm: the regexes compile, the grammar loads
    except BaseException as e:  # noqa: BLE001
        send({"ready": False, "error": f"{type(e).__name__}: {e}"})
        return
    state = {"fired": False}

    def alarm(signum, frame):
        state["fired"] = True
        raise TimeoutException("gradekit: the check's time is up")

    signal.signal(signal.SIGALRM, alarm)
    send({"ready": True, "pid": os.getpid()})
    for line in requests:
        request = json.loads(line)
        state["fired"] = False
        started, cpu = time.perf_counter(), time.process_time()
        reply = None
        try:
            signal.setitimer(signal.ITIMER_REAL, float(request["timeout"]), 0.05)
            try:
                reply = checker.check(request["gold"], request["response"], tuple(request["parse"]))
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except TimeoutException:
            pass
        except MemoryError:
            reply = {"outcome": "error", "error_kind": "verifier_error", "detail": "out of memory (the worker's cap)", "restart": True}
        except RecursionError:
            reply = {"outcome": "error", "error_kind": "verifier_error", "detail": "math_verify recursed too deep"}
        except Exception as e:  # noqa: BLE001 - a library failure is the check's error, never the worker's end
            reply = {"outcome": "error", "error_kind": "verifier_error", "detail": f"math_verify raised {type(e).__name__}: {str(e)[:SHOWN]}"}
        except BaseException:  # noqa: BLE001 - a late alarm between the try and the finally
            if not state["fired"]:
                raise
        if state["fired"] or reply is None:
            # Out of time, whatever came back: never "different" for an answer that was not finished.
            reply = {"outcome": "error", "error_kind": "timeout",
                     "detail": f"the check took longer than {float(request['timeout']):g} s"}
        reply["id"] = request["id"]
        reply["ms"] = round((time.perf_counter() - started) * 1000, 3)
        reply["cpu_ms"] = round((time.process_time() - cpu) * 1000, 3)
        send(reply)


if __name__ == "__main__":
    main()
