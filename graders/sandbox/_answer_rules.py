"""The answer checker's text rules: how a gold answer and a response are read, before any library runs.

Standard library only, and no ``from __future__``: in a checker worker this text comes first in
the ``-c`` program, before :mod:`gradekit.graders.sandbox._checker` (``checker_source()`` joins
them), so the rules run under the check's deadline and the worker's memory cap like the library
does. The host imports this module too, for the pure parts it needs (kinds, options of a row).

What lives here, each a pure function of text:

- look-alike characters (U+2212, fullwidth digits, ``×``, ``√``, ``π``, ``≤``) as ASCII math or LaTeX;
- the last ``\\boxed{}`` group of a response;
- numbers written in words, in English (``forty-two``, ``one hundred and five``, ``three
  quarters``) and Chinese (``四十二``, ``一百零五``, ``三分之一``, ``负三``);
- thousands separators (``1,234``, ``1 234``, ``1{,}234``), units, percent, currency, degrees;
- an answer split into its items at the top level (commas, ``or``, ``and``, ``或``), brackets kept;
- words: a run of two or more letters is a word, compared as a word (never ``l*i*s*t*e*n``);
- multiple choice: a question's options and the option a response chose;
- short strings: normalised (case, width, accents, punctuation, articles, spaces between CJK).
"""

import json
import re
import unicodedata
from fractions import Fraction

KINDS = ("auto", "number", "expression", "choice", "string")  # what a check's kind may be (auto: told from the gold)
SHORT = 200  # characters: a response this short with no \boxed{} may be the answer itself (parse: auto)


# ---- look-alikes ------------------------------------------------------------------------------
# Characters a model writes that look like ASCII math but that math_verify's plain-text reader
# does not know (U+2212 MINUS SIGN is read inside LaTeX only). Mapped before anything is parsed.

def _table():
    table = {0x2212: "-", 0x2010: "-", 0x2011: "-", 0x2012: "-", 0x2013: "-", 0x2014: "-", 0xFE63: "-", 0xFF0D: "-",
             0x2215: "/", 0x2044: "/", 0x00F7: "/", 0x00D7: "*", 0x2217: "*", 0x22C5: "*", 0x00B7: "*", 0x2219: "*",
             0x2796: "-", 0x2795: "+", 0x2797: "/", 0x2716: "*", 0xFF0E: ".", 0xFF0C: ",", 0x2024: ".", 0x2032: "'", 0x2033: "''",
             0x03C0: "\\pi ", 0x221E: "\\infty ", 0x2264: "\\le ", 0x2265: "\\ge ", 0x2A7D: "\\le ", 0x2A7E: "\\ge ", 0x2260: "\\ne ",
             0x00B1: "\\pm ", 0x2213: "\\mp ", 0x222A: "\\cup ", 0x2229: "\\cap ", 0x2208: "\\in ", 0x2205: "\\emptyset ",
             0x00B0: "^\\circ ", 0x2018: "'", 0x2019: "'", 0x201C: '"', 0x201D: '"'}
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
_ROOT = re.compile(r"\u221a\s*(\d+(?:\.\d+)?|[A-Za-z]|\([^()]*\)|\{[^{}]*\})")


def normalise(text):
    """Look-alike characters as the ASCII math or LaTeX they stand for; ``x²`` as ``x^2``, ``x¹²`` as
    ``x^(12)``, ``2√3`` as ``2\\sqrt{3}``, ``π`` as ``\\pi`` (plain-text forms a model writes)."""
    if text.isascii():
        return text
    text = _ROOT.sub(lambda m: "\\sqrt{" + m.group(1).strip("{}") + "}", text)
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


def boxes(text):
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
    """Where the last boxed answer is: (lead, start, end, spans). ``start:end`` is the last box, with
    the boxes just before it that are parts of the same answer (a short gap, no sentence end or
    revision word between them; ``spans`` lists them); ``lead`` goes back to the start of its
    sentence (at most GAP characters, never into an earlier box), so ``\\(y_1 = \\boxed{..}\\) and
    \\(y_2 = \\boxed{..}\\)`` keeps its delimiters. A draft box followed by prose and another box is
    not part of it. None: no box."""
    spans = boxes(text)
    if not spans:
        return None
    start, end = spans[-1]
    group = [spans[-1]]
    floor = 0
    for prev_start, prev_end in reversed(spans[:-1]):
        gap = text[prev_end:start]
        if prev_end > start or len(gap) > GAP or _BREAK.search(gap):
            floor = min(prev_end, start)
            break
        start = prev_start
        group.insert(0, (prev_start, prev_end))
    low = max(floor, start - GAP)
    lead = low
    for lead_match in _LEAD_BREAK.finditer(text, low, start):
        lead = lead_match.end()
    return lead, start, end, group


def box_contents(text, spans):
    """The text inside each box of ``spans``."""
    out = []
    for start, end in spans:
        inner = text[start:end]
        out.append(inner[inner.index("{") + 1:-1])
    return out


# ---- numbers written in words -----------------------------------------------------------------

_EN_SMALL = {w: i for i, w in enumerate("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
                                        "fifteen sixteen seventeen eighteen nineteen".split())}
_EN_TENS = {w: 10 * (i + 2) for i, w in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split())}
_EN_SCALES = {"thousand": 10**3, "million": 10**6, "billion": 10**9, "trillion": 10**12}
_EN_ORDINALS = {"half": 2, "halves": 2, "third": 3, "quarter": 4, "fourth": 4, "fifth": 5, "sixth": 6, "seventh": 7, "eighth": 8,
                "ninth": 9, "tenth": 10, "eleventh": 11, "twelfth": 12, "hundredth": 100, "thousandth": 1000}


