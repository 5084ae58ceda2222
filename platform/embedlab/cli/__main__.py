"""`python -m embedlab.cli ...`: the `embedlab` command, as the installed script runs it."""

import sys

from embedlab.cli import main

if __name__ == "__main__":
    sys.exit(main())
