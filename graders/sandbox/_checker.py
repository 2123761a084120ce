"""The answer checker: a long-lived worker with math_verify loaded, answering one check per line.

This file is not imported by gradekit: like the zygote, its text is the ``-c`` program of a
worker started under the sandbox's isolation (:mod:`gradekit.graders.sandbox._policy`), with nothing but
the standard library and the declared packages (math_verify, sympy, ...) on its path. The text
rules (:mod:`gradekit.graders.sandbox._answer_rules`: look-alikes, boxes, number words, units,
options, strings) come first in the same program (``checker_source()`` joins the two), so every
kind of check runs here, under one deadline.

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

How a math answer is read (kinds ``number`` and ``expression``): as what it is, not as what the
library's extraction regexes find in it. An answer without delimiters (a gold, a boxed answer,
an already-extracted response) is split into its items at the top level; each item is read
whole by the library's LaTeX parser (never its "last equation" fallback), after the text rules
took out units, percent, currency and number words; a word is a word. Items compare as a set,
except assignments to distinct unknowns (``a = -2, b = -2``), which compare in order against
bare values. Only a response that is prose goes through the library's extraction, as before; a
gold that only the extraction can read must cover at least half of its letters and digits
(the coverage rule), else it is ``invalid_gold`` with the fragment shown.

Protocol: the first argument is the settings JSON (limits, CPUs, the parent's pid). The worker
writes ``{"ready": true}`` (or ``{"ready": false, "error": ...}``) once loaded, then for each
request line ``{"id", "gold", "response", "parse", "timeout", "kind", "question", "options",
"aliases"}`` one reply line ``{"id", "outcome", "error_kind", "detail", "gold_parsed",
"answer_parsed", "kind"}``.
"""

import json
import os
import re
import resource
import signal
import sys
import time
import typing
from fractions import Fraction

if typing.TYPE_CHECKING:  # in a worker these come from the rules' text, which precedes this one
    from ._answer_rules import (DECIMAL_COMMA, GROUPS, SHORT, aliases_of, box_contents, choice_of_text, choice_reading, fraction_latex,
                                has_prose, join_thousands, last_boxed, last_complement, normalise, normalise_string, options_of, parse_options,
                                question_unit, split_items, split_unit, stated_answer, string_readings, strip_wrappers, textual_kind,
                                unwrap_text, word_number, word_of)

SHOWN = 200  # characters of what was parsed that a reply carries
GOLD_CACHE = 1024  # parsed gold answers kept: a prompt's rollouts share their gold
LATEX_CACHE = 4096  # parsed answer parts kept
_PLAIN_NUMBER = re.compile(r"(?P<num>[-+]?(?:\d+(?:\.\d*)?|\.\d+))(?:/(?P<den>[1-9]\d*))?")
COVERAGE = 0.5  # the coverage rule: a gold the extraction reads must keep at least this share of its letters and digits


class Unreadable(Exception):
    """The text is not one answer in a form the reader takes (prose, a part it cannot parse)."""


class Item:
    """One part of an answer: a math value (sympy) or a word, with the unit and percent it carried."""

    __slots__ = ("text", "value", "word", "unit", "percent", "whole", "ratio")

    def __init__(self, text, value=None, word=None, unit=None, percent=False, whole=None, ratio=0):
        self.text, self.value, self.word, self.unit, self.percent = text, value, word, unit, percent
        self.whole = whole  # a percent's number before /100 (25 for 25%)
        self.ratio = ratio  # parts of a ratio (5:8 is 2), 0 when it is none

    def shown(self):
        extra = "".join(f" [{x}]" for x in (self.unit, "%" if self.percent else None) if x)
        return (self.word if self.word is not None else self.text) + extra