def _en_cardinal(words):
    """A whole number from English words, or None when they are not one (``nineteen eighty`` is not)."""
    total, group, last, last_scale = 0, 0, None, None  # last: small, tens, hundred, scale, and
    for i, word in enumerate(words):
        if word == "and":
            if last not in ("hundred", "scale") or i == len(words) - 1:
                return None
            last = "and"
            continue
        if word == "a" and i == 0 and len(words) > 1 and (words[1] == "hundred" or words[1] in _EN_SCALES):
            group, last = 1, "small"
            continue
        if word in _EN_SMALL:
            value = _EN_SMALL[word]
            if last == "small" or (last == "tens" and not 0 < value < 10) or (last != "tens" and group % 100):
                return None
            group += value
            last = "small"
        elif word in _EN_TENS:
            if last in ("small", "tens") or group % 100:
                return None
            group += _EN_TENS[word]
            last = "tens"
        elif word == "hundred":
            if last not in ("small", "tens") or not 0 < group < 100:
                return None
            group *= 100
            last = "hundred"
        elif word in _EN_SCALES:
            scale = _EN_SCALES[word]
            if group == 0 or (last_scale is not None and scale >= last_scale) or last == "and":
                return None
            total += group * scale
            group, last, last_scale = 0, "scale", scale
        else:
            return None
    return None if last in (None, "and") else total + group


def en_number(text):
    """The number English words say (a Fraction), or None: ``seventeen``, ``minus three``,
    ``one hundred and five``, ``two point five``, ``three quarters``, ``two and a half``."""
    flat = re.sub(r"[\s-]+", " ", text.lower()).strip(" .!")
    words = flat.split()
    if not words or not all(w.isalpha() and w.isascii() for w in words):
        return None
    sign = 1
    if words[0] in ("minus", "negative"):
        sign, words = -1, words[1:]
        if not words:
            return None
    if "point" in words:
        at = words.index("point")
        whole = _en_cardinal(words[:at]) if at else 0
        digits = words[at + 1:]
        if whole is None or not digits or any(_EN_SMALL.get(w, 10) > 9 for w in digits):
            return None
        return sign * (whole + Fraction(int("".join(str(_EN_SMALL[w]) for w in digits)), 10 ** len(digits)))
    last = words[-1]
    denominator = _EN_ORDINALS.get(last) or (_EN_ORDINALS.get(last[:-1]) if last.endswith("s") else None)
    if denominator is not None:
        head, whole = words[:-1], 0
        if "and" in head:  # two and a half, one and three quarters
            at = head.index("and")
            whole, head = _en_cardinal(head[:at]), head[at + 1:]
            if whole is None:
                return None
        if head in ([], ["a"], ["one"]):
            if not head and denominator != 2:
                return None  # "fourth" alone is an ordinal, not a quarter
            numerator = 1
        else:
            numerator = _en_cardinal(head)
        if numerator is None:
            return None
        return sign * (whole + Fraction(numerator, denominator))
    value = _en_cardinal(words)
    return None if value is None else sign * Fraction(value)


_ZH_DIGITS = {"零": 0, "〇": 0, "一": 1, "壹": 1, "二": 2, "贰": 2, "两": 2, "三": 3, "叁": 3, "四": 4, "肆": 4, "五": 5, "伍": 5,
              "六": 6, "陆": 6, "七": 7, "柒": 7, "八": 8, "捌": 8, "九": 9, "玖": 9}
_ZH_UNITS = {"十": 10, "拾": 10, "百": 100, "佰": 100, "千": 1000, "仟": 1000}
_ZH_BIG = {"万": 10**4, "亿": 10**8}
_ZH_CHARS = "".join(_ZH_DIGITS) + "".join(_ZH_UNITS) + "".join(_ZH_BIG)
ZH_NUMERAL_RUN = re.compile(f"[{_ZH_CHARS}]+")


def _zh_integer(text):
    if not text or any(c not in _ZH_CHARS for c in text):
        return None
    if len(text) > 1 and all(c in _ZH_DIGITS for c in text):  # read digit by digit: 二〇二四
        return int("".join(str(_ZH_DIGITS[c]) for c in text))
    total, section, digit = 0, 0, None
    for i, c in enumerate(text):
        if c in _ZH_DIGITS:
            if digit is not None and _ZH_DIGITS[c] != 0 and text[i - 1] not in "零〇":
                return None  # two digits in a row: 三五
            digit = _ZH_DIGITS[c]
        elif c in _ZH_UNITS:
            section += (1 if digit is None else digit) * _ZH_UNITS[c]
            digit = None
        else:
            big = _ZH_BIG[c]
            section += digit or 0
            if section == 0:
                return None
            total = (total + section) * big if big > 10**4 else total + section * big
            section, digit = 0, None
    return total + section + (digit or 0)


def zh_number(text):
    """The number Chinese numerals say (a Fraction), or None: ``三十六``, ``一百零五``, ``两千零二十四``,
    ``负三``, ``三点五``, ``三分之一``, ``二〇二四``."""
    text = text.strip().rstrip("。")
    if not text:
        return None
    sign = 1
    if text[0] == "负":
        sign, text = -1, text[1:]
    if "分之" in text:
        denominator, _, numerator = text.partition("分之")
        d, n = _zh_integer(denominator), _zh_integer(numerator)
        return None if d in (None, 0) or n is None else sign * Fraction(n, d)
    if "点" in text:
        whole, _, digits = text.partition("点")
        w = _zh_integer(whole)
        if w is None or not digits or any(c not in _ZH_DIGITS for c in digits):
            return None
        return sign * (w + Fraction(int("".join(str(_ZH_DIGITS[c]) for c in digits)), 10 ** len(digits)))
    value = _zh_integer(text)
    return None if value is None else sign * Fraction(value)


