"""``type: reward_model``: a served scalar reward model scores a group through the fake provider's vLLM
``/classify`` and ``/pooling`` and SGLang's ``/v1/embeddings`` and ``/v1/classify`` (shapes from their
source: gradekit.judge.testing._fake_reward), with the documented mappings; a failing endpoint gives
errors, never zeros; the cache, a fleet's failover and the config's refusals."""

from __future__ import annotations

import math
import re
import statistics
from typing import Any

import pytest

from gradekit.graders import GraderConfigError, Sample, Trajectory, load_grader, load_group_grader
from gradekit.graders._reward_model import group_rewards, sigmoid_reward
from gradekit.judge import Judge, JudgeCache, Limiter, RetryPolicy
from gradekit.judge.testing import FakeProvider, Reply

ANSWERS = ["Paris", "Paris, the capital", "Lyon", "I do not know"]


def head(text: str) -> float:
    """The fake reward model: a logit from the response (the text after the last assistant turn, its
    template's markup removed), higher for Paris, lower for a refusal."""
    response = re.sub(r"<\|[^|]*\|>", "", text.rsplit("assistant", 1)[-1]).strip(" :\n")
    return 2.0 * ("Paris" in response) - 1.5 * ("not know" in response) + 0.1 * len(response.split())


def raws() -> list[float]:
    return [head(f"assistant: {a}") for a in ANSWERS]


async def _no_wait(_: float) -> None:
    return None


def judge(url: str, *, cache: JudgeCache | None = None, attempts: int = 2, **kwargs: Any) -> Judge:
    return Judge("skywork-reward", base_url=url, api_key="k", timeout=30, cache=cache, sleep=_no_wait,
                 limiter=Limiter(concurrency=8, sleep=_no_wait), retry=RetryPolicy(max_attempts=attempts), **kwargs)


def group_config(**node: Any) -> dict[str, Any]:
    return {"type": "group", "on_judge_error": "RETRY", "grader": {"type": "reward_model", **node}}


