"""A custom reward computer (Bailian's example, seed 001): longer responses score higher.

Name it in configs/config.yaml as ``reward.class: "implementations.length_reward:LengthRewardComputer"``.
``compute_reward`` is a plain ``def``, so the server runs it on its thread pool (blocking is fine).
"""

from gradekit.graders import BaseRewardComputer, RewardRequest, RewardResponse


class LengthRewardComputer(BaseRewardComputer):
    def compute_reward(self, request: RewardRequest) -> RewardResponse:
        try:
            response_length = len(request.response)
            if response_length > 100:
                score = 0.9
            elif response_length > 50:
                score = 0.7
            else:
                score = 0.5
            custom_param = request.extra_params.get("custom_param", "default")
            return RewardResponse(score=score, status="success",
                                  extra_info={"response_length": response_length, "custom_param": custom_param})
        except Exception as e:  # a failure is status "fail" with the reason, never a made-up score
            return RewardResponse(status="fail", detail=f"Error in compute_reward: {e}")

    def health_check(self) -> dict:
        return {"status": "healthy", "message": "Length reward computer is healthy"}
