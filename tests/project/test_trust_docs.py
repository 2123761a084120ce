"""Issue 35, docs and small defects the newcomer hit: hidden cards that show, a breaker that names no judge,
the fake's default reply in tags and json_object modes, ..."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gradekit.judge import Judge, load_rubric
from gradekit.judge.testing import FakeProvider

ROOT = Path(__file__).resolve().parents[2]
STATIC = ROOT / "graders" / "view" / "static"


def test_every_hidden_section_of_the_view_stays_hidden_whatever_its_display_rule() -> None:
    """`#labelling { display: flex }` beat the `hidden` attribute, so the labelling cards showed on every view and report."""
    css = (STATIC / "view.css").read_text(encoding="utf-8")
    html = (STATIC / "index.html").read_text(encoding="utf-8")
    hidden = re.findall(r'<[a-z]+ id="([\w-]+)"[^>]*\bhidden\b', html)
    displayed = [i for i in hidden if re.search(rf"#{re.escape(i)}\b[^{{]*\{{[^}}]*display:\s*(?!none)", css)]
    assert "labelling" in displayed  # the case this is about: a hidden element with a display rule of its own
    assert re.search(r"\[hidden\]\s*\{\s*display:\s*none\s*!important", css), displayed


def test_a_breaker_tripped_by_a_refused_parameter_names_the_judge(tmp_path) -> None:
    rows = tmp_path / "in.jsonl"
    rows.write_text("".join(json.dumps({"question": f"q{i}?", "references": ["x"], "prediction": "x"}) + "\n" for i in range(5)))
    with FakeProvider(dialect="openai-reasoning") as fake:
        done = subprocess.run([sys.executable, "-m", "gradekit", "grade", str(rows), "-r", "semantic_equivalence_en", "-o",
                               str(tmp_path / "out.jsonl"), "--base-url", fake.base_url, "--api-key", "k", "--no-cache",
                               "--temperature", "0.5", "--model", "o3-mini"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    assert f"the judge at {fake.base_url} (model o3-mini) looks broken" in done.stderr
    assert "(unknown URL)" not in done.stderr and "model unknown" not in done.stderr


@pytest.mark.parametrize("rubric", ["semantic_equivalence_en", "semantic_equivalence_zh", "correctness_3way"])
@pytest.mark.parametrize("mode", ["json_object", "tags"])
def test_the_fakes_default_reply_holds_a_verdict_in_tags_and_json_object_modes(rubric, mode) -> None:
    from gradekit.judge.testing import auto_reply

    spec = load_rubric(rubric)
    row = {k: (["x"] if v.type == "list" else "x") for k, v in spec.variables.items()}
    body = {"messages": spec.render(row, mode), **({"response_format": {"type": "json_object"}} if mode == "json_object" else {})}
    content = auto_reply(body).content or ""
    assert any(label in content for label in spec.labels), content


async def test_a_dialect_that_refuses_json_schema_still_gets_a_verdict_from_the_fake() -> None:
    with FakeProvider(dialect="deepseek-reasoner") as fake:
        judge = Judge("deepseek-reasoner", base_url=fake.base_url, api_key="k")
        try:
            verdict = await judge.judge(load_rubric("semantic_equivalence_en"), {"question": "q", "references": ["x"], "prediction": "x"})
        finally:
            await judge.aclose()
    assert verdict.ok and verdict.read.mode == "json_object" and verdict.label == "correct", verdict


def test_validate_of_an_evals_definition_with_a_python_criterion_says_which_sandbox_it_runs_in(tmp_path) -> None:
    from typer.testing import CliRunner

    from gradekit.graders.cli import app

    from ..graders.test_evals_api import EVAL

    (tmp_path / "eval.json").write_text(json.dumps(EVAL))
    done = CliRunner().invoke(app, ["validate", str(tmp_path / "eval.json"), "--json"])
    assert done.exit_code == 0, done.output
    report = json.loads(done.stdout)
    (code,) = [name for name in report["testing_criteria"] if name.startswith("code-")]
    assert list(report["sandbox"]) == [code]  # the python criterion, and only it
    assert any(word in report["sandbox"][code] for word in ("bubblewrap", "namespaces", "rlimits"))
    text = CliRunner().invoke(app, ["validate", str(tmp_path / "eval.json")])
    assert text.exit_code == 0 and "sandbox:" in text.stdout and code in text.stdout.split("sandbox:")[1]


def test_the_bedrock_lambda_stores_a_plain_reference_answer_under_answer_too(tmp_path) -> None:
    from typer.testing import CliRunner

    from gradekit.graders.cli import app

    from ..platforms.test_foundry_bedrock import lambda_call

    grader = {"type": "normalized_match", "name": "capital", "expression": "{{references.answer}}", "correct": 1, "wrong": 0}
    (tmp_path / "grader.json").write_text(json.dumps(grader))
    done = CliRunner().invoke(app, ["export", str(tmp_path / "grader.json"), "--to", "bedrock-lambda", "-o", str(tmp_path / "l.py")])
    assert done.exit_code == 0, done.output
    records = [{"id": f"s-{n}", "messages": [{"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": answer}],
                **({"metadata": {"reference_answer": "Paris"}} if n == 0 else {"reference_answer": "Paris"})}
               for n, answer in enumerate(["Paris", "paris.", "Lyon"])]
    ran = lambda_call(tmp_path, (tmp_path / "l.py").read_text(encoding="utf-8"), records)
    assert ran.returncode == 0, ran.stderr
    assert [r["aggregate_reward_score"] for r in json.loads(ran.stdout)] == [1.0, 1.0, 0.0]


def test_the_readme_says_to_activate_the_venv_before_its_first_bare_gradekit_command() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    activate = text.find("source .venv/bin/activate")
    bare = re.search(r"^gradekit ", text, re.M)
    assert activate != -1 and bare is not None and activate < bare.start()


def _documented_curls() -> list[tuple[str, str, dict]]:
    """(path, body, answer) of each `curl -s localhost:8000...` block of docs/server.md with its `# {...}` answer."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", (ROOT / "docs" / "server.md").read_text(encoding="utf-8"), re.S):
        if not block.startswith("curl -s localhost:8000"):
            continue
        command, _, answer = block.partition("\n# ")
        path = re.match(r"curl -s localhost:8000(\S*)", command).group(1)  # type: ignore[union-attr]
        body = command[command.index("-d '") + 4:command.rindex("'")]
        found.append((path, body, json.loads(answer.strip())))  # single-quoted in the shell: the text is literal
    return found


