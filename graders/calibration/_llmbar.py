"""LLMBar (Zeng et al., ICLR 2024) as a real judge: its 885 labelled pairs and GPT-4 / ChatGPT's recorded replies.

Two ways in, both through gradekit's own parts:

- :func:`rescore_llmbar` re-reads every recorded raw completion with gradekit's parse layer, using the
  upstream parsing regexes turned into gradekit parse specs, and computes Acc / Agr with
  :func:`graders.pairwise_report`. It reproduces the published ``statistics.json`` of all 147 runs.
- :func:`replay_responder` answers a chat-completions request with the completion recorded for
  the same instance in the same order, so the real :class:`judge.Judge` (cache, limiter, parse)
  and :func:`grade_pairwise_file` run on GPT-4's real outputs. :func:`replay_grade` does the lot.
"""

from __future__ import annotations

import functools
import json
import re
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from gradekit.judge import JudgeCache, ParseFailure, Rubric, load_rubric, parse_reply
from gradekit.judge._spec import JudgeSpec, Limits
from gradekit.judge.testing import FakeProvider, Reply
from gradekit.judge.testing._fake_provider import last_user_content

from .._pairwise import ConflictRule
from ..runs._pairwise import PairwiseRunSummary
from ._agreement import PairwiseReport, pairwise_report
from ._pairwise import grade_pairwise_file

Order = Literal["ab", "ba"]
StrategyKind = Literal["comparison", "swap", "rating"]


class LLMBarError(ValueError):
    """The LLMBar data are missing or not as expected; the message names the file and row."""


# ----------------------------------------------------------------------------------------------
# Finding and loading the data
# ----------------------------------------------------------------------------------------------


def packaged_eval_sets() -> Path:
    """eval_sets/ as installed: ``gradekit.eval_sets`` (the repository's top-level eval_sets/, mapped in by pyproject.toml)."""
    from importlib import resources

    return Path(str(resources.files("gradekit.eval_sets")))


def llmbar_root(root: str | Path | None = None) -> Path:
    """The LLMBar folder: ``root`` if given, else the copy shipped inside gradekit (the wheel carries it).

    The data are part of the package, like the rubrics, so ``gradekit llmbar`` and
    ``gradekit meta-eval --suite llmbar`` work from any folder after a plain ``pip install``.
    """
    candidates = [Path(root)] if root is not None else [packaged_eval_sets() / "llmbar"]
    for candidate in candidates:
        if (candidate / "manifest.json").is_file():
            return candidate
    looked = ", ".join(str(c) for c in candidates)
    raise LLMBarError(f"LLMBar data not found (looked for manifest.json in {looked}); "
                      "reinstall gradekit or pass `root` PATH/TO/eval_sets/llmbar")


def subset_dir(subset: str, root: str | Path | None = None) -> Path:
    """Accepts "Natural", "LLMBar/Natural", "LLMBar__Natural", "MT-Bench", "Processed/MT-Bench", ..."""
    base = llmbar_root(root) / "data"
    names = sorted(p.name for p in base.iterdir() if p.is_dir())
    wanted = subset.replace("/", "__").replace("LLMEval^2", "LLMEval2")
    for name in names:
        if name == wanted or name.split("__", 1)[-1] == wanted or name.endswith("__" + wanted):
            return base / name
    raise LLMBarError(f"no LLMBar subset {subset!r}; subsets are: {', '.join(names)}")


@dataclass(frozen=True)
class Instance:
    """One labelled pair: ``label`` is 1 or 2, whichever output is better (gold or human)."""

    idx: int
    input: str
    output_1: str
    output_2: str
    label: int


def load_llmbar(subset: str, root: str | Path | None = None) -> list[Instance]:
    path = subset_dir(subset, root) / "dataset.json"
    try:
        items = json.loads(path.read_text(encoding="utf-8"))
        return [Instance(idx=i, input=x["input"], output_1=x["output_1"], output_2=x["output_2"], label=int(x["label"]))
                for i, x in enumerate(items)]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise LLMBarError(f"{path}: cannot read the instances: {e}") from e


