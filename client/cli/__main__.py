"""`python -m bashfleet.client.cli`: the `bashfleet` command."""

import os
import sys

from bashfleet.client.cli import main

os.environ.setdefault("PYTHONUNBUFFERED", "1")
sys.exit(main())
