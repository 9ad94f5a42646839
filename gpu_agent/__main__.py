"""`python -m gpu_agent --control-plane URL --token TOKEN` (see gpu_agent/cli.py)."""

import sys

from gpu_agent.cli import main

if __name__ == "__main__":
    sys.exit(main())
