"""AWS Bedrock / SageMaker reinforcement fine-tuning: a grader config as a self-contained reward Lambda.

The file defines ``lambda_handler(event, context)``: ``event`` is the batch AWS sends, a list of
``{"id", "messages": [..., {"role": "assistant", "content": <the model's answer>}], "metadata":
{"reference_answer": ..., <other dataset fields>}}`` (the dataset fields may also sit at the top
level, as Nova's page shows); it returns ``[{"id", "aggregate_reward_score", "metrics_list":
[{"name", "value", "type": "Reward"}]}]``, one record per sample, in order. Sources: "Setting up
reward functions for open-weight models" (docs.aws.amazon.com/bedrock/latest/userguide/
reward-functions-open-weight.html), SageMaker's "Reinforcement fine-tuning (RFT) for Amazon Nova
models" and "Implementing reward functions" (docs.aws.amazon.com/sagemaker/latest/dg/
nova-implementing-reward-functions.html). RFT there is text only (Nova's page: "Multimodal inputs
are not supported for RFT"), so no image reaches the reward.

Deterministic graders run inside the file, standard library only (the file is the deployment
package). A grader with an LLM judge needs a model and credentials the file does not carry: with
``endpoint`` the file forwards each sample to ``gradekit serve``'s ``POST /grade`` (Foundry's
endpoint-grader shape: ``{"sample", "item", "trace_id"}`` -> ``{"score"}``) instead, in parallel,
and the server grades it with the judge. A sample the grader cannot grade, or one the server
failed (a judge error), raises: the invocation fails naming the sample (AWS's retry of a failed
invocation is not documented), unless ``on_invalid`` gives an ungradable sample's score. Never a
made-up reward.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._foundry_export import EndpointGrader, endpoint_url
from ._nodes import ExportError, read_tree
from ._standalone import standalone_source

TARGET = "an AWS Bedrock reward Lambda"
ConfigSource = str | Path | Mapping[str, Any]


def export_bedrock_lambda(config: ConfigSource, *, on_invalid: float | None = None, rescale: bool = False, endpoint: str | None = None,
                          headers: Mapping[str, str] | None = None) -> str:
    """A grader config as the source of ``lambda_function.py`` (handler ``lambda_function.lambda_handler``).

    Args:
        config: a grader config file or mapping (string/JSON/normalised/numeric match, string_check,
            python, code_tests, weighted, formula, or a Vertex spec of those, run in the file; any
            grader with ``endpoint``).
        on_invalid: the score of a sample the grader cannot grade; None (the default) fails the invocation.
        rescale: report ``(score + 1) / 2`` (gradekit's [-1, 1] onto 0..1) instead of the score.
        endpoint: gradekit serve's URL (``https://host`` gets ``/grade``): the file forwards every
            sample there instead of grading it itself. ``headers`` go with each request as written.

    Raises:
        ExportError: without ``endpoint``, a part needs a judge model or the network (the message names ``--endpoint-url``).
    """
    tree = read_tree(config, TARGET)
    if endpoint is not None:
        try:
            url = EndpointGrader(url=endpoint_url(endpoint)).url
        except ValueError as e:
            raise ExportError(TARGET, [f"endpoint: {e}"]) from None
        return _forwarder(tree.root.name, tree.source, url, dict(headers or {}), on_invalid=on_invalid, rescale=rescale)
    try:
        return standalone_source(tree.root, entry="lambda", target=TARGET, on_invalid=on_invalid, rescale=rescale,
                                 title=f"AWS Bedrock / SageMaker RFT reward Lambda: {tree.root.name} (from {tree.source}).")
    except ExportError as e:
        if any("gradekit serve" in r for r in e.reasons):
            raise ExportError(TARGET, [*e.reasons, "or pass `endpoint` https://your-host: the Lambda then forwards each "
                                                   "sample to `gradekit serve` (POST /grade), which grades it with the judge"]) from None
        raise


def _forwarder(name: str, source: str, url: str, headers: dict[str, str], *, on_invalid: float | None, rescale: bool) -> str:
    if on_invalid is not None and not -1.0 <= on_invalid <= 1.0:
        raise ValueError(f"on_invalid must be a score in [-1, 1], got {on_invalid}")
    head = (f'"""AWS Bedrock / SageMaker RFT reward Lambda: {name} (from {source}), graded by gradekit serve.\n\n'
            "Exported by gradekit: lambda_handler(event, context), standard library only. Each sample is sent to\n"
            "ENDPOINT (gradekit serve's POST /grade) as {sample, item, trace_id}; the reply's score is the reward.\n"
            "A sample the server cannot grade (HTTP 422) raises unless ON_INVALID is a score; a judge error\n"
            '(HTTP 502) or an unreachable server always raises: the invocation fails, naming the sample.\n"""\n\n')
    settings = (f"ENDPOINT = {url!r}\nHEADERS = {headers!r}\nNAME = {name!r}\nON_INVALID = {on_invalid!r}\nRESCALE = {rescale!r}\n"
                "TIMEOUT_S = 600  # Foundry's endpoint-grader limit too; Lambda itself stops at its own timeout (max 15 min)\n"
                "WORKERS = 16  # samples of one batch in flight at once\n")
    return head + _FORWARDER_IMPORTS + settings + _FORWARDER


