"""``python -m patterns.jobqueue``: see `patterns.jobqueue.cli` for the commands and exit codes."""

import sys

from patterns.jobqueue.cli import main

sys.exit(main())