def grading_rows(subset: str, root: str | Path | None = None) -> list[dict[str, Any]]:
    """The instances as rows for ``llmbar_pairwise``: idx, instruction, output_1, output_2, label."""
    return [{"idx": x.idx, "instruction": x.input, "output_1": x.output_1, "output_2": x.output_2, "label": x.label}
            for x in load_llmbar(subset, root)]


@dataclass(frozen=True)
class LLMBarRun:
    subset: str  # directory name, e.g. "LLMBar__Natural"
    judge: str  # "GPT-4" or "ChatGPT"
    strategy: str  # e.g. "Vanilla_NoRules"

    @property
    def config(self) -> str:
        return f"{self.judge}/{self.strategy}.json"

    @property
    def kind(self) -> StrategyKind:
        if self.strategy.startswith("Rating"):
            return "rating"
        return "swap" if self.strategy.startswith("Swap") else "comparison"


def list_runs(root: str | Path | None = None) -> list[LLMBarRun]:
    """Every recorded evaluator run (147 in the shipped copy)."""
    runs = []
    for path in sorted((llmbar_root(root) / "data").glob("*/*__*.jsonl")):
        judge, strategy = path.stem.split("__", 1)
        runs.append(LLMBarRun(path.parent.name, judge, strategy))
    return runs


def _run_path(run: LLMBarRun, root: str | Path | None) -> Path:
    return subset_dir(run.subset, root) / f"{run.judge}__{run.strategy}.jsonl"


def load_run(run: LLMBarRun, root: str | Path | None = None) -> list[dict[str, Any]]:
    path = _run_path(run, root)
    if not path.is_file():
        raise LLMBarError(f"{path}: no recorded run {run.judge}/{run.strategy} for {run.subset}")
    rows = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise LLMBarError(f"{path} row {number}: not valid JSON ({e.msg})") from e
    return rows


def _manifest(root: str | Path | None) -> dict[str, Any]:
    return _read_json(llmbar_root(root).resolve() / "manifest.json")


@functools.lru_cache(maxsize=8)
def _read_json(path: Path) -> dict[str, Any]:
    """The manifest and configs are read once per process: a suite's published rows ask for them per run."""
    return json.loads(path.read_text(encoding="utf-8"))


def published_statistics(run: LLMBarRun, root: str | Path | None = None) -> dict[str, Any]:
    """The run's ``statistics.json`` as the authors published it (verbatim strings)."""
    dst = f"data/{run.subset}/{run.judge}__{run.strategy}.jsonl"
    for entry in _manifest(root)["files"]:
        if entry["dst"] == dst:
            return entry["published_statistics"]
    raise LLMBarError(f"manifest.json: no published statistics for {dst}")


def llmbar_published(run: LLMBarRun, root: str | Path | None = None) -> tuple[float, float]:
    """(Acc, Agr) in percent, read from the published strings, e.g. "93.5%" and "97 / 100 = 97.0%"."""
    stats = published_statistics(run, root)
    acc = float(stats["correct_average"].rstrip("%"))
    agr = float(stats["equal"].rsplit("=", 1)[1].strip().rstrip("%"))
    return acc, agr


def _configs(root: str | Path | None) -> dict[str, Any]:
    return _read_json(llmbar_root(root).resolve() / "prompts_and_configs.json")["configs"]


# ----------------------------------------------------------------------------------------------
# Upstream parsing regexes as gradekit parse specs
# ----------------------------------------------------------------------------------------------

_LITERAL = re.compile(r"Output \\\((?P<letter>[ab])\\\)")