_FORWARDER_IMPORTS = """import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

"""

_FORWARDER = r'''

def _text(content):
    if isinstance(content, list):
        return "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return "" if content is None else str(content)


def _request(record):
    """Foundry's endpoint-grader body for one Bedrock sample: the answer is the last (assistant) message."""
    if not isinstance(record, dict):
        raise ValueError("each sample must be an object ({'id', 'messages', 'metadata'}), got %s" % type(record).__name__)
    messages = [m for m in record.get("messages") or [] if isinstance(m, dict)]
    if not messages or messages[-1].get("role") != "assistant":
        return None
    fields = dict((k, v) for k, v in record.items() if k not in ("id", "messages", "metadata"))
    if isinstance(record.get("metadata"), dict):
        fields.update(record["metadata"])
    item = dict(fields)
    if isinstance(fields.get("reference_answer"), dict):
        item.update(fields["reference_answer"])
        item["reference_answer"] = fields["reference_answer"]
    elif fields.get("reference_answer") is not None:
        # The one reference rule (docs/platforms.md): a plain value also goes under "answer", which it wins.
        item["answer"] = fields["reference_answer"]
    item["messages"] = messages[:-1]
    final = messages[-1]
    sample = {"output_text": _text(final.get("content")), "choices": [{"index": 0, "message": final, "finish_reason": "stop"}]}
    return {"sample": sample, "item": item, "trace_id": "trace_%s" % record.get("id")}


def _score(index, record):
    sample_id = record.get("id") if isinstance(record, dict) else None
    where = "sample %d (id %r)" % (index, sample_id)
    body = _request(record)
    if body is None:
        if ON_INVALID is None:
            raise ValueError("%s: the last message is not the model's answer (an assistant turn)" % where)
        return sample_id, float(ON_INVALID), {}
    request = urllib.request.Request(ENDPOINT, data=json.dumps(body).encode("utf-8"), method="POST",
                                     headers=dict({"Content-Type": "application/json"}, **HEADERS))
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            reply = json.loads(response.read())
            metrics = reply.get("metrics") if isinstance(reply.get("metrics"), dict) else {}  # a checklist's criteria
            return sample_id, float(reply["score"]), metrics
    except urllib.error.HTTPError as e:
        said = e.read().decode("utf-8", "replace")[:500]
        if e.code == 422 and ON_INVALID is not None:
            return sample_id, float(ON_INVALID), {}
        raise RuntimeError("%s: %s answered HTTP %d: %s" % (where, ENDPOINT, e.code, said)) from None
    except (urllib.error.URLError, OSError, ValueError, KeyError) as e:
        raise RuntimeError("%s: no score from %s: %s" % (where, ENDPOINT, e)) from None


def lambda_handler(event, context):
    """AWS Bedrock / SageMaker RFT reward Lambda: the batch of samples AWS sends (a list; one object is
    taken as a batch of one), one record per sample, in order:
    {"id", "aggregate_reward_score", "metrics_list": [{"name", "value", "type": "Reward"}]}."""
    batch = event if isinstance(event, list) else [event]
    with ThreadPoolExecutor(max_workers=max(1, min(WORKERS, len(batch)))) as pool:
        scores = list(pool.map(_score, range(len(batch)), batch))
    records = []
    for sample_id, score, metrics in scores:
        score = (score + 1.0) / 2.0 if RESCALE else score
        # A checklist grader's criteria (part.criteria.<id>, as gradekit serve names them) beside the reward.
        extra = [{"name": k, "value": float(v), "type": "Metric"} for k, v in sorted(metrics.items())]
        records.append({"id": sample_id, "aggregate_reward_score": score,
                        "metrics_list": [{"name": NAME, "value": score, "type": "Reward"}] + extra})
    return records
'''
