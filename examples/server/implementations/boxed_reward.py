"""A grader-backed reward computer: subclass GraderRewardComputer to adapt what the platform sends.

Bailian's legacy data rows carry the answer as ``extra_params.solution``; the grader file reads
``references.answer``. ``to_sample`` bridges the two; everything else (status mapping, invalid
policy, closing the grader on shutdown) is inherited. Name it as
``reward.class: "implementations.boxed_reward:BoxedAnswerReward"``.
"""

from pathlib import Path

from gradekit.graders import GraderRewardComputer, RewardRequest, Sample, load_grader

GRADER = Path(__file__).resolve().parent.parent / "graders" / "boxed_answer.yaml"


class BoxedAnswerReward(GraderRewardComputer):
    def __init__(self) -> None:
        super().__init__(load_grader(GRADER), invalid="fail")

    def to_sample(self, request: RewardRequest) -> Sample:
        sample = super().to_sample(request)
        if "solution" in sample.references and "answer" not in sample.references:
            sample.references["answer"] = sample.references["solution"]
        return sample
