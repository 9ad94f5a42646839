"""Field validators for served models (shared by the model and the API)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from typing import Any

from django.core.exceptions import ValidationError

from core import strict_json
from gpu_agent.config import MAX_SIM_RATE
from gpu_agent.engines.owned_flags import owned_flags_in
from serving.costmodel.config import MODEL_CONFIGS
from serving.costmodel.gpus import GPU_SPECS


def validate_power_of_two(value: int) -> None:
    """Tensor-parallel sizes split attention heads evenly: 1, 2, 4, 8, ..."""
    if value < 1 or value & (value - 1):
        raise ValidationError(f"{value} is not a power of two >= 1 (1, 2, 4, 8, ...).")


def validate_positive(value: float) -> None:
    if not value > 0:
        raise ValidationError(f"{value} must be positive.")


def validate_percentage(value: float) -> None:
    if not 0 < value <= 100:
        raise ValidationError(f"{value} must be in (0, 100].")


INT64_MAX = 2**63 - 1  # the engine's integer arguments end in C (torch, the CPU KV cache allocator)
SEED_MAX = 2**32 - 1  # vLLM seeds numpy too (set_random_seed), and np.random.seed refuses more


def _int(minimum: int, maximum: int = INT64_MAX) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        ok = isinstance(v, int) and not isinstance(v, bool) and minimum <= v <= maximum
        return None if ok else f"an integer from {minimum} to {maximum}"

    return check


def _bool(v: Any) -> str | None:
    return None if isinstance(v, bool) else "true or false"


def _fraction(v: Any) -> str | None:
    ok = isinstance(v, int | float) and not isinstance(v, bool) and 0 < v <= 1
    return None if ok else "a number in (0, 1]"


def _positive_number(v: Any) -> str | None:
    ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v > 0
    return None if ok else "a positive number"


def _sim_rate(v: Any) -> str | None:
    """The simulated agent's rate: as its own --sim-rate, at most MAX_SIM_RATE (a larger one made
    its simulated engine fail at start, out of memory for the arrivals)."""
    ok = _positive_number(v) is None and v <= MAX_SIM_RATE
    return None if ok else f"a positive number of requests/s up to {MAX_SIM_RATE:g}"


def _strings(v: Any) -> str | None:
    return None if isinstance(v, list) and all(isinstance(a, str) for a in v) else "a list of strings"


def _engine_args(v: Any) -> str | None:
    if _strings(v) is not None:
        return "a list of strings"
    owned = owned_flags_in(v)  # would break what the agent sets (gpu_agent/engines/owned_flags.py)
    if owned:
        return f"a list of strings without {', '.join(owned)} (the agent sets those from the deployment)"
    return None


def _object(v: Any) -> str | None:
    return None if isinstance(v, dict) else "a JSON object"


def _one_of(known: Iterable[str], what: str) -> Callable[[Any], str | None]:
    names = sorted(known)

    def check(v: Any) -> str | None:
        return None if isinstance(v, str) and v in names else f"a {what} (one of {', '.join(names)})"

    return check


# The options the GPU agent's engine launcher (gpu_agent/engines/command.py), the simulated agent
# (gpu_agent/simulated.py) and the profiler (planning/profiling.py) read, and what each must be.
# Checked here because a bad value would otherwise only fail on the host, when the engine starts.
# sim_model and sim_gpu name the cost-model presets (serving/costmodel) a simulator `profile` job
# uses for the model when the job names none (planning/profiling.py); sim_rate is the simulated
# agent's request rate for the model.
ENGINE_OPTIONS: dict[str, Callable[[Any], str | None]] = {
    "seed": _int(0, SEED_MAX),
    "enforce_eager": _bool,
    "max_num_seqs": _int(1),
    "kv_cache_bytes": _int(1),
    "gpu_memory_utilization": _fraction,
    "cpu_kvcache_space_gib": _int(1),
    "cpu_threads": _int(1),
    "aqua": _bool,
    "aqua_options": _object,
    "extra_args": _engine_args,
    "sim_model": _one_of(MODEL_CONFIGS, "cost-model preset model"),
    "sim_gpu": _one_of(GPU_SPECS, "cost-model preset GPU"),
    "sim_rate": _sim_rate,
}


def validate_engine_options(value: Any) -> None:
    """Engine options are a JSON object of the known options (ENGINE_OPTIONS), each of its type."""
    if not isinstance(value, dict):
        raise ValidationError("Engine options must be a JSON object.")
    # Checked first: PostgreSQL's jsonb refuses both (saving them was a 500), and the messages
    # below name the keys as given, which a response could not encode with a lone surrogate.
    if _holds_unstorable(value):
        raise ValidationError(
            "Engine options must not contain a NUL character (\\u0000) or a lone surrogate "
            "(\\ud800 to \\udfff, half of a UTF-16 pair) in a key or string."
        )
    unknown = sorted(str(key) for key in value if key not in ENGINE_OPTIONS)
    if unknown:
        raise ValidationError(
            f"Unknown engine option(s): {', '.join(unknown)}. Known: {', '.join(sorted(ENGINE_OPTIONS))}."
        )
    errors = []
    for key, option in value.items():
        expected = ENGINE_OPTIONS[key](option)
        if expected is not None:
            errors.append(f"{key} must be {expected}, not {option!r}.")
    if errors:
        raise ValidationError(" ".join(errors))


# What no jsonb string can hold: NUL, and a surrogate code point. JSON's "\ud800" escape without
# its pair decodes to one (a pair decodes to the one character it encodes); PostgreSQL refuses it
# ("Unicode low surrogate must follow a high surrogate"), and SQLite stored it.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def _holds_unstorable(value: Any) -> bool:
    """Whether a JSON value has a string (a key or a value, at any depth) holding a NUL or a
    lone surrogate (`_UNSTORABLE`)."""
    return any(_UNSTORABLE.search(text) for text in strict_json.json_strings(value))
