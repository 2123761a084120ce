"""Issue 35, files that are not what they claim: a cascade file edited after its fit, one-order pairwise
calibration, plain labels tables that label a key twice, CSV labels read as text by every command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gradekit.graders.cli import app

RUBRIC = "semantic_equivalence_en"


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _run(*args: str):
    return CliRunner().invoke(app, [*args, "--api-key", "k", "--no-cache"])


@pytest.fixture
def fitted(fake, tmp_path) -> tuple[Path, Path, dict]:
    """A cascade fitted on 40 rows the fake's default reply (the first label, correct) always agrees with."""
    rows = _write(tmp_path / "labelled.jsonl", [{"question": f"q{i}?", "references": ["x"], "prediction": "x", "label": "correct"}
                                                for i in range(40)])
    done = _run("cascade", "fit", str(rows), "-r", RUBRIC, "--model", "m", "--samples", "3", "--base-url", fake.base_url,
                "-o", str(tmp_path / "cascade.json"))
    assert done.exit_code == 0, done.output
    return tmp_path / "cascade.json", rows, json.loads((tmp_path / "cascade.json").read_text())


def _edited(tmp_path: Path, spec: dict, name: str, edit) -> Path:
    changed = json.loads(json.dumps(spec))
    edit(changed)
    (tmp_path / f"{name}.json").write_text(json.dumps(changed).replace('"__nan__"', "NaN"))
    return tmp_path / f"{name}.json"


@pytest.mark.parametrize("name, edit, named", [
    pytest.param("target", lambda s: s.update(target=0.99), "target", id="target_raised_without_a_refit"),
    pytest.param("samples", lambda s: s.update(samples=1), "samples", id="samples_3_to_1"),
    pytest.param("threshold", lambda s: s["judges"][0].update(threshold=0.5), "judges[0].threshold", id="threshold_lowered"),
    pytest.param("model", lambda s: s["judges"][0].update(model="other"), "judges[0].model", id="another_judge"),
    pytest.param("copy", lambda s: s.update(thresholds=[0.5]), "thresholds", id="the_top_level_copy_edited"),
    pytest.param("zero", lambda s: s["judges"][0].update(threshold=0), "judges.0.threshold", id="threshold_0"),
    pytest.param("nan", lambda s: s["judges"][0].update(threshold="__nan__"), "judges.0.threshold", id="threshold_nan"),
    pytest.param("big", lambda s: s["judges"][0].update(threshold=1.5), "judges.0.threshold", id="threshold_1_5"),
    pytest.param("delta", lambda s: s.update(delta=0), "delta", id="delta_0"),
    pytest.param("empty", lambda s: s.update(judges=[], thresholds=[]), "judges", id="no_judges"),
])
def test_a_cascade_file_edited_after_its_fit_is_exit_2_naming_the_field(fake, fitted, tmp_path, name, edit, named) -> None:
    path, rows, spec = fitted
    sent = len(fake.chat_requests())
    bad = _edited(tmp_path, spec, name, edit)
    done = _run("grade", str(rows), "-r", RUBRIC, "--cascade", str(bad), "--base-url", fake.base_url, "-o", str(tmp_path / f"{name}.jsonl"))
    assert done.exit_code == 2, done.output
    assert named in done.output and "Traceback" not in done.output
    assert len(fake.chat_requests()) == sent and not (tmp_path / f"{name}.jsonl").exists()


def test_the_fitted_cascade_file_itself_grades(fake, fitted, tmp_path) -> None:
    path, rows, spec = fitted
    assert spec["digest"]["target"] and spec["digest"]["judges[0].threshold"]  # what the fit measured, field by field
    done = _run("grade", str(rows), "-r", RUBRIC, "--cascade", str(path), "--base-url", fake.base_url, "-o", str(tmp_path / "o.jsonl"))
    assert done.exit_code == 0, done.output
    assert {json.loads(line)["status"] for line in (tmp_path / "o.jsonl").read_text().splitlines()} == {"ok"}


