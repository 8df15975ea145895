"""``python -m raysim.cli ...``: the ``raysim`` command."""

import sys

from raysim.cli.dispatch import entry

sys.exit(entry())
