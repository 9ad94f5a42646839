"""Engine flags the agent sets itself from a deployment, which `engine_options.extra_args` may not
give (the control plane refuses them when a model is saved, the launcher when it builds a command).

vLLM's parser (argparse with abbreviations allowed, `_` read as `-`) takes `--api-k X` for
`--api-key X` and the last of repeated flags, so an extra argument that is, or abbreviates, one of
these would make the engine listen where the gateway does not look, serve another name or model,
split over other devices, or refuse the gateway's engine key; `--config FILE` could set any of them
and `--uds` moves the server off its TCP port.
"""

from __future__ import annotations

from collections.abc import Iterable

AGENT_OWNED_FLAGS = (
    "--model",
    "--served-model-name",
    "--host",
    "--port",
    "--api-key",
    "--tensor-parallel-size",
    "--config",
    "--uds",
)
SHORT_OWNED = ("-tp",)  # vLLM's alias of --tensor-parallel-size


def owned_flags_in(args: Iterable[object]) -> list[str]:
    """The agent-owned flags that ``args`` give or abbreviate, sorted (empty: none)."""
    found: set[str] = set()
    for arg in args:
        name = str(arg).split("=", 1)[0].replace("_", "-")
        if name.startswith("--") and len(name) > 2:
            found.update(flag for flag in AGENT_OWNED_FLAGS if flag.startswith(name))
        elif name.startswith("-") and len(name) > 1:  # argparse abbreviates these too: -t for -tp
            found.update(flag for flag in SHORT_OWNED if flag.startswith(name) or name.startswith(flag))
    return sorted(found)