def test_calibrate_on_a_one_order_pairwise_file_reports_that_orders_accuracy_and_no_agr(fake, tmp_path) -> None:
    from gradekit.judge.testing import Reply

    # The judge always prefers the first output shown; 7 of 10 pairs have output 1 better: one-order accuracy 70%.
    fake.set_responder(lambda body: Reply(content="Output (a)"))
    pairs = _write(tmp_path / "pairs.jsonl", [{"id": i, "instruction": f"task {i}", "output_1": "A", "output_2": "B",
                                               "label": 1 if i < 7 else 2} for i in range(10)])
    graded = tmp_path / "graded.jsonl"
    done = _run("grade", str(pairs), "-r", "llmbar_pairwise", "--no-swap", "--base-url", fake.base_url, "-o", str(graded))
    assert done.exit_code == 0, done.output
    assert len(fake.chat_requests()) == 10
    report = CliRunner().invoke(app, ["calibrate", str(graded), "--human-column", "label", "--json", "--bootstrap", "0"])
    assert report.exit_code == 0, report.output
    pairwise = json.loads(report.stdout)["pairwise"]
    assert (pairwise["acc"], pairwise["agr"]) == (pytest.approx(0.7), None)  # was Acc 35%, Agr 0% from the order never asked
    assert pairwise["orders"] == 1 and pairwise["acc_ab"] == pytest.approx(0.7)
    assert pairwise["acc_ba"] is None and pairwise["acc_ba"] is None and pairwise["position_bias_p"] is None
    text = CliRunner().invoke(app, ["calibrate", str(graded), "--human-column", "label", "--bootstrap", "0"])
    assert text.exit_code == 0 and "Acc 70.0%" in text.output and "one order" in text.output and "Agr" not in text.output.replace("no Agr", "")


def _graded_yes_no(tmp_path: Path) -> Path:
    return _write(tmp_path / "graded.jsonl", [{"id": i, "label": "yes" if i % 2 else "no", "score": 1.0 if i % 2 else 0.0,
                                               "status": "ok"} for i in range(6)])


@pytest.mark.parametrize("kind", ["jsonl", "csv"])
def test_calibrate_with_a_plain_labels_table_labelling_a_key_twice_differently_is_exit_2_naming_the_key(tmp_path, kind) -> None:
    graded = _graded_yes_no(tmp_path)
    rows = [{"id": i, "label": "yes" if i % 2 else "no"} for i in range(6)] + [{"id": 3, "label": "no"}]
    labels = tmp_path / f"labels.{kind}"
    if kind == "jsonl":
        _write(labels, rows)
    else:
        labels.write_text("id,label\n" + "".join(f"{r['id']},{r['label']}\n" for r in rows), encoding="utf-8")
    done = CliRunner().invoke(app, ["calibrate", str(graded), "--labels", str(labels), "--on", "id", "--bootstrap", "0"])
    assert done.exit_code == 2, done.output
    assert "id='3'" in done.output and "twice" in done.output
    # The same label twice is one label; the viewer's store (labeller, time) keeps its last-line-wins rule.
    _write(labels.with_suffix(".same.jsonl"), rows[:6] + [{"id": 3, "label": "yes"}])
    same = CliRunner().invoke(app, ["calibrate", str(graded), "--labels", str(labels.with_suffix(".same.jsonl")), "--on", "id",
                                    "--bootstrap", "0", "--json"])
    assert same.exit_code == 0 and json.loads(same.stdout)["classification"]["accuracy"] == 1.0
    store = _write(tmp_path / "store.jsonl", [{**r, "labeller": "ann", "time": "2026-12-02T00:00:00Z"} for r in rows]
                   + [{"id": 3, "label": "yes", "labeller": "ann", "time": "2026-12-02T00:01:00Z"}])
    relabelled = CliRunner().invoke(app, ["calibrate", str(graded), "--labels", str(store), "--on", "id", "--bootstrap", "0", "--json"])
    assert relabelled.exit_code == 0 and json.loads(relabelled.stdout)["classification"]["accuracy"] == 1.0


