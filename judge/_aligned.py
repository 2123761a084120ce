"""An aligned rubric: what ``gradekit align`` changed, what it was certified on, and the digest that locks both.

``gradekit align`` (graders/calibration/_align.py) may change three things of a rubric: its
guidelines (distilled from the judge's disagreements with human labels), its few-shot examples
(labelled rows shown as earlier turns) and its label definitions. The output schema, the labels
and the score map stay as they were. The rubric it writes carries an ``alignment:`` block: the
original rubric, the labels file's hash, the label policy, the split seed and sizes, the judge,
and the certificate measured on held-out test rows. Its ``digest`` has one sha256 per field of
the spec, its template's source and the alignment block (judge._digest): a hand-edited aligned
rubric is refused, naming the field, as a hand-edited cascade file is.

The template of an aligned rubric is the original's, with a section that shows the guidelines and
label definitions spliced into its system block (:func:`spliced`): the wording lives in a shipped
template (prompts/aligned_section*.j2), the text itself stays data (template variables), never
template source.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ._digest import changed_fields, field_digest

ALIGNMENT_VERSION = 1
log = logging.getLogger("gradekit.certificate")  # the CLI shows its INFO lines: `grade` and `serve` print a certificate on load

# The fields of the spec an aligned rubric's digest covers (everything but where it lives): a change to any is a hand edit.
SPEC_FIELDS = ("name", "description", "language", "variables", "output", "labels", "unmatched", "invalid_labels", "sampling",
               "pairwise", "criteria", "guidelines", "label_definitions", "examples")
ALIGNMENT_FIELDS = ("version", "original", "labels_file", "label_policy", "seed", "splits", "judge", "optimiser")


class Example(BaseModel):
    """One few-shot example: a labelled row (the rubric's variables) and its human label, shown as an earlier turn."""

    model_config = ConfigDict(extra="forbid")

    row: dict[str, Any]
    label: str

    @field_validator("label", mode="before")
    @classmethod
    def _as_text(cls, value: Any) -> Any:
        return str(value) if isinstance(value, (int, float, bool)) else value


class Agreement(BaseModel):
    """A rubric's agreement with the human labels on the test rows: accuracy and Cohen's kappa, each with its interval."""

    model_config = ConfigDict(extra="forbid")

    accuracy: float  # share of test rows whose verdict is the human label (a failed verdict does not agree)
    accuracy_ci: tuple[float, float] | None = None
    kappa: float | None = None  # over the rows the judge gave a verdict on
    kappa_ci: tuple[float | None, float | None] | None = None
    failures: int = 0  # test rows without a verdict


class Certificate(BaseModel):
    """What the held-out test rows say: both rubrics' agreement, and the paired difference with its interval."""

    model_config = ConfigDict(extra="forbid")

    n: int  # test rows (never shown to the optimiser, never used to choose)
    aligned: Agreement
    original: Agreement
    difference: float  # aligned accuracy - original accuracy, on the same rows
    difference_ci: tuple[float, float]  # paired bootstrap (percentile) over the test rows
    confidence: float = 0.95
    resamples: int = 0
    margin: float = 0.0  # the lower end had to be above this for the rubric to be written
    method: str = "paired bootstrap over test rows, percentile interval"


class Alignment(BaseModel):
    """The ``alignment:`` block of an aligned rubric."""

    model_config = ConfigDict(extra="forbid")

    version: int = ALIGNMENT_VERSION
    original: dict[str, Any]  # {"rubric": name or path as given, "fingerprint": judge._rubric.rubric_fingerprint}
    labels_file: dict[str, Any]  # {"name": file name, "sha256": of its bytes, "rows": n}
    label_policy: dict[str, Any]  # {"name", "version"}: the labelling guide the labels follow
    seed: int  # the split's seed
    splits: dict[str, Any]  # {"stratified_by": "label", "fractions", "train"/"dev"/"test": [row ids]}
    judge: dict[str, Any]  # {"model", "params"}: the judge the certificate holds for
    optimiser: dict[str, Any]  # {"model"}: who wrote the guidelines
    certificate: Certificate
    digest: dict[str, str] = Field(default_factory=dict)


class AlignedSpec(Protocol):
    """What the digest and the certificate read of a rubric (judge._rubric's ``Rubric`` meets it): its fields, dumped
    as JSON, and its alignment block. A protocol, so the rubric's module imports this one and not the reverse."""

    @property
    def alignment(self) -> Alignment | None: ...

    def model_dump(self, *, mode: str, exclude: set[str]) -> dict[str, Any]: ...


def alignment_fields(rubric: AlignedSpec, template: str) -> dict[str, Any]:
    """Every field the digest of an aligned rubric covers, by the name a refusal names it."""
    dumped = rubric.model_dump(mode="json", exclude={"directory", "alignment", "template", "inline_template"})
    fields: dict[str, Any] = {name: dumped.get(name) for name in SPEC_FIELDS}
    fields["template"] = template  # its source: the wording the certificate was measured with
    alignment = rubric.alignment
    assert alignment is not None
    block = alignment.model_dump(mode="json", exclude={"digest"})
    for name in ALIGNMENT_FIELDS:
        fields[f"alignment.{name}"] = block[name]
    for name, value in block["certificate"].items():
        fields[f"alignment.certificate.{name}"] = value
    return fields


def seal(rubric: AlignedSpec, template: str) -> dict[str, str]:
    """The digest ``gradekit align`` writes into the rubric it certified."""
    return field_digest(alignment_fields(rubric, template))


def check_alignment(rubric: AlignedSpec, template: str, where: str) -> None:
    """Refuse an aligned rubric that is not what was certified (ValueError naming the fields), then announce its certificate."""
    alignment = rubric.alignment
    assert alignment is not None
    if not alignment.digest:
        raise ValueError(f"{where}: alignment.digest is missing: the certificate cannot be checked against the rubric; "
                         "run gradekit align again rather than write the alignment block by hand")
    changed = changed_fields(alignment.digest, alignment_fields(rubric, template))
    if changed:
        raise ValueError(f"{where}: {', '.join(changed)} changed after alignment (the rubric's digest does not match): its "
                         "certificate was measured on other values; run gradekit align again rather than edit the aligned rubric")
    log.info("%s", certificate_line(rubric, where))


def certificate_line(rubric: AlignedSpec, where: str) -> str:
    """One line a user reads when an aligned rubric is loaded: what it was certified for, and by how much it won."""
    a = rubric.alignment
    assert a is not None
    c = a.certificate
    policy = f"{a.label_policy.get('name')}" + (f"@{a.label_policy['version']}" if a.label_policy.get("version") else "")
    low, high = c.difference_ci
    kappa = "n/a" if c.aligned.kappa is None else f"{c.aligned.kappa:.2f}"
    return (f"{where}: aligned rubric certified on {c.n} held-out rows of {a.labels_file.get('name')} (label policy {policy}) for "
            f"judge {a.judge.get('model')}: accuracy {c.aligned.accuracy:.1%} (kappa {kappa}) vs {c.original.accuracy:.1%} for "
            f"{a.original.get('rubric')}, difference {c.difference:+.1%} [{low:+.1%}, {high:+.1%}] at {c.confidence:.0%}")


def section_template(language: str) -> str:
    """The shipped wording that shows guidelines and label definitions (a variant per language where one ships)."""
    from ._specs import packaged_prompts

    folder = packaged_prompts()
    own = folder / f"aligned_section_{language}.j2"
    return (own if own.exists() else folder / "aligned_section.j2").read_text(encoding="utf-8")


_TAG = re.compile(r"\{%-?\s*(block|endblock)\b[^%]*?-?%\}")
_SYSTEM = re.compile(r"\{%-?\s*block\s+system\s*-?%\}")


def spliced(template: str, section: str) -> str:
    """``template`` with ``section`` at the end of its system block (a system block holding only it, when there is none)."""
    start = _SYSTEM.search(template)
    if start is None:
        return "{% block system %}\n" + section.strip("\n") + "\n{% endblock %}\n" + template
    depth = 0
    for tag in _TAG.finditer(template, start.start()):
        depth += 1 if tag.group(1) == "block" else -1
        if depth == 0:
            body = template[:tag.start()].rstrip("\n")
            return body + "\n" + section.strip("\n") + "\n" + template[tag.start():]
    raise ValueError("the template's system block has no {% endblock %}")
