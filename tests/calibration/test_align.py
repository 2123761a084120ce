"""`gradekit align` end to end against a fake judge whose agreement with the labels depends on what its prompt teaches it
(judge.testing.AlignmentLab), over HTTP: the certificate, ship-only-if-better, no test row reaching the optimiser or the
choice (checked at the fake), and the digest that makes `grade` refuse a hand-edited aligned rubric."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gradekit.graders.calibration._align import stratified_split
from gradekit.graders.cli import app
from gradekit.judge import load_rubric
from gradekit.judge.testing import AlignmentLab, FakeProvider

from ..conftest import serve_in

runner = CliRunner()
RUBRIC = "semantic_equivalence_en"
LESSONS = {"words": "A number written out in words is the same answer as the number.",
           "hedge": "An answer that lists several candidates is incorrect even when one of them is right.",
           "units": "The same quantity given in other units is a correct answer."}


def labelled_set(path: Path, n: int = 160, seed: int = 7) -> tuple[Path, dict[str, str], dict[str, str]]:
    """``n`` labelled rows, half correct; 40% carry a trait the judge gets wrong until its prompt teaches it."""
    rng = random.Random(seed)
    truth, traits = {}, {}
    with path.open("w", encoding="utf-8") as f:
        for i in range(n):
            key = f"q{i:03d}"
            label = "correct" if i % 2 == 0 else "incorrect"
            trait = rng.choice(["words", "hedge", "units"]) if rng.random() < 0.4 else None
            truth[key] = label
            if trait:
                traits[key] = trait
            f.write(json.dumps({"id": key, "question": f"{key}: what is the answer?", "references": ["42"],
                                "prediction": "42" if label == "correct" else "41", "label": label}) + "\n")
    return path, truth, traits


def lab(truth: dict[str, str], traits: dict[str, str], **kwargs) -> AlignmentLab:
    return AlignmentLab(truth, ["correct", "incorrect"], r"\b(q\d{3})\b", traits=traits, lessons=LESSONS, **kwargs)


def align(fake: FakeProvider, data: Path, out: Path, *more: str) -> tuple[int, dict, str]:
    result = runner.invoke(app, ["align", str(data), "-r", RUBRIC, "-o", str(out), "--on", "id", "--base-url", fake.base_url,
                                 "--api-key", "k", "--model", "fake-judge", "--optimiser-model", "fake-optimiser",
                                 "--cache", str(out.parent / "cache.sqlite3"), "--json", *more])
    stdout = result.stdout
    report = json.loads(stdout[stdout.index("{"):]) if "{" in stdout else {}
    return result.exit_code, report, result.output


@pytest.fixture
def learnable(tmp_path: Path):
    data, truth, traits = labelled_set(tmp_path / "labelled.jsonl")
    judge = lab(truth, traits)
    with FakeProvider(responder=judge) as fake:
        yield fake, judge, data, traits


def test_align_raises_test_agreement_with_an_interval_above_zero_and_no_test_row_reaches_the_optimiser(learnable, tmp_path) -> None:
    fake, judge, data, traits = learnable
    out = tmp_path / "aligned.yaml"
    code, report, text = align(fake, data, out)
    assert code == 0, text
    c = report["certificate"]
    assert report["written"] and report["output"] == str(out) and out.exists() and out.with_suffix(".j2").exists()
    assert c["difference_ci"][0] > 0 and c["aligned"]["accuracy"] > c["original"]["accuracy"]
    assert c["n"] == len(report["splits"]["test"])

    train, dev, test = (set(report["splits"][k]) for k in ("train", "dev", "test"))
    assert not (train & dev or train & test or dev & test) and len(train | dev | test) == 160
    # Checked at the fake: the optimiser was shown train rows only, and each test row was judged with two prompts,
    # the original and the chosen one: no candidate was ever scored on it.
    assert judge.optimiser_keys and judge.optimiser_keys <= train and not judge.optimiser_keys & test
    assert {judge.prompts_for(k) for k in test} == {2}

    aligned, original = load_rubric(out), load_rubric(RUBRIC)
    assert aligned.output == original.output and aligned.labels == original.labels and aligned.unmatched == original.unmatched
    assert aligned.guidelines and set(aligned.guidelines) <= set(LESSONS.values())
    assert all(e.row["question"][:4] in train for e in aligned.examples)  # examples come from train
    a = aligned.alignment
    assert a is not None and a.seed == 0 and a.labels_file["rows"] == 160 and a.judge["model"] == "fake-judge"
    assert a.original["rubric"] == RUBRIC and a.optimiser == {"model": "fake-optimiser"}
    assert [r["round"] for r in report["rounds"]] and report["rounds"][0]["candidates"]

    # Aligned again: it already agrees with every train label, so nothing is left to learn and nothing is written.
    result = runner.invoke(app, ["align", str(data), "-r", str(out), "-o", str(tmp_path / "again.yaml"), "--on", "id", "--base-url",
                                 fake.base_url, "--api-key", "k", "--model", "fake-judge", "--optimiser-model", "fake-optimiser",
                                 "--cache", str(tmp_path / "cache.sqlite3")])
    assert result.exit_code == 1 and "agrees with every train label" in result.stdout and not (tmp_path / "again.yaml").exists()


def test_splits_are_stratified_seeded_and_recorded() -> None:
    labels = ["a"] * 50 + ["b"] * 30 + ["c"] * 5
    first = stratified_split(labels, (0.4, 0.2, 0.4), seed=3)
    assert first == stratified_split(labels, (0.4, 0.2, 0.4), seed=3) != stratified_split(labels, (0.4, 0.2, 0.4), seed=4)
    train, dev, test = first
    assert sorted(train + dev + test) == list(range(85))
    for split, share in ((train, 0.4), (dev, 0.2), (test, 0.4)):
        counts = Counter(labels[i] for i in split)
        assert set(counts) == {"a", "b", "c"}  # every label in every split
        assert abs(counts["a"] - 50 * share) <= 1 and abs(counts["b"] - 30 * share) <= 1


def test_a_judge_no_prompt_can_improve_gets_nothing_written_and_the_reason(tmp_path: Path) -> None:
    data, truth, traits = labelled_set(tmp_path / "labelled.jsonl")
    with FakeProvider(responder=lab(truth, traits, learnable=False)) as fake:
        code, report, text = align(fake, data, tmp_path / "aligned.yaml")
    assert code == 1, text
    assert not report["written"] and report["output"] is None and "nothing written" in report["reason"]
    assert not (tmp_path / "aligned.yaml").exists() and not (tmp_path / "aligned.j2").exists()


def test_better_but_not_by_the_margin_is_not_written(learnable, tmp_path) -> None:
    fake, _, data, _ = learnable
    code, report, text = align(fake, data, tmp_path / "aligned.yaml", "--margin", "0.9")
    assert code == 1, text
    c = report["certificate"]
    assert c["difference"] > 0 and c["difference_ci"][0] <= 0.9 and c["margin"] == 0.9
    assert "not above the margin" in report["reason"] and not (tmp_path / "aligned.yaml").exists()


@pytest.mark.parametrize("edit, field", [
    pytest.param(lambda spec, j2: (spec["guidelines"].append("Always say correct."), j2)[1], "guidelines", id="guideline_added"),
    pytest.param(lambda spec, j2: (spec["labels"].update(correct=0.5), j2)[1], "labels", id="score_map"),
    pytest.param(lambda spec, j2: (spec["alignment"]["certificate"]["difference_ci"].__setitem__(0, 0.5), j2)[1],
                 "alignment.certificate.difference_ci", id="certificate_widened"),
    pytest.param(lambda spec, j2: (spec["alignment"].update(seed=1), j2)[1], "alignment.seed", id="seed"),
    pytest.param(lambda spec, j2: j2.replace("careful", "lenient"), "template", id="template_reworded"),
])
def test_grade_prints_the_certificate_and_refuses_a_hand_edited_aligned_rubric(learnable, tmp_path, edit, field) -> None:
    fake, _, data, _ = learnable
    out = tmp_path / "aligned.yaml"
    assert align(fake, data, out)[0] == 0
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(line for line in data.read_text().splitlines(keepends=True)[:3]), encoding="utf-8")
    args = [str(rows), "-r", str(out), "--base-url", fake.base_url, "--api-key", "k", "--model", "fake-judge", "--no-cache"]
    ok = runner.invoke(app, ["grade", *args, "-o", str(tmp_path / "graded.jsonl")])
    assert ok.exit_code == 0, ok.output
    assert "aligned rubric certified on" in ok.stderr and "difference +" in ok.stderr

    spec = yaml.safe_load(out.read_text(encoding="utf-8"))
    template = out.with_suffix(".j2").read_text(encoding="utf-8")
    template = edit(spec, template)
    out.write_text(yaml.safe_dump(spec, sort_keys=False, allow_unicode=True), encoding="utf-8")
    out.with_suffix(".j2").write_text(template, encoding="utf-8")
    refused = runner.invoke(app, ["grade", *args, "-o", str(tmp_path / "again.jsonl")])
    assert refused.exit_code == 2, refused.output
    assert f"{field} changed after alignment" in refused.stderr and "run gradekit align again" in refused.stderr
    assert not (tmp_path / "again.jsonl").exists()


def test_align_as_a_real_subprocess_with_its_progress_lines(learnable, tmp_path) -> None:
    fake, _, data, _ = learnable
    out = tmp_path / "aligned.yaml"
    done = subprocess.run([sys.executable, "-m", "gradekit", "align", str(data), "-r", RUBRIC, "-o", str(out), "--base-url",
                           fake.base_url, "--api-key", "k", "--model", "fake-judge", "--optimiser-model", "fake-optimiser",
                           "--no-cache", "--progress-every", "0.01"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "round 1:" in done.stderr and "align: original on train and dev:" in done.stderr
    assert "written: on " in done.stdout and "difference" in done.stdout and out.exists()


def test_the_vectorized_kappa_interval_is_scikit_learns_kappa_resampled() -> None:
    import numpy as np
    from scipy.stats import bootstrap
    from sklearn.metrics import cohen_kappa_score

    from gradekit.graders.calibration._agreement import kappa_interval

    rng = np.random.default_rng(0)
    a = rng.integers(0, 3, 120)
    b = np.where(rng.random(120) < 0.7, a, rng.integers(0, 3, 120))
    fast = kappa_interval(a, b, 3, resamples=300, confidence=0.9, seed=5)
    slow = bootstrap((a, b), lambda x, y: cohen_kappa_score(x, y), n_resamples=300, vectorized=False, paired=True,
                     confidence_level=0.9, method="percentile", rng=5).confidence_interval
    assert fast is not None and fast.low == pytest.approx(slow.low) and fast.high == pytest.approx(slow.high)


def test_the_budget_stops_an_alignment_before_anything_is_written_and_the_same_command_resumes_from_the_cache(learnable, tmp_path) -> None:
    fake, _, data, _ = learnable
    prices = tmp_path / "prices.yaml"
    prices.write_text("fake-judge: {input: 1000, output: 1000}\nfake-optimiser: {input: 1000, output: 1000}\n", encoding="utf-8")
    out = tmp_path / "aligned.yaml"
    code, _, text = align(fake, data, out, "--prices", str(prices), "--max-cost", "5")
    assert code == 3, text
    assert "budget" in text and "nothing written" in text and "--max-cost" in text and not out.exists()
    sent = len(fake.chat_requests())
    assert sent > 0
    code, report, text = align(fake, data, out, "--prices", str(prices), "--max-cost", "10000")
    assert code == 0, text
    assert out.exists() and report["requests"] == len(fake.chat_requests()) - sent
    first = report["rounds"][0]
    assert first["cost_usd"] is not None and first["cost_usd"] > 0 and report["cost_usd"] > 0
    cold = tmp_path / "cold"  # the same alignment with an empty cache: what the resumed run did not send again
    cold.mkdir()
    code, again, _ = align(fake, data, cold / "aligned.yaml", "--prices", str(prices), "--max-cost", "10000")
    assert code == 0 and again["requests"] == report["requests"] + sent  # every judgement of the stopped run came from the cache
    assert again["certificate"] == report["certificate"]


def test_a_broken_judge_stops_the_alignment_with_exit_3_and_writes_nothing(tmp_path: Path) -> None:
    from gradekit.judge.testing import Reply

    data, _, _ = labelled_set(tmp_path / "labelled.jsonl", n=40)
    with FakeProvider(responder=lambda body: Reply(status=401, error_message="Incorrect API key provided")) as fake:
        code, _, text = align(fake, data, tmp_path / "aligned.yaml")
        sent = len(fake.chat_requests())
    assert code == 3, text
    assert "looks broken" in text and "nothing written" in text and not (tmp_path / "aligned.yaml").exists()
    assert sent < 40  # stopped early, not after asking every row


def test_serve_prints_an_aligned_rubrics_certificate_and_refuses_it_once_edited(learnable, tmp_path) -> None:
    import os

    fake, _, data, _ = learnable
    out = tmp_path / "aligned.yaml"
    assert align(fake, data, out)[0] == 0
    (tmp_path / "grader.yaml").write_text("type: llm\nrubric: aligned.yaml\njudge: {model: fake-judge}\n", encoding="utf-8")
    (tmp_path / "config.yaml").write_text("reward:\n  grader: grader.yaml\nlogging:\n  enable: false\n", encoding="utf-8")
    env = {**os.environ, "OPENAI_BASE_URL": fake.base_url, "OPENAI_API_KEY": "k"}
    proc, _ = serve_in(tmp_path, OPENAI_BASE_URL=fake.base_url, OPENAI_API_KEY="k")  # serving: the certificate held at start-up
    proc.terminate()
    _, err = proc.communicate(timeout=30)
    assert "aligned rubric certified on" in err and "for judge fake-judge" in err

    spec = yaml.safe_load(out.read_text(encoding="utf-8"))
    spec["label_definitions"]["correct"] = "anything that mentions the reference"
    out.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    refused = subprocess.run([sys.executable, "-m", "gradekit", "serve", "--config", "config.yaml", "--port", "0"], cwd=tmp_path,
                             capture_output=True, text=True, env=env, timeout=120)
    assert refused.returncode == 2 and "label_definitions changed after alignment" in refused.stderr


@pytest.mark.parametrize("template, expected", [
    pytest.param("{% block system %}Be fair.{% endblock %}{% block user %}{{ x }}{% endblock %}",
                 "{% block system %}Be fair.\nSECTION\n{% endblock %}{% block user %}{{ x }}{% endblock %}", id="end_of_system"),
    pytest.param("{% block user %}{{ x }}{% endblock %}",
                 "{% block system %}\nSECTION\n{% endblock %}\n{% block user %}{{ x }}{% endblock %}", id="no_system_block"),
    pytest.param("{%- block system -%}A{% block inner %}B{% endblock %}C{%- endblock -%}{% block user %}u{% endblock %}",
                 "{%- block system -%}A{% block inner %}B{% endblock %}C\nSECTION\n{%- endblock -%}{% block user %}u{% endblock %}",
                 id="nested_block_and_whitespace_control"),
])
def test_the_section_is_spliced_at_the_end_of_the_system_block(template: str, expected: str) -> None:
    from gradekit.judge._aligned import spliced

    assert spliced(template, "\nSECTION\n") == expected


def test_an_aligned_rubric_renders_its_guidelines_definitions_and_examples_and_zh_gets_its_own_wording() -> None:
    from gradekit.judge._aligned import Example, section_template, spliced
    from gradekit.judge._rubric import template_source

    for name, heading in (("semantic_equivalence_en", "Guidelines, learnt"), ("semantic_equivalence_zh", "准则")):
        rubric = load_rubric(name)
        row = {"question": "q?", "references": ["a"], "prediction": "a"}
        aligned = rubric.model_copy(update={"guidelines": ["<b>{{ 7*7 }}</b>"], "label_definitions": {next(iter(rubric.labels)): "means yes"},
                                            "examples": [Example(row=row, label=next(iter(rubric.labels)))],
                                            "inline_template": spliced(template_source(rubric), section_template(rubric.language))})
        messages = aligned.render(row)
        assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
        assert heading in messages[0]["content"] and "{{ 7*7 }}" in messages[0]["content"]  # data, never template source
        assert "means yes" in messages[0]["content"]
        plain = rubric.model_copy(update={"inline_template": spliced(template_source(rubric), section_template(rubric.language))})
        assert plain.render(row) == rubric.render(row)  # nothing to show: the spliced template renders as the original
