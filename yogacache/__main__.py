"""``python -m yogacache``: the command-line interface."""

import sys

from yogacache.cli import main

sys.exit(main())