SAMPLE = Sample(messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital of France?"}])
TRAJECTORIES = [Trajectory(messages=[{"role": "assistant", "content": a}]) for a in ANSWERS]


@pytest.fixture
def rm() -> Any:
    with FakeProvider(reward_model=head) as provider:
        yield provider


@pytest.mark.parametrize("mapping, scale, expected", [
    pytest.param("sigmoid", None, [sigmoid_reward(r) for r in raws()], id="sigmoid"),
    pytest.param("sigmoid", 4.0, [2 / (1 + math.exp(-r / 4.0)) - 1 for r in raws()], id="sigmoid-scale-4"),
    pytest.param("raw", None, [max(-1.0, min(1.0, r)) for r in raws()], id="raw-clipped"),
    pytest.param("minmax", None, [2 * (r - min(raws())) / (max(raws()) - min(raws())) - 1 for r in raws()], id="minmax"),
    pytest.param("zscore", None, [max(-1.0, min(1.0, (r - statistics.fmean(raws())) / (statistics.pstdev(raws()) * 2)))
                                  for r in raws()], id="zscore"),
])
async def test_a_group_scored_through_vllm_classify_with_each_mapping(rm: FakeProvider, mapping: str, scale: float | None,
                                                                     expected: list[float]) -> None:
    grade = load_group_grader(group_config(route="/classify", mapping=mapping, **({"scale": scale} if scale else {})),
                              judge=judge(rm.base_url))
    result = await grade(SAMPLE, TRAJECTORIES)
    assert result.status == "SUCCESS"
    assert result.rewards == pytest.approx(expected)
    assert [g.metrics["raw_score"] for g in result.grades] == pytest.approx(raws())
    sent = [r for r in rm.requests if r.path == "/classify"]
    assert len(sent) == 4 and all(r.body["use_activation"] is False and r.body["model"] == "skywork-reward" for r in sent)
    # the conversation as messages (vLLM renders it with the reward model's chat template), the response last
    assert sent[0].body["messages"][:2] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital of France?"}]
    assert {r.body["messages"][-1]["content"] for r in sent} == set(ANSWERS)
    assert all(r.body["messages"][-1]["role"] == "assistant" for r in sent)


async def test_vllm_pooling_reads_the_last_value_of_the_last_token(rm: FakeProvider) -> None:
    for task in (None, "token_classify"):
        grade = load_grader({"type": "reward_model", "route": "/pooling", "mapping": "raw", **({"task": task} if task else {})},
                            judge=judge(rm.base_url))
        got = await grade(SAMPLE.with_response("Paris"))
        assert got.ok and got.metrics["raw_score"] == pytest.approx(head("assistant: Paris"))
    assert [r.body.get("task") for r in rm.requests] == [None, "token_classify"]


CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


async def test_sglang_embeddings_gets_the_templated_text_and_its_classify_is_refused_for_one_label(rm: FakeProvider, tmp_path) -> None:
    (tmp_path / "template.jinja").write_text(CHATML, encoding="utf-8")
    (tmp_path / "rm.yaml").write_text("type: group\ngrader:\n  type: reward_model\n  route: /v1/embeddings\n  mapping: minmax\n"
                                      "  chat_template_file: template.jinja\n", encoding="utf-8")
    grade = load_group_grader(tmp_path / "rm.yaml", judge=judge(rm.base_url))
    result = await grade(SAMPLE, TRAJECTORIES)
    sent = [r for r in rm.requests if r.path == "/v1/embeddings"]
    assert len(sent) == 4 and all("messages" not in r.body for r in sent)
    assert sent[0].body["input"].startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nCapital of France?<|im_end|>")
    expected = group_rewards(raws(), "minmax")
    assert result.status == "SUCCESS" and result.rewards == pytest.approx(expected)

    one_label = load_grader({"type": "reward_model", "route": "/v1/classify", "chat_template": CHATML}, judge=judge(rm.base_url))
    got = await one_label(SAMPLE.with_response("Paris"))
    assert got.status == "error" and got.error_kind == "bad_request" and "/v1/embeddings" in got.error and got.score is None


async def test_sglang_classify_of_a_two_label_head_reads_the_last_probability() -> None:
    with FakeProvider(reward_model=lambda text: [0.0, head(text)]) as two:
        grade = load_grader({"type": "reward_model", "route": "/v1/classify", "mapping": "raw", "chat_template": CHATML},
                            judge=judge(two.base_url))
        got = await grade(SAMPLE.with_response("Paris"))
    logit = head("assistant: Paris")
    assert got.ok and got.metrics["raw_score"] == pytest.approx(math.exp(logit) / (1 + math.exp(logit)))


async def test_a_failing_reward_endpoint_gives_errors_never_zeros(rm: FakeProvider) -> None:
    rm.set_responder(lambda body: Reply(status=500) if "Lyon" in str(body) else None)
    grade = load_group_grader({**group_config(route="/classify", mapping="minmax"), "min_members": 2}, judge=judge(rm.base_url))
    result = await grade(SAMPLE, TRAJECTORIES)
    assert result.status == "SUCCESS" and result.failed_members == [2]
    finished = [r for i, r in enumerate(raws()) if i != 2]
    mapped = group_rewards(finished, "minmax")
    assert [result.rewards[i] for i in (0, 1, 3)] == pytest.approx(mapped), "minmax over the finished members only"
    assert result.grades[2].status == "error" and result.grades[2].error_kind == "server_error"
    assert result.rewards[2] == pytest.approx(sum(mapped) / 3), "the placeholder is the finished members' mean, not 0"

    rm.set_responder(lambda body: Reply(status=503))
    result = await load_group_grader(group_config(route="/classify"), judge=judge(rm.base_url))(SAMPLE, TRAJECTORIES)
    assert result.status == "RETRY" and result.rewards == [] and "HTTP 503" in (result.error or "")
    assert all(g.error_kind == "server_error" and g.score is None for g in result.grades)
    single = await load_grader({"type": "reward_model"}, judge=judge(rm.base_url))(SAMPLE.with_response("Paris"))
    assert single.status == "error" and single.score is None

    with FakeProvider() as chat_only:  # a server that serves no reward model: 404, named
        got = await load_grader({"type": "reward_model"}, judge=judge(chat_only.base_url))(SAMPLE.with_response("Paris"))
    assert got.status == "error" and got.error_kind == "bad_request" and "/classify has no route" in got.error


async def test_a_malformed_reply_is_retried_then_an_error(rm: FakeProvider) -> None:
    rm.push(Reply(raw_body='{"data": []}'), Reply(raw_body='{"data": [{"probs": ["x"]}]}'))
    got = await load_grader({"type": "reward_model"}, judge=judge(rm.base_url, attempts=3))(SAMPLE.with_response("Paris"))
    assert got.ok and got.metrics["raw_score"] == pytest.approx(head("assistant: Paris")), "the third attempt answered"
    assert got.usage is not None and got.usage.requests == 3  # every attempt was a request the endpoint served
    rm.push(*[Reply(raw_body='{"data": []}')] * 2)
    got = await load_grader({"type": "reward_model"}, judge=judge(rm.base_url, attempts=2))(SAMPLE.with_response("Paris"))
    assert got.status == "error" and got.error_kind == "server_error" and got.score is None
    assert got.usage is not None and got.usage.requests == 2  # an error row's attempts column


async def test_the_cache_answers_a_second_run(rm: FakeProvider, tmp_path) -> None:
    cache = JudgeCache(tmp_path / "cache.sqlite3")
    first = await load_group_grader(group_config(), judge=judge(rm.base_url, cache=cache))(SAMPLE, TRAJECTORIES)
    sent = len(rm.requests)
    second = await load_group_grader(group_config(), judge=judge(rm.base_url, cache=cache))(SAMPLE, TRAJECTORIES)
    assert second.rewards == first.rewards and len(rm.requests) == sent == 4
    # What each member billed reaches the group's usage (a run's requests): four requests, then four cache hits.
    assert [(g.usage.requests, g.cache_hits) for g in first.grades] == [(1, 0)] * 4 and first.usage.requests == 4
    assert [(g.usage.requests, g.cache_hits) for g in second.grades] == [(0, 1)] * 4 and second.usage.requests == 0


async def test_a_fleet_fails_over_from_a_dead_reward_endpoint(rm: FakeProvider) -> None:
    from gradekit.judge import Endpoint

    with FakeProvider(reward_model=head) as dead:
        dead.set_responder(lambda body: Reply(drop=True))
        fleet = Judge("skywork-reward", endpoints=[Endpoint(base_url=dead.base_url, api_key="k"), Endpoint(base_url=rm.base_url, api_key="k")],
                      timeout=30, cache=None, sleep=_no_wait, retry=RetryPolicy(max_attempts=3))
        try:
            result = await load_group_grader(group_config(mapping="raw"), judge=fleet)(SAMPLE, TRAJECTORIES * 2)
        finally:
            await fleet.aclose()
    assert result.status == "SUCCESS" and result.rewards == pytest.approx([max(-1, min(1, r)) for r in raws()] * 2)


@pytest.mark.parametrize("node, message", [
    pytest.param({"mapping": "minmax"}, "within a group", id="group-mapping-alone"),
    pytest.param({"route": "/v1/embeddings"}, "chat_template", id="sglang-without-template"),
    pytest.param({"route": "/classify", "chat_template": CHATML}, "applies the model's own chat template", id="vllm-with-template"),
    pytest.param({"route": "/rewards"}, "route", id="no-such-route"),
    pytest.param({"mapping": "sigmoid", "scale": 0}, "scale", id="zero-scale"),
])
def test_config_refusals(rm: FakeProvider, node: dict, message: str) -> None:
    with pytest.raises(GraderConfigError, match=message):
        load_grader({"type": "reward_model", **node}, judge=judge(rm.base_url))


def test_the_server_refuses_a_group_mapping_it_would_grade_per_request(tmp_path) -> None:
    from gradekit.graders._config import load_group_members

    with pytest.raises(GraderConfigError, match="use sigmoid or raw"):
        load_group_members(group_config(mapping="zscore"), judge=judge("http://127.0.0.1:9"))


async def test_a_hugging_face_chat_template_renders_as_transformers_renders_it(rm: FakeProvider) -> None:
    """The shape of Qwen2.5's template: a tools branch, raise_exception, loop controls; no tools given."""
    template = ("{% if tools %}{{ raise_exception('no tools here') }}{% endif %}"
                "{% for message in messages %}{% if message.role == 'system' and not loop.first %}{% continue %}{% endif %}"
                "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}")
    grade = load_grader({"type": "reward_model", "route": "/v1/embeddings", "chat_template": template, "mapping": "raw"},
                        judge=judge(rm.base_url))
    got = await grade(SAMPLE.with_response("Paris"))
    assert got.ok and got.metrics["raw_score"] == pytest.approx(head("assistant: Paris"))
    assert rm.requests[-1].body["input"].endswith("<|im_start|>assistant\nParis<|im_end|>\n")
    bad = load_grader({"type": "reward_model", "route": "/v1/embeddings", "chat_template": "{{ raise_exception('odd roles') }}"},
                      judge=judge(rm.base_url))
    refused = await bad(SAMPLE.with_response("Paris"))
    assert refused.status == "invalid" and "odd roles" in refused.error and len(rm.requests) == 1, "nothing sent for it"
