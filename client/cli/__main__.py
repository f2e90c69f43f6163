"""`python -m bashfleet.client.cli`: the `bashfleet` command."""

import os
import sys

from bashfleet.client.cli import main

# Guarded: importing every module of the package (the installed-package check does)
# must not run the command.
if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
