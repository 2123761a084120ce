"""gradekit's graders: everything that turns samples into rewards, built on the judge core.

A grader is an async callable ``grade(sample) -> Grade``; factories build them from Python or
from a YAML/JSON config (``load_grader``). Aggregates are pure functions over lists of grades.

The package reads as the flow: the graders themselves are its own modules; ``runs`` grades
files and DataFrames; ``grading`` is the library door for a whole run (``grade``), which picks one; ``calibration`` checks a judge against human labels; ``platforms`` serves
a grader to RL platforms (adapters, exports) and ``server`` over HTTP (the reward server); ``sandbox`` runs untrusted code
(graded programs and python graders); ``cli`` is the command line.
Names load on first use, so ``gradekit --help`` imports none of pandas, openai or FastAPI.
"""

from gradekit.judge._lazy import lazy_names

__all__, __getattr__, __dir__ = lazy_names(__name__, {
    "._atif": ["TrajectoryError", "trajectory_messages"],
    "._code_tests": ["CodeTestsGrader", "code_tests_grader"],
    "._composite": ["CompositeGrader", "FormulaError", "formula_grader", "weighted_grader"],
    "._config": ["ConfiguredGrader", "GraderConfigError", "load_grader", "load_group_grader"],
    "._group": ["GroupResult", "GroupStatus", "SampleChecks", "TrajectoryChecks", "group_grader"],
    "._math_equivalence": ["MathEquivalenceGrader", "math_equivalence_grader"],
    "._math_verify": ["MathCheck", "MathVerifier"],
    "._llm": ["autorater_grader", "label_model_grader", "llm_grader", "score_model_grader"],
    "._pairwise": ["PairVerdict", "pairwise_grader"],
    "._pairwise_group": ["pairwise_group_grader"],
    "._python": ["PythonGrader", "python_grader"],
    "._reward_model": ["RewardModelGrader", "reward_model_grader"],
    "._sample": ["FunctionCall", "Grade", "Grader", "Message", "Sample", "SyncGrader", "ToolCall", "Trajectory",
                 "aclose_grader", "sample_from_row", "sample_from_vertex"],
    "._spread": ["SpreadReport", "SpreadTally", "reward_spread"],
    "._string_match": ["Normalization", "ParseConfig", "json_match_grader", "normalized_match_grader", "numeric_match_grader",
                       "string_check_grader", "string_match_grader"],
    "._text_similarity": ["text_similarity_grader"],
    "._vertex": ["VertexSpec", "cloud_run_grader", "dump_vertex_spec", "parse_vertex_spec", "vertex_grader"],
    ".calibration": ["CalibrationReport", "CorrelationReport", "FileCalibration", "Interval", "JudgeAgreementReport",
                     "MetaEvalReport", "PPIReport", "PairwiseReport", "Probe",
                     "ProbeReport", "answer_listing", "calibrate", "calibrate_rows", "correlations", "grade_pairwise_file",
                     "instruction_injection", "judge_agreement", "load_suite", "majority_vote", "master_keys", "mean_vote",
                     "meta_eval", "pairwise_report", "plot_confusion", "plot_position_bias", "plot_scores",
                     "position_swap", "ppi_mean", "run_probes", "verbosity"],
    ".platforms": ["ExportError", "GradingError", "VerlReward", "ark_group_grader", "ark_single_grader",
                   "export_bedrock_lambda", "export_foundry_grader", "export_openai_grader",
                   "export_vertex_evaluate", "export_vertex_spec", "trl_reward_func", "verl_compute_score",
                   "AReaLReward", "GradekitTextEnv", "ROLLRewards", "areal_reward_fn", "roll_rewards",
                   "VerifiersV1Reward", "verifiers_group_reward_func", "verifiers_reward_func", "verifiers_v1_group_reward",
                   "verifiers_v1_reward", "GradekitStepEnv", "verifiers_step_reward_func"],
    ".grading": ["GradeError", "GradePlan", "GradeRun", "agrade", "grade"],
    ".runs": ["BatchRunError", "BreakerTripped", "InputError", "PairwiseRunSummary", "RunSummary", "agrade_frame", "grade_dataset", "grade_file", "grade_file_batch",
              "grade_frame"],
    ".sandbox": ["Isolation", "SandboxUnavailable", "SandboxWarning"],
    ".server": ["BaseRewardComputer", "GraderRewardComputer", "RewardRequest", "RewardResponse", "RewardServer", "create_app"],
})
