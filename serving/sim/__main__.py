"""Entry point of `python -m serving.sim` (see serving/sim/cli.py)."""

from serving.sim.cli import main

raise SystemExit(main())
