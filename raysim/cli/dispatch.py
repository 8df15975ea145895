"""``raysim``'s entry point: parse, dispatch to the verb, turn user errors into one line and exit code 2."""

from __future__ import annotations

import gc
import sys
from pathlib import Path
from typing import Optional, Sequence

import raysim.interrupts as interrupts
from raysim.cli.common import _RUN_DIR, EXIT_STOPPED, EXIT_USER_ERROR, _interrupted, _resume_hint
from raysim.cli.info import _cmd_config, _cmd_data, _cmd_list
from raysim.cli.parser import _parser
from raysim.cli.report import _cmd_report
from raysim.cli.run import _cmd_run, _cmd_seeds, _is_seeds
from raysim.cli.tune import _cmd_tune
from raysim.errors import RunStopped, UserError, find_user_error


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # overrides after an option (`run CONFIG --seeds 0-4 rounds=3`): argparse leaves them over
        if not hasattr(args, "overrides") or any(e.startswith("-") or "=" not in e for e in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = list(args.overrides) + extra
    _RUN_DIR.clear()  # a run directory of an earlier main() in this process (the API's, a test's) is not this one's
    with interrupts.handled():  # Ctrl-C and SIGTERM: finish the round, checkpoint, one line, exit 130 / 143
        try:
            if args.command == "run":
                return _cmd_seeds(args) if _is_seeds(args) else _cmd_run(args)
            if args.command == "tune":
                return _cmd_tune(args)
            if args.command == "report":
                return _cmd_report(args)
            if args.command == "config":
                return _cmd_config(args)
            if args.command == "list":
                return _cmd_list(args)
            if args.command == "data":
                return _cmd_data(args)
        except KeyboardInterrupt as exc:  # a second signal, SIGTERM's grace period over, or nothing to stop gently
            print(f"raysim: {_interrupted()}{_resume_hint(exc, say_round=True)}", file=sys.stderr)
            return interrupts.exit_status()
        except BaseException as exc:  # noqa: BLE001 - anything that is not the user's to fix is re-raised
            found = find_user_error(exc)
            if isinstance(found, UserError):
                print(f"raysim: error: {found}{_removed_run_dir()}", file=sys.stderr)
                return EXIT_USER_ERROR
            if isinstance(found, RunStopped):
                print(f"raysim: stopped: {found}{_resume_hint(found)}", file=sys.stderr)
                return EXIT_STOPPED
            if _removed_run_dir():
                print(f"raysim: the run failed{_removed_run_dir()}", file=sys.stderr)
            raise
    return 0


def _removed_run_dir() -> str:
    """" (...removed...)" when this `raysim run` announced a run directory that is gone: the run failed before it
    completed a round, and the runner removed what it had begun (nothing half-written stays on disk)."""
    if _RUN_DIR and not Path(_RUN_DIR[0]).exists():
        return f" ({_RUN_DIR[0]} was removed: no round completed, so there is nothing to resume or report)"
    return ""


def entry() -> int:
    """The ``raysim`` command: ``main()``, then a faster exit. With torch loaded, the interpreter's final garbage
    collection walks every torch object for ~0.7 s; frozen objects are skipped (atexit handlers still run)."""
    code = main()
    gc.freeze()
    return code

