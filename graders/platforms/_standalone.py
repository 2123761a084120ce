"""A deterministic grader as one self-contained Python file: standard library only, no gradekit.

The file has three layers:

1. gradekit's own parse and match functions (``parse_response``, ``match``, ``normalize_text``,
   ``to_number``, ...) and placeholder paths (``path_part``, ``follow``), copied from
   ``graders/_string_match.py`` and ``graders/_sample.py`` by ``inspect.getsource`` with their
   annotations stripped, so the exported code compares and reads a path exactly as the grader does;
2. a small interpreter (``_RUNTIME`` below) mirroring each grader type, the placeholders, the
   Vertex/OpenAI input shapes and the composites;
3. the grader itself as data (``GRADER``), the python graders' sources, and each formula
   compiled to a plain function.

Entry points: Vertex's ``evaluate(example, response)``, OpenAI's ``grade(sample, item)`` and AWS
Bedrock/SageMaker RFT's ``lambda_handler(event, context)`` (a batch of samples, one reward record each).
A sample the grader calls ``invalid`` raises ``ValueError`` (Vertex drops the call's reward,
OpenAI marks the sample invalid) unless ``ON_INVALID`` names a score.
"""

from __future__ import annotations

import ast
import inspect
import pprint
import re
import textwrap
from collections.abc import Callable
from typing import Any, Literal

from .. import _code_tests as ct
from .. import _string_match as sm
from .._composite import compile_formula, formula_text
from .._sample import PATH_PARTS, follow, path_part, placeholders
from ._nodes import ExportError, Node

Entry = Literal["evaluate", "grade", "lambda"]
DETERMINISTIC = ("string_match", "json_match", "normalized_match", "numeric_match", "string_check", "python", "code_tests", "weighted",
                 "formula", "math_equivalence", "verified_answer")
_COPIED: tuple[Callable[..., Any], ...] = (sm.parse_response, sm.match, sm._json_value, sm.to_number, sm._canonical_number,
                                           sm.normalize_text, sm._between_digits, sm._contains_words, sm._numbers,
                                           path_part, follow)
# The sample parts an exported file's context holds (its _resolve reads only these): not the whole trajectory,
# not OpenAI's sample namespace. A path to another part is refused at export (expressible).
FILE_PARTS = ("prompt", "response", "system", "references", "metadata")


def _without_annotations(fn: Callable[..., Any]) -> str:
    """A function's source with annotations removed: they name gradekit types the file does not have."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            node.returns = None
            args = node.args
            for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
                if arg is not None:
                    arg.annotation = None
    return ast.unparse(tree)


def copied_source() -> str:
    constants = (f"_NUMBER = re.compile({sm._NUMBER.pattern!r})\n"
                 f"_MINUS = {sm._MINUS!r}\n"
                 f"PATH_PARTS = {PATH_PARTS!r}\n"
                 f"FILE_PARTS = {FILE_PARTS!r}\n"
                 "DEFAULT_NORMALIZATION = _Config(case=True, whitespace=True, punctuation=True, width=True, numbers=True)\n")
    return constants + "\n\n" + "\n\n\n".join(_without_annotations(fn) for fn in _COPIED) + "\n"


_RUNTIME = r'''
class _Invalid(Exception):
    """The example cannot be graded this way (gradekit's "invalid"): a missing reference, a python grader that failed."""


class _Config(object):
    def __init__(self, **fields):
        self.__dict__.update(fields)


_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][\w.\-]*)\s*\}\}")
_ROLES = {"model": "assistant", "assistant": "assistant", "system": "system"}


def _clamp(value):
    return max(-1.0, min(1.0, float(value)))


def _value_text(value):
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _content_text(content):
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p if isinstance(p, str) else p["text"] for p in content
                       if isinstance(p, str) or (isinstance(p, dict) and isinstance(p.get("text"), str)))
    return str(content)


# ---- the two input shapes ---------------------------------------------------------------------

class _Message(object):
    def __init__(self, role, text, calls=(), name=None):
        self.role, self.text, self.calls, self.name = role, text, list(calls), name


