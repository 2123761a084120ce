"""verl reward file: a gradekit grader as ``compute_score``.

    custom_reward_function.path=examples/adapters/verl_reward.py
    custom_reward_function.name=compute_score
    reward_model.reward_manager=batch      # optional: grades a whole batch concurrently (LLM graders)

``ground_truth`` fills ``{{references.answer}}`` (a dict ground truth is merged into the references);
``extra_info`` is metadata, and its ``question`` or ``prompt`` is the prompt an LLM rubric reads.
"""

from pathlib import Path

from gradekit.graders import verl_compute_score

GRADER = Path(__file__).resolve().parent.parent / "graders" / "math_answer.yaml"

# An example the grader cannot grade (no ground truth) scores -1 instead of stopping the step;
# a judge error after its retries would score 0 (this grader has no judge).
compute_score = verl_compute_score(GRADER, on_invalid=-1.0, on_error=0.0)
