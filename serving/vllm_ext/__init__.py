"""Plug-ins for an unmodified vLLM 0.32 (V1 engine): the Aqua scheduler (`scheduler_cls`) and the
Aqua KV offload connector (`kv_connector_module_path`). Imported inside vLLM's engine processes.

vLLM configures only its own `vllm` logger, so the plug-ins' `serving.*` records at INFO (the
policy in use, lent regions allocated and given back) never reached the engine's log. Here the
`serving` logger gets a handler that hands its records to the `vllm` logger's handlers (as they
are when the record is emitted: vLLM may configure logging after this import), at INFO unless a
level was set. Where vLLM's logging is not configured, WARNING and above still reach stderr.
"""

from __future__ import annotations

import logging


class _ThroughVllm(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        handlers = logging.getLogger("vllm").handlers
        for handler in handlers:
            if record.levelno >= handler.level:
                handler.handle(record)
        last = logging.lastResort
        if not handlers and not logging.getLogger().handlers and last and record.levelno >= last.level:
            last.handle(record)


def _log_through_vllm() -> None:
    ours = logging.getLogger("serving")
    if any(isinstance(h, _ThroughVllm) for h in ours.handlers):
        return
    ours.addHandler(_ThroughVllm())
    if ours.level == logging.NOTSET:
        ours.setLevel(logging.INFO)


_log_through_vllm()