def _vertex_messages(content):
    """A Vertex Content as messages: text parts joined (thoughts skipped), function calls kept."""
    role = _ROLES.get(str(content.get("role", "user")), "user")
    texts, calls, out = [], [], []
    for part in content.get("parts") or []:
        if not isinstance(part, dict):
            continue
        if isinstance(part.get("text"), str) and not part.get("thought"):
            texts.append(part["text"])
        elif "functionCall" in part:
            calls.append(part["functionCall"] or {})
        elif "functionResponse" in part:
            answer = part["functionResponse"] or {}
            out.append(_Message("tool", _value_text(answer.get("response")), (), answer.get("name")))
    if texts or calls or not out:
        out.insert(0, _Message(role, "".join(texts), calls))
    return out


def _arguments(args):
    if args is None:
        return ""
    return args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)


class _Context(object):
    """What a grader reads: the response text, prompt, system text, references and metadata."""

    def __init__(self, response, prompt, system, references, metadata, final=None, example=None, content=None, sample=None, item=None):
        self.response, self.prompt, self.system = response, prompt, system
        self.references, self.metadata, self.final = references, metadata, final
        self._example, self._content, self._sample, self._item = example, content, sample, item

    def vertex_arguments(self):
        if self._example is None:  # built from OpenAI's sample: the example has no prompt here
            example = {"contents": []}
            if self.references:
                example["references"] = dict(self.references)
            parts = [{"text": self.response}] if self.response else []
            for call in (self._sample or {}).get("output_tools") or []:
                function = call.get("function") or {}
                try:
                    args = json.loads(function.get("arguments") or "{}")
                except ValueError:
                    args = {"_raw": function.get("arguments")}
                parts.append({"functionCall": {"name": function.get("name", ""), "args": args}})
            return example, {"role": "model", "parts": parts}
        return self._example, self._content

    def openai_arguments(self):
        if self._sample is None:  # built from Vertex's example and response
            final = self.final
            message = {"role": final.role, "content": final.text}
            tools = []
            for call in final.calls:
                dumped = {"type": "function", "function": {"name": call.get("name", ""), "arguments": _arguments(call.get("args", {}))}}
                if call.get("id") is not None:
                    dumped = dict([("id", call["id"])] + list(dumped.items()))
                tools.append(dumped)
            if tools:
                message["tool_calls"] = tools
            if final.name is not None:
                message["name"] = final.name
            try:
                output_json = json.loads(self.response)
            except ValueError:
                output_json = None
            sample = {"choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if tools else "stop"}],
                      "output_text": self.response,
                      "output_json": output_json if isinstance(output_json, (dict, list)) else None,
                      "output_tools": tools}
            return sample, dict(self.references)
        return self._sample, self._item


def _vertex_context(example, response):
    if isinstance(response, str):  # Vertex's own examples pass the model's text as is
        response = {"role": "model", "parts": [{"text": response}]}
    if response is not None and not isinstance(response, dict):
        raise ValueError("response must be a Vertex Content ({'role': 'model', 'parts': [{'text': ...}]}) or a string, got %s"
                         % type(response).__name__)
    if not isinstance(example, dict):
        raise ValueError("example must be an object ({'contents': [...], 'references': {...}}), got %s" % type(example).__name__)
    messages = []
    system = example.get("systemInstruction") or example.get("system_instruction")
    if system:
        messages.append(_Message("system", _content_text((system or {}).get("parts"))))
    for content in example.get("contents") or []:
        messages.extend(_vertex_messages(content))
    references = example.get("references") or {}
    if not isinstance(references, dict):
        raise ValueError("example references must be an object, got %s" % type(references).__name__)
    known = ("contents", "systemInstruction", "system_instruction", "references")
    metadata = dict((k, v) for k, v in example.items() if k not in known)
    answer = _vertex_messages(response if response is not None else {})
    prompt = next((m.text for m in reversed(messages) if m.role == "user"), "")
    system_text = "\n".join(m.text for m in messages if m.role in ("system", "developer"))
    return _Context(answer[-1].text, prompt, system_text, references, metadata, final=answer[-1], example=example, content=response)


def _openai_context(sample, item):
    text = sample.get("output_text")
    if not isinstance(text, str):
        text = _content_text((((sample.get("choices") or [{}])[0]).get("message") or {}).get("content"))
    return _Context(text, None, None, dict(item or {}), {}, sample=sample, item=item)


