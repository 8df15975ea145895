"""Ctrl-C and SIGTERM in the process of ``raysim run``, ``raysim run --seeds`` and ``raysim tune``.

SIGTERM is how batch schedulers and clouds take a machine back (Slurm's ``--signal`` or time limit, Kubernetes,
spot instances), with SIGKILL after a grace period of typically 30-60 s. raysim answers it as it answers Ctrl-C:

- the first signal asks the work in flight to stop (:func:`graceful`): a run finishes its round, checkpoints it and
  ends; a sweep has Ray Tune stop its trials (each keeps its last checkpoint) and save its state;
- after SIGTERM that stop gets :func:`grace_s` seconds (10, or the environment variable ``RAYSIM_TERM_GRACE_S``);
  past them the round in flight is abandoned and the command ends from the checkpoint already on disk, which is
  whole (every file is replaced atomically, ``server.pt`` last, so a write cut short leaves the previous one);
- a second signal abandons at once; a signal before any work is under way (setup) ends at once too, and one
  while Ray starts as soon as Ray is up (:func:`deferred`).

The command then prints one line with the resume command and exits 130 after Ctrl-C, 143 (128 + SIGTERM) after
SIGTERM. ``ray.init`` installs its own SIGTERM handlers in this process (a Python one that exits, and a C++ one that
prints a stack dump on the terminal first): while it runs (:func:`deferred`) Ray's Python handler is never put in
place and a first signal is held until Ray is up; raysim's handlers are put back right after, and the held signal
then ends the command as above (exit 143 or 130, with the resume line).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Any, Callable, Iterator, Optional

TERM_GRACE_S = 10.0  # seconds the round in flight gets to finish after SIGTERM before it is abandoned
EXIT_INTERRUPTED = 130  # 128 + SIGINT
EXIT_TERMINATED = 143  # 128 + SIGTERM


class Terminated(KeyboardInterrupt):
    """SIGTERM ended the command before its work could stop gracefully (the round in flight was abandoned)."""


class _Handling:
    """The command's handlers, what the first signal stops, and which signal came first."""

    def __init__(self) -> None:
        self.active = False
        self.received: Optional[int] = None
        self.abandoned = ""  # why the work in flight was abandoned rather than stopped gracefully
        self.stops: list[tuple[Callable[[], bool], str]] = []  # (stop, what it stops), innermost last
        self.previous: dict[int, Any] = {}
        self.deferring = 0  # > 0 while a block runs that must not be interrupted by the first signal (Ray starting)
        self.pending = False  # the first signal came while deferring: it interrupts when the block ends


_HANDLING = _Handling()
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGALRM)


def grace_s() -> float:
    """Seconds the work in flight gets after SIGTERM: ``RAYSIM_TERM_GRACE_S`` when set (a scheduler with a shorter
    or longer grace period than the usual 30-60 s), else :data:`TERM_GRACE_S`."""
    try:
        value = float(os.environ.get("RAYSIM_TERM_GRACE_S", TERM_GRACE_S))
    except ValueError:
        return TERM_GRACE_S
    return value if value > 0 else TERM_GRACE_S


def handling() -> bool:
    """Whether raysim's handlers are in place in this thread's process (inside :func:`handled`, main thread)."""
    return _HANDLING.active and threading.current_thread() is threading.main_thread()


def received() -> Optional[int]:
    """The first stop signal this command received (``signal.SIGINT`` or ``signal.SIGTERM``), or None."""
    return _HANDLING.received


def terminated() -> bool:
    """Whether SIGTERM came: the command exits 143."""
    return _HANDLING.received == signal.SIGTERM


def exit_status() -> int:
    return EXIT_TERMINATED if terminated() else EXIT_INTERRUPTED


def abandoned() -> str:
    """Why the work in flight was abandoned instead of stopped gracefully ("" when it was not): Ray's ``ray.get``
    turns the exception a signal handler raises into a bare KeyboardInterrupt, so the reason is kept here."""
    return _HANDLING.abandoned


def _interrupt(reason: str) -> KeyboardInterrupt:
    _HANDLING.abandoned = reason
    return Terminated(reason) if terminated() else KeyboardInterrupt(reason)


def _disarm() -> None:
    signal.setitimer(signal.ITIMER_REAL, 0)


def _on_signal(signum: int, frame: Any) -> None:
    h = _HANDLING
    if h.received is not None:  # a second signal: stop now
        if signum == signal.SIGTERM:
            h.received = signal.SIGTERM
        _disarm()
        raise _interrupt("a second signal")
    h.received = signum
    if h.deferring:  # Ray is starting: end once it has (a second signal ends at once)
        h.pending = True
        return
    if not (h.stops and h.stops[-1][0]()):
        raise _interrupt("")  # nothing under way that could stop gracefully: stop now
    acknowledge(signum, h.stops[-1][1])
    if signum == signal.SIGTERM:
        signal.setitimer(signal.ITIMER_REAL, grace_s())


