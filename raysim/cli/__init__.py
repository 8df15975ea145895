"""``raysim run | tune | report``: parse arguments, dispatch, turn user errors into one line and exit code 2."""

from raysim.cli.common import (EXIT_INTERRUPTED, EXIT_STOPPED, EXIT_TERMINATED, EXIT_TRIALS_FAILED,
                               EXIT_USER_ERROR, RESUMABLE, check_resume_overrides)
from raysim.cli.dispatch import entry, main
from raysim.cli.parser import LIST_KINDS

__all__ = ["EXIT_INTERRUPTED", "EXIT_STOPPED", "EXIT_TERMINATED", "EXIT_TRIALS_FAILED", "EXIT_USER_ERROR",
           "LIST_KINDS", "RESUMABLE", "check_resume_overrides", "entry", "main"]
