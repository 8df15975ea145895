"""Several seeds at once on one machine: this process and a few more, each running seed after seed in process.

``raysim run --seeds`` with in-process runs uses one process per core it may use (``inprocess.seeds_at_once``):
the command's own, and helpers it starts, each of which imports torch and raysim once, says it is ready and then
runs the seeds it is handed one after another, exactly as a seed runs in the command's process
(``seedrun.run_one_seed``), so the numbers are the same. The command's own process takes the first seed at once;
helpers start only when the work left is worth their start (:func:`helpers_worth_it`, from the pace of the first
rounds), so a set of short runs runs as it would in one process and a set of long runs keeps every core busy; a
seed goes to whichever process is free first. The command prints the progress every process reports and writes the
table, as for a seed set run in its own process.

The helpers speak JSON lines, never pickle: the command writes ``{"seed": n}`` (run it) or ``{"stop": true}``
(finish the round in flight, checkpoint it, take no other seed) to a helper's stdin; the helper writes
``{"seed": n, "event": ..., "row": {...}}`` to a pipe of its own (its stdout and stderr are the command's: a bug's
traceback reaches the terminal as it would in process). Ctrl-C and SIGTERM are the command's to answer: the
helpers ignore them (a terminal's Ctrl-C reaches the whole process group), and the command asks each process,
its own run included, to stop; a helper whose command is gone (its stdin closed) ends at once, its last checkpoint
whole.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import subprocess
import sys
import threading
import time
from collections import deque
from typing import Any, Callable, Optional

import raysim.interrupts as interrupts
from raysim.tune.seedrun import DONE, ENDED_BEFORE, FAILED, STOPPED, run_one_seed
from raysim.tune.trials import TrialSetup

HELPER_WORTH = 1.5  # start helpers once the work left in this process exceeds this many of its own start (0: at once)
HELPER_START_S = 1.0  # a helper's start counts as at least this (a fresh Python importing torch: 1-2 s quiet)
_ENDED = (DONE, FAILED, ENDED_BEFORE)  # the seed is over (STOPPED: Ctrl-C; checkpointed, unfinished)


class _SeedProcess:
    """One process of the pool: hands it seeds, reads what it reports."""

    def __init__(self, setup: TrialSetup) -> None:
        read, write = os.pipe()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(_import_path()))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "raysim.tune.seedpool", str(write)], stdin=subprocess.PIPE, pass_fds=(write,),
            env=env, text=True, bufsize=1)
        os.close(write)
        self.events = read  # the pipe it reports on (read in whole chunks: see lines())
        self._partial = b""
        self.seed: Optional[int] = None  # the seed it runs now
        self._send({"setup": {"base": setup.base, "fixed": list(setup.fixed), "trials_dir": setup.trials_dir,
                              "cwd": setup.cwd, "naming": setup.naming}})

    def run(self, seed: int) -> None:
        self.seed = seed
        self._send({"seed": seed})

    def stop(self) -> None:
        self._send({"stop": True})

    def lines(self) -> Optional[list[dict]]:
        """The messages that arrived (the pipe was readable); None: the process ended."""
        chunk = os.read(self.events, 1 << 16)
        if not chunk:
            return None
        *whole, self._partial = (self._partial + chunk).split(b"\n")
        return [json.loads(line) for line in whole if line.strip()]

    def _send(self, message: dict) -> None:
        with contextlib.suppress(OSError, ValueError):  # a process that died: its pipe's end tells the pool
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(message) + "\n")
            self.proc.stdin.flush()

    def end(self, kill: bool) -> None:
        """Close its stdin (it ends once its seed does) and wait; ``kill``: end it now."""
        if kill and self.proc.poll() is None:
            self.proc.kill()
        with contextlib.suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        with contextlib.suppress(OSError):
            os.close(self.events)


def _import_path() -> list[str]:
    """What the processes need on their import path: this process's own additions (where raysim and the
    plugins were found) first, then the inherited ``PYTHONPATH``."""
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    prefixes = tuple({sys.prefix, sys.base_prefix, os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix)})
    own = [os.path.abspath(p) for p in sys.path if p and not p.startswith(prefixes) and os.path.isdir(p)]
    return list(dict.fromkeys(own + inherited))


def run_seed_pool(setup: TrialSetup, seeds: list[int], processes: int, rounds: int,
                  tell: Callable[[int, str, dict], None]) -> None:
    """Run ``seeds`` (of ``rounds`` rounds each) in this process and up to ``processes - 1`` helpers;
    ``tell(seed, event, row)`` hears what ``seedrun.run_one_seed`` tells. The first Ctrl-C or SIGTERM asks every
    process to finish its round and stop (no seed more starts); a second one, or SIGTERM's grace period over, ends
    them at once (raised as KeyboardInterrupt). Called from this process's main thread, which runs its own seeds; a
    thread serves the helpers.

    Helpers start once the work left is worth a start: when this process's own runs, at the pace of their rounds
    so far, have more than :data:`HELPER_WORTH` times what this process took to start its first run (importing
    torch and raysim, building the data: what a helper pays too; at least :data:`HELPER_START_S`) still to do.
    A set of short runs (a smoke test) runs whole in this process, as fast as it would without helpers; a set of
    long runs gets every core after its first round."""
    lock = threading.RLock()  # the queue, the helpers and the console: this thread and the helpers' thread
    waiting = deque(seeds)
    stopping, closing, go = threading.Event(), threading.Event(), threading.Event()
    own: dict[str, Any] = {"control": None}  # the run in this process, once started
    helpers: list[_SeedProcess] = []
    failures: list[BaseException] = []
    began = time.monotonic()
    pace: dict[str, float] = {}  # this process's: start cost (to its first run's start), its run's start

    def told(seed: int, event: str, row: dict) -> None:
        with lock:
            tell(seed, event, row)

    def told_here(seed: int, event: str, row: dict) -> None:
        told(seed, event, row)
        now = time.monotonic()
        if event == "started":  # a helper starts as this process did, cold; this one may have been warm already
            pace.setdefault("start_cost", max(now - began, HELPER_START_S))
            pace["run_began"], pace["from"] = now, 0
        elif event == "result" and not go.is_set() and row.get("round"):
            per_round = (now - pace["run_began"]) / max(1, int(row["round"]) - int(pace.get("from", 0)))
            with lock:
                if helpers_worth_it(pace["start_cost"], per_round, rounds - int(row["round"]), len(waiting),
                                    rounds):
                    go.set()

    def next_seed() -> Optional[int]:
        with lock:
            return waiting.popleft() if waiting and not stopping.is_set() else None

    def stop() -> bool:
        stopping.set()
        with lock:
            if own["control"] is not None:
                own["control"].request_stop()
            for helper in helpers:
                if helper.seed is not None:
                    helper.stop()
        return True

    def on_start(info: dict) -> None:
        pace["from"] = info["start_round"]  # a resumed run's rounds count from its checkpoint
        with lock:
            own["control"] = info["control"]
            if stopping.is_set():
                info["control"].request_stop()

    thread = threading.Thread(target=_serve_helpers, name="raysim-seed-helpers", daemon=True,
                              args=(setup, processes - 1, helpers, lock, next_seed, lambda: bool(waiting), told,
                                    stopping, closing, go, failures))
    if HELPER_WORTH <= 0:
        go.set()
    killed = True
    try:
        with interrupts.graceful(stop, "the seeds' rounds in flight"):
            thread.start()
            while (seed := next_seed()) is not None:
                run_one_seed(setup, seed, lambda event, row, seed=seed: told_here(seed, event, row),
                             handle_signals=False, on_start=on_start)
                with lock:
                    own["control"] = None
            if not go.is_set():
                closing.set()  # no helper started: none is needed now
            while thread.is_alive():  # the helpers' last seeds (joined in steps: a signal must get through)
                thread.join(0.2)
        killed = False
    finally:
        stopping.set()
        closing.set()
        thread.join(5)
        with lock:
            for helper in helpers:
                helper.end(kill=killed)
    if failures:
        raise failures[0]


def helpers_worth_it(start_cost: float, per_round: float, rounds_left: int, seeds_waiting: int, rounds: int) -> bool:
    """Whether helpers are worth starting: seeds are waiting, and the work left here (the rounds left of this
    process's run and of every waiting seed, at this run's seconds a round) exceeds :data:`HELPER_WORTH` times what
    this process took to start its first run (what a helper pays before its first round)."""
    return seeds_waiting > 0 and per_round * (rounds_left + rounds * seeds_waiting) > HELPER_WORTH * start_cost


def _serve_helpers(setup: TrialSetup, count: int, helpers: list[_SeedProcess], lock: threading.RLock,
                   next_seed: Callable[[], Optional[int]], seeds_left: Callable[[], bool],
                   told: Callable[[int, str, dict], None], stopping: threading.Event, closing: threading.Event,
                   go: threading.Event, failures: list[BaseException]) -> None:
    """Once ``go`` is set, start ``count`` helpers, hand each a seed whenever it is ready or free, relay what they
    report; return once every helper is idle with no seed left (or the command is closing). A helper that ends
    mid-seed fails that seed in one line, and a fresh one takes its place while seeds are left."""
    from raysim.tune.trials import _record_error

    selector = selectors.DefaultSelector()

    def start() -> None:
        helper = _SeedProcess(setup)
        selector.register(helper.events, selectors.EVENT_READ, helper)
        with lock:
            helpers.append(helper)

    def hand_out(helper: _SeedProcess) -> None:
        seed = next_seed()
        if seed is not None:
            helper.run(seed)

    try:
        while not go.wait(0.2):
            if closing.is_set() or stopping.is_set():
                return
        for _ in range(count):
            if seeds_left():
                start()
        while not closing.is_set():
            with lock:
                busy = any(h.seed is not None for h in helpers)
            if not busy and (stopping.is_set() or not seeds_left()):
                return  # helpers still starting are ended by the command
            for key, _ in selector.select(timeout=0.5):
                helper = key.data
                messages = helper.lines()
                if messages is None:  # the helper ended (killed, out of memory): its seed failed
                    selector.unregister(helper.events)
                    with lock:
                        helpers.remove(helper)
                    helper.end(kill=True)
                    if helper.seed is not None:
                        _record_error(setup.run_dir({"seed": helper.seed}, f"seed-{helper.seed}"),
                                      RuntimeError(f"the process running it {_how_it_ended(helper.proc)}"))
                        told(helper.seed, FAILED, {})
                        if not stopping.is_set():
                            start()  # a fresh helper for the seeds left
                    continue
                for message in messages:
                    if message["event"] == "ready":
                        hand_out(helper)
                        continue
                    told(message["seed"], message["event"], message.get("row") or {})
                    if message["event"] in _ENDED or message["event"] == STOPPED:
                        helper.seed = None
                        hand_out(helper)
    except BaseException as exc:  # noqa: BLE001 - raised in the command's thread
        failures.append(exc)
    finally:
        selector.close()


def _how_it_ended(proc: subprocess.Popen) -> str:
    import signal

    code = proc.returncode
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed ({signal.Signals(-code).name})"
    return f"ended (exit status {code})"


def _serve(events_fd: int) -> None:
    """A pool process: run the seeds the command hands over, report on ``events_fd``; end when stdin closes."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the command answers Ctrl-C and SIGTERM, and asks us to stop
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    events = os.fdopen(events_fd, "w", buffering=1)
    lock = threading.Lock()
    setup_line = sys.stdin.readline()
    if not setup_line:
        return
    setup = TrialSetup(**{k: tuple(v) if k == "fixed" else v for k, v in json.loads(setup_line)["setup"].items()})
    seeds: deque[int] = deque()
    ready = threading.Condition()
    state: dict[str, Any] = {"control": None, "stop": False}

    def listen() -> None:  # the command's messages, read while a seed runs
        for line in sys.stdin:
            message = json.loads(line)
            with ready:
                if message.get("stop"):
                    state["stop"] = True
                    if state["control"] is not None:
                        state["control"].request_stop()
                else:
                    seeds.append(int(message["seed"]))
                ready.notify()
        os._exit(0)  # the command closed our stdin: it ended, or is gone (killed); the checkpoint on disk is whole

    threading.Thread(target=listen, name="raysim-seed-commands", daemon=True).start()
    import raysim.engine.runner  # noqa: F401 - torch and the driver: ready to run a seed at once
    import raysim.engine.driver  # noqa: F401

    with lock:
        events.write(json.dumps({"event": "ready"}) + "\n")

    while True:
        with ready:
            while not seeds:
                ready.wait()
            seed = seeds.popleft()

        def tell(event: str, row: dict, seed: int = seed) -> None:
            with lock:
                events.write(json.dumps({"seed": seed, "event": event, "row": row}, default=str) + "\n")

        def on_start(info: dict) -> None:
            with ready:
                state["control"] = info["control"]
                if state["stop"]:
                    info["control"].request_stop()

        outcome = run_one_seed(setup, seed, tell, handle_signals=False, on_start=on_start)
        with ready:
            state["control"] = None
        if outcome == STOPPED:
            tell(STOPPED, {})


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
