"""The reward server: one grader behind the HTTP contracts of Bailian, DashScope, Vertex Cloud Run and OpenRLHF.

The app and the runner (FastAPI, uvicorn) load on first use: a reward class imports
BaseRewardComputer without paying for the web stack, and so does every other gradekit command.
"""

from typing import Any

from ._computers import BaseRewardComputer, GraderRewardComputer
from ._config import ServerConfig, ServerConfigError, build_computer, load_server_config
from ._models import RewardRequest, RewardResponse


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from ._app import create_app

        return create_app
    if name == "RewardServer":
        from ._run import RewardServer

        return RewardServer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "BaseRewardComputer",
    "GraderRewardComputer",
    "RewardRequest",
    "RewardResponse",
    "RewardServer",
    "ServerConfig",
    "ServerConfigError",
    "build_computer",
    "create_app",
    "load_server_config",
]
