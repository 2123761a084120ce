"""Ark RL plugin file (plugins/gradekit_grader.py): a gradekit group grader as ``@group_grader``.

In the pipeline: ``custom_rl_pipeline.graders[].plugin.python_func: "plugins.gradekit_grader:search_grader"``.
The judge is configured by environment variables (OPENAI_BASE_URL, OPENAI_API_KEY, GRADEKIT_MODEL):
set them in the plugin's ``envs``.

Statuses: every trajectory graded -> SUCCESS; no ``extra.answer`` -> DISCARD (rewards=[]);
a judge error after its retries -> RETRY (the config's on_judge_error); a crash -> FAILURE.
"""

from pathlib import Path

from ark_sdk.resources.pipeline_plugin import group_grader
from ark_sdk.types.pipeline_plugin import PluginInstance, Runtime

from gradekit.graders import ark_group_grader

CONFIG = Path(__file__).resolve().parent / "search_agent_group.yaml"  # copy of examples/graders/search_agent_group.yaml

search_grader = group_grader(
    name="gradekit_search_grader",
    description="seed 000's search-agent grader: trajectory checks, then a semantic-equivalence judge",
    runtime=Runtime(instance=PluginInstance.CPU1MEM2, max_concurrency=32, timeout=900),
)(ark_group_grader(CONFIG))
