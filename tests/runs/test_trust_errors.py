"""Issue 48, every error told as what it is: a failure in this process is ``local_error`` (its cause and its fix,
never a request, never the judge's fault), an unparseable port fails before any request, a figure over nothing is
``n/a`` with the reason."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gradekit.graders.cli import app
from gradekit.judge.testing import FakeProvider

runner = CliRunner()


def _rows(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"question": f"q{i}?", "references": ["x"], "prediction": "x"}) + "\n" for i in range(n)),
                    encoding="utf-8")
    return path


# A module gradekit loads on the first streamed request, made unimportable the way a broken install is
# (None in sys.modules is Python's documented "import of X halted"): the failure is in this process.
_BROKEN = ("import sys; sys.modules['openai.resources.chat.completions'] = None; "
           "from gradekit.graders.cli import main; sys.argv[0] = 'gradekit'; main()")


@pytest.mark.parametrize("keep_going", [False, True], ids=["stops_saying_it_is_local", "keep_going_rows_say_local_error"])
def test_an_import_error_inside_gradekit_is_a_local_error_never_a_request_nor_the_judges_fault(tmp_path, keep_going) -> None:
    source = _rows(tmp_path / "in.jsonl", 60)
    with FakeProvider() as fake:
        done = subprocess.run([sys.executable, "-c", _BROKEN, "grade", str(source), "-r", "semantic_equivalence_en",
                               "-o", str(tmp_path / "out.jsonl"), "--base-url", fake.base_url, "--api-key", "k", "--no-cache",
                               "--judge-param", "stream=true", "--json", *(["--keep-going"] if keep_going else [])],
                              capture_output=True, text=True, timeout=180)
        sent = len(fake.chat_requests())
    report = json.loads(done.stdout)
    said = " ".join((done.stdout + done.stderr).split())
    assert sent == 0
    assert "looks broken" not in said and "server_error" not in said and "TaskGroup" not in said, said
    assert "ModuleNotFoundError" in said and "not at the judge" in said and "reinstall" in said, said
    if keep_going:
        assert done.returncode == 1, done.stderr
        rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
        assert len(rows) == 60 and {r["error_kind"] for r in rows} == {"local_error"}, rows[0]
        assert report["requests"] == 0 and report["errors_by_kind"] == {"local_error": 60}, report
    else:
        assert done.returncode == 3, done.stderr  # stopped early: every row would fail the same way, here
        assert report["error_kind"] == "local_error" and report["summary"].get("requests", 0) == 0, report


def test_an_unparseable_port_in_the_base_url_is_exit_2_before_any_request(tmp_path) -> None:
    source = _rows(tmp_path / "in.jsonl", 5)
    done = runner.invoke(app, ["grade", str(source), "-r", "semantic_equivalence_en", "-o", str(tmp_path / "o.jsonl"),
                               "--base-url", "http://127.0.0.1:80x0/v1", "--api-key", "k", "--no-cache"])
    assert done.exit_code == 2, done.output  # was: 5 rows of server_error "InvalidURL", each counted as a request
    assert "port" in done.output and "80x0" in done.output, done.output
    assert not (tmp_path / "o.jsonl").exists()


async def test_a_judge_raises_nothing_when_something_in_this_process_fails(fake, make_judge, tmp_path) -> None:
    """A row whose rendering fails in this process (here: a rubric template that raises at render time, a bug of the
    template's) is that row's local_error, from Judge.judge itself: no exception reaches a caller, no request is sent."""
    from gradekit.judge import load_rubric

    spec = tmp_path / "broken.yaml"
    (tmp_path / "broken.j2").write_text("{% block user %}{{ '%d' % question }}{% endblock %}", encoding="utf-8")
    spec.write_text("name: broken\ntemplate: broken.j2\nvariables:\n  question: {type: str}\nlabels: {a: 1, b: 0}\n"
                    "output: {mode: tags, tag: answer}\n", encoding="utf-8")
    judge = make_judge()
    verdict = await judge.judge(load_rubric(spec), {"question": "not a number"})
    assert verdict.status == "error" and verdict.error_kind == "local_error", verdict
    assert verdict.usage.requests == 0 and not fake.chat_requests()


# ---- gradekit llmbar: a figure over nothing is n/a, with the reason and an example ----------------------------


def test_llmbar_over_zero_decided_pairs_prints_n_a_with_the_reason_and_an_error_example() -> None:
    # arena_hard_pairwise reads "[[A>B]]"; GPT-4's recorded Vanilla_NoRules replies are bare "Output (a)": no pair is decided.
    done = subprocess.run([sys.executable, "-m", "gradekit", "llmbar", "--subset", "Natural", "-r", "arena_hard_pairwise"],
                          capture_output=True, text=True, timeout=300)
    said = " ".join(done.stdout.split())
    assert done.returncode == 1, done.stderr
    assert "Agr 100.0" not in said and "Acc 0.0" not in said, said  # was: "Acc 0.0 / Agr 100.0" over no decided pair
    assert "Acc n/a / Agr n/a" in said and "no pair was judged" in said, said
    assert "parse_failure" in said, said  # an example of the errors, as grade's summary shows
    as_json = subprocess.run([sys.executable, "-m", "gradekit", "llmbar", "--subset", "Natural", "-r", "arena_hard_pairwise", "--json"],
                             capture_output=True, text=True, timeout=300)
    report = json.loads(as_json.stdout)["summary"]["report"]
    assert report["agr"] is None and report["acc"] is None, report


# ---- meta-eval --suite answer-verification: a breaker, and an unknown suite answered with the suite names -----


def test_answer_verification_meta_eval_stops_at_a_broken_judge_as_grade_does(tmp_path) -> None:
    from gradekit.judge.testing import Reply

    with FakeProvider() as fake:
        fake.set_responder(lambda body: Reply(content="I would rather not say."))  # never in the rubric's format
        done = subprocess.run([sys.executable, "-m", "gradekit", "meta-eval", "--suite", "answer-verification", "--mode", "judge",
                               "--base-url", fake.base_url, "--api-key", "k", "--no-cache"],
                              capture_output=True, text=True, timeout=600)
        sent = len(fake.chat_requests())
    said = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 3, said[-2000:]
    assert "looks broken" in said and "parse_failure" in said, said[-2000:]
    assert sent < 500, sent  # was 4,004 unreadable requests in 28 s


def test_a_misspelt_suite_is_answered_with_the_suite_names() -> None:
    done = runner.invoke(app, ["meta-eval", "--suite", "answer-verificaton", "--base-url", "http://127.0.0.1:9/v1", "--api-key", "k"])
    said = " ".join(done.output.split())
    assert done.exit_code == 2, said
    assert "pairwise rubric" not in said, said  # was: "give a pairwise rubric with -r", about a suite nobody named
    assert "answer-verificaton" in said and "answer-verification" in said and "llmbar" in said, said
