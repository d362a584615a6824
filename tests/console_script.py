"""What the installed ``aioratelimit`` console script runs (the two lines pip writes for
``aioratelimit._cli:main``), for tests/test_cli.py to run in a fork of a warm interpreter
(tests/forkrun.py)."""

import sys

from aioratelimit._cli import main

sys.exit(main())
