"""The JSON schema of a grader file, generated from the models the loader validates with.

The schema ships in the package (``gradekit/graders/grader.schema.json``) so that ``gradekit schema``
prints it without importing pydantic or any grader, and an editor can be pointed at a copy of it
(docs/graders.md). tests/graders/test_grader_schema.py regenerates it and fails when the shipped file has
drifted from the models; ``python -m gradekit.graders._schema`` writes it again.

A file is one node (graders._config_nodes, ``group`` included at the top) with the file-level keys
``judge`` (the judge block, the model graders._config validates it with) and ``$schema`` (an editor's
pointer to this schema, ignored by the loader); or an Evals-API eval definition; or a bare Vertex spec.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from ._config import JudgeSettings
from ._config_nodes import NODE_MODELS, GroupNode, with_keys
from ._evals import EvalDefinition

SCHEMA_FILE = Path(__file__).with_name("grader.schema.json")
# Draft 7: what yaml-language-server (VS Code's YAML extension) and VS Code's JSON support check instances with;
# pydantic's output reads the same there (its $defs are reached by JSON pointer, its prefixItems only add detail).
DIALECT = "http://json-schema.org/draft-07/schema#"

_FILE_KEYS: dict[str, Any] = {
    "judge": (JudgeSettings | None, Field(None, description="The judge of this file's LLM nodes: one model (model, base_url, params, "
                                                            "timeout, ...), a fleet (endpoints) or a jury (jury, aggregate, quorum); "
                                                            "the command line's judge flags override it (docs/judges.md).")),
    "schema_": (str | None, Field(None, alias="$schema", description="This schema's location, for editors; the loader ignores it.")),
}
_FILES = tuple(with_keys(model, "File", **_FILE_KEYS) for model in (*NODE_MODELS, GroupNode))


class VertexSpecFile(BaseModel):
    """A Vertex reinforcementTuningSpec as the whole file: it loads as type: vertex, unchanged."""

    model_config = ConfigDict(extra="allow", json_schema_extra={
        "anyOf": [{"required": [key]} for key in ("reinforcementTuningSpec", "singleRewardConfig", "compositeRewardConfig")]})

    reinforcementTuningSpec: dict[str, Any] | None = Field(None, description="The spec, wrapped as Vertex's API gives it.")
    singleRewardConfig: dict[str, Any] | None = Field(None, description="One reward.")
    compositeRewardConfig: dict[str, Any] | None = Field(None, description="Several rewards, weighted.")


class EvalFile(EvalDefinition):
    """An OpenAI Evals-API eval definition (what evals.retrieve() returns): each testing criterion is a grader."""

    model_config = ConfigDict(json_schema_extra={"not": {"required": ["type"]}})  # graders._evals.is_eval_definition


GraderFile = Union[Annotated[Union[_FILES], Field(discriminator="type")], EvalFile, VertexSpecFile]  # type: ignore[valid-type]


def grader_schema() -> dict[str, Any]:
    """The JSON schema of a grader file (YAML or JSON), generated from the node models."""
    schema = TypeAdapter(GraderFile).json_schema()
    return {
        "$schema": DIALECT,
        "title": "gradekit grader file",
        "description": "A grader: one node with a `type` (docs/graders.md), or an Evals-API eval definition, or a Vertex spec.",
        **schema,
    }


def schema_text(schema: dict[str, Any] | None = None) -> str:
    """The schema as the shipped file holds it."""
    return json.dumps(grader_schema() if schema is None else schema, indent=2, ensure_ascii=False) + "\n"


if __name__ == "__main__":  # python -m gradekit.graders._schema: regenerate the shipped file after changing a node model
    SCHEMA_FILE.write_text(schema_text(), encoding="utf-8")
    sys.stdout.write(f"wrote {SCHEMA_FILE}\n")
