import sys

from infra.preflight.cli import main

sys.exit(main())
