"""The reward server: one grader behind the HTTP contracts of Bailian, DashScope, Vertex Cloud Run and OpenRLHF."""

from ._app import create_app
from ._computers import BaseRewardComputer, GraderRewardComputer
from ._config import ServerConfig, ServerConfigError, build_computer, load_server_config
from ._models import RewardRequest, RewardResponse
from ._run import RewardServer

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
