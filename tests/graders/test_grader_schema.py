"""Grader files carry their schema: `gradekit schema` prints the JSON schema generated from the node models;
every grader file in examples/ and docs/ validates against it (with the jsonschema library, as an editor
would check it); a broken file fails it and the loader alike; the schema lists what an editor completes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from gradekit.graders import GraderConfigError, load_grader, load_group_grader
from gradekit.graders._config import NODES
from gradekit.graders._config_nodes import NODE_MODELS
from gradekit.graders._schema import SCHEMA_FILE, schema_text
from gradekit.judge.testing import FakeProvider

from ..conftest import reference_judge

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "graders"


def gradekit(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gradekit", *args], capture_output=True, text=True, timeout=120, cwd=cwd,
                          env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def printed() -> dict[str, Any]:
    """The schema as `gradekit schema` prints it: what a user points an editor at."""
    done = gradekit("schema")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module", params=["declared", "2020-12"])
def validator(request: pytest.FixtureRequest, printed: dict[str, Any]) -> jsonschema.protocols.Validator:
    """The dialect the schema declares (draft 7, as editors check), and 2020-12 (pydantic's own), which must agree."""
    cls = jsonschema.validators.validator_for(printed) if request.param == "declared" else jsonschema.Draft202012Validator
    cls.check_schema(printed)
    return cls(printed)


def test_the_shipped_schema_is_the_one_the_models_give() -> None:
    # A changed node model without the regenerated file fails here: run `python -m gradekit.graders._schema`.
    assert SCHEMA_FILE.read_text(encoding="utf-8") == schema_text(), "grader.schema.json is stale: python -m gradekit.graders._schema"


def test_schema_command_prints_it_and_writes_it(tmp_path: Path, printed: dict[str, Any]) -> None:
    assert printed == json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    assert printed["$schema"] == "http://json-schema.org/draft-07/schema#"  # what editors' YAML and JSON support check with
    out = tmp_path / "grader.schema.json"
    done = gradekit("schema", "--output", str(out))
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert out.read_text(encoding="utf-8") == SCHEMA_FILE.read_text(encoding="utf-8")
    done = gradekit("schema", "-o", str(tmp_path / "no" / "such" / "folder" / "s.json"))
    assert done.returncode == 2
    assert done.stderr.startswith("error: ") and "No such file or directory" in done.stderr and "Traceback" not in done.stderr


def grader_files() -> list[Path]:
    """Every YAML/JSON file under examples/ whose top level is a grader (a node's type, an eval's criteria)."""
    found = []
    for path in sorted(ROOT.glob("examples/**/*")):
        if path.suffix in (".yaml", ".yml", ".json"):
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
            if isinstance(data, dict) and ("type" in data or "testing_criteria" in data):
                found.append(path)
    return found


EXAMPLES = grader_files()


def test_the_examples_are_found() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in EXAMPLES}
    assert {"examples/graders/math_answer.yaml", "examples/graders/search_agent_group.yaml",
            "examples/server/graders/boxed_answer.yaml", "examples/trajectories/tool_use_steps.yaml"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_example_validates(path: Path, validator: jsonschema.protocols.Validator) -> None:
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(yaml.safe_load(path.read_text()))]
    assert errors == []


def docs_grader_blocks() -> list[Any]:
    """The grader files shown in docs/*.md (fenced yaml/json blocks whose top level has a type)."""
    blocks = []
    for md in sorted((ROOT / "docs").glob("*.md")):
        text = md.read_text(encoding="utf-8")
        for match in re.finditer(r"```(?:yaml|json)\n(.*?)```", text, re.S):
            try:
                data = yaml.safe_load(match.group(1))
            except yaml.YAMLError:
                continue  # a JSON Lines block or a fragment: not a grader file
            if isinstance(data, dict) and "type" in data:
                line = text[:match.start()].count("\n") + 1
                blocks.append(pytest.param(data, id=f"{md.name}:{line}"))
    return blocks


DOCS = docs_grader_blocks()


def test_the_docs_blocks_are_found() -> None:
    assert len(DOCS) >= 8


@pytest.mark.parametrize("data", DOCS)
def test_every_docs_grader_validates(data: Any, validator: jsonschema.protocols.Validator) -> None:
    assert [e.message for e in validator.iter_errors(data)] == []


S = "{{references.answer}}"
BROKEN = [
    pytest.param({"type": "strng_match", "expression": S}, "unknown grader type 'strng_match'", id="wrong_type_name"),
    pytest.param({"type": "string_match", "expresion": S}, "did you mean expression?", id="misspelt_key"),
    pytest.param({"type": "string_match", "expression": S, "operation": "EXACT"}, "operation: Input should be", id="wrong_enum"),
    pytest.param({"type": "weighted", "parts": {"a": {"weight": 1, "type": "numeric_match", "expression": S, "abs_tol": "x"}}},
                 "parts.a.abs_tol", id="nested_wrong_value"),
    pytest.param({"type": "weighted", "parts": {"a": {"weight": 1, "type": "numeric_match", "expresion": S}}},
                 "parts.a.expresion: Extra inputs are not permitted; did you mean expression?", id="nested_misspelt_key"),
    pytest.param({"type": "formula", "formula": "a", "graders": {"a": {"type": "llm"}}}, "graders.a.rubric: Field required",
                 id="nested_missing_key"),
    pytest.param({"type": "weighted", "parts": {"a": {"type": "group", "weight": 1}}}, "parts.a: unknown grader type 'group'",
                 id="group_not_at_the_top"),
    pytest.param({"type": "string_match", "expression": S, "judge": {"modle": "m"}}, "judge.modle: Extra inputs are not permitted; "
                 "did you mean model?", id="judge_misspelt_key"),
    pytest.param({"type": "group", "grader": {"type": "string_match", "expression": S}, "on_judge_eror": "RETRY"},
                 "did you mean on_judge_error?", id="group_misspelt_key"),
    pytest.param({"type": "verified_answer", "expression": S, "sandbox": "off"}, "sandbox: Input should be", id="sandbox_enum"),
    pytest.param({"expression": S}, "unknown grader type None", id="no_type"),
    pytest.param({"type": "weighted", "parts": {"a": 5}}, "parts.a: Input should be a valid dictionary", id="part_not_a_mapping"),
]


