"""Plug-ins for an unmodified vLLM 0.32 (V1 engine): the Aqua scheduler (`scheduler_cls`) and the
Aqua KV offload connector (`kv_connector_module_path`). Imported inside vLLM's engine processes."""
