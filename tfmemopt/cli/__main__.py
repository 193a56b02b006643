"""`python -m tfmemopt.cli ...` runs the `tfmemopt` command."""

import sys

from tfmemopt.cli import main

sys.exit(main())