class Reading:
    """What one side was read as: its items, how they were joined, and which reading found them."""

    __slots__ = ("items", "joiner", "how", "fragment", "alt")

    def __init__(self, items, joiner, how, fragment=None, alt=None):
        self.items, self.joiner, self.how, self.fragment = items, joiner, how, fragment
        self.alt = alt  # another way to read the same text (1,22 is 1.22 or the list 1, 22)

    def shown(self):
        sep = {"or": " or ", "and": " and "}.get(self.joiner, ", ")
        text = sep.join(item.shown() for item in self.items)
        return text if len(text) <= SHOWN else text[:SHOWN] + "..."


def _significant(text):
    """The letters and digits of a text outside LaTeX command names (for the coverage rule)."""
    return [c for c in re.sub(r"\\[A-Za-z]+", " ", text) if c.isalnum()]


def _math_parts(text):
    """The parts of a gold inside math delimiters ($...$, \\(...\\), \\[...\\], \\boxed{}), or all of it."""
    parts = re.findall(r"\$\$(.+?)\$\$|\$(.+?)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", text, re.S)
    found = [next(g for g in groups if g) for groups in parts if any(groups)]
    return " ".join(found) if found else text


class Checker:
    def __init__(self, mv):
        from math_verify import grader, parser

        # sympy and latex2sympy2_extended as math_verify has them: the versions it was installed with, no import of ours
        self.mv, self.sympy, self.grader, self.parser = mv, parser.sympy, grader, parser
        self.latex = mv.LatexExtractionConfig()
        self.expr = mv.ExprExtractionConfig()
        self.normalization = self.latex.normalization_config
        self.gold_cache = {}
        self.latex_cache = {}
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

    # ---- the library's extraction (prose) ------------------------------------------------------

    def _parse(self, text, configs):
        return self.mv.parse(text, configs, parsing_timeout=None, raise_on_error=True)

    def extract(self, text, modes):
        """What a prose text answers, as math_verify's parse finds it, and which reading found it."""
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

    def library_reading(self, found, how):
        """A Reading of what the library extracted: its first value (a set stays one item); the text it
        matched decides when that is a word (``$silent$`` is a word, not s*i*l*e*n*t)."""
        texts = [x for x in found if isinstance(x, str)]
        values = [x for x in found if not isinstance(x, str)]
        text = texts[-1] if texts else "<parsed>"
        word = word_of(strip_wrappers(text)) if texts else None
        if word is not None:
            return Reading([Item(text, word=word)], "single", how)
        if values:
            return Reading([Item(text, value=values[0])], "single", how)
        return Reading([Item(text, word=text)], "single", how)  # only the library's text fallback

    # ---- reading an answer as what it is -------------------------------------------------------

    def _latex(self, text):
        """The whole of ``text`` parsed as LaTeX (no "last equation" fallback); Unreadable if it is not.
        A plain number skips the grammar (as the library's own number reading does); readings are kept
        (a prompt's rollouts repeat their answers)."""
        hit = self.latex_cache.get(text)
        if hit is not None:
            if isinstance(hit, Unreadable):
                raise hit
            return hit
        try:
            value = self._parse_latex(text)
        except Unreadable as e:
            value = e
        if len(self.latex_cache) >= LATEX_CACHE:
            self.latex_cache.pop(next(iter(self.latex_cache)))
        self.latex_cache[text] = value
        if isinstance(value, Unreadable):
            raise value
        return value

    def _parse_latex(self, text):
        plain = _PLAIN_NUMBER.fullmatch(text.strip())
        if plain:
            number = plain.group("num")
            value = self.sympy.Float(number) if "." in number else self.sympy.Integer(int(number))  # 004 is 4, as the library reads it
            return value / int(plain.group("den")) if plain.group("den") else value
        normalized = self.parser.normalize_latex(text, config=self.normalization)
        try:
            return self.parser.latex2sympy(normalized, is_real=not self.grader.should_treat_as_complex(normalized),
                                           convert_degrees=False, normalization_config=None)
        except (RecursionError, MemoryError):
            raise
        except Exception as e:  # noqa: BLE001 - the parser's own errors: this reading does not hold
            if "\\" not in text and re.search(r"\*\*|[A-Za-z]{2,}\(", text):
                try:  # plain Python-style math: x**2, sqrt(3)
                    return self.parser.parse_expr_cached(text.replace("^", "**"))
                except (RecursionError, MemoryError):
                    raise
                except Exception:  # noqa: BLE001
                    pass
            raise Unreadable(f"{text[:60]!r} does not parse as LaTeX ({type(e).__name__})") from None

    def read_item(self, raw):
        try:
            return self._read_item(raw)
        except (Unreadable, RecursionError, MemoryError):
            raise
        except Exception as e:  # noqa: BLE001 - sympy's own errors on a part (004, a malformed power): not this reading
            raise Unreadable(f"{raw[:60]!r}: {type(e).__name__}") from None

    def _read_item(self, raw):
        text = join_thousands(re.sub(r"^(?:\s|\\[,;:! ]|\\q?quad)+|(?:\s|\\[,;:! ]|\\q?quad)+$", "", strip_wrappers(raw)))
        if not text:
            raise Unreadable("an empty part")
        if "$" in text.replace("\\$", "") or "\\boxed" in text:
            raise Unreadable("prose around math")
        number = word_number(text.strip(" .。!"))
        if number is not None:
            return self._number_item(text, number)
        word = word_of(text)
        if word is not None:
            return Item(text, word=word)
        setbuilder = re.match(r"^\\\{\s*[A-Za-z]\s*(?:\\mid|\||:|\\colon)\s*(.+)\\\}$", text, re.S)
        if setbuilder:  # {x | x > 1} is its condition
            text = setbuilder.group(1).strip()
        core, unit, percent = split_unit(text)
        core = join_thousands(core)
        number = word_number(core)
        if number is not None:
            item = self._number_item(core, number)
        else:
            if has_prose(core):
                raise Unreadable(f"words in {core[:60]!r}")
            item = self._ratio(core) or self._math_item(core)
            item.text = text
        item.unit = unit
        if percent and item.value is not None:
            item.percent, item.whole = True, item.value
            item.value = self.sympy.Mul(item.value, self.sympy.Rational(1, 100))
        return item

    def _number_item(self, text, number):
        """A number written in words, shown as the number it was read as (``5 (five)``)."""
        return Item(f"{fraction_latex(number)} ({text.strip()})", value=self.sympy.Rational(number.numerator, number.denominator))

    def _math_item(self, core):
        core = re.sub(r"(?<![\\A-Za-z])(?:infinity|infty|inf)(?![A-Za-z])", r"\\infty ", core)
        core = re.sub(r"(?<![\\A-Za-z])pi(?![A-Za-z])", r"\\pi ", core)
        core = core.replace("\\varnothing", "\\emptyset")
        core = re.sub(r"\\(?:mathrm|mathit)\s*\{\s*([A-Za-z])\s*\}", r"\1", core)  # \mathrm{e}: the letter
        return Item(core, value=self._latex(core))

    def _ratio(self, core):
        """``5:8`` is 5/8 (so ``10:16`` and ``0.625`` equal it); ``1:2:3`` is (1, 2, 3) up to a factor;
        ``12:00`` (a zero part) is a time, compared as text."""
        parts = re.split(r"\s*(?::|\\colon|∶)\s*", core)
        if len(parts) < 2 or not all(re.fullmatch(r"[-+]?(?:\d+(?:\.\d+)?|\.\d+|\\[dt]?frac\{\d+\}\{\d+\}|\\sqrt\{\d+\})", p) for p in parts):
            return None
        values = [self._latex(p) for p in parts]
        if any(v == 0 for v in values[1:]) or values[0] == 0:
            return Item(core, word=core.replace(" ", ""))
        if len(values) == 2:
            return Item(core, value=values[0] / values[1], ratio=2)
        return Item(core, value=self.sympy.Tuple(*[v / values[0] for v in values]), ratio=len(values))

    def read_answer(self, text, how):
        """``text`` read whole as one answer (its items), or Unreadable."""
        text = strip_wrappers(join_thousands(text))
        if not text:
            raise Unreadable("nothing to read")
        if len(text) > 4 * SHORT and "\n" in text:
            raise Unreadable("a long text, not one answer")
        number = word_number(text.strip(" .。"))
        if number is not None:  # "one hundred and five" is one number, not two items
            return Reading([self._number_item(text, number)], "single", how)
        groups, _ = split_items(text, GROUPS)
        if len(groups) > 1:  # p=5, q=2; p=7, q=2: solutions, each a tuple of unknowns
            readings = [self._items(group) for group in groups]
            if all(len(items) > 1 and self._names(items) for items, _ in readings):
                tuples = [Item(group, value=self.sympy.Tuple(*[i.value.rhs for i in items])) for group, (items, _) in zip(groups, readings)]
                return Reading(tuples, "list", how)
        items, joiner = self._items(text)
        reading = Reading(items, joiner, how)
        if DECIMAL_COMMA.fullmatch(text):  # 1,22: a decimal comma, or two numbers
            reading.alt = Reading([self.read_item(text.replace(",", "."))], "single", how + " (a decimal comma)")
        return reading

    def _items(self, text):
        parts, joiner = split_items(text)
        items = [self.read_item(part) for part in parts]
        return self._joined(items, joiner), joiner

    def _joined(self, items, joiner):
        """Inequalities joined by "and" are one condition; by "or", one union of sets (``x < -1 or x > 2``)."""
        if len(items) < 2 or any(i.value is None for i in items):
            return items
        relational = self.sympy.core.relational.Relational
        if not all(isinstance(i.value, relational) and not isinstance(i.value, self.sympy.Eq) for i in items):
            return items
        text = f" {joiner} ".join(i.text for i in items)
        if joiner == "and":  # latex2sympy2_extended's And, which math_verify compares (as -1 \le a \le 3 parses)
            return [Item(text, value=self.grader.And(*[i.value for i in items]))]
        if joiner == "or":
            symbols = set().union(*(i.value.free_symbols for i in items))
            if len(symbols) == 1:
                return [Item(text, value=self.sympy.Union(*[i.value.as_set() for i in items]))]
        return items

    # ---- gold and response, math kinds ---------------------------------------------------------

    def gold(self, text):
        hit = self.gold_cache.get(text)
        if hit is None:
            hit = self._gold(text)
            if len(self.gold_cache) >= GOLD_CACHE:
                self.gold_cache.pop(next(iter(self.gold_cache)))
            self.gold_cache[text] = hit
        return hit

    def _gold(self, text):
        """The gold's Reading, or a str saying why it is invalid."""
        target, how = text, "the gold as an answer"
        box = last_boxed(text)
        if box is not None:
            target, how = ", ".join(box_contents(text, box[3])), "the gold's last \\boxed{}"
            if len(box[3]) == 1 and re.match(r"\s*\$?\s*(?:\\%|%|percent\b)", text[box[2]:]):
                target += "\\%"  # "$\\boxed{20}$ percent": the gold carries the percent after its box
        try:
            return self.read_answer(target, how)
        except Unreadable as e:
            why = str(e)
        stated = stated_answer(target)
        if stated is not None:
            try:
                return self.read_answer(stated, "the gold's stated answer")
            except Unreadable:
                pass
        found, found_how = self.extract(target, ("boxed", "latex", "expr"))
        if not found and target.strip() and "$" not in target and "\\(" not in target:
            found, found_how = self._parse("$" + target + "$", [self.latex]), "latex"  # bare LaTeX: \frac12 without $...$
        if not found:
            return f"math_verify found no answer in the gold text ({why})"
        if all(isinstance(x, str) for x in found) and not any(c.isalnum() for x in found for c in x):
            return f"the gold text {found[-1][:SHOWN]!r} holds no math and no words"
        reading = self.library_reading(found, "the library's extraction (" + found_how + ")")
        whole, kept = _significant(_math_parts(target)), _significant(reading.items[0].text)
        if whole:
            left = list(whole)
            covered = 0
            for c in kept:
                if c in left:
                    left.remove(c)
                    covered += 1
            if covered / len(whole) < COVERAGE:
                reading.fragment = (f"the coverage rule: the gold reads only as the fragment {reading.items[0].text[:SHOWN]!r}, "
                                    f"{covered} of its {len(whole)} letters and digits ({why})")
        return reading

    def response(self, text, modes):
        """The response's Reading, or None when it holds no answer in the readings ``modes`` allow."""
        extract = "latex" in modes or "expr" in modes
        if "boxed" in modes:
            box = last_boxed(text)
            if box is not None:
                if "answer" in modes and extract:
                    stated = stated_answer(text[box[2]:])  # "\\boxed{..}. The final answer is 10,455": the statement after it wins
                    if stated is not None:
                        try:
                            return self.read_answer(stated, "the stated answer after the last \\boxed{}")
                        except Unreadable:
                            pass
                contents = box_contents(text, box[3])
                try:
                    readings = [self.read_answer(c, "the last \\boxed{}") for c in contents]
                    items = [item for r in readings for item in r.items]
                    return Reading(items, readings[0].joiner if len(readings) == 1 else "list", "the last \\boxed{}")
                except Unreadable:
                    found, how = self.extract(text, modes)
                    return self.library_reading(found, how) if found else None
        if "answer" in modes and extract:
            stated = stated_answer(text)  # "The answer is seventeen.": what it states, before the sentence as a whole
            if stated is not None:
                found = self._math_reading(stated, "the stated answer") or self._math_reading(last_complement(stated), "the stated answer")
                if found is not None:  # "Final Answer: the volume is 120": what the statement says the answer is
                    return found
        whole = None
        if "answer" in modes and (not extract or len(text.strip()) <= SHORT):
            try:
                whole = self.read_answer(text, "the response as the answer")
            except Unreadable:
                if not extract:
                    return None
            # A sentence of words ("I think it is twelve") reads as a phrase: kept only when nothing else reads.
            if whole is not None and not (extract and len(whole.items) == 1 and whole.items[0].word and len(whole.items[0].word.split()) > 2):
                return whole
        if not extract:
            return whole
        if "answer" in modes:
            found = self._math_reading(last_complement(text), "the last sentence's complement")  # "The median is six."
            if found is not None:
                return found
        found, how = self.extract(text, modes)
        return self.library_reading(found, how) if found else whole

    def _math_reading(self, text, how):
        """``text`` read as an answer that holds some math (a stated "the solution", "correct" is not one), or None."""
        if not text:
            return None
        try:
            reading = self.read_answer(text, how)
        except Unreadable:
            return None
        return reading if any(item.word is None for item in reading.items) else None

    # ---- comparing readings --------------------------------------------------------------------

    def verify(self, gold, answer):
        return self.mv.verify(gold, answer, timeout_seconds=None, raise_on_error=True, allow_set_relation_comp=True)

    def same(self, g, a):
        """Whether two items are equal: words as words, values by math_verify, with units and percent.
        A comparison the library raised on is not equal, and is remembered (``self.error``): a check that
        did not come out equal with such an error is ``verifier_error``, not ``different``."""
        try:
            return self._same(g, a)
        except (RecursionError, MemoryError):
            raise
        except Exception as e:  # noqa: BLE001 - the library raised for this pair; another may still match
            self.error = self.error or e
            return False

    def _same(self, g, a):
        if g.word is not None or a.word is not None:
            return g.word is not None and a.word is not None and normalise_string(g.word) == normalise_string(a.word)
        gv, av = g.value, a.value
        pi = self.sympy.pi
        expected = g.unit or self.asked_unit
        if expected and a.unit and a.unit != expected and not (a.unit == "deg" and expected == "rad"):
            return False  # 100 km against a gold of 100 (the question asked for meters)
        if (a.unit == "deg") != (g.unit == "deg"):  # degrees against radians: 60 degrees is pi/3
            if a.unit == "deg" and gv.has(pi):
                av = av * pi / 180
            elif g.unit == "deg" and av.has(pi):
                gv = gv * pi / 180
        if g.ratio > 2 or a.ratio > 2:
            return g.ratio == a.ratio and self.verify(gv, av)
        if g.percent and not a.percent and self.verify(g.whole, av):
            return True  # 25% against 25: the gold carries the percent, the answer left it out
        return self.verify(gv, av)

    def _elements(self, item):
        """A set's elements as items (``\\{1, 2\\}``, ``1 \\pm \\sqrt{5}``, ``x = \\pm 2``); None for any other item."""
        value = item.value
        if value is None or item.ratio:
            return None
        if isinstance(value, self.sympy.FiniteSet):
            return [Item(item.text, value=v, unit=item.unit) for v in self.sympy.ordered(value.args)]
        if isinstance(value, self.sympy.Eq) and isinstance(value.rhs, self.sympy.FiniteSet):
            return [Item(item.text, value=self.sympy.Eq(value.lhs, v, evaluate=False), unit=item.unit)
                    for v in self.sympy.ordered(value.rhs.args)]
        return None

    def _ordered(self, item, n):
        """A tuple or an open interval of n parts, as its parts in order ((2, 5) against x = 2, y = 5)."""
        value = item.value
        if isinstance(value, self.sympy.Tuple) and len(value) == n:
            return [Item(item.text, value=v) for v in value]
        if isinstance(value, self.sympy.Interval) and n == 2 and value.left_open and value.right_open:
            return [Item(item.text, value=value.start), Item(item.text, value=value.end)]
        return None

    def _assigned(self, item):
        """The unknown an item assigns (``a = -2`` -> "a"), or None."""
        value = item.value
        if value is None or not isinstance(value, self.sympy.Eq) or not self.grader.is_assignment_relation(value):
            return None
        return str(value.lhs) if len(str(value.lhs)) <= 40 else None

    def compare(self, gold, answer):
        """Whether the answer's reading equals the gold's (either reading of an ambiguous text)."""
        return any(self._compare(g, a) for g in (gold, gold.alt) if g is not None for a in (answer, answer.alt) if a is not None)

    def _names(self, items):
        """The unknowns items assign when they assign distinct ones (``a = 1, b = 2``), else None."""
        names = [self._assigned(i) for i in items]
        return names if len(items) > 1 and all(names) and len(set(names)) == len(names) else None

    def _compare(self, gold, answer):
        g, a = list(gold.items), list(answer.items)
        if len(g) == 1 and len(a) == 1 and self.same(g[0], a[0]):
            return True
        if len(g) == 1:
            g = self._elements(g[0]) or g
        names, answer_names = self._names(g), self._names(a)
        if names and answer_names:  # both name their unknowns: by name, in any order
            by_name = dict(zip(answer_names, a))
            return set(answer_names) == set(names) and all(self.same(gi, by_name[n]) for gi, n in zip(g, names))
        if names or answer_names:  # a = -2, b = -2 against -2, -2 or (-2, -2): the right-hand sides in order
            named, values = (g, a) if names else (a, g)
            if len(values) == 1:
                values = self._ordered(values[0], len(named)) or self._elements(values[0]) or values
            if len(values) != len(named) or any(isinstance(i.value, self.sympy.Eq) for i in values):
                return False
            rhs = [Item(i.text, value=i.value.rhs, unit=i.unit) for i in named]
            pairs = zip(rhs, values) if names else zip(values, rhs)
            return all(self.same(x, y) for x, y in pairs)
        if len(a) == 1:
            a = self._elements(a[0]) or a
        if len(g) == 1 and len(a) == 1:
            return len(gold.items) + len(answer.items) > 2 and self.same(g[0], a[0])
        if len(g) == 1 or len(a) == 1:  # (1, 3) against 1, 3: a pair (or an open interval) read in order, as the library does
            one, many = (g[0], a) if len(g) == 1 else (a[0], g)
            parts = self._ordered(one, len(many))
            if parts is None:
                return False
            return all(self.same(x, y) for x, y in (zip(parts, many) if len(g) == 1 else zip(many, parts)))
        return self._match(g, a)

    def _match(self, g, a):
        """Whether two lists hold the same elements, as sets (order and repeats aside): every gold item
        equals some answer item and every answer item some gold item."""
        if len(g) == 1 or len(a) == 1:
            return False  # one value against several: a part missing, or a hedge
        equal = [[self.same(gi, ai) for ai in a] for gi in g]
        return all(any(row) for row in equal) and all(any(row[k] for row in equal) for k in range(len(a)))

    # ---- one check ------------------------------------------------------------------------------

    def check(self, request):
        self.exhausted, self.error, self.asked_unit = None, None, None
        reply = self._check(request)
        if self.exhausted and reply["outcome"] != "equal":
            # The library ran out of stack or memory on some reading and fell back to another: not a verdict.
            what = "Python's recursion limit (the expression nests too deep)" if self.exhausted == "RecursionError" else "the memory cap"
            reply = {**reply, "outcome": "error", "error_kind": "verifier_error",
                     "detail": f"math_verify hit {what} and fell back to another reading; it would have said {reply['outcome']}"}
        elif self.error is not None and reply["outcome"] == "different":
            reply = {**reply, "outcome": "error", "error_kind": "verifier_error",
                     "detail": f"math_verify raised {type(self.error).__name__}: {str(self.error)[:SHOWN]}"}
        return reply

    def _check(self, request):
        gold, response = normalise(str(request["gold"])), normalise(str(request["response"]))
        modes = tuple(request.get("parse") or ("boxed", "answer", "latex", "expr"))
        kind = request.get("kind") or "auto"
        aliases = [normalise(a) for a in aliases_of(gold) + [str(a) for a in request.get("aliases") or ()]]
        aliases = [a for a in aliases if a.strip()]
        if not aliases:
            return {"outcome": "invalid_gold", "detail": "the gold answer is empty", "kind": kind}
        options = options_of(request.get("options")) or parse_options(normalise(str(request.get("question") or "")))
        if kind == "auto":
            kind = textual_kind(aliases[0], options)
        if kind == "choice":
            return self.check_choice(aliases, response, options, modes)
        if kind == "string":
            return self.check_string(aliases, response, modes)
        self.asked_unit = question_unit(normalise(str(request.get("question") or "")))
        reply = self.check_math(aliases, response, modes, kind)
        if kind == "math" and reply["outcome"] == "invalid_gold" and not any(c.isdigit() for c in aliases[0]) \
                and re.search(r"[A-Za-z]{2}|[\u4e00-\u9fff]", aliases[0]):
            return self.check_string(aliases, response, modes)  # auto: C++ is no math, but a string
        return reply

    def check_math(self, aliases, response, modes, kind):
        golds = []
        for alias in aliases:
            reading = self.gold(alias)
            if isinstance(reading, str):
                return {"outcome": "invalid_gold", "detail": reading, "kind": "expression" if kind == "math" else kind}
            if reading.fragment:
                return {"outcome": "invalid_gold", "detail": reading.fragment, "gold_parsed": reading.shown(),
                        "kind": "expression" if kind == "math" else kind}
            golds.append(reading)
        numeric = all(len(r.items) == 1 and r.items[0].value is not None and not r.items[0].ratio
                      and getattr(r.items[0].value, "is_number", False) for r in golds)
        if kind == "math":
            kind = "number" if numeric else "expression"
        elif kind == "number" and not numeric:
            return {"outcome": "invalid_gold", "kind": kind, "gold_parsed": golds[0].shown(),
                    "detail": f"kind: number, but the gold reads as {golds[0].shown()!r}, not one number"}
        gold_shown = " | ".join(r.shown() for r in golds)
        if not response.strip():
            return {"outcome": "different", "detail": "the response is empty", "gold_parsed": gold_shown, "kind": kind}
        answer = self.response(response, modes)
        if answer is None:
            return {"outcome": "different", "detail": f"no answer found in the response (parse: {'+'.join(modes)})",
                    "gold_parsed": gold_shown, "answer_parsed": None, "kind": kind}
        outcome = "equal" if any(self.compare(g, answer) for g in golds) else "different"
        return {"outcome": outcome, "detail": f"gold read as {golds[0].how}, answer as {answer.how}", "gold_parsed": gold_shown,
                "answer_parsed": answer.shown(), "kind": kind}

    def check_choice(self, aliases, response, options, modes):
        letters = {choice_of_text(a, options) for a in aliases}
        if None in letters or len(letters) != 1:
            listed = ", ".join(letter for letter, _ in options) or "none listed: A to J"
            return {"outcome": "invalid_gold", "kind": "choice",
                    "detail": f"the gold {aliases[0][:SHOWN]!r} is not one option's letter or text (options: {listed})"}
        gold = letters.pop()
        text = dict(options).get(gold)
        gold_shown = gold + (f" ({text[:SHOWN]})" if text else "")
        if not response.strip():
            return {"outcome": "different", "detail": "the response is empty", "gold_parsed": gold_shown, "kind": "choice"}
        chosen, how = choice_reading(response, options, modes)
        if chosen is None:
            return {"outcome": "different", "detail": how, "gold_parsed": gold_shown, "answer_parsed": None, "kind": "choice"}
        return {"outcome": "equal" if chosen == gold else "different", "detail": f"the answer is {how}", "kind": "choice",
                "gold_parsed": gold_shown, "answer_parsed": chosen + (f" ({dict(options)[chosen][:SHOWN]})" if chosen in dict(options) else "")}

    def check_string(self, aliases, response, modes):
        golds = {}
        for alias in aliases:
            key = normalise_string(unwrap_text(strip_wrappers(alias)))
            if key:
                golds.setdefault(key, alias)
        if not golds:
            return {"outcome": "invalid_gold", "kind": "string", "detail": f"the gold {aliases[0][:SHOWN]!r} holds no letters or digits"}
        gold_shown = " | ".join(list(golds)[:8])[:SHOWN]
        if not response.strip():
            return {"outcome": "different", "detail": "the response is empty", "gold_parsed": gold_shown, "kind": "string"}
        readings = string_readings(response, modes)
        if not readings:
            return {"outcome": "different", "detail": "no answer found in the response", "gold_parsed": gold_shown, "kind": "string"}
        numbers = {_number_of(g) for g in golds} - {None}
        for text, how in readings:
            key = normalise_string(text)
            if key in golds or (numbers and _number_of(key) in numbers):
                return {"outcome": "equal", "detail": f"the answer is {how}", "gold_parsed": gold_shown,
                        "answer_parsed": key[:SHOWN], "kind": "string"}
        return {"outcome": "different", "detail": f"the answer is {readings[0][1]}", "gold_parsed": gold_shown,
                "answer_parsed": normalise_string(readings[0][0])[:SHOWN], "kind": "string"}


def _number_of(text):
    """A short string's number (``5``, ``five``, ``五``), for string answers that are numbers."""
    text = text.strip()
    if re.fullmatch(r"[-+]?\d+(?:\.\d+)?", text):
        return Fraction(text)
    return word_number(text)


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
        checker.check({"gold": "1", "response": "1"})  # warm: the regexes compile, the grammar loads
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
                reply = checker.check(request)
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