def word_number(text):
    """A number written in English or Chinese words, or None."""
    stripped = text.strip()
    if not stripped or any(c.isdigit() for c in stripped):
        return None
    if stripped.isascii():
        return en_number(stripped)
    return zh_number(stripped)


def fraction_latex(value):
    """A Fraction as LaTeX the library reads exactly (``\\frac{1}{3}``, ``-3``, ``2.5``)."""
    if value.denominator == 1:
        return str(value.numerator)
    digits = value.denominator
    while digits % 2 == 0:
        digits //= 2
    while digits % 5 == 0:
        digits //= 5
    if digits == 1:  # a terminating decimal: 2.5 stays 2.5
        return format(value.numerator / value.denominator, "f").rstrip("0") if abs(value.numerator) < 10**15 else \
            f"\\frac{{{value.numerator}}}{{{value.denominator}}}"
    sign = "-" if value < 0 else ""
    return f"{sign}\\frac{{{abs(value.numerator)}}}{{{value.denominator}}}"


# ---- numbers, units, percent -------------------------------------------------------------------

_THOUSANDS_LATEX = re.compile(r"(?<=\d)(?:\{,\}|,\\!|\\,|\\;|\\ |\{\\,\})\s*(?=\d{3}(?!\d))")
_THOUSANDS = re.compile(r"[-+]?[1-9]\d{0,2}(?:(?P<sep>[, ])\d{3})(?:(?P=sep)\d{3})*(?:\.\d+)?")
DECIMAL_COMMA = re.compile(r"[-+]?\d+,\d+")


def join_thousands(text):
    """Thousands separators out of a number: ``1,234,567``, ``1 234``, and LaTeX's ``1{,}234``,
    ``1,\\!234``, ``1\\,234`` anywhere (they mean nothing else). The plain comma and space forms
    only when they are the whole ``text`` (one item): in ``(2,12) \\cup (12,102)`` a comma separates."""
    text = _THOUSANDS_LATEX.sub("", text)
    if _THOUSANDS.fullmatch(text.strip()):
        return text.strip().replace(",", "").replace(" ", "")
    return text


# unit word -> its canonical name; a unit not listed compares by its own (singular, lower-case) name
_UNITS = {}
for _canon, _names in {
    "km": "km kilometer kilometers kilometre kilometres 千米 公里", "m": "m meter meters metre metres 米",
    "cm": "cm centimeter centimeters centimetre centimetres 厘米", "mm": "mm millimeter millimeters 毫米",
    "kg": "kg kilogram kilograms kilo kilos 千克 公斤", "g": "g gram grams 克", "mg": "mg milligram milligrams 毫克",
    "s": "s sec secs second seconds 秒", "min": "min mins minute minutes 分钟", "h": "h hr hrs hour hours 小时",
    "day": "day days 天 日", "week": "week weeks 周 星期", "year": "year years yr yrs 年", "month": "month months 月",
    "l": "l liter liters litre litres 升", "ml": "ml milliliter milliliters 毫升", "$": "$ \\$ dollar dollars usd 美元",
    "cent": "cent cents ¢ 分", "deg": "deg degree degrees \\circ ^\\circ ^{\\circ} 度", "rad": "rad radian radians 弧度",
    "yuan": "yuan rmb cny 元 块", "euro": "€ euro euros eur", "pound": "£ pound pounds gbp", "yen": "¥ yen jpy 日元",
    "mph": "mph", "km/h": "km/h kmh kph 千米/小时 公里/小时", "m/s": "m/s 米/秒", "ft": "ft foot feet", "in": "inch inches",
    "mi": "mi mile miles", "lb": "lb lbs", "oz": "oz ounce ounces", "sq": "sq", "unit": "unit units",
}.items():
    for _name in _names.split():
        _UNITS[_name] = _canon
SINGLE_LETTER_UNITS = {"m", "g", "s", "h", "l"}  # "5 m": a unit after a space; "5m" or "2x" stays math
_ZH_WORD = r"(?:(?![零〇一二两三四五六七八九十百千万亿])[\u4e00-\u9fff])"  # a Chinese character that is no numeral
_TEXT_GROUP = r"\\(?:text|textrm|textnormal|mathrm|mbox|operatorname)\s*\{[^{}]*\}"
_UNIT_TAIL = re.compile(
    r"^(?P<core>.*?[\d}).!])\s*(?:\\[,;:! ]\s*)*"  # the number ends with a digit, a brace, a bracket, a factorial
    rf"(?P<unit>(?:{_TEXT_GROUP}(?:\s*\^\s*\{{?\d\}}?)?\s*)+"  # \text{ cm}, \mathrm{km/h}, \text{ m}^2
    r"|\^\s*\{?\\circ\}?(?:\s*[CF]\b)?"  # degrees
    r"|[A-Za-z]{2,}(?:\^\{?\d\}?)?(?:\s*/\s*[A-Za-z]+)?(?:\s+[A-Za-z]{2,}){0,2}"  # dollars, km/h, cm^2, square meters
    r"|[a-z](?:\^\{?\d\}?)?(?:\s*/\s*[a-z]+)?"  # m, g, s, m^2 (after a space only: checked below)
    r"|[\u4e00-\u9fff]+(?:\s*/\s*[\u4e00-\u9fff]+)?)\s*$", re.S)  # 千米/小时, 个, 元
