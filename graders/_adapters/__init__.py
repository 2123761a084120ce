"""In-process platform adapters: one grader as Ark, verl, TRL, Vertex and OpenAI expect it.

Ark, verl and TRL wrap a live grader in the function each trainer calls; Vertex and OpenAI get
an export of the grader's configuration (a standalone ``evaluate``, a ``reinforcementTuningSpec``,
OpenAI grader JSON), because their graders run on the platform, not in this process.
"""

from ._ark import ark_group_grader
from ._common import GradingError
from ._nodes import ExportError
from ._openai_export import export_openai_grader
from ._trl import trl_reward_func
from ._verl import VerlReward, verl_compute_score
from ._vertex_export import export_vertex_evaluate, export_vertex_spec

__all__ = [
    "ExportError",
    "GradingError",
    "VerlReward",
    "ark_group_grader",
    "export_openai_grader",
    "export_vertex_evaluate",
    "export_vertex_spec",
    "trl_reward_func",
    "verl_compute_score",
]
