"""graders._flags: a library message names the argument a Python user passes; the command line says it as its flag.

Each case calls the real library function with a mistake and checks both readings of its one message: the library's
(the field in backticks, no flag) and the command line's (``in_flags``), which is the text `gradekit` printed before
the library said fields, byte for byte.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any, Callable

import pytest

from gradekit.graders._flags import FLAGS, in_flags, said_as_flags

from ..cases import cases

FLAG = re.compile(r"(?<![\w-])--[a-z]")


def _raised(call: Callable[[Path], Any], tmp_path: Path) -> str:
    with pytest.raises(Exception) as caught:  # noqa: PT011 -- each case's own error type; the text is what is checked
        call(tmp_path)
    return str(caught.value)


def _parse_every(_: Path) -> None:
    from gradekit.graders.runs._canary import parse_every

    parse_every(["ten"])


def _suite_limit(_: Path) -> None:
    from gradekit.graders.calibration import load_suite

    load_suite("llmbar", limit=0)


def _answer_suite_limit(_: Path) -> None:
    from gradekit.graders.calibration._answer_eval import load_answer_suite

    load_answer_suite(limit=0)


def _label_map(_: Path) -> None:
    from gradekit.graders.calibration._labels import parse_label_map

    parse_label_map(["yes"])


def _vocabularies(_: Path) -> None:
    from gradekit.graders.calibration._labels import check_vocabularies

    check_vocabularies(["yes"], ["correct"])


def _encoding(_: Path) -> None:
    from gradekit.graders.runs._io import codec

    codec("no-such-codec")


def _not_utf8(tmp_path: Path) -> None:
    from gradekit.graders.runs._io import check_encoding

    path = tmp_path / "rows.csv"
    path.write_bytes("question\ncaf\u00e9\n".encode("latin-1"))
    check_encoding(path)


def _no_key(_: Path) -> None:
    from gradekit.graders.calibration import calibrate_rows

    calibrate_rows([{"id": 1, "label": "yes"}], [{"id": 1, "label": "yes"}])


def _verdict_column(_: Path) -> None:
    from gradekit.graders.calibration import calibrate_rows

    calibrate_rows([{"id": 1, "label": "yes", "verdict": "yes"}])


def _key_missing(_: Path) -> None:
    from gradekit.graders.calibration import calibrate_rows

    calibrate_rows([{"id": 1, "label": "yes"}], [{"key": 1, "label": "yes"}], on="id")


def _llmbar_data(tmp_path: Path) -> None:
    from gradekit.graders.calibration import llmbar_root

    llmbar_root(tmp_path)


def _cascade_target(_: Path) -> None:
    from gradekit.graders.calibration._cascade import fit_cascade
    from gradekit.judge import load_rubric

    asyncio.run(fit_cascade([], load_rubric("semantic_equivalence_en"), [], [], target=1.5))


def _rescale(_: Path) -> None:
    from gradekit.graders import export_openai_grader

    export_openai_grader({"type": "autorater", "name": "q", "prompt": "Rate {{response}} from -1 to 1.", "judge": {"model": "m"}})


def _endpoint(_: Path) -> None:
    from gradekit.graders import export_foundry_grader

    export_foundry_grader({"type": "llm", "rubric": "semantic_equivalence_en", "name": "same"})


def _eval_definition(_: Path) -> None:
    from gradekit.graders import export_openai_grader

    export_openai_grader({"name": "e", "testing_criteria": [{"type": "string_check", "name": "s", "input": "{{ sample.output_text }}",
                                                             "reference": "a", "operation": "eq"}]})


def _autorater_without_judge(_: Path) -> None:
    from gradekit.graders._vertex import _judge

    _judge(None, "quality")


CASES = [
    pytest.param(_parse_every, "`canary_every`", "--canary-every 'ten': a number of rows (500) or a time (90s, 10m, 1h)",
                 id="canary_every"),
    pytest.param(_suite_limit, "`limit`", "--limit must be at least 1, not 0", id="suite_limit"),
    pytest.param(_answer_suite_limit, "`limit`", "--limit must be at least 1, not 0", id="answer_suite_limit"),
    pytest.param(_label_map, "`label_map`", "--label-map 'yes': expected HUMAN=JUDGE, e.g. yes=correct", id="label_map"),
    pytest.param(_vocabularies, "`label_map`",
                 "the human labels (yes) share no value with the judge's labels (correct): every row would count as a "
                 "disagreement. Map them with --label-map HUMAN=JUDGE,... (e.g. --label-map yes=<correct>)", id="vocabularies"),
    pytest.param(_encoding, "`encoding`",
                 "unknown encoding 'no-such-codec' (--encoding takes a Python codec name: utf-8, latin-1, cp1252, gbk, ...)",
                 id="unknown_encoding"),
    pytest.param(_not_utf8, "`encoding`", "another encoding; name it with --encoding, e.g. --encoding latin-1 or "
                 "--encoding cp1252 for an Excel export", id="not_utf8"),
    pytest.param(_no_key, "`on`", "human labels from a separate file need --on KEY, the column both files share", id="no_key"),
    pytest.param(_verdict_column, "`human_column`",
                 "graded file: column 'label' holds the judge's verdict; give human labels with --labels FILE --on KEY; for "
                 "labels in this file: its columns are id, label, verdict; name the column with --human-column COLUMN "
                 "(e.g. --human-column verdict)", id="verdict_column"),
    pytest.param(_key_missing, "`on`",
                 "labels file row 1: field 'id' is missing; its columns are key, label; name the column with --on COLUMN",
                 id="key_missing"),
    pytest.param(_llmbar_data, "`root`", "reinstall gradekit or pass --data PATH/TO/eval_sets/llmbar", id="llmbar_data"),
    pytest.param(_cascade_target, "`target`", "--target and --delta are probabilities strictly between 0 and 1", id="cascade_target"),
    pytest.param(_rescale, "`rescale`", "set its wrong score to 0 or export with rescale (--rescale) to map gradekit's [-1, 1] "
                 "onto 0..1 as (score + 1) / 2", id="rescale"),
    pytest.param(_endpoint, "`endpoint`", "pass an endpoint URL (--endpoint-url https://your-host) to export an endpoint grader",
                 id="endpoint"),
    pytest.param(_eval_definition, "`export_foundry_grader`",
                 "not one grader: export it with --to foundry, or grade it with `gradekit grade --grader`", id="eval_definition"),
    pytest.param(_autorater_without_judge, "`model`/`base_url`",
                 "quality is an autorater: pass a judge (gradekit validate builds one from --model/--base-url)", id="autorater"),
]


@pytest.mark.parametrize(("call", "field", "said"), CASES)
def test_a_library_message_names_the_field_and_the_command_line_says_the_flag(tmp_path, call, field, said) -> None:
    message = _raised(call, tmp_path)
    outside_commands = re.sub(r"`gradekit [^`]*`", "", message)
    assert field in message and not FLAG.search(outside_commands), message
    assert said in in_flags(message), in_flags(message)


@pytest.mark.parametrize(("message", "said"), cases("said_as_flags"))
def test_in_flags_says_only_the_fields_of_the_table(message, said) -> None:
    assert in_flags(message) == said
    assert said_as_flags(None) is None


def test_each_field_says_one_flag_and_each_flag_is_said_for_one_field() -> None:
    """One name, one flag, in every command: a flag two fields claimed would leave a reader unsure which one to pass."""
    flags = list(FLAGS.values())
    assert len(flags) == len(set(flags)), sorted(f for f in flags if flags.count(f) > 1)
    assert all(re.fullmatch(r"[a-z_.]+(=[A-Za-z0-9_]+)?", field) for field in FLAGS), sorted(FLAGS)