_CURRENCY_HEAD = re.compile(r"^(?P<unit>\\\$|\$|€|£|¥|USD\s*|RMB\s*)\s*(?=[-+\d.\\])")
_PERCENT_TAIL = re.compile(r"\s*(?:\\%|%|\s(?:percent|per cent|percentage|pct)|百分之)\s*$", re.I)


def unit_name(unit):
    """A unit as one canonical name (``kilometres`` -> ``km``); unknown ones singular and lower-case."""
    text = re.sub(rf"\\(?:text|textrm|textnormal|mathrm|mbox|operatorname)\s*\{{([^{{}}]*)\}}", r"\1", unit)
    text = re.sub(r"\s+", " ", text.replace("\\ ", " ").replace("\\,", " ")).strip().lower()
    power = re.search(r"\^\s*\{?(\d)\}?$", text)
    if power:  # m^2, cm^3: the unit's name and its power
        return unit_name(text[:power.start()]) + "^" + power.group(1)
    if text in _UNITS:
        return _UNITS[text]
    if text.startswith("^") or "circ" in text:
        return "deg"
    if len(text) > 3 and text.endswith("s") and not text.endswith("ss"):
        text = text[:-1]
    return _UNITS.get(text, text)


_ZH_NUMERAL_CHARS = set("负零〇一二两三四五六七八九十百千万亿点分之")


def _zh_unit(text):
    """(number, unit) of a Chinese number with a Chinese unit (``三十六个``, ``三十六千米`` as 36 km: a
    unit the table knows wins over a longer number), or None."""
    if not text or text[0] not in _ZH_NUMERAL_CHARS or not _CJK.search(text[-1]) or text[-1] in _ZH_NUMERAL_CHARS:
        return None
    splits = [i for i in range(1, len(text)) if all(c in _ZH_NUMERAL_CHARS for c in text[:i]) and _CJK.match(text[i])]
    for i in splits:
        if text[i:] in _UNITS:
            return text[:i], text[i:]
    tail = [i for i in splits if text[i] not in _ZH_NUMERAL_CHARS]
    return (text[:tail[0]], text[tail[0]:]) if tail else None


def split_unit(text):
    """(core, unit, percent) of one item: ``12 \\text{ km}`` -> (``12``, ``km``, False); ``25\\%`` ->
    (``25``, None, True); ``\\$45`` -> (``45``, ``$``, False). An item that is not a number with a
    unit comes back whole: ``2x`` and ``5m`` are math, ``5 m`` is five metres."""
    core, unit, percent = text.strip(), None, False
    if core.startswith("百分之"):
        core, percent = core[3:], True
    match = _PERCENT_TAIL.search(core)
    if match and match.start() > 0:
        core, percent = core[:match.start()].strip(), True
    match = _CURRENCY_HEAD.match(core)
    if match:
        core, unit = core[match.end():].strip(), unit_name(match.group("unit").strip())
    zh = _zh_unit(core)
    if zh is not None:
        return zh[0], unit or unit_name(zh[1]), percent
    match = _UNIT_TAIL.match(core)
    if match is None:
        return core, unit, percent
    head, tail = match.group("core").strip(), match.group("unit").strip()
    spaced = match.start("unit") > match.end("core")  # a space (or \,) between the number and the unit
    if re.fullmatch(r"[a-z](?:\^\{?\d\}?)?(?:\s*/\s*[a-z]+)?", tail):
        accepted = spaced and (tail[0] in SINGLE_LETTER_UNITS or "/" in tail)  # 5 m, 36 m^2, but 2x, 5m, 4k are math
    elif re.fullmatch(r"[A-Za-z]{2,}.*", tail, re.S):
        accepted = (spaced or tail.lower() in _UNITS) and not _is_prose_word(tail)  # 45 dollars, 12km; not 2ab, not "3 is odd"
    else:
        accepted = True  # \text{ cm}, ^\circ, 千米/小时
    if not accepted or not head:
        return core, unit, percent
    return head, unit or unit_name(tail), percent


_QUESTION_UNIT = re.compile(r"\bin\s+(?P<power>square\s+|cubic\s+)?(?P<a>[A-Za-z]+(?:/[A-Za-z]+)?)\b"
                            r"|\((?:in\s+)?(?P<b>[A-Za-z]+(?:/[A-Za-z]+)?)\)|以(?P<c>[\u4e00-\u9fff]{1,4})为单位", re.I)


def question_unit(question):
    """The unit a question asks the answer in (``How far, in km?`` -> ``km``; ``in square meters`` ->
    ``m^2``), or None."""
    for match in _QUESTION_UNIT.finditer(question or ""):
        name = match.group("a") or match.group("b") or match.group("c")
        canonical = _UNITS.get(name.lower(), _UNITS.get(name))
        if canonical is not None:
            power = (match.group("power") or "").strip().lower()
            return canonical + {"square": "^2", "cubic": "^3"}.get(power, "")
    return None


_PROSE_WORDS = {"or", "and", "is", "are", "be", "the", "where", "when", "for", "all", "with", "of", "which", "if", "then", "so",
                "not", "an", "to", "it", "as", "at", "by", "on", "no", "we"}


def _is_prose_word(word):
    return any(w.lower() in _PROSE_WORDS for w in re.findall(r"[A-Za-z]+", word))


# ---- items and words ----------------------------------------------------------------------------

_WRAPPERS = ((r"^\$\$(.*)\$\$$", re.S), (r"^\$(.*)\$$", re.S), (r"^\\\((.*)\\\)$", re.S), (r"^\\\[(.*)\\\]$", re.S))
_WRAPPER_RES = [re.compile(p, f) for p, f in _WRAPPERS]
_TRAILING = re.compile(r"(?:\s|\\[,;:! ]|\\quad|\\qquad)*[.。;；]?\s*$")


