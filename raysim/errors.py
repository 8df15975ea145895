"""The one exception type that means "the user must change something".

The CLI turns it into a one-line message and exit code 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """A mistake the user can fix: bad config, missing data, impossible resources, bad files."""


class RunStopped(Exception):
    """The run stopped on purpose before its last round (non-finite update, retries exhausted).

    The last complete round's checkpoint is on disk; the message says why and how to resume.
    """


class OutOfMemory(RunStopped):
    """A job ran out of (GPU or host) memory: the run stops with its last checkpoint kept (a round-0 one when no
    round completed, so it can be resumed with a smaller share); the message names the job and what to change."""


class NotOnCPU(TypeError):
    """A tensor on a device was about to enter Ray's object store or a checkpoint, which hold CPU tensors only (the
    engine moves what leaves a job to the CPU, so this is a tensor that escaped that path)."""


def find_user_error(exc: BaseException) -> UserError | RunStopped | None:
    """Dig a UserError/RunStopped out of Ray's wrappers (RayTaskError chains keep the cause)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        cause = getattr(exc, "cause", None)  # ray.exceptions.RayTaskError keeps the original here
        if isinstance(cause, BaseException):
            exc = cause
            continue
        if isinstance(exc, (UserError, RunStopped)):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None