def comparison_spec(parsing: Mapping[str, str], name: str = "llmbar") -> Rubric:
    """A parse spec that reads a reply exactly as LLMBar's ``completion_with_parsing`` does.

    Upstream tries its regexes in order ("1" then "2") and the first one found *anywhere* wins;
    gradekit's regex mode binds to the last match instead. One anchored pattern gives upstream's
    rule: a lookahead per regex records which ones occur, and a conditional then captures the
    "Output (a)"/"Output (b)" of the first that does. ``(?-s:...)`` keeps upstream's "." (no
    newline) inside their regexes, while gradekit parses with DOTALL.
    """
    parts = []
    for key, pattern in parsing.items():
        found = list(_LITERAL.finditer(pattern))
        if len(found) != 1:
            raise LLMBarError(f"{name}: parsing regex for {key!r} ({pattern!r}) must name exactly one 'Output \\(a\\)' or 'Output \\(b\\)'")
        expected = {"1": "a", "2": "b"}.get(key)
        if expected != found[0]["letter"]:
            raise LLMBarError(f"{name}: parsing key {key!r} should read Output ({expected}), its regex reads {pattern!r}")
        m = found[0]
        parts.append((pattern, pattern[: m.start()], pattern[m.start(): m.end()], pattern[m.end():]))

    def chain(which: int, i: int = 0) -> str:
        piece = f"(?-s:{parts[i][which]})"
        if i == len(parts) - 1:
            return piece
        return f"(?(m{i}){piece}|{chain(which, i + 1)})"

    probe = "|".join(f"(?=.*?(?-s:{p[0]}))(?P<m{i}>)" for i, p in enumerate(parts))
    regex = rf"\A(?:{probe}).*?{chain(1)}(?P<label>{chain(2)}){chain(3)}"
    return Rubric.model_validate({"name": name, "template": "-", "variables": {},
                                  "output": {"mode": "regex", "pattern": regex, "rationale_field": None},
                                  "labels": {"Output (a)": 1.0, "Output (b)": -1.0}})


def rating_spec(name: str = "llmbar:rating") -> Rubric:
    """A reply that is one integer, as upstream's ``int(completion)``; 0..10 scores -1..1 (order kept)."""
    return Rubric.model_validate({"name": name, "template": "-", "variables": {},
                                  "output": {"mode": "regex", "pattern": r"\A\s*(?P<label>\d+)\s*\Z", "rationale_field": None},
                                  "labels": {str(s): (s - 5) / 5 for s in range(11)}})


def parse_specs(judge: str, strategy: str, root: str | Path | None = None) -> list[Rubric | None]:
    """One parse spec per generation step of a config (None for steps that are not parsed)."""
    configs = _configs(root)
    key = f"{judge}/{strategy}.json"
    if key not in configs:
        raise LLMBarError(f"prompts_and_configs.json: no config {key!r}")
    specs: list[Rubric | None] = []
    for step, config in enumerate(configs[key]["json"]):
        name = f"llmbar:{judge}/{strategy}#{step}"
        if config.get("parsing"):
            specs.append(comparison_spec(config["parsing"], name))
        elif config["prompt"].startswith("rating/"):
            specs.append(rating_spec(name))
        else:
            specs.append(None)  # self-generated metrics or reference output: free text
    return specs


# ----------------------------------------------------------------------------------------------
# Re-scoring the recorded runs
# ----------------------------------------------------------------------------------------------


def _read(spec: Rubric, text: str) -> float | None:
    try:
        # Upstream strips the completion before matching.
        return parse_reply(spec, text.strip(), "text").score
    except ParseFailure:
        return None


def _winner(score: float | None, swapped: bool) -> str | None:
    """Map "the output shown first won" back to the input's numbering."""
    if score is None:
        return None
    first_won = score > 0
    return ("1" if first_won else "2") if not swapped else ("2" if first_won else "1")


def _orders(step: Any, spec: Rubric, where: str) -> tuple[str | None, str | None]:
    if not isinstance(step, dict) or "swap = False" not in step or "swap = True" not in step:
        raise LLMBarError(f"{where}: expected a step with 'swap = False' and 'swap = True'")
    return (_winner(_read(spec, step["swap = False"]["completion"][0]), False),
            _winner(_read(spec, step["swap = True"]["completion"][0]), True))


