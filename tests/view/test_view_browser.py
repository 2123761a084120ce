"""The results browser and the report in a real headless Chromium (Debian's package, driven by Playwright).

Skipped where chromium or Playwright is missing on a developer's machine; in CI (CI set) their
absence fails, since `.ci/run` installs both. `GRADEKIT_SCREENSHOT=1` also saves the page to
docs/view.png (the README's picture).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gradekit.graders.cli import app

from ..conftest import need
from .test_view import UNREADABLE, files, read, start_view, stop_view  # noqa: F401  (files: the graded-file fixture)

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--no-first-run", "--disable-sync"]
INSTALL = "apt-get install chromium; pip install playwright"
TIMEOUT_MS = 60_000  # generous: a shared CI machine; nothing here asserts a duration


def _missing(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; CI must install it ({INSTALL})")
    pytest.skip(f"{reason}: {INSTALL}")


@pytest.fixture(scope="module")
def browser(files: dict[str, Path]) -> Iterator[Any]:  # noqa: F811  (graded first: Playwright's loop then owns this thread)
    need("duckdb", "pip install 'gradekit[view]'")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("Playwright for Python is not installed")
    if not (Path(CHROMIUM).exists() or shutil.which("chromium")):
        _missing("chromium is not installed")
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium"), args=ARGS,
                                     timeout=TIMEOUT_MS)  # start-up on a loaded machine: 30 s by default
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.set_default_timeout(TIMEOUT_MS)
    tab = context.new_page()
    problems: list[str] = []
    tab.on("pageerror", lambda e: problems.append(str(e)))
    yield tab
    context.close()
    assert not problems, problems  # a script error on the page fails the test


@pytest.fixture(scope="module")
def view(files: dict[str, Path]) -> Iterator[str]:  # noqa: F811
    # Started in the files' folder with their names, as a user runs it: the page (and docs/view.png) shows "out.jsonl",
    # not the test's temporary folder.
    folder = files["jsonl"].parent
    proc, url = start_view(files["jsonl"].name, "--labels", files["labels"].name, "--on", "id", "--rubric", "semantic_equivalence_en",
                           cwd=folder)
    yield url
    stop_view(proc)


def test_table_shows_the_first_rows_and_the_total(page: Any, view: str, files: dict[str, Path]) -> None:  # noqa: F811
    rows = read(files["jsonl"])
    page.goto(view)
    page.wait_for_function("document.querySelectorAll('#rows-table tbody tr').length === 50")
    assert page.inner_text("#total") == str(len(rows))
    first = page.locator("#rows-table tbody tr").first
    assert first.get_attribute("data-index") == "0" and rows[0]["id"] in first.inner_text()
    page.wait_for_selector("#summary-rows")
    assert page.inner_text("#summary-rows") == str(len(rows))
    page.wait_for_selector("#accuracy")  # --labels: the agreement card
    # Issue 48: the README's picture showed a temporary path; it shows the file as the user named it.
    assert page.inner_text("#file") == "out.jsonl"
    if os.environ.get("GRADEKIT_SCREENSHOT"):
        page.screenshot(path=str(ROOT / "docs" / "view.png"))


def test_status_filter_shows_exactly_the_error_rows(page: Any, view: str, files: dict[str, Path]) -> None:  # noqa: F811
    rows = read(files["jsonl"])
    errors = [str(i) for i, r in enumerate(rows) if r["status"] == "error"]
    page.goto(view)
    page.wait_for_selector("#filter-status option[value=error]", state="attached")
    page.select_option("#filter-status", "error")
    page.wait_for_function(f"document.getElementById('total').textContent === '{len(errors)}'")
    page.wait_for_function(f"document.querySelectorAll('#rows-table tbody tr').length === {len(errors)}")
    shown = page.locator("#rows-table tbody tr")
    assert [shown.nth(i).get_attribute("data-index") for i in range(shown.count())] == errors
    assert all("error" in shown.nth(i).inner_text() for i in range(shown.count()))


def test_clicking_a_row_opens_its_raw_reply_and_prompt(page: Any, view: str, files: dict[str, Path]) -> None:  # noqa: F811
    rows = read(files["jsonl"])
    failed = next(i for i, r in enumerate(rows) if r["status"] == "error")
    page.goto(f"{view}")
    page.wait_for_selector("#filter-q")
    page.fill("#filter-q", rows[failed]["id"])
    page.wait_for_function("document.getElementById('total').textContent === '1'")
    page.click(f"#rows-table tbody tr[data-index='{failed}']")
    page.wait_for_selector("#row-view:not([hidden]) #raw-reply")
    assert page.inner_text("#raw-reply") == UNREADABLE
    assert rows[failed]["prediction"] in page.inner_text("#inputs")
    page.wait_for_function("document.querySelector('#prompt .message') !== null")  # rendered again from --rubric
    assert rows[failed]["prediction"] in page.inner_text("#prompt")
    if os.environ.get("GRADEKIT_SCREENSHOT"):
        page.screenshot(path=str(ROOT / "docs" / "view-row.png"))


def test_disagreement_list_opens_the_row(page: Any, view: str, files: dict[str, Path]) -> None:  # noqa: F811
    page.goto(view)
    link = page.locator("#disagreements a").first
    link.wait_for()
    index = link.get_attribute("data-index")
    link.click()
    page.wait_for_function(f"document.getElementById('row-title').textContent === 'row {index}'")
    assert "human_label" in page.inner_text("#verdict")


def test_disagreements_are_named_by_the_on_key(page: Any, view: str, files: dict[str, Path]) -> None:  # noqa: F811
    rows = read(files["jsonl"])
    page.goto(view)
    link = page.locator("#disagreements a").first
    link.wait_for()
    index = int(link.get_attribute("data-index"))
    assert link.inner_text() == f"id={rows[index]['id']}"  # the view was started with --on id


def test_a_row_has_its_own_url_that_survives_a_reload(page: Any, view: str) -> None:
    page.goto(f"{view}/#/rows/17")  # a bookmark
    page.wait_for_function("document.getElementById('row-title').textContent === 'row 17'")
    assert page.is_visible("#row-view")
    page.click("#close")
    page.wait_for_function("document.getElementById('row-view').hidden")
    assert "#/rows/" not in page.url
    page.wait_for_selector("#rows-table tbody tr[data-index='3']")
    page.click("#rows-table tbody tr[data-index='3']")
    page.wait_for_function("document.getElementById('row-title').textContent === 'row 3'")
    assert page.url.endswith("#/rows/3")
    page.reload()
    page.wait_for_function("document.getElementById('row-title').textContent === 'row 3'")
    assert page.is_visible("#row-view")
    page.go_back()  # back from a row to the table (the close above was a history entry too)
    page.wait_for_function("!location.hash.startsWith('#/rows/3')")


def test_report_opens_with_no_network_and_shows_its_rows(page: Any, files: dict[str, Path], tmp_path: Path) -> None:  # noqa: F811
    out = tmp_path / "report.html"
    result = CliRunner().invoke(app, ["report", str(files["jsonl"]), "-o", str(out), "--labels", str(files["labels"]), "--on", "id"])
    assert result.exit_code == 0, result.output
    requested: list[str] = []

    def only_the_file(route: Any) -> None:
        requested.append(route.request.url)
        if route.request.url.startswith("file://"):
            route.continue_()
        else:
            route.abort()

    page.route("**/*", only_the_file)
    page.goto(out.as_uri())
    page.wait_for_function("document.querySelectorAll('#rows-table tbody tr').length === 50")
    page.wait_for_selector("#sort option", state="attached")
    assert page.locator("#sort option").first.inner_text() == "worst first"  # the report's order, not the file's
    rows = read(files["jsonl"])
    assert page.inner_text("#total") == str(len(rows))
    errors = sum(r["status"] == "error" for r in rows)
    first = page.locator("#rows-table tbody tr").first
    assert "error" in first.inner_text()  # the worst first
    page.select_option("#filter-status", "error")
    page.wait_for_function(f"document.getElementById('total').textContent === '{errors}'")
    page.locator("#rows-table tbody tr").first.click()
    page.wait_for_selector("#row-view:not([hidden]) #raw-reply")
    assert page.inner_text("#raw-reply") == UNREADABLE
    assert requested == [out.as_uri()]  # the file itself, and nothing else


def test_label_five_rows_by_keyboard_in_blind_mode_and_reload(page: Any, files: dict[str, Path], tmp_path: Path) -> None:  # noqa: F811
    from gradekit.graders.calibration import read_labels

    store = tmp_path / "labels.jsonl"
    total = len(read(files["jsonl"]))
    proc, url = start_view(str(files["jsonl"]), "--annotate", "--blind", "--labels", str(store), "--on", "id",
                           "--rubric", "semantic_equivalence_en")
    try:
        page.goto(url)
        first = None
        for n, key in enumerate(["1", "2", "1", "2", "1", "u", "2"], start=1):
            # The drawn row is open, its verdict hidden, before a key labels it.
            page.wait_for_selector("#row-view:not([hidden]) #blind-note")
            page.wait_for_function("document.getElementById('label-status').textContent === 'not labelled yet'")
            assert page.locator("#verdict dt", has_text="score").count() == 0 and page.locator("#rationale").count() == 0
            title = page.inner_text("#row-title")
            first = first or title.split()[-1]
            page.keyboard.press(key)
            labelled = min(n, 5) if key != "u" else 4
            page.wait_for_function(f"document.getElementById('label-progress').textContent === '{labelled} / {total}'")
            if key == "u":  # the undone row opens again, unlabelled
                page.wait_for_function("document.getElementById('label-status').textContent === 'not labelled yet'")
            else:
                page.wait_for_function(f"document.getElementById('row-title').textContent !== {title!r}")
        page.reload()
        page.wait_for_function(f"document.getElementById('label-progress').textContent === '5 / {total}'")
        page.goto(f"{url}/#/rows/{first}")
        page.wait_for_function("document.getElementById('label-status').textContent === 'labelled: correct'")
        page.wait_for_selector("#verdict dt:text-is('score')")  # labelled: the judge's verdict shows now
    finally:
        page.goto("about:blank")  # the page's own requests end before its server does
        stop_view(proc)
    state = read_labels(store, "id")
    assert len(state.records) == 5 and len(store.read_text(encoding="utf-8").splitlines()) == 7  # 6 labels and an undo


def test_an_eval_run_report_shows_result_counts_and_each_criterion(page: Any, tmp_path: Path) -> None:
    criteria = [{"type": "string_check", "name": "exact", "input": "{{ sample.output_text }}", "reference": "{{ item.answer }}", "operation": "eq"},
                {"type": "string_check", "name": "city", "input": "{{ item.city }}", "reference": "Paris", "operation": "eq"}]
    definition, source, output, out = tmp_path / "eval.json", tmp_path / "items.jsonl", tmp_path / "out.jsonl", tmp_path / "report.html"
    definition.write_text(json.dumps({"name": "v", "data_source_config": {"type": "custom", "item_schema": {}}, "testing_criteria": criteria}))
    rows = [{"item": {"answer": "Paris", "city": "Paris"}, "sample": {"output_text": a}} for a in ("Paris", "Rome", "Paris")]
    rows.append({"item": {"answer": "Paris"}, "sample": {"output_text": "Paris"}})  # no item.city: an errored row
    source.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    # Subprocesses: Playwright's event loop owns this thread, and grading runs its own.
    graded = subprocess.run([sys.executable, "-m", "gradekit", "grade", str(source), "--grader", str(definition), "-o", str(output),
                             "--no-cache"], capture_output=True, text=True, timeout=300)
    assert graded.returncode == 1, graded.stderr  # 1: the errored row
    made = subprocess.run([sys.executable, "-m", "gradekit", "report", str(output), "-o", str(out)], capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    page.goto(out.as_uri())
    page.wait_for_selector("#eval-run:not([hidden]) #eval-result-counts")
    assert page.inner_text("#eval-result-counts") == "total 4, passed 2, failed 1, errored 1"
    cells = page.locator("#eval-criteria tbody tr").all_inner_texts()
    assert [c.split("\t")[0].split("-")[0] for c in cells] == ["exact", "city"]
    assert [c.split("\t")[1:3] for c in cells] == [["3", "1"], ["3", "0"]]
