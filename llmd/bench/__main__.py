"""`python -m llmd.bench`: the same as `llmd bench`."""

import sys

from llmd.bench.command import main

if __name__ == "__main__":
    sys.exit(main())
