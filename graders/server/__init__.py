"""The reward server: one grader behind the HTTP contracts of Bailian, DashScope, Vertex Cloud Run, OpenRLHF and Foundry.

Names load on first use: a reward class imports BaseRewardComputer without paying for the web
stack (FastAPI, uvicorn load with ``create_app`` / ``RewardServer``), and so does every other
gradekit command.
"""

from gradekit.judge._lazy import lazy_names

__all__, __getattr__, __dir__ = lazy_names(__name__, {
    "._app": ["create_app"],
    "._computers": ["BaseRewardComputer", "GraderRewardComputer"],
    "._config": ["ServerConfig", "ServerConfigError", "build_computer", "load_server_config"],
    "._models": ["RewardRequest", "RewardResponse"],
    "._run": ["RewardServer"],
})