class RescoredRun(BaseModel):
    """One recorded run re-read with gradekit: the winners per order and LLMBar's statistics."""

    subset: str
    judge: str
    strategy: str
    winner_ab: list[str | None]  # "swap = False": output_1 shown first
    winner_ba: list[str | None]  # "swap = True", mapped back to the input's numbering
    labels: list[str]
    differs_from_recorded: int  # rows whose re-read winners differ from the recorded "winner" fields
    report: PairwiseReport


def rescore_llmbar(run: LLMBarRun, root: str | Path | None = None, *, bootstrap: int = 0) -> RescoredRun:
    """Re-read one run's raw completions with gradekit's parse layer and compute Acc / Agr."""
    rows = load_run(run, root)
    specs = parse_specs(run.judge, run.strategy, root)
    path = _run_path(run, root)
    ab: list[str | None] = []
    ba: list[str | None] = []
    labels: list[str] = []
    differs = 0
    for number, row in enumerate(rows, start=1):
        where = f"{path} row {number}"
        results = row["results"]
        final = results[-1]
        if run.kind == "rating":
            spec = specs[-1]
            assert spec is not None
            s1, s2 = _read(spec, final["score_1"][0]), _read(spec, final["score_2"][0])
            if s1 is None or s2 is None:
                pair: tuple[str | None, str | None] = ("1", "2")  # upstream's except branch: counted inconsistent
            else:
                pair = ("1" if s1 > s2 else "2", "2" if s2 > s1 else "1")
        elif run.kind == "swap":
            first, synth = specs[0], specs[1]
            assert first is not None and synth is not None
            pair = _orders(results[0], first, where)
            conflict = set(pair) == {"1", "2"}
            if conflict != (len(results) == 2):
                raise LLMBarError(f"{where}: re-read stage-1 winners {pair} {'disagree' if conflict else 'agree'}, "
                                  f"but the recording has {len(results)} step(s)")
            if conflict:
                pair = _orders(results[1], synth, where)
        else:
            spec = specs[-1]
            assert spec is not None
            pair = _orders(final, spec, where)
        recorded = (final["swap = False"]["winner"], final["swap = True"]["winner"])
        differs += pair != recorded
        ab.append(pair[0])
        ba.append(pair[1])
        labels.append(str(row["label"]))
    report = pairwise_report(ab, ba, labels, convention="llmbar", bootstrap=bootstrap)
    return RescoredRun(subset=run.subset, judge=run.judge, strategy=run.strategy, winner_ab=ab, winner_ba=ba,
                       labels=labels, differs_from_recorded=differs, report=report)


def upstream_statistics(report: PairwiseReport) -> dict[str, str]:
    """A report's counts written the way LLMBar's evaluate.py writes ``statistics.json``."""
    n = report.n

    def share(count: int) -> str:
        return f"{count} / {n} = {count / n * 100}%"

    return {
        "correct_False": share(report.correct_ab),
        "correct_True": share(report.correct_ba),
        "correct_average": f"{(report.correct_ab + report.correct_ba) / 2 / n * 100}%",
        "correct_both": share(report.both_correct_count),
        "equal": share(report.agree_count),
    }


# ----------------------------------------------------------------------------------------------
# Replaying the recorded completions over HTTP
# ----------------------------------------------------------------------------------------------

# Delimiters of the shipped pairwise rubrics: (instruction, first shown, second shown).
KNOWN_TAGS: tuple[tuple[str, str, str], ...] = (
    ("instruction", "output_a", "output_b"),  # llmbar_pairwise
    ("user_prompt", "assistant_a", "assistant_b"),  # arena_hard_pairwise
)
# Upstream's Azure error path recorded "content management policy" with an empty completion.
_FINISH = {"content management policy": "content_filter", "": "stop"}


def _user_text(body: Mapping[str, Any]) -> str:
    content = last_user_content(body)
    if isinstance(content, list):
        return "".join(p.get("text") or "" for p in content if isinstance(p, dict))
    return content or ""


def _tagged(text: str, tags: Iterable[tuple[str, str, str]]) -> tuple[str, str, str] | None:
    for names in tags:
        found = [re.search(rf"<{t}>\n?(.*?)\n?</{t}>", text, re.DOTALL) for t in names]
        if all(found):
            return tuple(m.group(1).strip() for m in found)  # type: ignore[return-value,union-attr]
    return None