def _bedrock_calls(message):
    calls = []
    for call in message.get("tool_calls") or []:
        function = (call or {}).get("function") or {}
        try:
            args = json.loads(function.get("arguments") or "{}")
        except ValueError:
            args = {"_raw": function.get("arguments")}
        calls.append({"name": function.get("name", ""), "args": args, "id": (call or {}).get("id")})
    return calls


def _bedrock_context(record):
    """One sample of a Bedrock/SageMaker RFT batch: ``messages`` (the model's answer appended last,
    as the assistant turn), ``reference_answer`` and the other dataset fields, at the top level (Nova's
    page) or under ``metadata`` (the open-weight page). References are the fields, ``reference_answer``
    itself and, when it is an object, its keys (``{{references.answer}}``)."""
    if not isinstance(record, dict):
        raise ValueError("each sample must be an object ({'id', 'messages', 'metadata'}), got %s" % type(record).__name__)
    turns = [m for m in record.get("messages") or [] if isinstance(m, dict)]
    if not turns or turns[-1].get("role") != "assistant":
        raise _Invalid("the sample's last message is not the model's answer (an assistant turn)")
    final = turns[-1]
    answer = _Message("assistant", _content_text(final.get("content")), _bedrock_calls(final), final.get("name"))
    prompt = next((_content_text(m.get("content")) for m in reversed(turns[:-1]) if m.get("role") == "user"), "")
    system = "\n".join(_content_text(m.get("content")) for m in turns[:-1] if m.get("role") in ("system", "developer"))
    metadata = record.get("metadata") if isinstance(record.get("metadata"), dict) else {}
    fields = dict((k, v) for k, v in record.items() if k not in ("id", "messages", "metadata"))
    fields.update(metadata)
    references = dict(fields)
    gold = fields.get("reference_answer")
    if isinstance(gold, dict):
        references.update(gold)
        references["reference_answer"] = gold
    elif gold is not None:  # the one reference rule (docs/platforms.md): a plain value also goes under "answer"
        references["answer"] = gold
    return _Context(answer.text, prompt, system, references, dict(fields, id=record.get("id")), final=answer)


# ---- the graders --------------------------------------------------------------------------------

def _resolve(ctx, path):
    found = path_part(path)
    if found is None or found[0] not in FILE_PARTS:
        raise _Invalid("unknown placeholder %r" % path)
    part, keys = found
    value = getattr(ctx, part)
    try:
        return follow(value, keys) if keys else value
    except KeyError:
        raise _Invalid("%r: the example has no %s key %r" % (path, part, keys))


def _fill(template, ctx, escape=None):
    def sub(found):
        text = _value_text(_resolve(ctx, found.group(1)))
        return escape(text) if escape is not None else text

    return _PLACEHOLDER.sub(sub, template)


def _parsed(node, ctx):
    return parse_response(ctx.response, _Config(**node["parse"]))


def _string_match(node, ctx):
    expected = _fill(node["expression"], ctx, re.escape if node["operation"] == "REGEX_CONTAINS" else None)
    parsed = _parsed(node, ctx)
    if parsed is None:
        return node["wrong"]
    return node["correct"] if match(parsed, expected, node["operation"]) else node["wrong"]


def _json_match(node, ctx):
    expected = _fill(node["expression"], ctx, re.escape if node["operation"] == "REGEX_CONTAINS" else None)
    parsed = _parsed(node, ctx)
    if parsed is None:
        return node["wrong"]
    try:
        value = _json_value(parsed)
        for part in node["key"].split("."):
            if not isinstance(value, dict) or part not in value:
                raise ValueError("no key")
            value = value[part]
    except ValueError:
        return node["wrong"]
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return node["correct"] if match(text, expected, node["operation"]) else node["wrong"]


def _normalized_match(node, ctx):
    how = _Config(**node["normalization"])
    expected = normalize_text(_fill(node["expression"], ctx), how)
    parsed = _parsed(node, ctx)
    if parsed is None:
        return node["wrong"]
    got = normalize_text(parsed, how)
    right = got == expected if node["operation"] == "EXACT_MATCH" else bool(expected) and _contains_words(got, expected)
    return node["correct"] if right else node["wrong"]