def strip_wrappers(text):
    """An answer without what surrounds the whole of it: ``$...$``, ``\\(...\\)``, ``\\[...\\]``,
    ``\\boxed{...}``, grouping braces, a final period; repeated (``$\\boxed{5}$.``)."""
    text = text.strip()
    while True:
        before = text
        text = _TRAILING.sub("", text).strip()
        for pattern in _WRAPPER_RES:
            match = pattern.match(text)
            if match and "$" not in match.group(1).replace("\\$", ""):
                text = match.group(1).strip()
        spans = boxes(text)
        if len(spans) == 1 and spans[0] == (0, len(text)):
            text = box_contents(text, spans)[0].strip()
        elif text.startswith("{") and text.endswith("}") and _one_group(text):
            text = text[1:-1].strip()  # {35 cm, 4}: braces that only group
        if text == before:
            return text


def _one_group(text):
    """Whether ``{...}`` is one brace group from its first character to its last."""
    depth = 0
    for i, c in enumerate(text):
        if c == "\\":
            continue
        depth += (c == "{") - (c == "}")
        if depth == 0 and i < len(text) - 1:
            return False
    return depth == 0


_OPEN, _CLOSE = "([{", ")]}"
_SEPARATOR = re.compile(
    r"\\(?:text|textrm|textnormal|mathrm|mbox)\s*\{\s*(or|and|,)\s*\}"  # \text{ or }
    r"|\s+(or|and)\s+"  # a spaced word
    r"|(\\quad|\\qquad|或者|或|以及|和|及)"  # zh joiners, wide spaces
    r"|(,|;|，|；|\n)", re.I)


def split_items(text, separator=None):
    """(items, joiner): the answer's parts at the top level (never inside brackets or braces), and how
    they were joined: ``"single"``, ``"list"`` (commas), or ``"or"`` / ``"and"`` (words).
    ``separator`` (a compiled pattern): split only there (``;`` between groups of ``p=5, q=2; p=7, q=2``)."""
    items, joiner, depth, start, i = [], "single", 0, 0, 0
    n = len(text)
    while i < n:
        c = text[i]
        if c == "\\" and i + 1 < n and text[i + 1] in "{}":  # \{ \} open and close a set
            depth += 1 if text[i + 1] == "{" else -1
            i += 2
            continue
        if c == "\\" and text.startswith(("\\left", "\\right"), i):
            i += 5 if text.startswith("\\left", i) else 6
            continue
        if c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth = max(0, depth - 1)
        elif depth == 0:
            match = (separator or _SEPARATOR).match(text, i)
            if match and separator is not None:
                items.append(text[start:i])
                joiner, i = "list", match.end()
                start = i
                continue
            if match and not (match.group(4) == "," and _thousands_comma(text, i)):
                items.append(text[start:i])
                word = (match.group(1) or match.group(2) or "").lower()
                mark = match.group(3) or match.group(4) or ""
                here = "or" if word == "or" or mark in ("或者", "或") else "and" if word == "and" or mark in ("以及", "和", "及") else "list"
                joiner = here if joiner in ("single", "list") or here == joiner else ("or" if "or" in (here, joiner) else joiner)
                i = start = match.end()
                continue
        i += 1
    items.append(text[start:])
    items = [s.strip() for s in items]
    items = [s for s in items if s and s not in ("\\", "\\ ")]
    return (items, joiner if len(items) > 1 else "single")


GROUPS = re.compile(r"[;；]")


def _thousands_comma(text, i):
    return i > 0 and text[i - 1].isdigit() and re.match(r",\d{3}(?!\d)", text[i:]) is not None and \
        re.search(r"(?<![\d.,])[1-9]\d{0,2}(?:,\d{3})*$", text[:i]) is not None


_COMMAND = re.compile(r"\\[A-Za-z]+")
_ENVIRONMENT = re.compile(r"\\(?:begin|end)\s*\{[A-Za-z*]+\}|\\(?:color|textcolor)\s*\{[A-Za-z]+\}")
_TEXT_ARG = re.compile(rf"{_TEXT_GROUP}|\\text(?:bf|it|sf|tt)?\s*\{{[^{{}}]*\}}")
# Names that are math, not words, when they stand alone or inside an expression.
MATH_NAMES = {"sin", "cos", "tan", "cot", "sec", "csc", "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh", "log", "ln", "lg",
              "exp", "lim", "max", "min", "gcd", "lcm", "mod", "det", "sqrt", "pi", "inf", "infty", "infinity", "deg", "arg", "sgn",
              "cis", "tr", "rank", "dx", "dy", "dt", "oo", "e"}
_WORD_ITEM = re.compile(r"^[A-Za-z][A-Za-z'\-]*(?:\s+[A-Za-z][A-Za-z'\-]*)*$")
_TEXT_ONLY = re.compile(rf"^(?:\\text(?:bf|it|sf|tt|rm|normal)?|\\mathrm|\\mbox|\\operatorname|\\textsc)\s*\{{([^{{}}]*)\}}$")


def unwrap_text(text):
    """``\\text{Monday}`` -> ``Monday``; other text unchanged."""
    match = _TEXT_ONLY.match(text.strip())
    return match.group(1).strip() if match else text.strip()


def word_of(item):
    """The item as a word or phrase (``listen``, ``\\text{no solution}``, ``Tuesday``), or None when it is
    math: a single letter (``x``), a math name (``pi``), or anything with digits or operators."""
    text = unwrap_text(item)
    if not text.isascii():
        plain = text.strip(" .。!！")
        if plain and not any(c.isdigit() for c in plain) and not re.search(r"[=+*/^<>\\]", plain) and zh_number(plain) is None \
                and _zh_unit(plain) is None:
            return plain  # CJK words (三十六个 is a number and its unit)
        return None
    if not _WORD_ITEM.match(text):
        return None
    letters = re.sub(r"[^A-Za-z]", "", text)
    if len(letters) < 2 or text.lower() in MATH_NAMES:
        return None
    return text