def _scan(text: str, instances: list[Instance]) -> list[tuple[int, Order]]:
    """For prompts without known delimiters: instances whose instruction and outputs all appear.

    The order is read from where the outputs sit once the instruction is blanked out (an output
    can quote the instruction, and a short output can occur inside the longer one).
    """
    hits: list[tuple[int, Order]] = []
    for x in instances:
        inst, o1, o2 = x.input.strip(), x.output_1.strip(), x.output_2.strip()
        if not (inst in text and o1 in text and o2 in text) or o1 == o2 or not o1 or not o2:
            continue
        start = text.find(inst)
        blank = text[:start] + "\0" * len(inst) + text[start + len(inst):]
        long_, short = (o1, o2) if len(o1) >= len(o2) else (o2, o1)
        p_long = blank.rfind(long_)
        if p_long < 0:
            continue
        masked = blank[:p_long] + "\0" * len(long_) + blank[p_long + len(long_):]
        p_short = masked.rfind(short)
        if p_short < 0:
            continue
        first_is_o1 = (p_long < p_short) == (long_ is o1)
        hits.append((x.idx, "ab" if first_is_o1 else "ba"))
    return hits


def replay_responder(run: LLMBarRun, root: str | Path | None = None, *,
                     tags: Iterable[tuple[str, str, str]] = KNOWN_TAGS) -> Callable[[dict[str, Any]], Reply]:
    """A FakeProvider ``responder`` that plays a recorded run back, request by request.

    The instance and the order shown are read from the request itself: the instruction and the
    two outputs between the rubric's delimiters (or, failing that, located in the text), looked
    up among the subset's instances. Prompts need not be byte-identical to anything recorded,
    so any pairwise rubric wording replays. A request that shows no recorded pair gets an HTTP
    400 that says so. Swap strategies replay their first (comparison) stage.
    """
    if run.kind == "rating":
        raise LLMBarError(f"{run.judge}/{run.strategy} rates one output at a time; replay a comparison strategy")
    instances = load_llmbar(run.subset, root)
    rows = load_run(run, root)
    if len(rows) != len(instances):
        raise LLMBarError(f"{_run_path(run, root)}: {len(rows)} rows but dataset.json has {len(instances)} instances")
    recorded: dict[tuple[int, Order], tuple[str, str]] = {}
    table: dict[tuple[str, str, str], tuple[int, Order]] = {}
    for x, row in zip(instances, rows):
        step = row["results"][0] if run.kind == "swap" else row["results"][-1]
        for order, key in (("ab", "swap = False"), ("ba", "swap = True")):
            text, finish = step[key]["completion"]
            recorded[(x.idx, order)] = (text, finish)  # type: ignore[index]
        # Identical outputs make both orders one prompt: the first recorded order answers it.
        table.setdefault((x.input.strip(), x.output_1.strip(), x.output_2.strip()), (x.idx, "ab"))
        table.setdefault((x.input.strip(), x.output_2.strip(), x.output_1.strip()), (x.idx, "ba"))
    tag_list = tuple(tags)

    def respond(body: dict[str, Any]) -> Reply:
        text = _user_text(body)
        shown = _tagged(text, tag_list)
        hit = table.get(shown) if shown is not None else None
        if hit is None and shown is None:
            found = _scan(text, instances)
            hit = found[0] if len(found) == 1 else None
        if hit is None:
            return Reply(status=400, error_message=f"LLMBar replay ({run.subset}, {run.judge}/{run.strategy}): "
                                                   "no recorded completion for the instruction and outputs in this request")
        content, finish = recorded[hit]
        return Reply(content=content, finish_reason=_FINISH.get(finish, finish))

    return respond