def _numeric_match(node, ctx):
    raw = _fill(node["expression"], ctx)
    expected = to_number(raw)
    if expected is None:
        raise _Invalid("grader %r: expected value %r is not a number" % (node["name"], raw[:80]))
    numbers = _numbers(_parsed(node, ctx) or "")
    if not numbers:
        return node["wrong"]
    limit = max(node["abs_tol"], node["rel_tol"] * abs(float(expected)))
    return node["correct"] if abs(float(numbers[-1] - expected)) <= limit else node["wrong"]


def _string_check(node, ctx):
    got, want = _fill(node["input"], ctx), _fill(node["reference"], ctx)
    holds = {"eq": got == want, "ne": got != want, "like": want in got, "ilike": want.casefold() in got.casefold()}[node["operation"]]
    return 1.0 if holds else 0.0


_LOADED = {}


def _python(node, ctx):
    key = node["source"]
    fn = _LOADED.get(key)
    try:
        if fn is None:
            namespace = {"__name__": "__gradekit_grader__"}
            exec(compile(SOURCES[key], "<%s>" % key, "exec"), namespace)
            fn = namespace.get(node["entry"])
            if not callable(fn):
                raise _Invalid("python grader %r defines no function %r" % (node["name"], node["entry"]))
            _LOADED[key] = fn
        args = ctx.vertex_arguments() if node["flavour"] == "vertex" else ctx.openai_arguments()
        value = fn(*args)
        if inspect.iscoroutine(value):
            value = asyncio.run(value)
    except _Invalid:
        raise
    except Exception as e:
        raise _Invalid("python grader %r raised %s: %s" % (node["name"], type(e).__name__, e))
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        raise _Invalid("python grader %r returned %r, not a finite number" % (node["name"], value))
    return value


def _weighted(node, ctx):
    scores = [(weight, _score(part, ctx)) for _, weight, part in node["parts"]]
    return sum(w * s for w, s in scores) / sum(w for w, _ in scores)


def _formula(node, ctx):
    scores = dict((name, _score(part, ctx)) for name, part in node["parts"])
    try:
        total = globals()[node["function"]](scores)
    except (ArithmeticError, ValueError) as e:
        raise _Invalid("grader %r: the formula cannot be computed: %s" % (node["name"], e))
    if math.isnan(total):
        raise _Invalid("grader %r: the formula is not a number" % node["name"])
    return total


_FN = {"min": lambda *a: min(a), "max": lambda *a: max(a), "abs": abs, "floor": lambda x: float(math.floor(x)),
       "ceil": lambda x: float(math.ceil(x)), "exp": math.exp, "sqrt": math.sqrt, "log": math.log}
_pow = math.pow
_KINDS = {"string_match": _string_match, "json_match": _json_match, "normalized_match": _normalized_match,
          "numeric_match": _numeric_match, "string_check": _string_check, "python": _python, "weighted": _weighted,
          "formula": _formula}


def _score(node, ctx):
    """A grader's score, clamped to [-1, 1] as every gradekit Grade is."""
    return _clamp(_KINDS[node["type"]](node, ctx))


def _run(make_context):
    try:
        score = _score(GRADER, make_context())
    except _Invalid as e:
        if ON_INVALID is None:
            raise ValueError("cannot grade this example: %s" % e) from None
        score = ON_INVALID
    return float(score)
'''

# code_tests outside gradekit: each case in a fresh `python -I` subprocess of the platform's own
# sandbox, with the same extraction, case layouts and comparison (copied from graders/_code_tests.py).
_CODE_TESTS = r'''

def _run_case(program, case, node):
    """1 if the case passes, else 0: a fresh interpreter per case, its own temp dir, a memory cap."""
    tests = case.get("tests")
    marker = "gradekit-done-" + os.urandom(8).hex()  # assert cases pass only if the tests ran to their end
    source = program if not tests else program + "\n\n" + tests + "\nprint(%r)\n" % marker
    cap = node["memory_mb"]

    def limit():
        if cap:
            resource.setrlimit(resource.RLIMIT_AS, (cap << 20, cap << 20))

    with tempfile.TemporaryDirectory() as home:
        try:
            done = subprocess.run([sys.executable, "-I", "-c", source], input=case.get("stdin", ""), capture_output=True, text=True,
                                  timeout=node["timeout"], cwd=home, preexec_fn=limit,
                                  env={"HOME": home, "TMPDIR": home, "PATH": os.environ.get("PATH", "/usr/bin:/bin")})
        except subprocess.TimeoutExpired:
            return 0
    if tests:
        return 1 if done.returncode == 0 and done.stdout.rstrip().endswith(marker) else 0
    if done.returncode != 0:
        return 0
    return 1 if "expected" not in case or same_output(done.stdout, case["expected"]) else 0


