"""The library door for a run: ``grade(input, output, GradePlan(...))``, the call `gradekit grade` makes.

It sits above the engines it chooses among: the rubric, grader-config and Batch API runs
(``runs``), the pairwise run (``calibration``) and the Ray run; the run's record is filled by
``runs._record``. ``_grade`` holds the plan, the result and the choice.
"""

from gradekit.judge._lazy import lazy_names

__all__, __getattr__, __dir__ = lazy_names(__name__, {
    "._grade": ["GradeError", "GradePlan", "GradeRun", "agrade", "grade"],
})
