"""``python -m yogacache.cli``: the command-line interface, as ``python -m yogacache``."""

import sys

from yogacache.cli import main

sys.exit(main())
