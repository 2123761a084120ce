"""The deterministic checks that label eval_sets/instruction_checklist (IFEval-style verifiable instructions).

Each criterion of a row names a check and its argument; ``python checks.py`` re-derives every
label from the responses and fails if one differs from data.jsonl, so the labels stay verifiable.
Standard library only.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

DATA = Path(__file__).with_name("data.jsonl")


def _words(text: str) -> list[str]:
    return re.findall(r"[A-Za-z0-9']+", text)


def _paragraphs(text: str) -> list[str]:
    return [p for p in re.split(r"\n\s*\n", text.strip()) if p.strip()]


def _bullets(text: str) -> list[str]:
    return [line for line in text.splitlines() if re.match(r"^\s*[*-] ", line)]


def _han(text: str) -> int:
    return len(re.findall(r"[\u4e00-\u9fff]", text))


CHECKS = {
    "lowercase": lambda t, a: t == t.lower(),
    "no_commas": lambda t, a: "," not in t and "，" not in t,
    "max_words": lambda t, a: len(_words(t)) < int(a),
    "min_words": lambda t, a: len(_words(t)) >= int(a),
    "keywords": lambda t, a: all(k.lower() in t.lower() for k in a),
    "ends_with": lambda t, a: t.rstrip().endswith(a),
    "paragraphs": lambda t, a: len(_paragraphs(t)) == int(a),
    "bullets": lambda t, a: len(_bullets(t)) == int(a),
    "title": lambda t, a: re.search(r"<<[^<>\n]+>>", t) is not None,
    "quoted": lambda t, a: t.strip().startswith('"') and t.strip().endswith('"'),
    "uppercase": lambda t, a: t == t.upper(),
    "json": lambda t, a: _is_json(t),
    "max_han": lambda t, a: _han(t) < int(a),
    "min_han": lambda t, a: _han(t) >= int(a),
    "book_title": lambda t, a: re.search(r"《[^《》\n]+》", t) is not None,
    "forbidden": lambda t, a: not any(k.lower() in t.lower() for k in a),
}


def _is_json(text: str) -> bool:
    body = re.sub(r"^```(?:json)?\s*|\s*```$", "", text.strip())
    try:
        json.loads(body)
    except ValueError:
        return False
    return True


def label(check: str, argument: object, response: str) -> str:
    return "yes" if CHECKS[check](response, argument) else "no"


def main() -> int:
    bad = 0
    for line in DATA.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        for criterion in row["criteria"]:
            check, argument = row["checks"][criterion["id"]]
            want = label(check, argument, row["response"])
            if row["criteria_labels"][criterion["id"]] != want:
                print(f"{row['id']}: {criterion['id']}: labelled {row['criteria_labels'][criterion['id']]!r}, check says {want!r}")
                bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
