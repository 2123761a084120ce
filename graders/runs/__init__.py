"""Runs: a grader or rubric over a file or a DataFrame, streamed in order, resumable.

Every input row gets exactly one output row. ``_record`` fills a run's record (cost at the price table,
a jury's or cascade's block), as the library door (graders/grading) returns it. A front door resolves its input once and hands the
streaming runner (``_file``) one plan (``_plan``); the runner reads rows (``_io``), maps them to
samples (``_rows``), keeps a resume checkpoint (``_checkpoint``), holds
the output's lock (``_lock``), and can send its requests through the provider's Batch API
instead (``_provider_batch``). ``_pairwise`` grades a file of pairs, both orders each. pandas
users get the same path in memory (``_frame``); ``_cassette`` records and replays judge traffic.
On a Ray cluster (``_ray``) actors (``_ray_worker``) judge the rows the same loop reads and
writes; ``_ray_dataset`` adds grade columns to a user's own Ray Data pipeline. ``_drift`` counts
the rows each served model and fingerprint answered; ``_canary`` checks, as a run goes, that the
judge it started with is still the one answering.
"""

from gradekit.judge._lazy import lazy_names

__all__, __getattr__, __dir__ = lazy_names(__name__, {
    "._canary": ["Canary"],
    "._file": ["BreakerTripped", "grade_file", "grade_file_with"],
    "._frame": ["agrade_frame", "grade_frame"],
    "._io": ["InputError"],
    "._pairwise": ["PairwiseRunSummary"],
    "._provider_batch": ["BatchRunError", "grade_file_batch"],
    "._record": ["RunSummary"],
    "._ray_dataset": ["grade_dataset"],
})
