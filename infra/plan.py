"""``python -m infra.plan``: the planner's command line (``infra.planner``) under a short name."""

import sys

from infra.planner.cli import main

if __name__ == "__main__":
    sys.exit(main())
