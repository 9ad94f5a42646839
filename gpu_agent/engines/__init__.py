"""vLLM engine processes: command lines, supervision, metrics scraping and log files."""

from gpu_agent.engines.command import EngineConfigError, LaunchSpec, VllmLauncher
from gpu_agent.engines.manager import EngineManager
from gpu_agent.engines.supervisor import EngineSupervisor

__all__ = ["EngineConfigError", "EngineManager", "EngineSupervisor", "LaunchSpec", "VllmLauncher"]
