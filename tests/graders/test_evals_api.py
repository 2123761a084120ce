"""Evals-API definitions as graders: an eval's testing criteria over run data in the {"item", "sample"} shape."""

from __future__ import annotations

import base64
import json
import re

from typer.testing import CliRunner

from gradekit.graders.cli import app
from gradekit.judge.testing import FakeProvider, Reply

runner = CliRunner()

PYTHON = "def grade(sample, item):\n    return 1.0 if str(item['n']) in sample['output_text'] or item['n'] % 2 == 0 else 0.2\n"

EVAL = {
    "name": "capitals",
    "data_source_config": {"type": "custom", "include_sample_schema": True,
                           "item_schema": {"type": "object", "properties": {"question": {"type": "string"}, "answer": {"type": "string"},
                                                                            "n": {"type": "integer"}}}},
    "testing_criteria": [
        {"type": "string_check", "name": "exact", "input": "{{ sample.output_text }}", "reference": "{{ item.answer }}", "operation": "eq"},
        {"type": "text_similarity", "name": "close", "input": "{{ sample.output_text }}", "reference": "{{ item.answer }}",
         "evaluation_metric": "fuzzy_match", "pass_threshold": 0.8},
        {"type": "python", "name": "code", "source": PYTHON, "pass_threshold": 0.5},
        {"type": "label_model", "name": "judge", "model": "gpt-4o-mini", "labels": ["good", "bad"], "passing_labels": ["good"],
         "input": [{"role": "system", "content": "Label the answer good or bad."},
                   {"role": "user", "content": [{"type": "input_text", "text": "Question {{ item.n }}: {{ item.question }}"},
                                                {"type": "input_image", "image_url": "{{ item.image }}", "detail": "low"},
                                                {"type": "input_text", "text": "Answer: {{ sample.output_text }}"}]}]},
    ],
}

ANSWERS = ["Paris", "Berlin", "Madrid", "Rome", "Lisbon"]


def outputs(n: int) -> str:
    answer = ANSWERS[n % 5]
    return [answer, answer.lower(), answer[:-1], f"no idea {n}"][n % 4]


PNG = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000")  # a PNG's first bytes: enough to be sent


def image(n: int) -> str:
    """Even rows name a local file beside the input, odd rows carry a data: URI."""
    return f"img/{n % 3}.png" if n % 2 == 0 else "data:image/png;base64," + base64.b64encode(PNG + bytes([n])).decode()


def image_sent(n: int) -> str:
    return "data:image/png;base64," + base64.b64encode(PNG + bytes([n % 3]) if n % 2 == 0 else PNG + bytes([n])).decode()


def items() -> list[dict]:
    return [{"item": {"question": f"capital number {n}?", "answer": ANSWERS[n % 5], "n": n, "image": image(n)},
             "sample": {"output_text": outputs(n)}} for n in range(40)]


def write_images(folder) -> None:
    (folder / "img").mkdir(exist_ok=True)
    for k in range(3):
        (folder / "img" / f"{k}.png").write_bytes(PNG + bytes([k]))


def indel_ratio(a: str, b: str) -> float:
    """rapidfuzz's fuzz.ratio / 100, written out here: 1 - indel distance / (len a + len b)."""
    if not a and not b:
        return 1.0
    table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i, x in enumerate(a):
        for j, y in enumerate(b):
            table[i + 1][j + 1] = table[i][j] + 1 if x == y else max(table[i][j + 1], table[i + 1][j])
    return 2 * table[-1][-1] / (len(a) + len(b))


def judge_says(n: int) -> str:
    return "bad" if n % 3 == 0 else "good"


def user_text(body: dict) -> str:
    content = body["messages"][-1]["content"]
    return content if isinstance(content, str) else "".join(p.get("text", "") for p in content)


def rating(n: int) -> int:
    return 1 + (n * 5) % 7


def responder(body: dict) -> Reply:
    """The label_model's label, or (asked for a "result") the score_model's rating."""
    n = int(re.search(r"Question (\d+):", user_text(body)).group(1))
    if "result" in body["response_format"]["json_schema"]["schema"]["properties"]:
        return Reply(content=json.dumps({"steps": [{"description": "d", "conclusion": "c"}], "result": rating(n)}))
    return Reply(content=json.dumps({"label": judge_says(n)}))