def test_view_and_report_read_csv_yes_no_labels_as_text_like_calibrate(tmp_path) -> None:
    from gradekit.graders.view import Labels, ResultsFile
    from gradekit.graders.view import summarise

    graded = _graded_yes_no(tmp_path)
    labels = tmp_path / "labels.csv"
    labels.write_text("id,label\n" + "".join(f"{i},{'yes' if i % 2 else 'no'}\n" for i in range(6)), encoding="utf-8")
    results = ResultsFile(graded, labels=Labels(path=labels, on="id"), background=False)
    try:
        agreement = summarise(results)["agreement"]
    finally:
        results.close()
    assert (agreement["accuracy"], agreement["judged"]) == (1.0, 6)  # was 0.0: the labels came back as 'true'/'false'
    assert agreement["confusion"]["labels"] == ["no", "yes"]
    calibrated = CliRunner().invoke(app, ["calibrate", str(graded), "--labels", str(labels), "--on", "id", "--bootstrap", "0", "--json"])
    assert json.loads(calibrated.stdout)["classification"]["accuracy"] == 1.0
    page = CliRunner().invoke(app, ["report", str(graded), "--labels", str(labels), "--on", "id", "-o", str(tmp_path / "r.html")])
    assert page.exit_code == 0, page.output


@pytest.mark.parametrize("kind", ["jsonl", "csv"])
def test_view_with_a_labels_file_holding_a_key_twice_exits_2_instead_of_serving_errors(tmp_path, kind) -> None:
    import subprocess
    import sys

    graded = _graded_yes_no(tmp_path)
    labels = tmp_path / f"labels.{kind}"
    labels.write_text("id,label\n1,yes\n1,no\n" if kind == "csv" else '{"id": 1, "label": "yes"}\n{"id": 1, "label": "no"}\n',
                      encoding="utf-8")
    try:
        done = subprocess.run([sys.executable, "-m", "gradekit", "view", str(graded), "--labels", str(labels), "--on", "id",
                               "--port", "0", "--no-browser"], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the viewer kept serving a labels file with a key twice")
    assert done.returncode == 2, done.stderr
    assert "id='1'" in done.stderr and "twice" in done.stderr


def test_view_annotate_without_label_values_or_rubric_offers_the_graded_files_own_labels_and_blind_still_hides(tmp_path) -> None:
    pytest.importorskip("duckdb")
    from .test_labels import JUDGE_COLUMNS, call
    from ..view.test_view import start_view, stop_view

    graded = _write(tmp_path / "graded.jsonl", [{"id": f"q{i}", "question": f"q{i}?", "label": "correct" if i % 3 else "incorrect",
                                                 "score": 1.0 if i % 3 else 0.0, "rationale": "r", "status": "ok"} for i in range(6)]
                    + [{"id": "q6", "question": "q6?", "label": None, "score": None, "status": "error", "error": "e"}])
    store = tmp_path / "labels.jsonl"
    proc, url = start_view(str(graded), "--annotate", "--blind", "--labels", str(store), "--on", "id")
    try:
        status, labels = call(url + "/api/labels")
        assert status == 200 and labels["values"] == ["correct", "incorrect"]
        for row in call(url + "/api/rows?limit=10")[1]["rows"]:
            assert not set(JUDGE_COLUMNS) & set(row), row  # each row's verdict stays hidden until it is labelled
        status, answer = call(f"{url}/api/rows/0/label", {"label": "incorrect"})
        assert status == 200, answer
    finally:
        stop_view(proc)
    # A file with no judge label column (and an empty store) still needs --label-values: exit 2 saying so.
    plain = _write(tmp_path / "plain.jsonl", [{"id": f"q{i}", "question": f"q{i}?"} for i in range(3)])
    done = CliRunner().invoke(app, ["view", str(plain), "--annotate", "--labels", str(tmp_path / "l2.jsonl"), "--on", "id",
                                    "--no-browser"])
    assert done.exit_code == 2 and "--label-values" in done.output
