"""Imports every built-in policy module so that each registers itself.

Add one import per policy module here.
"""

from serving.policies import fcfs  # noqa: F401
