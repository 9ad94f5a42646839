"""Framework-free serving core: workloads, cost model, simulator, policies, Aqua, placement.

Nothing under this package may import Django, DRF, Channels or Celery: the same code runs in the
simulator, inside vLLM engine processes and in the control plane's jobs.
"""
