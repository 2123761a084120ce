"""Exports to Vertex (standalone evaluate, reinforcementTuningSpec) and OpenAI (grader JSON), and
`gradekit export`. Exported code runs in a fresh `python -I -S` (standard library only, gradekit
not importable) and must give the grader's own scores."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from typer.testing import CliRunner

from gradekit.graders import aclose_grader, load_grader, vertex_grader
from gradekit.graders.platforms import ExportError, export_openai_grader, export_vertex_evaluate, export_vertex_spec
from gradekit.graders.cli import app
from gradekit.graders._composite import compile_formula
from gradekit.graders._sample import Sample, fill_placeholders, sample_from_vertex, to_openai_item, to_openai_sample
from gradekit.judge.testing import FakeProvider, Reply

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "graders"
EXAMPLES = ROOT / "examples" / "graders"
STDLIB = {"asyncio", "inspect", "json", "math", "numbers", "re", "unicodedata", "collections", "decimal", "fractions"}

# A driver for the fresh interpreter: load each exported file by path, call its entry on each
# argument pair, print one JSON line per call (the score, or the exception's type).
DRIVER = r'''
import importlib.util, json, sys
try:
    import gradekit.graders  # noqa: F401
    sys.exit("gradekit is importable in the fresh interpreter")
except ImportError:
    pass
jobs = json.load(open(sys.argv[1], encoding="utf-8"))
modules = {}
for job in jobs:
    path = job["file"]
    if path not in modules:
        spec = importlib.util.spec_from_file_location("exported_%d" % len(modules), path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        modules[path] = module
    try:
        value = getattr(modules[path], job["entry"])(*job["args"])
        print(json.dumps({"score": value}))
    except Exception as e:
        print(json.dumps({"raised": type(e).__name__, "message": str(e)}))
'''


def run_fresh(tmp_path: Path, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Run exported files in one `python -I -S` process: no site-packages, no PYTHONPATH, no cwd on the path."""
    (tmp_path / "driver.py").write_text(DRIVER, encoding="utf-8")
    (tmp_path / "jobs.json").write_text(json.dumps(jobs), encoding="utf-8")
    done = subprocess.run([sys.executable, "-I", "-S", str(tmp_path / "driver.py"), str(tmp_path / "jobs.json")],
                          capture_output=True, text=True, cwd=tmp_path, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == len(jobs), done.stdout
    return lines


def assert_stdlib_only(source: str) -> None:
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    assert imported <= STDLIB, imported - STDLIB


async def grades_of(config: Any, samples: list[Sample]) -> list[float | None]:
    grader = load_grader(config)
    try:
        return [(await grader(s)).score for s in samples]
    finally:
        await aclose_grader(grader)


def vx(references: dict[str, Any] | None, text: str, *, prompt: str = "What is asked?", system: str | None = None) -> tuple[dict, dict]:
    example: dict[str, Any] = {"contents": [{"role": "user", "parts": [{"text": prompt}]}]}
    if system:
        example["systemInstruction"] = {"parts": [{"text": system}]}
    if references is not None:
        example["references"] = references
    return example, {"role": "model", "parts": [{"text": text}]}


# ---- configs and examples the exported code must agree on ----------------------------------------

BOXED = {"type": "REGEX_EXTRACT", "regex": r"\\boxed\{([^}]*)\}"}
CASES: dict[str, tuple[Any, list[tuple[dict, dict]]]] = {
    "string_regex_extract": (DATA / "vertex_single.json", [
        vx({"answer": "Paris"}, r"Reasoning... \boxed{Lyon}? No: \boxed{Paris}"), vx({"answer": "Paris"}, r"\boxed{Lyon}"),
        vx({"answer": "Paris"}, "Paris, unboxed"), vx({"answer": "Paris"}, r"\boxed{ Paris }"), vx({}, r"\boxed{Paris}"),
        (vx({"answer": "Paris"}, "")[0], {"role": "model", "parts": [{"text": r"\boxed{Paris}", "thought": True}, {"text": "Paris"}]}),
    ]),
    "regex_contains_escapes_references": ({"type": "string_match", "operation": "REGEX_CONTAINS", "expression": r"^answer: {{references.answer}}$",
                                           "correct": 1, "wrong": 0}, [
        vx({"answer": "1+1"}, "answer: 1+1"), vx({"answer": "1+1"}, "answer: 11"), vx({"answer": "a.b"}, "answer: axb"),
    ]),
    # item.<key> is references.<key>, and a dot goes into a list by position: the export reads a path as gradekit does
    "path_into_a_list_of_references": ({"type": "string_match", "operation": "EXACT_MATCH", "expression": "{{item.answers.1}}"}, [
        vx({"answers": ["Lyon", "Paris"]}, "Paris"), vx({"answers": ["Lyon", "Paris"]}, "Lyon"), vx({"answers": ["Lyon"]}, "Paris"),
        vx({"answers": {"1": "Paris"}}, "Paris"),
    ]),
    "partial_match_on_prompt_and_system": ({"type": "weighted", "parts": {
        "echo": {"weight": 1, "type": "string_match", "operation": "PARTIAL_MATCH", "expression": "{{prompt}}"},
        "sys": {"weight": 1, "type": "string_match", "operation": "PARTIAL_MATCH", "expression": "{{system_instruction}}", "wrong": 0},
    }}, [
        vx({}, "You asked: What is asked?", system="Be brief."), vx({}, "Be brief. What is asked?", system="Be brief."), vx({}, "nothing"),
    ]),
    "json_match_nested": ({"type": "json_match", "key": "result.city", "expression": "{{references.answer}}", "correct": 1, "wrong": -0.5}, [
        vx({"answer": "Paris"}, '{"result": {"city": "Paris"}}'), vx({"answer": "Paris"}, 'Sure! ```json\n{"result": {"city": "Lyon"}}\n```'),
        vx({"answer": "Paris"}, 'text {"x": 1} then {"result": {"city": "Paris"}}'), vx({"answer": "Paris"}, "no json"),
        vx({"answer": "3"}, '{"result": {"city": 3}}'),
    ]),
    "normalized_match": ({"type": "normalized_match", "expression": "{{references.answer}}", "parse": BOXED}, [
        vx({"answer": "1,000 Meters"}, r"\boxed{１０００ meters.}"), vx({"answer": "0.5"}, r"\boxed{1/2}"), vx({"answer": "0.5"}, r"\boxed{1/3}"),
        vx({"answer": "New-York"}, r"\boxed{new york!}"), vx({"answer": "x"}, "unboxed"),
    ]),
    "normalized_partial": ({"type": "normalized_match", "operation": "PARTIAL_MATCH", "expression": "{{references.answer}}", "wrong": 0}, [
        vx({"answer": "12"}, "The answer is 12."), vx({"answer": "12"}, "The answer is 123."), vx({"answer": "Ｐａｒｉｓ"}, "it's paris"),
    ]),
    "numeric_with_tolerance": ({"type": "numeric_match", "expression": "{{references.answer}}", "abs_tol": 0.01, "rel_tol": 0,
                                "parse": BOXED, "correct": 1, "wrong": -1}, [
        vx({"answer": "3.14159"}, r"\boxed{3.14}"), vx({"answer": "3.14159"}, r"\boxed{3.1}"), vx({"answer": "1000"}, r"\boxed{1,000.004}"),
        vx({"answer": "-3"}, r"\boxed{−3}"), vx({"answer": "1/4"}, r"\boxed{0.25}"), vx({"answer": "n/a"}, r"\boxed{1}"), vx({"answer": "2"}, "none"),
    ]),
    "string_check_ilike": ({"type": "string_check", "input": "{{ sample.output_text }}", "reference": "{{ item.answer }}", "operation": "ilike"}, [
        vx({"answer": "paris"}, "PARIS is it"), vx({"answer": "paris"}, "Lyon"),
    ]),
    "string_check_like_and_ne": ({"type": "weighted", "parts": {
        "like": {"weight": 2, "type": "string_check", "input": "{{response}}", "reference": "{{references.answer}}", "operation": "like"},
        "ne": {"weight": 1, "type": "string_check", "input": "{{response}}", "reference": "{{references.answer}}", "operation": "ne"}}}, [
        vx({"answer": "Paris"}, "Paris"), vx({"answer": "Paris"}, "It is Paris"), vx({"answer": "Paris"}, "It is paris"),
        vx({"answer": "It is Paris"}, "Paris"),
    ]),
    "openai_python_sees_tool_calls": ({"type": "python", "source": (
        "def grade(sample, item):\n"
        "    calls = sample['output_tools']\n"
        "    return len(calls) / 4 + (0.5 if sample['choices'][0]['finish_reason'] == 'tool_calls' else 0) - (sample['output_json'] is None) / 8\n")}, [
        vx({}, '{"a": 1}'), (vx({}, "")[0], {"role": "model", "parts": [{"text": "calling"}, {"functionCall": {"name": "search", "args": {"q": "x"}}}]}),
    ]),
    "math_answer_with_python_file": (EXAMPLES / "math_answer.yaml", [
        vx({"answer": "1000"}, r"So \boxed{1,000}"), vx({"answer": "1000"}, r"\boxed{999} \boxed{1000}"), vx({"answer": "1000"}, "1000"),
        vx({"answer": "7"}, r"\boxed{7}" + "x" * 2100),
    ]),
    "openai_python_in_weighted": (DATA / "weighted.yaml", [
        vx({"answer": "Paris", "max_words": 3}, "<answer>paris</answer>"), vx({"answer": "Paris"}, "<answer>Lyon</answer> " + "w " * 30),
    ]),
    "vertex_python_raises_is_invalid": ({"type": "python", "file": str(DATA / "reward_vertex.py")}, [
        vx({"answer": "Paris"}, "It is paris."), vx({"answer": "Paris"}, "Lyon"), vx({}, "Paris"),
    ]),
    "formula_and_nested_weighted": ({"type": "formula", "formula": "0.5 * exact + 0.5 * max(inner, 0) ^ 2 - abs(exact) / 4", "graders": {
        "exact": {"type": "string_check", "input": "{{response}}", "reference": "{{references.answer}}", "operation": "eq"},
        "inner": {"type": "weighted", "parts": {
            "a": {"weight": 2, "type": "string_match", "operation": "PARTIAL_MATCH", "expression": "{{references.answer}}"},
            "b": {"weight": 1, "type": "numeric_match", "expression": "{{references.n}}"}}}}}, [
        vx({"answer": "Paris", "n": 2}, "Paris"), vx({"answer": "Paris", "n": 2}, "Paris 2"), vx({"answer": "Paris", "n": 2}, "Lyon 3"),
        vx({"answer": "Paris"}, "Paris"),
    ]),
    "formula_division_by_zero_is_invalid": ({"type": "formula", "formula": "a / (a - 1)", "graders": {
        "a": {"type": "string_check", "input": "{{response}}", "reference": "yes"}}}, [vx({}, "yes"), vx({}, "no")]),
    "vertex_composite_spec_without_autorater": ({"compositeRewardConfig": {"weightedRewardConfigs": [
        w for w in json.loads((DATA / "vertex_composite.json").read_text())["reinforcementTuningSpec"]["compositeRewardConfig"]["weightedRewardConfigs"]
        if "autoraterScorer" not in w["rewardConfig"]]}}, [
        vx({"answer": "Paris"}, '{"city": "Paris"}'), vx({"answer": "Paris"}, "Lyon " * 60), vx({"answer": "Paris"}, 'Paris {"city": "Rome"}'),
    ]),
}


async def test_exported_evaluate_gives_the_graders_scores_in_a_fresh_interpreter(tmp_path: Path) -> None:
    jobs, expected = [], []
    for case, (config, examples) in CASES.items():
        source = export_vertex_evaluate(config)
        assert_stdlib_only(source)
        path = tmp_path / f"{case}.py"
        path.write_text(source, encoding="utf-8")
        lenient = tmp_path / f"{case}_lenient.py"
        lenient.write_text(export_vertex_evaluate(config, on_invalid=-0.75), encoding="utf-8")
        scores = await grades_of(config, [sample_from_vertex(e, r) for e, r in examples])
        for (example, response), score in zip(examples, scores):
            jobs += [{"file": str(path), "entry": "evaluate", "args": [example, response]},
                     {"file": str(lenient), "entry": "evaluate", "args": [example, response]}]
            expected += [(case, score, False), (case, score, True)]
    results = run_fresh(tmp_path, jobs)
    invalid_seen = 0
    for (case, score, lenient), got in zip(expected, results):
        if score is None:  # the grader says invalid: the export raises, or gives ON_INVALID
            invalid_seen += 1
            assert got == {"score": -0.75} if lenient else got.get("raised") == "ValueError", (case, got)
        else:
            assert got == {"score": pytest.approx(score, abs=1e-12)}, (case, score, got)
    assert invalid_seen >= 8, "the cases include invalid examples (missing references, a raising python grader, 1/0)"
    distinct = {round(s, 6) for _, s, _ in expected if s is not None}
    assert len(distinct) >= 8, "the cases cover many different scores, not just +1/-1"


@pytest.mark.parametrize("config", [
    pytest.param({"type": "llm", "rubric": "semantic_equivalence_en"}, id="llm"),
    pytest.param(DATA / "autorater_tone.yaml", id="autorater"),
    pytest.param(DATA / "vertex_composite.json", id="spec_with_autorater"),
    pytest.param({"singleRewardConfig": {"cloudRunRewardScorer": {"cloudRunUri": "https://r.a.run.app"}}}, id="cloud_run"),
])
def test_evaluate_export_refuses_what_needs_the_network(config: Any) -> None:
    with pytest.raises(ExportError) as caught:
        export_vertex_evaluate(config)
    assert caught.value.reasons and ("network" in str(caught.value) or "HTTP" in str(caught.value))


@pytest.mark.parametrize("path", ["trajectory", "sample.output_json.city"])
async def test_an_export_refuses_a_path_its_file_cannot_read(path: str) -> None:
    """gradekit reads the whole trajectory and OpenAI's sample namespace; the exported file has neither, so it would
    call every example invalid on the platform: refused at export, naming the placeholder."""
    config = {"type": "string_match", "operation": "PARTIAL_MATCH", "expression": "{{%s}}" % path}
    assert None not in await grades_of(config, [sample_from_vertex(*vx({}, '{"city": "Paris"}'))])  # gradekit reads it
    with pytest.raises(ExportError, match=r"uses \{\{%s\}\}, which an exported file cannot read" % path.replace(".", r"\.")):
        export_vertex_evaluate(config)


# ---- Vertex spec ------------------------------------------------------------------------------------

SPEC_EXAMPLES = [vx({"answer": "Paris", "n": "2"}, t) for t in (r"\boxed{Paris}", "<answer>paris</answer> 2", '{"city": "Paris"} 2.0', "Lyon")]


@pytest.mark.parametrize("name", ["vertex_single.json", "vertex_composite.json"])
def test_spec_export_of_a_vertex_spec_is_unchanged(name: str) -> None:
    original = json.loads((DATA / name).read_text(encoding="utf-8"))
    assert export_vertex_spec(DATA / name) == original


async def test_spec_export_uses_native_scorers_and_code_execution_and_scores_the_same() -> None:
    config = {"type": "weighted", "name": "mix", "parts": {
        "boxed": {"weight": 2, "type": "string_match", "expression": "{{references.answer}}", "parse": BOXED, "wrong": 0},
        "city": {"weight": 1, "type": "json_match", "key": "city", "expression": "{{references.answer}}"},
        "inner": {"weight": 1, "type": "weighted", "parts": {
            "norm": {"weight": 3, "type": "normalized_match", "operation": "PARTIAL_MATCH", "expression": "{{references.answer}}"},
            "num": {"weight": 1, "type": "numeric_match", "expression": "{{references.n}}"}}},
        "short": {"weight": 1, "type": "python", "source": "def grade(sample, item):\n    return 1.0 if len(sample['output_text']) < 20 else 0.0\n"},
    }}
    spec = export_vertex_spec(config)["reinforcementTuningSpec"]
    parts = {w["rewardConfig"]["rewardName"]: w for w in spec["compositeRewardConfig"]["weightedRewardConfigs"]}
    assert set(parts) == {"boxed", "city", "inner.norm", "inner.num", "short"}, "the nested composite is flattened"
    assert parts["inner.norm"]["weight"] == 0.75 and parts["inner.num"]["weight"] == 0.25
    assert parts["boxed"]["rewardConfig"]["parseResponseConfig"] == {"parseType": "REGEX_EXTRACT", "regexExtractExpression": BOXED["regex"]}
    assert "stringMatchExpression" in parts["boxed"]["rewardConfig"]["stringMatchRewardScorer"]
    assert parts["city"]["rewardConfig"]["stringMatchRewardScorer"]["jsonMatchExpression"]["keyName"] == "city"
    for name in ("inner.norm", "inner.num", "short"):
        assert "def evaluate(example, response)" in parts[name]["rewardConfig"]["codeExecutionRewardScorer"]["pythonCodeSnippet"]
    # gradekit's own Vertex loader runs the exported spec (code execution in its python sandbox): same scores.
    samples = [sample_from_vertex(e, r) for e, r in SPEC_EXAMPLES]
    exported = vertex_grader(spec)
    try:
        got = [(await exported(s)).score for s in samples]
    finally:
        await aclose_grader(exported)
    want = await grades_of(config, samples)
    assert got == pytest.approx(want) and len(set(want)) > 2


async def test_spec_export_of_an_autorater_round_trips(fake: FakeProvider, make_judge) -> None:
    spec = export_vertex_spec(DATA / "autorater_tone.yaml")["reinforcementTuningSpec"]["singleRewardConfig"]
    scorer = spec["autoraterScorer"]
    assert scorer["exactMatchScorer"] == {"expression": "Yes", "correctAnswerReward": 1.0, "wrongAnswerReward": -1.0}
    assert scorer["autoraterResponseParseConfig"]["regexExtractExpression"] == "<answer>(.*?)</answer>"
    fake.set_responder(lambda body: Reply(content="<answer>" + ("Yes" if "please" in body["messages"][-1]["content"] else "No") + "</answer>"))
    judge = make_judge()
    sample = sample_from_vertex(vx({"tone": "polite"}, "Yes, please.")[0], vx(None, "Yes, please.")[1])
    original = load_grader(DATA / "autorater_tone.yaml", judge=judge)
    assert (await vertex_grader({"singleRewardConfig": spec}, judge=judge)(sample)).score == (await original(sample)).score == 1.0


@pytest.mark.parametrize(("config", "reason"), [
    pytest.param({"type": "llm", "rubric": "semantic_equivalence_en"}, "type: autorater", id="llm_rubric"),
    pytest.param({"type": "formula", "formula": "a", "graders": {"a": {"type": "llm", "rubric": "tone"}}}, "network", id="formula_over_llm"),
    pytest.param({"type": "weighted", "parts": {f"p{i}": {"weight": 1, "type": "string_check", "input": "{{response}}", "reference": "x"}
                                                for i in range(17)}}, "at most 16", id="seventeen_rewards"),
    pytest.param({"type": "group", "grader": {"type": "string_check", "input": "{{response}}", "reference": "x"}}, "Ark", id="group"),
])
def test_spec_export_refuses_with_a_reason(config: dict, reason: str) -> None:
    with pytest.raises(ExportError, match=reason):
        export_vertex_spec(config)


# ---- OpenAI -----------------------------------------------------------------------------------------

# The documented grader shapes (fine_tuning/alpha/graders), written out independently of the exporter.
_LEAF = [
    {"type": "object", "additionalProperties": False, "required": ["type", "name", "input", "reference", "operation"],
     "properties": {"type": {"const": "string_check"}, "name": {"type": "string"}, "input": {"type": "string"},
                    "reference": {"type": "string"}, "operation": {"enum": ["eq", "ne", "like", "ilike"]}}},
    {"type": "object", "additionalProperties": False, "required": ["type", "name", "source"],
     "properties": {"type": {"const": "python"}, "name": {"type": "string"}, "source": {"type": "string", "maxLength": 256 * 1024},
                    "image_tag": {"type": "string"}, "pass_threshold": {"type": "number"}}},
    {"type": "object", "additionalProperties": False, "required": ["type", "name", "model", "input"],
     "properties": {"type": {"const": "score_model"}, "name": {"type": "string"}, "model": {"type": "string"},
                    "input": {"type": "array", "items": {"type": "object", "required": ["role", "content"], "additionalProperties": False,
                                                         "properties": {"role": {"enum": ["system", "developer", "user", "assistant"]},
                                                                        "content": {"type": "string"}}}},
                    "range": {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2},
                    "pass_threshold": {"type": "number"}, "sampling_params": {"type": "object"}}},
]
OPENAI_SCHEMA = {"oneOf": [*_LEAF, {
    "type": "object", "additionalProperties": False, "required": ["type", "graders", "calculate_output"],
    "properties": {"type": {"const": "multi"}, "name": {"type": "string"}, "calculate_output": {"type": "string"},
                   "graders": {"type": "object", "additionalProperties": {"oneOf": _LEAF}}}}]}


def openai_string_check(grader: dict, sample: dict, item: dict) -> float:
    """OpenAI's string_check, for the test: render {{ sample.x }} / {{ item.x }}, then compare."""
    def render(template: str) -> str:
        return fill_placeholders(template, Sample(response=sample["output_text"], references=item))
    got, want = render(grader["input"]), render(grader["reference"])
    return float({"eq": got == want, "ne": got != want, "like": want in got, "ilike": want.lower() in got.lower()}[grader["operation"]])


def openai_jobs(tmp_path: Path, grader: dict, samples: list[Sample]) -> tuple[list[dict], list[str]]:
    """Fresh-interpreter jobs for every python grader in an export, one per sample; the keys they fill."""
    leaves = grader["graders"] if grader["type"] == "multi" else {"top": grader}
    jobs, keys = [], []
    for key, leaf in leaves.items():
        if leaf["type"] != "python":
            continue
        assert_stdlib_only(leaf["source"])
        path = tmp_path / f"{grader['name']}_{key}.py"
        path.write_text(leaf["source"], encoding="utf-8")
        keys.append(key)
        jobs += [{"file": str(path), "entry": "grade", "args": [to_openai_sample(s), to_openai_item(s)]} for s in samples]
    return jobs, keys


def combine(grader: dict, samples: list[Sample], fresh: dict[str, list[Any]]) -> list[float | None]:
    """The OpenAI reward per sample: python parts from the fresh interpreter, string_check by its
    definition, a multi grader's calculate_output over them (gradekit's formula parser, ^ = power)."""
    out: list[float | None] = []
    leaves = grader["graders"] if grader["type"] == "multi" else {"top": grader}
    for i, sample in enumerate(samples):
        values: dict[str, float] = {}
        for key, leaf in leaves.items():
            if leaf["type"] == "python":
                values[key] = fresh[key][i].get("score")
            else:
                values[key] = openai_string_check(leaf, to_openai_sample(sample), to_openai_item(sample))
        if any(v is None for v in values.values()):
            out.append(None)
        else:
            out.append(compile_formula(grader["calculate_output"], list(values))(values) if grader["type"] == "multi" else values["top"])
    return out


OPENAI_CASES = {
    "multi_string_check_and_python": (DATA / "formula.json", False),
    "string_match_rescaled": (DATA / "string_match.yaml", True),
    "weighted_matches": ({"type": "weighted", "name": "w", "parts": {
        "tag": {"weight": 3, "type": "string_match", "expression": "{{references.answer}}", "parse": {"type": "REGEX_EXTRACT", "regex": "<answer>(.*?)</answer>"}, "wrong": 0},
        "num": {"weight": 1, "type": "numeric_match", "expression": "{{ item.n }}", "abs_tol": 0.5, "wrong": 0},
        "exact": {"weight": 1, "type": "string_check", "input": "{{response}}", "reference": "{{references.answer}}"},
        "len": {"weight": 1, "type": "python", "file": str(DATA / "reward_openai.py"), "range": [0, 1]}}}, False),
    "formula_rescaled": ({"type": "formula", "name": "f", "formula": "(a + b ^ 2) / 2 - min(a, 0)", "graders": {
        "a": {"type": "normalized_match", "expression": "{{references.answer}}"},
        "b": {"type": "python", "file": str(DATA / "reward_vertex.py")}}}, True),
}
OPENAI_SAMPLES = [Sample(response=t, references=r) for t, r in [
    ("<answer>Paris</answer> 2", {"answer": "Paris", "n": 2, "max_words": 5}), ("paris", {"answer": "Paris", "n": 2}),
    ("Paris", {"answer": "Paris", "n": 7}), ("<answer>Lyon</answer> 1.6", {"answer": "Paris", "n": 2, "max_words": 1}),
    ("no answer here at all, only words " * 3, {"answer": "Paris", "n": "x"}),
]]


async def test_openai_exports_validate_and_score_like_the_grader(tmp_path: Path) -> None:
    exports = {case: (export_openai_grader(config, rescale=rescale), config, rescale) for case, (config, rescale) in OPENAI_CASES.items()}
    jobs, spans = [], {}
    for case, (grader, _, _) in exports.items():
        jsonschema.validate(grader, OPENAI_SCHEMA)
        case_jobs, keys = openai_jobs(tmp_path, grader, OPENAI_SAMPLES)
        spans[case] = (len(jobs), keys)
        jobs += case_jobs
    results = run_fresh(tmp_path, jobs)
    checked = 0
    for case, (grader, config, rescale) in exports.items():
        start, keys = spans[case]
        n = len(OPENAI_SAMPLES)
        fresh = {key: results[start + j * n: start + (j + 1) * n] for j, key in enumerate(keys)}
        got = combine(grader, OPENAI_SAMPLES, fresh)
        want = await grades_of(config, OPENAI_SAMPLES)
        for g, w in zip(got, want):
            if w is None:
                assert g is None, (case, g)  # the python grader raised: OpenAI marks the sample invalid
                continue
            checked += 1
            assert g == pytest.approx((w + 1) / 2 if rescale else w, abs=1e-12), (case, g, w)
    assert checked >= 15
    assert exports["multi_string_check_and_python"][0]["graders"]["exact"] == {
        "type": "string_check", "name": "exact", "input": "{{ sample.output_text }}", "reference": "{{ item.answer }}", "operation": "ilike"}
    assert exports["weighted_matches"][0]["calculate_output"] == "(3.0 * tag + 1.0 * num + 1.0 * exact + 1.0 * len) / 6.0"
    assert exports["formula_rescaled"][0]["calculate_output"] == "(((((a + (b ^ 2.0)) / 2.0) - min(a, 0.0))) + 1) / 2"


def test_openai_score_model_and_rescale_wrapper() -> None:
    config = {"type": "autorater", "name": "quality", "prompt": "Rate {{response}} against {{references.answer}} from -1 to 1.",
              "judge": {"model": "gpt-4.1-mini"}}
    with pytest.raises(ExportError, match=r"can score -1.*`rescale`"):  # the argument; `gradekit export` says --rescale
        export_openai_grader(config)
    grader = export_openai_grader(config, rescale=True)
    jsonschema.validate(grader, OPENAI_SCHEMA)
    assert grader["calculate_output"] == "(quality + 1) / 2"
    inner = grader["graders"]["quality"]
    assert inner["type"] == "score_model" and inner["model"] == "gpt-4.1-mini" and inner["range"] == [-1.0, 1.0]
    assert inner["input"] == [{"role": "user", "content": "Rate {{ sample.output_text }} against {{ item.answer }} from -1 to 1."}]


@pytest.mark.parametrize(("config", "reasons"), [
    pytest.param({"type": "llm", "rubric": "semantic_equivalence_en"}, ["label_model is for evals only"], id="llm_rubric"),
    pytest.param(DATA / "autorater_tone.yaml", ["matches the judge's reply", "{{prompt}}"], id="autorater_exact_match_and_prompt"),
    pytest.param({"type": "string_match", "expression": "{{prompt}}", "wrong": 0}, ["{{prompt}}"], id="prompt_placeholder"),
    pytest.param({"type": "weighted", "parts": {
        "a": {"weight": 1, "type": "string_match", "expression": "x", "parse": {"type": "REGEX_EXTRACT", "regex": "(x)"}},
        "b": {"weight": 1, "type": "python", "source": "def evaluate(example, response):\n    return len(example['contents'])\n"}}},
        ["can score -1", "reads the example's contents"], id="negative_range_and_prompt_reading_python"),
    pytest.param({"type": "weighted", "parts": {"inner": {"weight": 1, "type": "formula", "formula": "t", "graders": {
        "t": {"type": "llm", "rubric": "tone"}}}}}, ["cannot contain another"], id="nested_multi_with_llm"),
])
def test_openai_export_refuses_listing_every_reason(config: Any, reasons: list[str]) -> None:
    with pytest.raises(ExportError) as caught:
        export_openai_grader(config)
    for reason in reasons:
        assert reason in str(caught.value)


# ---- CLI ------------------------------------------------------------------------------------------

runner = CliRunner()


def test_cli_export_each_target(tmp_path: Path) -> None:
    out = tmp_path / "reward.py"
    result = runner.invoke(app, ["export", str(EXAMPLES / "math_answer.yaml"), "--to", "vertex-evaluate", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "def evaluate(example, response)" in out.read_text(encoding="utf-8")
    result = runner.invoke(app, ["export", str(DATA / "vertex_single.json"), "--to", "vertex-spec"])
    assert result.exit_code == 0 and json.loads(result.stdout) == json.loads((DATA / "vertex_single.json").read_text(encoding="utf-8"))
    result = runner.invoke(app, ["export", str(DATA / "string_match.yaml"), "--to", "openai", "--rescale"])
    assert result.exit_code == 0 and json.loads(result.stdout)["type"] == "python"


def test_cli_export_not_expressible_exits_2_with_the_reasons(tmp_path: Path) -> None:
    result = runner.invoke(app, ["export", str(DATA / "string_match.yaml"), "--to", "openai"])
    assert result.exit_code == 2
    assert "cannot export to an OpenAI grader" in result.output and "--rescale" in result.output
    result = runner.invoke(app, ["export", str(tmp_path / "missing.yaml"), "--to", "vertex-spec"])
    assert result.exit_code == 2 and "missing.yaml" in result.output


def test_cli_export_as_a_real_subprocess(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "gradekit", "export", str(DATA / "autorater_tone.yaml"), "--to", "vertex-evaluate"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=60, check=False)
    assert done.returncode == 2, done.stdout
    assert "LLM judge needs network access" in done.stderr


def test_exported_vertex_evaluate_takes_a_plain_string_response(tmp_path: Path) -> None:
    # Vertex's own examples pass the model's text as is; a Content and a string give the same score.
    out = tmp_path / "reward.py"
    result = runner.invoke(app, ["export", str(EXAMPLES / "math_answer.yaml"), "--to", "vertex-evaluate", "-o", str(out)])
    assert result.exit_code == 0, result.output
    example = {"contents": [{"role": "user", "parts": [{"text": "1+1?"}]}], "references": {"answer": "2"}}
    content = {"role": "model", "parts": [{"text": "\\boxed{2}"}]}
    got = run_fresh(tmp_path, [{"file": str(out), "entry": "evaluate", "args": [example, content]},
                               {"file": str(out), "entry": "evaluate", "args": [example, "\\boxed{2}"]},
                               {"file": str(out), "entry": "evaluate", "args": [example, 42]}])
    assert "score" in got[0] and got[1] == got[0], got
    assert got[2]["raised"] == "ValueError" and "response must be" in got[2]["message"], got
