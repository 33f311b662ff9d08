import sys

from infra.costrun.cli import main

sys.exit(main())
