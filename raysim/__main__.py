"""``python -m raysim ...`` is the ``raysim`` command."""

import sys

from raysim.cli import entry

sys.exit(entry())