def _code_tests(node, ctx):
    references = ctx.references or {}
    if node["tests"] not in references:
        raise _Invalid("code_tests %r: no references.%s (its test cases)" % (node["name"], node["tests"]))
    try:
        cases = read_cases(references[node["tests"]])
    except ValueError as e:
        raise _Invalid("code_tests %r: references.%s: %s" % (node["name"], node["tests"], e))
    program = extract_code(ctx.response or "")
    passed = sum(_run_case(program, case, node) for case in cases)
    if node["scoring"] == "fraction":
        return 2.0 * passed / len(cases) - 1.0
    return 1.0 if passed == len(cases) else -1.0


_KINDS["code_tests"] = _code_tests
'''


def code_tests_source() -> str:
    constants = (f"_FENCE = re.compile({ct._FENCE.pattern!r}, re.S)\n"
                 f"_PYTHON_TAGS = {ct._PYTHON_TAGS!r}\n")
    copied = "\n\n\n".join(_without_annotations(fn) for fn in (ct.extract_code, ct.read_cases, ct._text, ct.same_output))
    return constants + "\n\n" + copied + "\n" + _CODE_TESTS


_ENTRIES = {
    "evaluate": '''

def evaluate(example, response):
    """Vertex code-execution reward: the grader's score in [-1, 1]."""
    return _run(lambda: _vertex_context(example, response))
''',
    "grade": '''

def grade(sample, item):
    """OpenAI python grader: the grader's score, mapped to OpenAI's range as RESCALE says."""
    score = _run(lambda: _openai_context(sample, item))
    return (score + 1.0) / 2.0 if RESCALE else score
''',
    "lambda": '''

def lambda_handler(event, context):
    """AWS Bedrock / SageMaker RFT reward Lambda: the batch of samples AWS sends (a list; one object is
    taken as a batch of one), one record per sample, in order:
    {"id", "aggregate_reward_score", "metrics_list": [{"name", "value", "type": "Reward"}]}."""
    batch = event if isinstance(event, list) else [event]
    records = []
    for index, record in enumerate(batch):
        sample_id = record.get("id") if isinstance(record, dict) else None
        try:
            score = _run(lambda: _bedrock_context(record))
        except ValueError as e:
            raise ValueError("sample %d (id %r): %s" % (index, sample_id, e)) from None
        score = (score + 1.0) / 2.0 if RESCALE else score
        records.append({"id": sample_id, "aggregate_reward_score": score,
                        "metrics_list": [{"name": GRADER["name"], "value": score, "type": "Reward"}]})
    return records