def has_prose(item):
    """Whether an item mixes words into math (``4k+3 where k is odd``): then it is not one answer.
    A word is a chunk of letters standing alone: three or more letters that are not a math name or a
    unit, or a two-letter function word (``is``, ``or``); ``2ab`` and ``a b`` stay products."""
    text = _TEXT_ARG.sub(lambda m: " " + m.group(0)[m.group(0).index("{") + 1:-1] + " ", item)
    text = _COMMAND.sub(" ", _ENVIRONMENT.sub(" ", text))
    for chunk in text.split():
        bare = chunk.strip(".,;:!?()[]{}")
        if bare.isascii() and bare.isalpha():
            lower = bare.lower()
            if (len(bare) >= 3 and lower not in MATH_NAMES and lower not in _UNITS) or lower in _PROSE_WORDS:
                return True
        elif _CJK.search(bare) and not ZH_NUMERAL_RUN.fullmatch(bare):
            return True
    return False


# ---- stated answers ---------------------------------------------------------------------------

_STATED = re.compile(
    r"(?:(?:final|correct|best|my)\s+)?answer(?:\s+to\s+(?:the|this|your)\s+question)?\s*(?:is|:|=|will\s+be|would\s+be)\s*:?\s*"
    r"|答案(?:是|为|應為|应为|：|:)\s*|(?:结果|結果)(?:是|为|：|:)\s*", re.I)
_SENTENCE_END = re.compile(r"(?:(?<!\d)\.(?!\d)|[!?。！？\n]|$)")


def stated_answer(text):
    """What the last "the answer is ..." / "Answer: ..." / "答案是..." states, up to the end of its
    sentence, or None."""
    last = None
    for match in _STATED.finditer(text):
        last = match
    if last is None:
        return None
    rest = text[last.end():]
    end = _SENTENCE_END.search(rest)
    stated = rest[:end.start()] if end else rest
    stated = stated.strip().strip("*").strip()
    return stated or None


def plain_answer(text):
    """A short answer without markdown emphasis, quotes or a final full stop (``**Paris**.`` -> ``Paris``)."""
    text = text.strip()
    for _ in range(3):
        before = text
        text = text.strip().strip("*_`").strip()
        text = re.sub(r"[.。!！?？;；,，]+$", "", text).strip()
        if len(text) >= 2 and text[0] + text[-1] in ('""', "''", "「」", "『』", "“”", "‘’", "《》", "()"):
            text = text[1:-1].strip()
        if text == before:
            break
    return text


# ---- strings ------------------------------------------------------------------------------------

_KEEP_SIGNS = set("+#&%$@°")
_ARTICLES = {"a", "an", "the"}
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")


def normalise_string(text):
    """A short answer as compared: NFKC (width), case-folded, accents dropped, LaTeX text wrappers and
    markdown removed, apostrophes and dots dropped (``O'Brien``, ``U.S.A.``), other punctuation a space
    (``Jean-Paul``) except signs that change meaning (``C++``, ``C#``), English articles dropped,
    no spaces between CJK characters, Chinese numerals as digits (``三月`` is ``3月``)."""
    text = unicodedata.normalize("NFKC", text)
    text = re.sub(r"\\(?:text\w*|mathrm|mbox|textbf|emph)\s*\{([^{}]*)\}", r"\1", text)
    text = text.replace("\\", " ").casefold()
    text = "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))
    out = []
    for c in text:
        if c in "'’.·":
            continue
        if c in _KEEP_SIGNS or c.isalnum() or c.isspace() or _CJK.match(c):
            out.append(c)
        elif unicodedata.category(c)[0] in "PSZ":
            out.append(" ")
        else:
            out.append(c)
    words = "".join(out).split()
    if words and not any(_CJK.search(w) for w in words):
        words = [w for w in words if w not in _ARTICLES] or words
    text = " ".join(words)
    text = re.sub(r"(?<=[\u3400-\u9fff]) (?=[\u3400-\u9fff])", "", text)
    return ZH_NUMERAL_RUN.sub(lambda m: str(_zh_integer(m.group(0))) if _zh_integer(m.group(0)) is not None else m.group(0), text)


_COPULA = re.compile(r"(?:\b(?:is|are|was|were|equals|it's|its)\s+|是)(?P<x>[^,;:，；：]+?)\s*$", re.I)


def last_complement(text):
    """What the last sentence says something is: ``The median is six.`` -> ``six``, ``It's Saturn`` ->
    ``Saturn``, ``首都是北京`` -> ``北京``; None when its last sentence says no such thing."""
    sentences = [s for s in re.split(r"(?<=[.!?。！？])\s*|\n+", text.strip()) if s.strip()]
    if not sentences or len(sentences[-1]) > SHORT:
        return None
    match = _COPULA.search(plain_answer(sentences[-1]))
    return plain_answer(match.group("x")) if match else None


