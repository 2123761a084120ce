"""The judge protocol (judge._protocol) and the Verdict made of values (judge._verdict), issue 33 item 2.

A Judge, a Jury and a Cascade against the loopback fake: each answers the protocol on its own
terms (a panel's identity names its members, its stats are theirs, its usage their sum), and a
run's checkpoint settings come from ``identity()`` alone.
"""

from __future__ import annotations

import json

from gradekit.graders.runs._file import panel_cells, result_row, rubric_settings
from gradekit.judge import (Cascade, CascadeSpec, Judge, JudgeIdentity, JudgeProtocol, Jury, Limiter, PanelInfo, ReadInfo, Usage,
                   Verdict, load_rubric)
from gradekit.judge._cascade import CascadeJudge
from gradekit.judge.testing import FakeProvider, Reply

RUBRIC = "semantic_equivalence_en"
ROW = {"question": "Capital of France?", "references": ["Paris"], "prediction": "Paris"}


def test_a_verdict_is_at_most_15_fields_and_its_values_add_up() -> None:
    # The decision (status, score, label, rationale, raw, error_kind, error, reasoning), its cost (usage, latency_s,
    # cached), how it was read (read: mode, score source, who served it, what of a trajectory it was shown) and its
    # parts (panel, criteria, steps): a new concern goes into one of those values, not beside them.
    assert len(Verdict.model_fields) <= 15
    a = Usage(prompt_tokens=10, completion_tokens=2, reasoning_tokens=1, cached_tokens=4, requests=1)
    b = Usage(prompt_tokens=5, saved_prompt_tokens=7, saved_completion_tokens=3)
    assert a + b == Usage(prompt_tokens=15, completion_tokens=2, reasoning_tokens=1, cached_tokens=4, saved_prompt_tokens=7,
                          saved_completion_tokens=3, requests=1)
    assert sum([a, b]) == a + b == sum([a, b], Usage()), "sum() starts from 0 or from Usage()"
    assert a + Usage() == Usage() + a == a and b + a == a + b and Usage() + Usage() == Usage(), "zero is the identity"
    # Flat keys still build one (so the client stays short); each lands in its value.
    flat = Verdict(status="ok", score=1.0, prompt_tokens=3, attempts=2, agreement=0.5, jurors=[], mode="tags",
                   score_source="logprobs")
    assert (flat.usage.prompt_tokens, flat.usage.requests) == (3, 2)
    assert flat.panel == PanelInfo(agreement=0.5, jurors=[]) and flat.read == ReadInfo(mode="tags", score_source="logprobs")
    assert Verdict(status="ok").panel is None, "a single judge's verdict has no panel"
    assert Verdict.model_validate_json(flat.model_dump_json()) == flat, "a stored verdict (a batch's) reads back the same"
    # The output row reads the values under the column names it always had.
    row = result_row({"id": 1}, Verdict(status="error", error_kind="timeout", error="slow", prompt_tokens=9, attempts=3))
    assert (row["prompt_tokens"], row["completion_tokens"], row["attempts"]) == (9, 0, 3)
    assert panel_cells(flat, ["agreement", "jurors", "decided_by"]) == {"agreement": 0.5, "jurors": "[]", "decided_by": None}


async def test_judge_jury_and_cascade_each_answer_the_protocol_and_a_panel_is_its_members() -> None:
    rubric = load_rubric(RUBRIC)
    with FakeProvider(responder=lambda body: Reply(content=json.dumps({"rationale": "r", "judgement": "correct"}))) as fake:
        def judge(model: str, **kw) -> Judge:
            return Judge(model, base_url=fake.base_url, api_key="k", limiter=Limiter(concurrency=kw.pop("concurrency", 4)),
                         cache=None, **kw)

        alone = [await judge(m).judge(rubric, ROW) for m in ("a", "b", "c")]
        members = [judge("a"), judge("b", concurrency=2), judge("c", params={"temperature": 0.5})]
        jury = Jury(members)
        spec = CascadeSpec(rubric=RUBRIC, samples=3, target=0.9, delta=0.1, delta_per_judge=0.1, calibration_n=0,
                           judges=[CascadeJudge(model="a", threshold=0.9), CascadeJudge(model="b", threshold=0.9)])
        cascade = Cascade([judge("a"), judge("b")], spec)
        panels: list[JudgeProtocol] = [members[0], jury, cascade]
        assert [(p.model, p.panel_columns) for p in panels] == [
            ("a", ()), ("jury(a, b, c)", ("agreement", "jurors")), ("cascade(a -> b)", ("decided_by", "confidence"))]
        assert members[0].identity() == JudgeIdentity(model="a", base_url=fake.base_url, sampling={}, logprobs=None)

        verdict = await jury.judge(rubric, ROW)
        assert verdict.usage == sum(v.usage for v in alone) and verdict.usage.requests == 3
        assert verdict.panel is not None and verdict.panel.agreement == 1.0
        assert [j["model"] for j in verdict.panel.jurors or []] == ["a", "b", "c"]
        assert jury.concurrency == 2, "the busiest juror bounds the rows in flight"

        decided = await cascade.judge(rubric, ROW)
        assert (decided.status, decided.panel.decided_by, decided.panel.confidence) == ("ok", "a", 1.0)
        assert decided.usage.requests == 3, "the K samples of the first judge, summed"

        stats = jury.stats()
        assert [e.base_url for e in stats.endpoints] == [fake.base_url] * 3 and stats.pacing is None
        assert stats.members is not None and [f["requests"] for f in stats.members.by_model.values()] == [1, 1, 1]
        assert members[0].stats().members is None and members[0].stats().pacing is not None
        assert cascade.stats().members.by_model["a"]["requests"] == 3  # type: ignore[union-attr]

        # The checkpoint's settings are the identity: a juror's parameters are in it, so another jury is another run.
        settings = rubric_settings(jury, rubric, {})
        assert (settings["model"], settings["base_url"], settings["logprobs"]) == ("jury(a, b, c)", " ".join([fake.base_url] * 3), None)
        assert settings["sampling"]["jurors"][2] == {"model": "c", "base_url": fake.base_url, "params": {"temperature": 0.5}}
        plain = rubric_settings(members[2], rubric, {})
        assert (plain["model"], plain["sampling"], plain["logprobs"]) == ("c", {"temperature": 0.5}, None)
        assert rubric_settings(cascade, rubric, {})["sampling"]["cascade"]["samples"] == 3
        for one in (jury, cascade):
            await one.aclose()


def test_no_grader_or_run_probes_its_judge() -> None:
    """Graders and runs read the protocol; a probe (``hasattr(judge, ...)``) would let a panel pose as a Judge again."""
    import re
    from pathlib import Path

    probe = re.compile(r"\b(hasattr|getattr)\(\s*(self\.)?(judge|made_judge|panel|jury|cascade)\b")
    root = Path(__file__).resolve().parents[2] / "graders"
    found = [f"{path.relative_to(root)}:{n}" for path in sorted(root.rglob("*.py"))
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if probe.search(line)]
    assert found == []