def expected() -> tuple[dict, dict]:
    per = {"exact": [0, 0], "close": [0, 0], "code": [0, 0], "judge": [0, 0], "rating": [0, 0]}
    total = passed = 0
    for row in items():
        item, text = row["item"], row["sample"]["output_text"]
        n = item["n"]
        verdicts = {"exact": text == item["answer"], "close": indel_ratio(text, item["answer"]) >= 0.8,
                    "code": (1.0 if str(n) in text or n % 2 == 0 else 0.2) >= 0.5, "judge": judge_says(n) == "good",
                    "rating": rating(n) >= 3}
        for name, ok in verdicts.items():
            per[name][0 if ok else 1] += 1
        total += 1
        passed += all(verdicts.values())
    return ({"total": total, "passed": passed, "failed": total - passed, "errored": 0},
            {name: {"passed": p, "failed": f} for name, (p, f) in per.items()})


def test_eval_definition_runs_with_openai_run_figures(tmp_path) -> None:
    """The issue's done-when: string_check, text_similarity (fuzzy_match, 0.8), python (pass_threshold), label_model
    with an input_image part, and a score_model with one too, over 40 {"item", "sample"} rows."""
    definition, data, out = tmp_path / "eval.json", tmp_path / "items.jsonl", tmp_path / "out.jsonl"
    definition.write_text(json.dumps({**EVAL, "testing_criteria": [*EVAL["testing_criteria"], {**SCORE, "pass_threshold": 3}]}))
    data.write_text("".join(json.dumps(row) + "\n" for row in items()))
    write_images(tmp_path)
    with FakeProvider(responder=responder) as fake:
        result = runner.invoke(app, ["grade", str(data), "--grader", str(definition), "-o", str(out), "--base-url", fake.base_url,
                                     "--api-key", "k", "--no-cache", "--json"])
        requests = fake.chat_requests()
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    counts, per = expected()
    assert 0 < counts["passed"] < counts["total"]
    assert summary["result_counts"] == counts
    got = summary["per_testing_criteria_results"]
    assert [r["testing_criteria"].rsplit("-", 5)[0] for r in got] == ["exact", "close", "code", "judge", "rating"]
    assert all(re.fullmatch(r".+-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", r["testing_criteria"]) for r in got)
    assert {r["testing_criteria"].split("-")[0]: {"passed": r["passed"], "failed": r["failed"]} for r in got} == per
    assert len(requests) == 80
    labels = [r for r in requests if "label" in r.body["response_format"]["json_schema"]["schema"]["properties"]]
    assert len(labels) == 40 and sorted(int(re.search(r"Question (\d+):", user_text(r.body)).group(1)) for r in labels) == list(range(40))
    for request in requests:  # every model criterion's request carries its row's image as a chat content part, after the text
        content = request.body["messages"][-1]["content"]
        n = int(re.search(r"Question (\d+):", user_text(request.body)).group(1))
        assert content[0]["type"] == "text" and "[image 1]" in content[0]["text"]
        detail = {"detail": "low"} if request in labels else {}
        assert content[1:] == [{"type": "image_url", "image_url": {"url": image_sent(n), **detail}}]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 40 and all(set(r["parts"]) == {g["testing_criteria"] for g in got} for r in rows)
    assert [r["score"] for r in rows] == [float(r["metrics"]["passed"]) for r in rows]


