import sys

from infra.stage.cli import main

sys.exit(main())