@pytest.mark.parametrize(("data", "message"), BROKEN)
def test_a_broken_file_fails_the_schema_and_the_loader(data: dict[str, Any], message: str, validator: jsonschema.protocols.Validator,
                                                       tmp_path: Path) -> None:
    assert not validator.is_valid(data)
    path = tmp_path / "grader.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(GraderConfigError) as info:
        (load_group_grader if data.get("type") == "group" else load_grader)(path)
    assert str(info.value).startswith(f"{path}: ") and message in str(info.value)


def resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = schema["$defs"][node["$ref"].removeprefix("#/$defs/")]
    return node


def alternatives(schema: dict[str, Any], node: dict[str, Any]) -> list[dict[str, Any]]:
    """The object schemas a value may match, through anyOf/oneOf and $ref (what an editor offers from)."""
    node = resolve(schema, node)
    nested = node.get("oneOf", []) + node.get("anyOf", [])
    if nested:
        return [found for sub in nested for found in alternatives(schema, sub)]
    return [node] if node.get("type") == "object" else []


def type_values(schema: dict[str, Any], node: dict[str, Any]) -> set[str]:
    values = set()
    for alt in alternatives(schema, node):
        kind = alt.get("properties", {}).get("type", {})
        values |= {kind["const"]} if "const" in kind else set(kind.get("enum", ()))
    return values


def test_an_editor_completes_type_and_keys_from_it(printed: dict[str, Any]) -> None:
    # The top level offers every node type and group; a weighted part or a formula's grader every node type.
    assert type_values(printed, printed) == set(NODES) | {"group"}
    weighted = resolve(printed, {"$ref": "#/$defs/WeightedNode"})
    assert type_values(printed, weighted["properties"]["parts"]["additionalProperties"]) == set(NODES)
    formula = resolve(printed, {"$ref": "#/$defs/FormulaNode"})
    assert type_values(printed, formula["properties"]["graders"]["additionalProperties"]) == set(NODES)
    # Every node type and every key of it says what it is (an editor's hover and completion detail).
    files = [alt for alt in alternatives(printed, printed) if "type" in alt.get("properties", {})]  # not the eval nor the Vertex spec
    assert len(files) == len(set(NODE_MODELS)) + 1
    for alt in files:
        assert alt.get("description"), alt["title"]
        assert alt["additionalProperties"] is False, alt["title"]  # a misspelt key is flagged in the editor
        missing = [key for key, prop in alt["properties"].items() if not prop.get("description")]
        assert missing == [], alt["title"]
        assert {"judge", "$schema"} <= set(alt["properties"]), alt["title"]
    judge = resolve(printed, files[0]["properties"]["judge"]["anyOf"][0])
    assert {"model", "base_url", "endpoints", "jury", "timeout", "params"} <= set(judge["properties"])


def test_a_json_grader_file_names_its_schema(tmp_path: Path, fake: FakeProvider, validator: jsonschema.protocols.Validator) -> None:
    """A JSON grader file with "$schema" (how a JSON editor finds the schema) loads, and its judge block is used."""
    assert gradekit("schema", "-o", str(tmp_path / "grader.schema.json")).returncode == 0
    fake.set_responder(reference_judge)
    grader = {"$schema": "./grader.schema.json", "type": "weighted", "parts": {
        "exact": {"weight": 1, "type": "string_match", "expression": S},
        "judged": {"weight": 1, "type": "llm", "rubric": "semantic_equivalence_en",
                   "map": {"question": "prompt", "references": "references.answer", "prediction": "response"}}},
        "judge": {"model": "fake-judge", "base_url": fake.base_url}}
    assert validator.is_valid(grader)
    (tmp_path / "grader.json").write_text(json.dumps(grader), encoding="utf-8")
    (tmp_path / "example.json").write_text(json.dumps({"contents": [{"role": "user", "parts": [{"text": "Capital of France?"}]}],
                                                       "references": {"answer": "Paris"}}), encoding="utf-8")
    (tmp_path / "response.txt").write_text("Paris", encoding="utf-8")
    done = gradekit("validate", "--grader", "grader.json", "--example", "example.json", "--response", "response.txt", "--json",
                    cwd=tmp_path, env={"OPENAI_API_KEY": "test-key"})
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert {name: part["reward"] for name, part in result["parts"].items()} == {"exact": 1.0, "judged": 1.0}
    assert len(fake.chat_requests()) == 1


async def test_the_loader_takes_schema_in_a_mapping_too() -> None:
    grader = load_grader({"$schema": "https://example.invalid/grader.schema.json", "type": "string_match", "expression": S})
    from gradekit.graders import Sample

    grade = await grader(Sample(messages="q", response="Paris", references={"answer": "Paris"}))
    assert grade.score == 1.0
