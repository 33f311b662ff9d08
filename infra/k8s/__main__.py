"""``python -m infra.k8s``: the same as ``lrc k8s``."""

import sys

from infra.k8s.cli import main

sys.exit(main())