def acknowledge(signum: int, what: str) -> None:
    """One line at once on stderr, so that the first signal is seen to be taken while the round finishes (written
    with ``os.write``: safe in a signal handler; a live progress line is erased first on a terminal)."""
    if signum == signal.SIGTERM:
        line = f"raysim: got SIGTERM: finishing {what} (at most {grace_s():g} s), then checkpointing"
    else:
        line = f"raysim: Ctrl-C: finishing {what}, then checkpointing (Ctrl-C again stops at once)"
    try:
        erase = "\r\033[K" if os.isatty(2) else ""
        os.write(2, f"{erase}{line}\n".encode())
    except OSError:
        pass


def _on_deadline(signum: int, frame: Any) -> None:
    what = _HANDLING.stops[-1][1] if _HANDLING.stops else "the work in flight"
    raise _interrupt(f"{what} did not end within {grace_s():g} s")


def _install() -> None:
    for sig in _SIGNALS:
        signal.signal(sig, _on_deadline if sig == signal.SIGALRM else _on_signal)


@contextlib.contextmanager
def handled() -> Iterator[None]:
    """Answer SIGINT and SIGTERM as described above while the block runs (a command's whole life). Only the main
    thread can install signal handlers: elsewhere this does nothing."""
    h = _HANDLING
    if h.active or threading.current_thread() is not threading.main_thread():
        yield
        return
    h.active, h.received, h.abandoned, h.stops, h.deferring, h.pending = True, None, "", [], 0, False
    h.previous = {sig: signal.getsignal(sig) for sig in _SIGNALS}
    _install()
    try:
        yield
    finally:
        _disarm()
        for sig, previous in h.previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        h.active = False


def reclaim() -> None:
    """Put raysim's handlers back after ``ray.init`` replaced them (a no-op outside :func:`handled`)."""
    if _HANDLING.active and threading.current_thread() is threading.main_thread():
        _install()


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Around ``ray.init``: the first Ctrl-C or SIGTERM meanwhile does not interrupt Ray halfway through its start
    (which would leave its processes behind); it is held, and interrupts as soon as the block ends. A second signal
    interrupts at once. Whatever handlers the block installed (``ray.init`` installs Ray's), raysim's are put back
    at its end. A no-op outside :func:`handled`."""
    h = _HANDLING
    if not h.active or threading.current_thread() is not threading.main_thread():
        yield
        return
    h.deferring += 1
    try:
        yield
    finally:
        h.deferring -= 1
        _install()
    if not h.deferring and h.pending:
        h.pending = False
        if not (h.stops and h.stops[-1][0]()):
            raise _interrupt("")


@contextlib.contextmanager
def graceful(stop: Callable[[], Any], what: str = "the round in flight") -> Iterator[None]:
    """While the block runs, the first signal calls ``stop()`` (which asks the work to stop soon and returns True,
    or returns False when it cannot, and the signal then interrupts at once) instead of interrupting; ``what`` names
    that work in the line printed when it does not end in time. On leaving the block the SIGTERM deadline is
    disarmed: what follows (ending Ray) has bounds of its own."""
    h = _HANDLING
    if not h.active or threading.current_thread() is not threading.main_thread():
        yield
        return

    def asked() -> bool:
        return stop() is not False

    entry = (asked, what)
    h.stops.append(entry)
    try:
        if h.received is not None:  # the signal came while this was being set up: stop it as soon as it starts
            if not asked():
                raise _interrupt("")
        yield
    finally:
        h.stops.remove(entry)
        if not h.stops:
            _disarm()


def quiet_exit_on_sigterm() -> None:
    """In a Ray worker process of raysim's (a Tune trial's, a ClientWorker, a trial's host): when Ray ends the
    process, Ray's SIGTERM handler raises ``SystemExit(1)``; if that lands inside a weakref callback or a
    finaliser, Python prints it as "Exception ignored in ... Traceback", which Ray forwards to the user's terminal
    (9 lines after a successful sweep). An exit is not an error: this process drops such reports and leaves every
    other one to Python's default hook."""
    import sys

    default = sys.unraisablehook
    if getattr(default, "drops_sigterm_exits", False):  # a process that runs several trials installs it once
        return

    def hook(report: Any) -> None:
        if not isinstance(report.exc_value, SystemExit):
            default(report)

    hook.drops_sigterm_exits = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook
