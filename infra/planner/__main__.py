"""``python -m infra.planner``: choose and price a cluster for a model on every provider."""

import sys

from infra.planner.cli import main

sys.exit(main())
