"""Platforms: one grader as each RL platform expects it, in process or as an export.

Ark, verl, TRL, AReaL, SkyRL, verifiers/prime-rl and ROLL wrap a live grader in the function
each trainer calls; Vertex, OpenAI, Foundry and
Bedrock get an export of the grader's configuration (a standalone ``evaluate``, a
``reinforcementTuningSpec``, OpenAI/Foundry grader JSON, a reward ``lambda_function.py``), because their
graders run on the platform, not in this process. Over HTTP, the reward server is its own room:
``gradekit.graders.server``.
"""

from gradekit.judge._lazy import lazy_names

__all__, __getattr__, __dir__ = lazy_names(__name__, {
    "._ark": ["ark_group_grader", "ark_single_grader"],
    "._bedrock_export": ["export_bedrock_lambda"],
    "._common": ["GradingError"],
    "._foundry_export": ["export_foundry_grader"],
    "._nodes": ["ExportError"],
    "._openai_export": ["export_openai_grader"],
    "._skyrl": ["GradekitTextEnv"],
    "._step_rewards": ["GradekitStepEnv", "verifiers_step_reward_func"],
    "._trainers": ["AReaLReward", "ROLLRewards", "areal_reward_fn", "roll_rewards"],
    "._trl": ["trl_reward_func"],
    "._verifiers": ["VerifiersV1Reward", "verifiers_group_reward_func", "verifiers_reward_func", "verifiers_v1_group_reward",
                    "verifiers_v1_reward"],
    "._verl": ["VerlReward", "verl_compute_score"],
    "._vertex_export": ["export_vertex_evaluate", "export_vertex_spec"],
})
