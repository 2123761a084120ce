"""Calibration: can the judge be trusted? Agreement with human labels, pairwise judging, LLMBar, probes.

``_agreement`` holds the statistics (pure functions over lists, pydantic reports, plots);
``_pairwise`` grades a labelled file of pairs (the pairwise run, ``runs._pairwise``, whose pairs
``graders._pairwise`` judges in both orders under a pair rule) with Acc and Agr; ``_llmbar`` reproduces the
LLMBar paper's figures from its recorded judge outputs; ``_suites`` and ``_meta_eval`` score a
judge on labelled pairwise suites beside the published judges; ``_ppi`` turns a few human labels
plus many judge scores into an estimate with an honest interval (weighted by the labels' draw
probabilities when they were drawn actively); ``_labels`` is the human labels store (one fsynced
JSONL line per act) and the active order rows are offered in; ``_probes`` perturbs inputs to catch a
judge that rewards length, listings, injected instructions, content-free openers or position;
``_align`` makes a rubric agree better with human labels and certifies it on held-out ones;
``_judging`` reads a labelled set and judges it under a breaker (shared by cascade fit and align).
"""

from gradekit.judge._lazy import lazy_names

__all__, __getattr__, __dir__ = lazy_names(__name__, {
    "._align": ["AlignReport", "align"],
    "._agreement": ["CalibrationReport", "CorrelationReport", "FileCalibration", "Interval", "JudgeAgreementReport",
                    "PairwiseReport", "calibrate", "calibrate_rows", "correlations", "judge_agreement", "majority_vote",
                    "mean_vote", "pairwise_report", "plot_confusion", "plot_position_bias", "plot_scores"],
    "._llmbar": ["LLMBarRun", "RescoredRun", "llmbar_published", "llmbar_root", "load_llmbar", "rescore_llmbar",
                 "suite_replay_responder"],
    "._meta_eval": ["MetaEvalReport", "MetaEvalRow", "meta_eval", "plot_meta_eval"],
    "._pairwise": ["grade_pairwise_file"],
    "gradekit.graders._pairwise": ["PairVerdict", "pairwise_grader"],  # the pair judging sits with the grader kinds
    "gradekit.graders.runs._pairwise": ["PairwiseRunSummary"],  # the pairwise run's record
    "._labels": ["LabelState", "LabelStore", "LabelsError", "draw_probabilities", "read_labels", "uncertainty"],
    "._ppi": ["PPIReport", "ppi_mean", "ppi_mean_active", "ppi_rows"],
    "._probes": ["MASTER_KEYS", "Probe", "ProbeReport", "answer_listing", "instruction_injection", "master_key", "master_keys",
                 "position_swap", "run_probes", "verbosity"],
    "._suites": ["Suite", "SuitePair", "load_suite"],
})
