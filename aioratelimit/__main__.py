"""``python -m aioratelimit``: the same as the ``aioratelimit`` command."""

import sys

from ._cli.main import main

if __name__ == "__main__":
    sys.exit(main())
