"""Imports every built-in policy module so that each registers itself.

Add one import per policy module here.
"""

import serving.policies.aqua
import serving.policies.ecoserve  # noqa: F401
from serving.policies import fcfs  # noqa: F401