def string_readings(response, modes):
    """What a response states as its answer, as (text, how) readings in order: the last box, the last
    "the answer is ...", the whole response when short, the end of its last sentence after "is" / "是"."""
    out = []
    text = response.strip()
    if "boxed" in modes:
        box = last_boxed(text)
        if box is not None:
            return [(plain_answer(unwrap_text(c)), "the last \\boxed{}") for c in box_contents(text, box[3])][-1:]
    if "answer" in modes and ("latex" not in modes or len(text) <= SHORT):
        out.append((plain_answer(strip_wrappers(text)), "the whole response"))
    if "latex" in modes or "expr" in modes:
        stated = stated_answer(text)
        if stated is not None:
            out.insert(0, (plain_answer(stated), "the stated answer"))
        last = [s for s in re.split(r"(?<=[.!?。！？])\s*|\n+", text) if s.strip()]
        if last and len(last[-1]) <= SHORT:
            out.append((plain_answer(last[-1]), "the last sentence"))
            complement = last_complement(text)
            if complement:
                out.append((complement, "the last sentence's complement"))
    return out


# ---- multiple choice ----------------------------------------------------------------------------

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_OPTION_LINE = re.compile(r"^\s*(?:[-*]\s*)?(?:\(([A-Z])\)|([A-Z])\s*[.)．、:：])\s*(?P<text>.*\S)?\s*$", re.M)
_OPTION_INLINE = re.compile(r"(?:^|\s)\(([A-Z])\)\s*")


def parse_options(question):
    """The options a question lists, as [(letter, text), ...] from A on, consecutive; [] when none.
    One per line (``A. Paris``, ``(B) 56``, ``C) Rome``, ``D: Berlin``, ``A、上海``) or inline
    (``(A) 54 (B) 56 (C) 64``)."""
    if not question:
        return []
    found = []
    for match in _OPTION_LINE.finditer(question):
        found.append((match.group(1) or match.group(2), (match.group("text") or "").strip()))
    options = _consecutive(found)
    if len(options) >= 2:
        return options
    marks = list(_OPTION_INLINE.finditer(question))
    inline = [(m.group(1), question[m.end():(marks[k + 1].start() if k + 1 < len(marks) else len(question))].strip())
              for k, m in enumerate(marks)]
    options = _consecutive(inline)
    return options if len(options) >= 2 else []


def _consecutive(found):
    """The last run of options lettered A, B, C, ... (a question may quote an earlier list)."""
    runs, run = [], []
    for letter, text in found:
        if letter == "A":
            run = [(letter, text)]
            runs.append(run)
        elif run and ord(letter) == ord(run[-1][0]) + 1:
            run.append((letter, text))
    return list(runs[-1]) if runs else []


def options_of(value):
    """Options given as data (a list of texts, a {letter: text} mapping, or text listing them) as
    [(letter, text), ...]."""
    if value is None:
        return []
    if isinstance(value, str):
        stripped = value.strip()
        if stripped.startswith(("[", "{")):
            try:
                return options_of(json.loads(stripped))
            except ValueError:
                pass
        return parse_options(value)
    if isinstance(value, dict):
        return [(str(k).strip().strip("()").upper(), str(v)) for k, v in value.items()]
    if isinstance(value, (list, tuple)):
        out = []
        for i, v in enumerate(value):
            if isinstance(v, (list, tuple)) and len(v) == 2:
                out.append((str(v[0]).strip().strip("()").upper(), str(v[1])))
            else:
                out.append((LETTERS[i] if i < len(LETTERS) else str(i), str(v)))
        return out
    return []


_LETTER_FORM = re.compile(r"^\s*(?:(?:option|choice)\s+|选项\s*)?(?P<open>[\(\[（【])?\s*(?P<letter>[A-Za-z])(?![A-Za-z'’])\s*"
                          r"(?P<close>[\)\]）】])?\s*(?P<sep>[.:：、．)]|\s|$)\s*(?P<rest>.*?)\s*$", re.S | re.I)


def choice_of_text(text, options):
    """The letter a short answer names: ``B``, ``(B)``, ``B. Paris``, ``\\text{(B)}``, ``b``, or an
    option's full text (``Paris``); None when it names none. A letter followed by another option's
    text (``B. London`` where B is Paris) is a contradiction: None."""
    text = plain_answer(unwrap_text(strip_wrappers(text)))
    text = re.sub(r"\\text(?:bf|rm)?\s*\{([^{}]*)\}", r"\1", text).strip()
    if not text:
        return None
    letters = [l for l, _ in options] or list(LETTERS[:10])
    by_text = {}
    for letter, option in options:
        by_text.setdefault(normalise_string(option), letter)
    match = _LETTER_FORM.match(text)
    if match and match.group("letter").upper() in letters:
        letter, rest = match.group("letter").upper(), plain_answer(match.group("rest"))
        if not rest:
            return letter
        named = by_text.get(normalise_string(rest))
        if named is not None:
            return letter if named == letter else None
        marked = match.group("open") or match.group("close") or (match.group("sep") or "").strip()
        if marked and match.group("letter").isupper():
            return letter  # "(C) the letter A", "B. because ...": a marked capital letter, then words
    return by_text.get(normalise_string(text))