''',
}


# ---- the grader as data -----------------------------------------------------------------------


def expressible(root: Node, entry: Entry) -> list[str]:
    """Why ``root`` cannot run inside a standalone file for ``entry`` (an empty list: it can)."""
    reasons = []
    for node in root.walk():
        if node.kind in ("llm", "autorater", "label_model", "score_model"):
            reasons.append(f"{node.where}: an LLM judge needs a model endpoint and credentials, which a standalone reward file "
                           "does not carry; serve this grader with `gradekit serve` instead" if entry == "lambda" else
                           f"{node.where}: an LLM judge needs network access, which the sandbox does not have")
        elif node.kind == "cloud_run":
            reasons.append(f"{node.where}: a Cloud Run reward is an HTTP call, which the sandbox cannot make")
        elif node.kind == "code_tests" and entry == "grade":
            reasons.append(f"{node.where}: code_tests starts a python subprocess per test case; OpenAI's python grader "
                           "does not document running subprocesses, so it is exported to Vertex's evaluate() only")
        elif node.kind in ("math_equivalence", "verified_answer"):
            where = {"lambda": "a Lambda", "grade": "OpenAI's python grader", "evaluate": "Vertex's code execution"}[entry]
            reasons.append(f"{node.where}: {node.kind} runs the math-verify library (with latex2sympy2_extended and its "
                           f"ANTLR parser, about 2 MB) in gradekit's checker workers; {where} does not install it and a "
                           "standalone reward file is the standard library only, so the check cannot run there; serve this "
                           "grader with `gradekit serve` instead (the reward server runs it)")
        elif node.kind == "text_similarity":
            reasons.append(f"{node.where}: text_similarity has no standalone form yet (export it to OpenAI, where it is native)")
        elif entry == "grade":
            reasons.extend(_openai_gaps(node))
        if node.kind in DETERMINISTIC:
            reasons.extend(f"{node.where}: uses {{{{{p}}}}}, which an exported file cannot read: it has the prompt, the "
                           "response, the system text, references and metadata, not the whole trajectory or OpenAI's "
                           "sample namespace" for p in _paths(node) if _unreadable(p))
    return reasons


def _part(path: str) -> str | None:
    """The sample part a placeholder path reads (None: an unknown path, the grader's own error)."""
    found = path_part(path)
    return None if found is None else found[0]


def _unreadable(path: str) -> bool:
    """A path gradekit reads but an exported file cannot."""
    return _part(path) not in (None, *FILE_PARTS)


def _paths(node: Node) -> list[str]:
    """The placeholder paths a node's templates use, each once, in order."""
    templates = [getattr(node.cfg, f, None) for f in ("expression", "input", "reference")]
    return list(dict.fromkeys(p for t in templates if isinstance(t, str) for p in placeholders(t)))


def _openai_gaps(node: Node) -> list[str]:
    """What OpenAI's ``grade(sample, item)`` does not receive: the prompt, the system text, metadata."""
    missing = sorted({p for p in _paths(node) if _part(p) in ("prompt", "system", "metadata")})
    reasons = [f"{node.where}: uses {{{{{p}}}}}, but OpenAI's grader sees only the sample and the item (the dataset row "
               "without its messages)" for p in missing]
    if node.kind == "python" and node.flavour == "vertex" and re.search(r"contents|systemInstruction|system_instruction", node.source or ""):
        reasons.append(f"{node.where}: evaluate() reads the example's contents or system instruction, which OpenAI's grader "
                       "does not receive")
    return reasons


class _Emitter:
    def __init__(self) -> None:
        self.sources: dict[str, str] = {}
        self.functions: list[str] = []
        self.code_tests = False

    def node(self, node: Node) -> dict[str, Any]:
        cfg = node.cfg
        data: dict[str, Any] = {"type": node.kind, "name": node.name}
        if node.kind in ("string_match", "json_match", "normalized_match", "numeric_match"):
            assert cfg is not None
            parse = cfg.parse  # type: ignore[attr-defined]
            data.update(expression=cfg.expression, parse={"type": parse.type, "regex": parse.regex},  # type: ignore[attr-defined]
                        correct=float(cfg.correct), wrong=float(cfg.wrong))  # type: ignore[attr-defined]
            if node.kind != "numeric_match":
                data["operation"] = cfg.operation  # type: ignore[attr-defined]
            if node.kind == "json_match":
                data["key"] = cfg.key  # type: ignore[attr-defined]
            if node.kind == "normalized_match":
                data["normalization"] = cfg.normalization.model_dump()  # type: ignore[attr-defined]
            if node.kind == "numeric_match":
                data.update(abs_tol=float(cfg.abs_tol), rel_tol=float(cfg.rel_tol))  # type: ignore[attr-defined]
        elif node.kind == "string_check":
            data.update(input=cfg.input, reference=cfg.reference, operation=cfg.operation)  # type: ignore[union-attr]
        elif node.kind == "python":
            key = node.name
            while key in self.sources:
                key += "_"
            self.sources[key] = node.source or ""
            data.update(source=key, flavour=node.flavour, entry=node.entry)
        elif node.kind == "code_tests":
            self.code_tests = True
            data.update(tests=cfg.tests, scoring=cfg.scoring, timeout=float(cfg.timeout), memory_mb=cfg.memory_mb)  # type: ignore[union-attr]
        elif node.kind == "weighted":
            data["parts"] = [[name, float(weight or 0.0), self.node(part)] for name, weight, part in node.parts]
        elif node.kind == "formula":
            function = f"_formula_{len(self.functions) + 1}"
            self.functions.append(formula_function(function, node.formula or "", [n for n, _, _ in node.parts]))
            data.update(function=function, parts=[[name, self.node(part)] for name, _, part in node.parts])
        else:  # expressible() reports these before emitting
            raise AssertionError(node.kind)
        return data


def formula_function(name: str, formula: str, names: list[str]) -> str:
    """A gradekit/OpenAI formula as a plain Python function of the part scores, as the composite computes it."""
    compile_formula(formula, names)  # the whitelist check; raises FormulaError
    symbols = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}

    def binary(op: type, left: str, right: str) -> str:
        # math.pow, as the composite: floats only, an overflow raises instead of building a huge int.
        return f"_pow({left}, {right})" if op is ast.Pow else f"({left} {symbols[op]} {right})"

    body = formula_text(formula, variable=lambda key: f"_s[{key!r}]", binary=binary, negate=lambda x: f"(-{x})",
                        call=lambda fn, args: f"float(_FN[{fn!r}]({', '.join(args)}))")
    return f"def {name}(_s):\n    # {formula.strip()}\n    return {body}\n"


def standalone_source(root: Node, *, entry: Entry, target: str, title: str, on_invalid: float | None = None,
                      rescale: bool = False) -> str:
    """The whole file for ``root``; ExportError when a node cannot run in a sandbox."""
    reasons = expressible(root, entry)
    if reasons:
        raise ExportError(target, reasons)
    if on_invalid is not None and not -1.0 <= on_invalid <= 1.0:
        raise ValueError(f"on_invalid must be a score in [-1, 1], got {on_invalid}")
    emitter = _Emitter()
    grader = emitter.node(root)
    signature = {"evaluate": "evaluate(example, response)", "grade": "grade(sample, item)",
                 "lambda": "lambda_handler(event, context)"}[entry]
    platform = "AWS" if entry == "lambda" else "OpenAI"
    mapping = ("Scores lie in [-1, 1], as gradekit's." if entry == "evaluate" else
               f"{platform} reward = (score + 1) / 2: gradekit's [-1, 1] mapped onto 0..1." if rescale else
               f"{platform} reward = gradekit score, unchanged (clamped to [-1, 1]).")
    lines = [
        f'"""{title}',
        "",
        f"Exported by gradekit: {signature}, standard library only. {mapping}",
        "An example the grader cannot grade (a missing reference, a python grader that failed) raises",
        "ValueError, unless ON_INVALID is a score to return instead.",
        '"""',
        "",
        "import asyncio",
        "import inspect",
        "import json",
        "import math",
        "import numbers",
        "import re",
        "import unicodedata",
        "from collections.abc import Mapping",
        "from decimal import Decimal",
        "from fractions import Fraction",
        "",
        f"ON_INVALID = {on_invalid!r}",
    ]
    if entry in ("grade", "lambda"):
        lines.append(f"RESCALE = {rescale!r}")
    if emitter.code_tests:
        lines[lines.index("import numbers"):lines.index("import numbers") + 1] = ["import numbers", "import os"]
        lines[lines.index("import re"):lines.index("import re") + 1] = ["import re", "import resource", "import subprocess", "import sys",
                                                                        "import tempfile"]
    text = "\n".join(lines) + "\n"
    text += _RUNTIME + "\n\n# ---- copied from gradekit's graders/_string_match.py and _sample.py " + "-" * 26 + "\n\n" + copied_source()
    if emitter.code_tests:
        text += "\n\n# ---- copied from gradekit's graders/_code_tests.py " + "-" * 42 + "\n\n" + code_tests_source()
    text += "\n\n# ---- the grader " + "-" * 78 + "\n\n"
    text += "SOURCES = " + pprint.pformat(emitter.sources, width=120, sort_dicts=False) + "\n\n"
    for function in emitter.functions:
        text += "\n" + function + "\n"
    text += "\nGRADER = " + pprint.pformat(grader, width=120, sort_dicts=False) + "\n"
    text += _ENTRIES[entry]
    return text