def suite_replay_responder(judge: str, strategy: str, subsets: Iterable[str] | None = None,
                           root: str | Path | None = None) -> Callable[[dict[str, Any]], Reply]:
    """One responder replaying ``judge``/``strategy`` on several subsets (default: every subset that recorded it).

    Each request goes to the subset whose instances it shows; this is how a whole suite
    (``gradekit meta-eval --suite llmbar``) runs against LLMBar's recorded completions.
    """
    names = [subset_dir(s, root).name for s in subsets] if subsets is not None else \
        [d.name for d in sorted((llmbar_root(root) / "data").iterdir()) if (d / f"{judge}__{strategy}.jsonl").is_file()]
    responders = [replay_responder(resolve_run(name, judge, strategy, root), root) for name in names]
    if not responders:
        raise LLMBarError(f"no LLMBar subset recorded {judge}/{strategy}")

    def respond(body: dict[str, Any]) -> Reply:
        reply = None
        for responder in responders:
            reply = responder(body)
            if reply.status == 200:
                return reply
        assert reply is not None
        return Reply(status=400, error_message=f"LLMBar replay ({judge}/{strategy} on {', '.join(names)}): "
                                               "no recorded completion for the instruction and outputs in this request")

    return respond


def judge_model(judge: str, strategy: str, root: str | Path | None = None) -> str:
    """The model name the run's config used ("gpt-4", "gpt-3.5-turbo")."""
    config = _configs(root).get(f"{judge}/{strategy}.json")
    return config["json"][-1]["model_name"] if config else judge.lower()


class ReplayResult(BaseModel):
    run: str
    rubric: str
    model: str
    output: str | None
    summary: PairwiseRunSummary
    published_acc: float
    published_agr: float


async def replay_grade(
    run: LLMBarRun,
    *,
    rubric: str | Rubric = "llmbar_pairwise",
    output: Path | None = None,
    root: str | Path | None = None,
    cache: JudgeCache | None = None,
    concurrency: int = 16,
    on_conflict: ConflictRule = "tie",
) -> ReplayResult:
    """Grade a subset with a pairwise rubric against a loopback replay of a recorded judge.

    The replay server is a :class:`gradekit.judge.testing.FakeProvider` on 127.0.0.1; the grading is the
    ordinary path: :class:`judge.Judge` (cache, limiter, retry, parse) under
    :func:`grade_pairwise_file`, with LLMBar's convention for Acc / Agr.
    """
    spec = load_rubric(rubric) if not isinstance(rubric, Rubric) else rubric
    responder = replay_responder(run, root)
    published = llmbar_published(run, root)
    model = judge_model(run.judge, run.strategy, root)
    with tempfile.TemporaryDirectory(prefix="gradekit-llmbar-") as tmp:
        source = Path(tmp) / "rows.jsonl"
        with source.open("w", encoding="utf-8") as handle:
            for row in grading_rows(run.subset, root):
                handle.write(json.dumps(row, ensure_ascii=False) + "\n")
        destination = output if output is not None else Path(tmp) / "graded.jsonl"
        with FakeProvider(responder=responder, model=model) as server:
            asked = JudgeSpec.of(model, base_url=server.base_url, api_key="replay", limits=Limits(concurrency=concurrency))
            async with asked.build(cache=cache) as judge:
                summary = await grade_pairwise_file(judge, spec, source, destination, {v: v for v in spec.variables},
                                                    on_conflict=on_conflict, label_column="label", convention="llmbar")
    return ReplayResult(run=f"{run.subset} {run.judge}/{run.strategy}", rubric=spec.name, model=model,
                        output=str(output) if output is not None else None, summary=summary,
                        published_acc=published[0], published_agr=published[1])


def resolve_run(subset: str, judge: str, strategy: str, root: str | Path | None = None) -> LLMBarRun:
    """A LLMBarRun from user spellings, checked against the files on disk."""
    directory = subset_dir(subset, root)
    run = LLMBarRun(directory.name, judge, strategy)
    if not _run_path(run, root).is_file():
        have = sorted(p.stem.replace("__", "/") for p in directory.glob("*__*.jsonl"))
        raise LLMBarError(f"{directory}: no recorded run {judge}/{strategy}; recorded: {', '.join(have)}")
    return run