_ANSWER_STATEMENTS = [re.compile(p, re.I) for p in (
    r"\b(?:correct|right|best|final)\s+(?:option|choice)\s*(?:is|:|：|would\s+be)?\s*:?\s*[\(\[（【]?\s*\**\s*(?P<letter>[A-Za-z])(?![A-Za-z'’])",
    r"answer\s*(?:is|:|：|=|would\s+be|will\s+be|should\s+be)?\s*:?\s*(?:option|choice)?\s*[\(\[（【]?\s*\**\s*"
    r"(?:\\text(?:bf|rm)?\{\s*\(?)?(?P<letter>[A-Za-z])(?![A-Za-z'’])",
    r"(?:答案|选项|选择|选)\s*(?:是|为|應為|应为|：|:)?\s*[\(\[（【]?(?P<letter>[A-Za-z])(?![A-Za-z])",
)]
_OTHER_STATEMENTS = [re.compile(p, re.I) for p in (
    r"\b(?:option|choice)\s*[\(\[（]?(?P<letter>[A-Z])(?![A-Za-z'’])",
    r"\b(?:choose|chose|pick|picked|select|selected|go\s+with)\s*(?:option\s*)?[\(\[（]?(?P<letter>[A-Za-z])(?![A-Za-z'’])",
    r"(?:^|[\s\(\[（])(?P<letter>[A-Z])[\)\]）]?\s+(?:is|would\s+be)\s+(?:the\s+)?(?:correct|right|best)\b",
    r"\bit(?:'s|’s|\s+is)\s+[\(\[（]?(?P<letter>[A-Z])(?![A-Za-z'’])[\)\]）]?\s*[.!]?\s*$",
)]
_HEDGE = re.compile(r"^\s*[\)\]）】]?\s*(?:(?i:or|and)|/|,|、|或|和)\s*(?:(?i:option)\s*)?[\(\[（]?[A-J](?![A-Za-z])")


def _statement(text, patterns, letters):
    """The last letter a pattern states in ``text``: (position, letter, what follows), or None."""
    best = None
    for pattern in patterns:
        for match in pattern.finditer(text):
            letter, after = match.group("letter"), text[match.end():]
            if letter.islower() and re.match(r"\s*[A-Za-z]", after):
                continue  # "the answer is a prime": an article, not a letter
            if letter.upper() in letters and (best is None or match.start("letter") > best[0]):
                best = (match.start("letter"), letter.upper(), after)
    return best


def choice_reading(response, options, modes):
    """(letter, how) the response chose, or (None, why). In order: the last ``\\boxed{}``; the whole
    response as a letter or an option's text (``B``, ``(B)``, ``B. Paris``, ``Paris``) when short; the
    last "answer" statement (``the answer is (B)``, ``Answer: B``, ``答案是B``, ``选B``), else the last
    other statement (``Option B is correct``, ``I choose B``, ``It's B``); what "the answer is" states,
    as an option's text; the last line. A statement that names two letters (``B or C``) or a letter
    with another option's text chooses nothing."""
    text = response.strip()
    letters = [l for l, _ in options] or list(LETTERS[:10])
    if "boxed" in modes:
        box = last_boxed(text)
        if box is not None:
            chosen = {choice_of_text(c, options) for c in box_contents(text, box[3])}
            if len(chosen) == 1 and None not in chosen:
                return chosen.pop(), "the last \\boxed{}"
            return None, "the last \\boxed{} names no single option"
    extract = "latex" in modes or "expr" in modes
    if "answer" in modes and (not extract or len(text) <= SHORT):
        letter = choice_of_text(text, options)
        if letter is not None:
            return letter, "the whole response"
    if not extract:
        return None, "the response is not an option's letter or text"
    best = _statement(text, _ANSWER_STATEMENTS, letters) or _statement(text, _OTHER_STATEMENTS, letters)
    if best is not None:
        _, letter, after = best
        if _HEDGE.match(after):
            return None, f"the response names {letter} and another option"
        following = re.split(r"[.。!?！？\n]", re.sub(r"^[\s\)\]）】:：,，.]+", "", after), maxsplit=1)[0]
        named = {normalise_string(o): l for l, o in options}.get(normalise_string(plain_answer(following))) if following else None
        if named is not None and named != letter:
            return None, f"the response names {letter} with the text of option {named}"
        return letter, "the stated choice"
    stated = stated_answer(text)
    if stated is not None:
        letter = choice_of_text(stated, options)
        if letter is not None:
            return letter, "the stated answer"
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) > 1 and len(lines[-1]) <= SHORT:
        letter = choice_of_text(lines[-1], options)
        if letter is not None:
            return letter, "the last line"
    return None, "no option chosen"


# ---- the kind of a gold -------------------------------------------------------------------------

_MATH_MARK = re.compile(r"[\d=+*/^<>_|]|\\(?!text|mathrm|mbox|textbf|operatorname)[A-Za-z]+|\\[{}]|\\%")


def aliases_of(gold):
    """A gold that is a JSON list of strings is its aliases (an empty list: none); any other gold is one answer."""
    text = gold.strip()
    if text.startswith("[") and text.endswith("]"):
        try:
            value = json.loads(text)
        except ValueError:
            return [gold]
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return [v for v in value if v.strip()]  # [] and [""]: no answer at all
    return [gold]


def textual_kind(gold, options):
    """``choice``, ``string`` or ``math`` (the math reader tells number from expression): a letter
    among the options (or a letter A-J when the question lists none), or an option's text, is a
    choice; words without digits or math (not number words) are a string; the rest is math."""
    plain = plain_answer(unwrap_text(strip_wrappers(gold)))
    if re.fullmatch(r"[\(\[（]?[A-J][\)\]）]?\.?", plain) and (not options or plain.strip("()[]（）.") in [l for l, _ in options]):
        return "choice"
    if options and choice_of_text(gold, options) is not None and re.match(r"^[\(\[（]?[A-Z][\)\]）.:]", plain + " ") is not None:
        return "choice"
    if options and normalise_string(plain) in {normalise_string(o) for _, o in options} and word_number(plain) is None:
        return "choice"
    if word_number(plain) is not None:
        return "math"
    body = unwrap_text(plain)
    if re.fullmatch(r"[A-Za-z]+[+#]+", body):
        return "string"  # C++, C#: names, not sums
    if _MATH_MARK.search(body):
        return "math"
    if re.fullmatch(r"[A-Za-z]", body.strip()):
        return "math"  # a single letter: a variable or a constant (x, e)
    return "string" if body.strip() else "math"
