"""One raysim process per run (or sweep) directory: an exclusive ``flock`` on ``DIR/.raysim.lock``, held while it runs.

The kernel drops the lock when its holder exits, however it exits (SIGKILL, OOM, power loss of a local disk), so a
lock file left behind by a killed run never blocks ``--resume``. The file stays in the directory (removing it would
let two processes lock two different files); it holds the holder's pid, host and command, for the refusal message.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Optional

from raysim.errors import UserError

LOCK_NAME = ".raysim.lock"


class DirLock:
    """``with DirLock(path, key='log.dir'):`` or ``acquire()`` / ``release()``; refuses at once unless told to wait."""

    def __init__(self, directory: Path, key: str = "log.dir"):
        self.directory = Path(directory)
        self.key = key
        self._fd: Optional[int] = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, wait_s: float = 0.0) -> "DirLock":
        """Claim the directory; ``wait_s``: how long a holder may take to end first (a Tune trial restarted after its
        node was lost waits for the lost attempt's processes, which Ray ends shortly after, to let go)."""
        path = self.directory / LOCK_NAME
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise UserError(f"config key '{self.key}': cannot create {path} ({exc.strerror})") from None
        deadline = time.monotonic() + wait_s
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK) or time.monotonic() >= deadline:
                        raise
                    time.sleep(0.2)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):  # a filesystem without locks
                print(f"raysim: warning: cannot lock {path} ({exc.strerror}); nothing stops a second process "
                      f"from using {self.directory} at the same time", file=sys.stderr, flush=True)
                self._fd = fd
                return self
            holder = _describe(fd)
            os.close(fd)
            raise UserError(f"{self.directory} is in use by another raysim process{holder}; wait for it to end "
                            f"(or stop it), or choose another {self.key}") from None
        try:  # who holds it, for the message another process prints; a full disk only loses the description
            os.ftruncate(fd, 0)
            info = {"pid": os.getpid(), "host": socket.gethostname(),
                    "since": datetime.datetime.now().isoformat(timespec="seconds"),
                    "command": " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv))}
            os.pwrite(fd, json.dumps(info).encode(), 0)
        except OSError:
            pass
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    def __enter__(self) -> "DirLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _describe(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        return ""
    if not isinstance(info, dict) or "pid" not in info:
        return ""
    return f" (pid {info['pid']} on {info.get('host', '?')}, since {info.get('since', '?')})"