def test_retrieved_eval_keeps_criterion_ids_and_ignores_extra_fields(tmp_path) -> None:
    retrieved = {"object": "eval", "id": "eval_1", "created_at": 1, "metadata": {}, "name": "capitals",
                 "data_source_config": {"type": "custom", "schema": {}},
                 "testing_criteria": [{**EVAL["testing_criteria"][0], "id": "exact-c4fdf789-2fa5-407f-8a41-a6f4f9afd482"}]}
    definition, data, out = tmp_path / "eval.json", tmp_path / "items.jsonl", tmp_path / "out.jsonl"
    definition.write_text(json.dumps(retrieved))
    data.write_text("".join(json.dumps(row) + "\n" for row in items()[:8]))
    result = runner.invoke(app, ["grade", str(data), "--grader", str(definition), "-o", str(out), "--json", "--no-cache"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["per_testing_criteria_results"] == [{"testing_criteria": "exact-c4fdf789-2fa5-407f-8a41-a6f4f9afd482", "passed": 2, "failed": 6}]
    assert summary["result_counts"] == {"total": 8, "passed": 2, "failed": 6, "errored": 0}


def test_an_errored_criterion_makes_an_error_row_never_a_fail(tmp_path) -> None:
    broken = {**EVAL, "testing_criteria": [EVAL["testing_criteria"][0],
                                           {"type": "string_check", "name": "missing", "input": "{{ item.nope }}", "reference": "x", "operation": "eq"}]}
    definition, data, out = tmp_path / "eval.json", tmp_path / "items.jsonl", tmp_path / "out.jsonl"
    definition.write_text(json.dumps(broken))
    data.write_text("".join(json.dumps(row) + "\n" for row in items()[:4]))
    result = runner.invoke(app, ["grade", str(data), "--grader", str(definition), "-o", str(out), "--json", "--no-cache"])
    summary = json.loads(result.stdout)
    assert result.exit_code == 1
    assert summary["result_counts"] == {"total": 4, "passed": 0, "failed": 0, "errored": 4}
    assert [(r["passed"], r["failed"]) for r in summary["per_testing_criteria_results"]] == [(1, 3), (0, 0)]


def test_sample_output_json_templating(tmp_path) -> None:
    check = {"name": "j", "data_source_config": {"type": "custom", "item_schema": {}},
             "testing_criteria": [{"type": "string_check", "name": "city", "input": "{{ sample.output_json.city }}",
                                   "reference": "{{ item.answer }}", "operation": "ilike"}]}
    definition, data, out = tmp_path / "eval.json", tmp_path / "items.jsonl", tmp_path / "out.jsonl"
    definition.write_text(json.dumps(check))
    rows = [{"item": {"answer": "paris"}, "sample": {"output_text": '{"city": "Paris"}', "output_json": {"city": "Paris"}}},
            {"item": {"answer": "rome"}, "sample": {"output_json": {"city": "Oslo"}}}]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = runner.invoke(app, ["grade", str(data), "--grader", str(definition), "-o", str(out), "--json", "--no-cache"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["result_counts"] == {"total": 2, "passed": 1, "failed": 1, "errored": 0}


def test_validate_checks_an_eval_with_the_sdk_types(tmp_path) -> None:
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(EVAL))
    wrong = json.loads(json.dumps(EVAL))
    wrong["testing_criteria"][0]["operation"] = "contains"  # not an operation the SDK's StringCheckGrader takes
    del wrong["testing_criteria"][1]["pass_threshold"]  # required for text_similarity in an eval
    bad.write_text(json.dumps(wrong))
    ok = runner.invoke(app, ["validate", str(good), "--json"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["valid"] is True and len(json.loads(ok.stdout)["testing_criteria"]) == 4
    refused = runner.invoke(app, ["validate", str(bad), "--json"])
    assert refused.exit_code == 2
    problems = json.loads(refused.stdout)["problems"]
    assert any(p.startswith("openai SDK: ") and "pass_threshold" in p for p in problems)
    assert any("operation" in p for p in problems)


SCORE = {"type": "score_model", "name": "rating", "model": "gpt-4.1", "range": [1, 7], "pass_threshold": 5,
         "sampling_params": {"temperature": 0.2, "seed": 7, "max_completions_tokens": 300},
         "input": [{"role": "developer", "content": "Rate the answer from 1 to 7."},
                   {"role": "user", "content": [{"type": "input_text", "text": "Question {{ item.n }}: {{ item.question }}"},
                                                {"type": "input_image", "image_url": "{{ item.image }}"},
                                                {"type": "input_text", "text": "Answer: {{ sample.output_text }}"}]}]}


def judge_rates(n: int) -> float:
    return 9 if n == 5 else 1 + (n * 5) % 7  # 9: outside the range, an error row


def score_responder(body: dict) -> Reply:
    n = int(re.search(r"Question (\d+):", user_text(body)).group(1))
    return Reply(content=json.dumps({"steps": [{"description": "read", "conclusion": "ok"}], "result": judge_rates(n)}))


def test_score_model_criterion_scores_in_range_and_passes_at_the_threshold(tmp_path) -> None:
    definition, data, out = tmp_path / "eval.json", tmp_path / "items.jsonl", tmp_path / "out.jsonl"
    definition.write_text(json.dumps({**EVAL, "testing_criteria": [EVAL["testing_criteria"][0], SCORE]}))
    data.write_text("".join(json.dumps(row) + "\n" for row in items()[:14]))
    write_images(tmp_path)
    with FakeProvider(responder=score_responder) as fake:
        result = runner.invoke(app, ["grade", str(data), "--grader", str(definition), "-o", str(out), "--base-url", fake.base_url,
                                     "--api-key", "k", "--no-cache", "--json"])
        requests = fake.chat_requests()
    assert result.exit_code == 1, result.output  # the out-of-range reply is an error row
    summary = json.loads(result.stdout)
    rows = items()[:14]
    exact = [r["sample"]["output_text"] == r["item"]["answer"] for r in rows]
    rated = [judge_rates(n) >= 5 for n in range(14)]
    ok = [n for n in range(14) if n != 5]
    assert summary["result_counts"] == {"total": 14, "passed": sum(exact[n] and rated[n] for n in ok),
                                        "failed": sum(not (exact[n] and rated[n]) for n in ok), "errored": 1}
    per = {r["testing_criteria"].split("-")[0]: (r["passed"], r["failed"]) for r in summary["per_testing_criteria_results"]}
    assert per["rating"] == (sum(rated[n] for n in ok), sum(not rated[n] for n in ok))
    assert per["exact"] == (sum(exact), 14 - sum(exact))
    assert len(requests) == 14
    for request in requests:
        body = request.body
        n = int(re.search(r"Question (\d+):", user_text(body)).group(1))
        assert body["response_format"]["type"] == "json_schema"
        assert body["temperature"] == 0.2 and body["seed"] == 7 and body["max_completion_tokens"] == 300
        assert "from 1 to 7" in body["messages"][0]["content"] and body["messages"][0]["role"] == "system"
        assert body["messages"][-1]["content"][1:] == [{"type": "image_url", "image_url": {"url": image_sent(n)}}]
    graded = [json.loads(line) for line in out.read_text().splitlines()]
    name = next(k for k in graded[0]["parts"] if k.startswith("rating-"))
    assert graded[5]["status"] == "error" and "outside its range [1, 7]" in graded[5]["error"]
    assert [g["metrics"][f"{name}.raw_score"] for i, g in enumerate(graded) if i != 5] == [judge_rates(n) for n in ok]
    assert graded[0]["parts"][name] == (judge_rates(0) - 1) / 6  # a range beyond [-1, 1] is rescaled to 0..1


def test_a_local_image_outside_the_input_folder_is_refused(tmp_path) -> None:
    (tmp_path / "secret.png").write_bytes(PNG)
    inside = tmp_path / "run"
    inside.mkdir()
    write_images(inside)
    result, out, sent = grade_with_image(inside, "../secret.png")
    assert result.exit_code == 1
    assert json.loads(result.stdout)["result_counts"] == {"total": 2, "passed": 0, "failed": 1, "errored": 1}
    assert len(out) == 2 and out[1]["status"] == "invalid" and "outside the input's folder" in out[1]["error"]
    assert len(sent) == 1  # the refused row sent nothing


def grade_with_image(tmp_path, image: str):
    """Grade a good row and one whose image cell is ``image`` with the image criterion against the fake:
    the CLI's result, the output rows and the requests the fake received."""
    rows = [items()[0], {**items()[2], "item": {**items()[2]["item"], "image": image}}]
    (tmp_path / "eval.json").write_text(json.dumps({**EVAL, "testing_criteria": [EVAL["testing_criteria"][3]]}))
    (tmp_path / "items.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    with FakeProvider(responder=responder) as fake:
        result = runner.invoke(app, ["grade", str(tmp_path / "items.jsonl"), "--grader", str(tmp_path / "eval.json"), "-o",
                                     str(tmp_path / "out.jsonl"), "--base-url", fake.base_url, "--api-key", "k", "--no-cache", "--json"])
        sent = fake.chat_requests()
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()] if (tmp_path / "out.jsonl").exists() else []
    return result, out, sent


def test_a_data_uri_that_is_not_base64_is_the_rows_error_and_sends_nothing(tmp_path) -> None:
    write_images(tmp_path)
    result, out, sent = grade_with_image(tmp_path, "data:image/png;base64,not base64!")
    assert result.exit_code == 1, result.output
    assert out[1]["status"] == "invalid" and "not valid base64" in out[1]["error"]
    assert len(sent) == 1


def test_a_file_url_is_a_local_path_under_the_same_folder_rule_and_other_schemes_are_named() -> None:
    import tempfile
    from pathlib import Path

    import pytest

    from gradekit.graders._llm import local_media

    folder = Path(tempfile.mkdtemp())
    (folder / "a.png").write_bytes(PNG)
    assert local_media((folder / "a.png").as_uri(), folder).startswith("data:image/png;base64,")
    with pytest.raises(ValueError, match="outside the input's folder"):
        local_media("file:///etc/passwd", folder)
    with pytest.raises(ValueError, match="a gs:// URL is not one the judge can fetch"):
        local_media("gs://bucket/a.png", folder)


def test_media_reach_the_cache_key_as_digests_only() -> None:
    from gradekit.judge import cache_key
    from gradekit.judge._media import Media, digest_media

    def request(url: str) -> dict:
        return {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "q"},
                                                                        {"type": "image_url", "image_url": {"url": url}}]}]}

    one, two = image_sent(1), image_sent(3)
    assert cache_key("u", request(one)) != cache_key("u", request(two))
    assert cache_key("u", request(one)) == cache_key("u", request(one))
    shown = json.dumps(digest_media(request(one)["messages"]))
    assert one.split(",")[1] not in shown and "data:sha256:" in shown
    assert "base64" not in str(Media("image", one))  # what the row-values key and any printed row carry


def test_a_cassette_holds_media_as_digests_and_replays(tmp_path) -> None:
    definition, data = tmp_path / "eval.json", tmp_path / "items.jsonl"
    definition.write_text(json.dumps({**EVAL, "testing_criteria": [EVAL["testing_criteria"][3]]}))
    data.write_text("".join(json.dumps(row) + "\n" for row in items()[:6]))
    write_images(tmp_path)
    tape = tmp_path / "tape.yaml"
    with FakeProvider(responder=responder) as fake:
        recorded = runner.invoke(app, ["grade", str(data), "--grader", str(definition), "-o", str(tmp_path / "a.jsonl"), "--base-url",
                                       fake.base_url, "--api-key", "k", "--record", str(tape), "--json"])
    assert recorded.exit_code == 0, recorded.output
    text = tape.read_text()
    assert "data:sha256:" in text and all(image_sent(n).split(",")[1] not in text for n in range(6))
    replayed = runner.invoke(app, ["grade", str(data), "--grader", str(definition), "-o", str(tmp_path / "b.jsonl"), "--base-url",
                                   "http://127.0.0.1:9/v1", "--replay", str(tape), "--json"])
    assert replayed.exit_code == 0, replayed.output
    assert json.loads(replayed.stdout)["result_counts"] == json.loads(recorded.stdout)["result_counts"]


def test_score_model_reads_a_reply_that_missed_the_schema_but_gives_one_number() -> None:
    from gradekit.graders import Sample, SyncGrader, load_grader
    from gradekit.judge import Judge, RetryPolicy

    replies = {"bare": "6", "score": '{"score": 3}', "words": "I would say six", "two": "[6, 7]"}

    def reply(body: dict) -> Reply:
        return Reply(content=replies[user_text(body).split()[-1]])

    node = {"type": "score_model", "name": "r", "range": [1, 7], "input": [{"role": "user", "content": "Rate {{ sample.output_text }}"}]}
    with FakeProvider(responder=reply) as fake:
        grader = SyncGrader(load_grader(node, judge=lambda: Judge("m", base_url=fake.base_url, api_key="k", cache=None,
                                                                  retry=RetryPolicy(max_attempts=1))))
        grades = {key: grader(Sample(response=key)) for key in replies}
        sent = fake.chat_requests()
    assert grades["bare"].metrics["raw_score"] == 6 and grades["score"].metrics["raw_score"] == 3
    assert grades["words"].status == "error" and grades["words"].error_kind == "parse_failure"
    assert grades["two"].status == "error"
    schema = sent[0].body["response_format"]["json_schema"]["schema"]
    assert schema["properties"]["result"] == {"type": "number", "minimum": 1.0, "maximum": 7.0}


def test_a_content_that_is_one_image_part_on_its_own_is_sent_as_a_part_and_checked(tmp_path) -> None:
    """The SDK's label_model content is "either as a single item or an array of items": one input_image object."""
    (tmp_path / "secret.png").write_bytes(PNG)
    inside = tmp_path / "run"
    inside.mkdir()
    write_images(inside)
    criterion = {**EVAL["testing_criteria"][3], "input": [
        {"role": "user", "content": {"type": "input_image", "image_url": "{{ item.image }}"}},
        {"role": "user", "content": "Question {{ item.n }}: {{ sample.output_text }}"}]}
    rows = [items()[0], {**items()[2], "item": {**items()[2]["item"], "image": "../secret.png"}}]
    (inside / "eval.json").write_text(json.dumps({**EVAL, "testing_criteria": [criterion]}))
    (inside / "items.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    with FakeProvider(responder=responder) as fake:
        result = runner.invoke(app, ["grade", str(inside / "items.jsonl"), "--grader", str(inside / "eval.json"), "-o",
                                     str(inside / "out.jsonl"), "--base-url", fake.base_url, "--api-key", "k", "--no-cache"])
        sent = fake.chat_requests()
    assert result.exit_code == 1, result.output
    out = [json.loads(line) for line in (inside / "out.jsonl").read_text().splitlines()]
    assert out[1]["status"] == "invalid" and "outside the input's folder" in out[1]["error"]
    assert len(sent) == 1
    parts = sent[0].body["messages"][-1]["content"]
    assert parts[-1] == {"type": "image_url", "image_url": {"url": image_sent(0)}} and "input_image" not in json.dumps(parts)


def test_validate_takes_a_multi_criterion_with_a_map_of_graders(tmp_path) -> None:
    """The API takes `graders` as a map (name -> grader) where the SDK types one grader: each member is checked alone."""
    multi = {"type": "multi", "name": "both", "calculate_output": "0.5 * a + 0.5 * b", "graders": {
        "a": EVAL["testing_criteria"][0], "b": {**EVAL["testing_criteria"][1], "evaluation_metric": "bleu"}}}
    path = tmp_path / "eval.json"
    path.write_text(json.dumps({**EVAL, "testing_criteria": [multi]}))
    ok = runner.invoke(app, ["validate", str(path), "--json"])
    assert ok.exit_code == 0, ok.output
    multi["graders"]["b"]["evaluation_metric"] = "nope"
    path.write_text(json.dumps({**EVAL, "testing_criteria": [multi]}))
    refused = runner.invoke(app, ["validate", str(path), "--json"])
    assert refused.exit_code == 2
    problems = [p for p in json.loads(refused.stdout)["problems"] if p.startswith("openai SDK: ")]
    assert problems and all(p.startswith("openai SDK: testing_criteria.0.graders.b.evaluation_metric") for p in problems)


def test_a_multi_criterion_passes_at_its_pass_threshold(tmp_path) -> None:
    """As the docs have it (text_similarity, python, multi pass at pass_threshold): a multi's threshold is the eval's,
    not a field of the multi grader (which has none), so the eval builds."""
    multi = {"type": "multi", "name": "half", "calculate_output": "0.5 * a + 0.5 * b", "pass_threshold": 0.5, "graders": {
        "a": {"type": "string_check", "name": "a", "input": "{{ sample.output_text }}", "reference": "{{ item.answer }}", "operation": "eq"},
        "b": {"type": "string_check", "name": "b", "input": "{{ sample.output_text }}", "reference": "{{ item.other }}", "operation": "eq"}}}
    (tmp_path / "eval.json").write_text(json.dumps({**EVAL, "testing_criteria": [multi]}))
    (tmp_path / "items.jsonl").write_text("".join(json.dumps({"item": {"answer": "Paris", "other": o}, "sample": {"output_text": a}}) + "\n"
                                                  for a, o in (("Paris", "x"), ("Rome", "x"), ("Paris", "Paris"))))
    result = runner.invoke(app, ["grade", str(tmp_path / "items.jsonl"), "--grader", str(tmp_path / "eval.json"), "-o",
                                 str(tmp_path / "out.jsonl"), "--json", "--no-cache"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["result_counts"] == {"total": 3, "passed": 2, "failed": 1, "errored": 0}
    assert [p["passed"] for p in report["per_testing_criteria_results"]] == [2]


def test_item_paths_go_into_nested_objects_and_lists_as_sample_paths_do(tmp_path) -> None:
    check = {"name": "p", "data_source_config": {"type": "custom", "item_schema": {}}, "testing_criteria": [
        {"type": "string_check", "name": "deep", "input": "{{ sample.choices.0.message.content }}",
         "reference": "{{ item.answers.1.text }}", "operation": "eq"}]}
    definition, data, out = tmp_path / "eval.json", tmp_path / "items.jsonl", tmp_path / "out.jsonl"
    definition.write_text(json.dumps(check))
    rows = [{"item": {"answers": [{"text": "Rome"}, {"text": "Paris"}]},
             "sample": {"choices": [{"message": {"role": "assistant", "content": c}}]}} for c in ("Paris", "Rome")]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = runner.invoke(app, ["grade", str(data), "--grader", str(definition), "-o", str(out), "--json", "--no-cache"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["result_counts"] == {"total": 2, "passed": 1, "failed": 1, "errored": 0}