def test_the_server_pages_curls_answer_as_shown_with_the_config_it_names() -> None:
    import urllib.request

    curls = _documented_curls()
    assert len(curls) >= 4
    page = (ROOT / "docs" / "server.md").read_text(encoding="utf-8")
    assert "gradekit serve --config configs/grader_config.yaml" in page
    proc = subprocess.Popen([sys.executable, "-m", "gradekit", "serve", "--config", "configs/grader_config.yaml", "--port", "0"],
                            cwd=ROOT / "examples" / "server", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().strip()  # type: ignore[union-attr]
        assert url.startswith("http://"), proc.stderr.read() if proc.poll() is not None else url  # type: ignore[union-attr]
        for path, body, answer in curls:
            request = urllib.request.Request(url.rstrip("/") + (path or "/"), data=body.encode(), method="POST",
                                             headers={"Content-Type": "application/x-www-form-urlencoded"})
            with urllib.request.urlopen(request, timeout=60) as response:
                assert json.loads(response.read()) == answer, (path, body)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_every_extra_a_dependency_names_is_one_its_distribution_provides_as_written() -> None:
    """Issue 48: `math-verify[antlr4_13_2]` warned on every install ("math-verify 0.9.0 does not provide the extra
    'antlr4_13_2'"): its metadata spells it antlr4-13-2, and pip before 23.3 compares extras as written. The extras
    those extras pull in are checked too (math-verify's antlr4-13-2 asks for latex2sympy2_extended[antlr4_13_2])."""
    import importlib.metadata
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    pending = [Requirement(t) for t in [*project["dependencies"], *(r for extra in project.get("optional-dependencies", {}).values() for r in extra)]]
    wrong, seen = [], set()
    while pending:
        requirement = pending.pop()
        if not requirement.extras or requirement.name == "gradekit" or str(requirement) in seen:
            continue
        seen.add(str(requirement))
        try:
            meta = importlib.metadata.metadata(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            continue  # not installed here: nothing to compare with
        provided = set(meta.get_all("Provides-Extra") or [])
        wrong += [f"{requirement.name}[{extra}] (it provides {sorted(provided)})" for extra in requirement.extras if extra not in provided]
        for text in meta.get_all("Requires-Dist") or []:  # what the extras asked for bring in, with their own extras
            inner = Requirement(text)
            if inner.marker is not None and any(inner.marker.evaluate({"extra": e}) for e in requirement.extras):
                pending.append(inner)
    assert not wrong, wrong
