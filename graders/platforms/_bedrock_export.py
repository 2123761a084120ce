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

Deterministic graders only, standard library only (the file is the deployment package); an LLM
judge needs a model and credentials the file does not carry: serve such a grader with
``gradekit serve`` instead. A sample the grader cannot grade raises (the invocation fails, naming
the sample) unless ``on_invalid`` gives its score: never a made-up reward.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._nodes import read_tree
from ._standalone import standalone_source

TARGET = "an AWS Bedrock reward Lambda"
ConfigSource = str | Path | Mapping[str, Any]


def export_bedrock_lambda(config: ConfigSource, *, on_invalid: float | None = None, rescale: bool = False) -> str:
    """A deterministic grader config as the source of ``lambda_function.py`` (handler ``lambda_function.lambda_handler``).

    Args:
        config: a grader config file or mapping (string/JSON/normalised/numeric match, string_check,
            python, code_tests, weighted, formula, or a Vertex spec of those).
        on_invalid: the score of a sample the grader cannot grade; None (the default) fails the invocation.
        rescale: report ``(score + 1) / 2`` (gradekit's [-1, 1] onto 0..1) instead of the score.

    Raises:
        ExportError: a part needs a judge model or the network (llm, autorater, label_model, score_model, Cloud Run).
    """
    tree = read_tree(config, TARGET)
    return standalone_source(tree.root, entry="lambda", target=TARGET, on_invalid=on_invalid, rescale=rescale,
                             title=f"AWS Bedrock / SageMaker RFT reward Lambda: {tree.root.name} (from {tree.source}).")
