"""Writing a file so that a reader (or a kill) sees the old file or the new one, never half of one; and the one
line a failed write to a run directory stops a run with (:func:`run_dir_write`).

Each caller says whether the new file must also survive a power cut (``fsync=True``: run state and results a
resumed run or sweep depends on) or only a killed process (``fsync=False``: caches, which are rebuilt when lost).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from pathlib import Path
from typing import IO, Iterator

from raysim.errors import RunStopped


class WriteFailed(RunStopped):
    """Writing the run directory failed (a full disk): the run stops; the checkpoint on disk is whole."""


@contextlib.contextmanager
def run_dir_write(run_dir: Path, what: str, checkpointed: int) -> Iterator[None]:
    """A failed write to the run directory (a full disk, a quota, a lost mount) stops the run in one line,
    :class:`WriteFailed`, naming the round whose checkpoint is on disk.

    The checkpoint is replaced atomically and metrics beyond it are trimmed on resume, so nothing is lost."""
    try:
        yield
    except WriteFailed:
        raise
    except (OSError, RuntimeError) as exc:  # torch.save reports a failed write as a RuntimeError
        if isinstance(exc, OSError):
            reason = exc.strerror or str(exc)
        else:
            free = shutil.disk_usage(run_dir).free if run_dir.is_dir() else 0
            reason = (f"No space left on device ({free} bytes free)" if free < 16 * 1024 * 1024
                      else f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        then = ", then resume" if checkpointed else " first"
        raise WriteFailed(f"cannot write {what} in {run_dir}: {reason}; {run_stopped(checkpointed)} (free some "
                          f"space{then})") from None


def run_stopped(checkpointed: int) -> str:
    """"the run stopped with round N checkpointed", or, before round 1's checkpoint, "the run stopped" (the command's
    own line then says that no round was checkpointed)."""
    return f"the run stopped with round {checkpointed} checkpointed" if checkpointed else "the run stopped"


@contextlib.contextmanager
def atomic_writer(path: Path, *, fsync: bool, text: bool = False) -> Iterator[IO]:
    """Yield a temporary file next to ``path``; when the block ends without error, flush it (fsync if asked) and
    rename it over ``path``. The temporary name is unique, so concurrent writers (Tune trials filling one cache)
    never write into one another's file; on an error it is removed and ``path`` is untouched."""
    path = Path(path)
    # not mkstemp: its files are private (0600); this one gets the umask's permissions, like any file opened to write
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w" if text else "wb", **({"newline": ""} if text else {})) as fh:
            yield fh
            fh.flush()
            if fsync:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: Path, data: bytes, *, fsync: bool) -> None:
    """``data`` into ``path`` through :func:`atomic_writer`."""
    with atomic_writer(path, fsync=fsync) as fh:
        fh.write(data)


def atomic_write_text(path: Path, text: str, *, fsync: bool) -> None:
    """``text`` into ``path`` (newlines as given) through :func:`atomic_writer`."""
    with atomic_writer(path, fsync=fsync, text=True) as fh:
        fh.write(text)
