"""One spec at every door (issue 47): the judge options are made from the spec's fields and the flag table, unset unless
given; ``JudgeSpec.merge`` layers the environment, a grader file's ``judge:``, the command line and a server's settings;
``Judge(spec)`` and the keyword form build the same judge; a grader file's block reaches a :class:`FileJudge`.

Command lines are parsed by typer for real; judges speak HTTP to the loopback fake provider; ``gradekit grade --grader``
runs as a subprocess, so what is asserted is what the provider saw and what the run wrote.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from gradekit.graders import Sample
from gradekit.graders._config import FileJudge, JudgeSettings, load_grader
from gradekit.graders._flags import JUDGE_FLAGS
from gradekit.graders.cli._judge_options import OPTIONS, JudgeOptions, judge_options
from gradekit.judge import Judge, load_rubric
from gradekit.judge._spec import DEFAULTS, JudgeSpec, Limits
from gradekit.judge.testing import FakeProvider, Reply

ROW = {"question": "q", "references": ["a"], "prediction": "a"}
SHELL = [str(o.metadata["option"].envvar) for o in OPTIONS if o.metadata["option"].envvar]


@pytest.mark.parametrize(("layers", "expected"), [
    pytest.param([JudgeSpec(timeout=300.0), JudgeSpec()], {"timeout": 300.0}, id="an-unset-layer-keeps-what-is-beneath"),
    pytest.param([JudgeSpec(timeout=1.0), JudgeSpec(timeout=300.0), JudgeSpec(timeout=5.0)], {"timeout": 5.0}, id="the-highest-layer-wins"),
    pytest.param([JudgeSpec(model="shell"), JudgeSpec(model="file"), JudgeSpec(timeout=5.0)], {"model": "file", "timeout": 5.0},
                 id="the-environment-beneath-the-file-beneath-the-command-line"),
    pytest.param([JudgeSpec.of(params={"a": 1, "b": 1}), JudgeSpec.of(params={"b": 2}), JudgeSpec.of(params={"c": 3})],
                 {"params": {"a": 1, "b": 2, "c": 3}}, id="params-key-by-key"),
    pytest.param([JudgeSpec.of(base_url="http://a.example/v1"), JudgeSpec.of(endpoints=[{"base_url": "http://b.example/v1"}])],
                 {"base_url": None}, id="the-endpoint-as-a-whole"),
    pytest.param([JudgeSpec(limits=Limits(rps=1, concurrency=4)), JudgeSpec(limits=Limits(rps=2)), JudgeSpec(limits=Limits(adapt=False))],
                 {"limits": Limits(rps=2, concurrency=4, adapt=False)}, id="limits-field-by-field"),
])
def test_merge_reads_its_layers_lowest_first(layers: list[JudgeSpec], expected: dict) -> None:
    merged = JudgeSpec.merge(*layers)
    assert {name: getattr(merged, name) for name in expected} == expected
    assert merged == functools.reduce(JudgeSpec.merge, layers)  # several layers at once: one at a time, in order
    assert {name for name, value in expected.items() if value is not None} <= merged.given | {"limits"}


def _parsed(args: list[str], env: dict[str, str] | None = None) -> JudgeOptions:
    """The JudgeOptions a real typer command receives for this command line, in a shell with none of their variables."""
    seen: list[JudgeOptions] = []
    command = typer.Typer()

    @command.command()
    @judge_options
    def run(opts: JudgeOptions) -> None:
        seen.append(opts)

    result = CliRunner().invoke(command, args, env={**{name: None for name in SHELL}, **(env or {})})  # type: ignore[dict-item]
    assert result.exit_code == 0, result.output
    return seen[0]


def test_every_judge_option_is_its_spec_fields_flag_and_unset_unless_given() -> None:
    spec_fields = {f.name for f in dataclasses.fields(JudgeSpec)} | {f"limits.{f.name}" for f in dataclasses.fields(Limits)}
    for option in OPTIONS:
        path, flags = option.metadata["field"], option.metadata["flags"]
        if path is not None:  # a spec field (params.x: a request parameter) or the run's budget: said as the flag table says
            assert flags.split("/")[0] == JUDGE_FLAGS[path], option.name
            assert path in spec_fields or path.startswith("params.") or path in ("max_cost_usd", "max_tokens", "prices"), path
    assert set(JUDGE_FLAGS) == {o.metadata["field"] for o in OPTIONS} - {None}  # every flag of the table is an option, once
    opts = _parsed([])
    assert all(getattr(opts, o.name) in (None, []) for o in OPTIONS), opts
    beneath, over = opts.layers()
    assert (beneath.given, over.given) == (set(), {"limits.key"})  # only the limiter's name, which names the endpoint


@pytest.mark.parametrize(("args", "env", "beneath", "over"), [
    pytest.param(["--timeout", "5"], {}, {}, {"timeout": 5.0}, id="written-timeout-over-the-file"),
    pytest.param([], {"GRADEKIT_TIMEOUT": "5"}, {"timeout": 5.0}, {}, id="exported-timeout-beneath-the-file"),
    pytest.param(["--model", "cli"], {"GRADEKIT_MODEL": "shell", "OPENAI_BASE_URL": "http://shell.example/v1"},
                 {"base_url": ("http://shell.example/v1",)}, {"model": "cli"}, id="each-option-from-its-own-source"),
    pytest.param(["--no-adapt", "--concurrency", "3"], {}, {}, {"limits": Limits(concurrency=3, adapt=False, key="default|default")},
                 id="limits"),
    pytest.param(["--judge-param", "seed=7", "--temperature", "0.2"], {}, {}, {"params": {"seed": 7, "temperature": 0.2}}, id="params"),
    pytest.param(["--no-hedge"], {"GRADEKIT_CONTEXT_WINDOW": "8000"}, {"context_window": 8000}, {"hedge": False}, id="hedge-and-window"),
])
def test_the_command_line_is_one_layer_and_the_environment_another(args, env, beneath, over) -> None:
    opts = _parsed(args, env)
    below, above = opts.layers(opts.model[0] if opts.model else None)
    assert {name: getattr(below, name) for name in beneath} == beneath
    assert {name: getattr(above, name) for name in over} == over
    assert below.given == set(beneath) | ({"limits.key"} if "limits" in beneath else set())
    assert above.given - {"limits.key"} == {name for name in over if name != "limits"} | (
        {f"limits.{k}" for k, v in dataclasses.asdict(over["limits"]).items() if v is not None and k != "key"} if "limits" in over else set())
    assert opts.spec(opts.model[0] if opts.model else None) == below.merge(above)


def test_every_spec_field_is_a_judge_keyword() -> None:
    from gradekit.judge._client import _SPEC_KEYWORDS

    assert {f.name for f in dataclasses.fields(JudgeSpec)} - {"model", "limits"} == set(_SPEC_KEYWORDS)
    assert set(JudgeSpec.of("m", base_url="http://a.example/v1", timeout=1.0).judge_keywords()) == {"model", "base_url", "timeout"}


def test_judge_of_a_spec_and_of_keywords_send_the_same_request() -> None:
    rubric = load_rubric("semantic_equivalence_en")

    async def ask(judge: Judge) -> None:
        async with judge:
            assert (await judge.judge(rubric, ROW)).ok

    with FakeProvider() as fake:
        spec = JudgeSpec.of("fake-judge", base_url=fake.base_url, api_key="k", timeout=7.0, params={"seed": 7})
        by_spec = Judge(spec)
        by_keywords = Judge("fake-judge", base_url=fake.base_url, api_key="k", timeout=7.0, params={"seed": 7})
        assert (by_spec.model, by_spec.base_url, by_spec.params, by_spec.row_deadline) == \
            (by_keywords.model, by_keywords.base_url, by_keywords.params, by_keywords.row_deadline) == ("fake-judge", fake.base_url, {"seed": 7}, 21.0)
        asyncio.run(ask(by_spec))
        asyncio.run(ask(by_keywords))
        first, second = (r.body for r in fake.chat_requests())
    assert first == second and first["seed"] == 7
    unset = Judge(JudgeSpec(api_key=("k",)))
    assert (unset._timeout, unset.row_deadline) == (DEFAULTS.timeout, 3 * DEFAULTS.timeout)  # nothing given: the spec's defaults
    with pytest.raises(TypeError, match="give params, timeout in the spec"):
        Judge(spec, timeout=5.0, params={"seed": 1})  # a field beside the spec would be a second layer, said nowhere


def test_a_file_judge_gets_the_files_block_and_a_plain_factory_is_called_bare() -> None:
    with FakeProvider() as fake:
        fake.set_responder(lambda body: Reply(content=json.dumps({"rationale": "r", "judgement": "correct"})))
        config = {"type": "llm", "rubric": "semantic_equivalence_en", "map": {"question": "prompt", "prediction": "response",
                                                                                "references": "references.answer"},
                  "judge": {"model": "file-judge", "base_url": fake.base_url, "params": {"seed": 3}}}
        got: list[JudgeSettings | None] = []
        over = JudgeSpec.of(api_key="k", params={"seed": 4})  # a front door's layer over the file's block

        def made(settings: JudgeSettings | None) -> Judge:
            got.append(settings)
            assert settings is not None
            return settings.spec().merge(over).build()

        bare: list[int] = []

        def plain() -> Judge:
            bare.append(1)
            return Judge("plain-judge", base_url=fake.base_url, api_key="k")

        sample = Sample(messages=[{"role": "user", "content": "q"}], response="a", references={"answer": ["a"]})

        async def grade(judge) -> None:
            grader = load_grader(dict(config), judge=judge)
            assert (await grader(sample)).status == "ok"

        asyncio.run(grade(FileJudge(made)))
        asyncio.run(grade(plain))
        sent = [(r.body["model"], r.body.get("seed")) for r in fake.chat_requests()]
    assert [s.model if s else None for s in got] == ["file-judge"] and bare == [1]
    assert sent == [("file-judge", 4), ("plain-judge", None)]


def _grade(tmp_path: Path, judge: dict, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    rows, grader = tmp_path / "in.jsonl", tmp_path / "grader.json"
    rows.write_text(json.dumps({"prompt": "q?", "response": "x", "answer": "x"}) + "\n", encoding="utf-8")
    grader.write_text(json.dumps({"type": "llm", "rubric": "semantic_equivalence_en", "judge": judge,
                                  "map": {"question": "prompt", "references": "references.answer", "prediction": "response"}}),
                      encoding="utf-8")
    clean = {k: v for k, v in os.environ.items() if k not in SHELL}
    return subprocess.run([sys.executable, "-m", "gradekit", "grade", str(rows), "--grader", str(grader), "-o", str(tmp_path / "out.jsonl"),
                           "--no-cache", "--restart", "--json", *extra], capture_output=True, text=True, timeout=180,
                          env={**clean, "OPENAI_API_KEY": "k", **(env or {})})


@pytest.mark.parametrize(("extra", "status"), [
    pytest.param([], "error", id="the-files-1s-holds-over-the-default-60s"),
    pytest.param(["--timeout", "30"], "ok", id="a-written-timeout-wins-over-the-file"),
])
def test_grade_grader_keeps_the_files_judge_timeout_unless_the_command_line_writes_one(tmp_path, extra, status) -> None:
    with FakeProvider() as fake:
        fake.set_responder(lambda body: Reply(content=json.dumps({"rationale": "r", "judgement": "correct"}), delay=2.5))
        done = _grade(tmp_path, {"model": "file-judge", "base_url": fake.base_url, "timeout": 1}, *extra)
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [r["status"] for r in rows] == [status], done.stderr
    if status == "error":
        assert rows[0]["error_kind"] == "timeout", rows
