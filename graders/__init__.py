"""gradekit's graders: everything that turns samples into rewards, built on the judge core.

A grader is an async callable ``grade(sample) -> Grade``; factories build them from Python or
from a YAML/JSON config (``load_grader``). Aggregates are pure functions over lists of grades.
"""

from ._adapters import (
    ExportError,
    GradingError,
    VerlReward,
    ark_group_grader,
    export_openai_grader,
    export_vertex_evaluate,
    export_vertex_spec,
    trl_reward_func,
    verl_compute_score,
)
from ._batch import RunSummary, grade_file
from ._calibration import (
    CalibrationReport,
    CorrelationReport,
    FileCalibration,
    Interval,
    JudgeAgreementReport,
    PairwiseReport,
    calibrate,
    calibrate_rows,
    correlations,
    judge_agreement,
    majority_vote,
    mean_vote,
    pairwise_report,
    plot_confusion,
    plot_position_bias,
    plot_scores,
)
from ._composite import CompositeGrader, FormulaError, formula_grader, weighted_grader
from ._config import ConfiguredGrader, GraderConfigError, load_grader, load_group_grader
from ._frame import agrade_frame, grade_frame
from ._group import GroupResult, GroupStatus, SampleChecks, TrajectoryChecks, group_grader
from ._llm import autorater_grader, llm_grader
from ._pairwise import PairVerdict, PairwiseRunSummary, grade_pairwise_file, pairwise_grader
from ._probes import Probe, ProbeReport, answer_listing, instruction_injection, position_swap, run_probes, verbosity
from ._provider_batch import BatchRunError, grade_file_batch
from ._python import PythonGrader, python_grader
from ._sample import (
    FunctionCall,
    Grade,
    Grader,
    Message,
    Sample,
    SyncGrader,
    ToolCall,
    Trajectory,
    aclose_grader,
    sample_from_row,
    sample_from_vertex,
)
from ._server import BaseRewardComputer, GraderRewardComputer, RewardRequest, RewardResponse
from ._spread import SpreadReport, SpreadTally, reward_spread
from ._string_match import (
    Normalization,
    ParseConfig,
    json_match_grader,
    normalized_match_grader,
    numeric_match_grader,
    string_check_grader,
    string_match_grader,
)
from ._vertex import VertexSpec, cloud_run_grader, dump_vertex_spec, parse_vertex_spec, vertex_grader

__all__ = [
    "BaseRewardComputer",
    "BatchRunError",
    "CalibrationReport",
    "CompositeGrader",
    "ConfiguredGrader",
    "CorrelationReport",
    "ExportError",
    "FileCalibration",
    "FormulaError",
    "FunctionCall",
    "Grade",
    "Grader",
    "GraderConfigError",
    "GraderRewardComputer",
    "GradingError",
    "GroupResult",
    "GroupStatus",
    "Interval",
    "JudgeAgreementReport",
    "Message",
    "Normalization",
    "PairVerdict",
    "PairwiseReport",
    "PairwiseRunSummary",
    "ParseConfig",
    "Probe",
    "ProbeReport",
    "PythonGrader",
    "RewardRequest",
    "RewardResponse",
    "RewardServer",
    "RunSummary",
    "Sample",
    "SampleChecks",
    "SpreadReport",
    "SpreadTally",
    "SyncGrader",
    "ToolCall",
    "Trajectory",
    "TrajectoryChecks",
    "VerlReward",
    "VertexSpec",
    "aclose_grader",
    "agrade_frame",
    "answer_listing",
    "ark_group_grader",
    "autorater_grader",
    "calibrate",
    "calibrate_rows",
    "cloud_run_grader",
    "correlations",
    "create_app",
    "dump_vertex_spec",
    "export_openai_grader",
    "export_vertex_evaluate",
    "export_vertex_spec",
    "formula_grader",
    "grade_file",
    "grade_file_batch",
    "grade_frame",
    "grade_pairwise_file",
    "group_grader",
    "instruction_injection",
    "json_match_grader",
    "judge_agreement",
    "llm_grader",
    "load_grader",
    "load_group_grader",
    "majority_vote",
    "mean_vote",
    "normalized_match_grader",
    "numeric_match_grader",
    "pairwise_grader",
    "pairwise_report",
    "parse_vertex_spec",
    "plot_confusion",
    "plot_position_bias",
    "plot_scores",
    "position_swap",
    "python_grader",
    "reward_spread",
    "run_probes",
    "sample_from_row",
    "sample_from_vertex",
    "string_check_grader",
    "string_match_grader",
    "trl_reward_func",
    "verbosity",
    "verl_compute_score",
    "vertex_grader",
    "weighted_grader",
]


def __getattr__(name: str) -> object:
    """The reward server's app and runner load FastAPI and uvicorn: only when asked for."""
    if name in ("RewardServer", "create_app"):
        from . import _server

        return getattr(_server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
