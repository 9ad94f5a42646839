"""Per-host GPU agent: inventory, engine supervision, the host Aqua coordinator and the link to the
control plane. Framework-free (no Django); `gpu_agent.protocol` is shared with the control plane."""

__version__ = "0.1.0"
