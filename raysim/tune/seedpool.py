"""Several seeds at once on one machine: a few processes, each running seed after seed in process.

``raysim run --seeds`` with in-process runs starts one process per core it may use (``inprocess.seeds_at_once``);
each imports torch and raysim once and runs the seeds it is handed one after another, exactly as a seed runs in
the command's own process (``seedrun.run_one_seed``), so the numbers are the same. The command hands out the
seeds, prints the progress the processes report and writes the table, as for a seed set run in its own process.

The processes speak JSON lines, never pickle: the command writes ``{"seed": n}`` (run it) or ``{"stop": true}``
(finish the round in flight, checkpoint it, take no other seed) to a process's stdin; the process writes
``{"seed": n, "event": ..., "row": {...}}`` to a pipe of its own (its stdout and stderr are the command's: a bug's
traceback reaches the terminal as it would in process). Ctrl-C and SIGTERM are the command's to answer: the
processes ignore them (a terminal's Ctrl-C reaches the whole process group), and the command asks each to stop;
a process whose command is gone (its stdin closed) ends at once, its last checkpoint whole.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import subprocess
import sys
import threading
from collections import deque
from typing import Any, Callable, Optional

import raysim.interrupts as interrupts
from raysim.tune.seedrun import DONE, ENDED_BEFORE, FAILED, STOPPED, run_one_seed
from raysim.tune.trials import TrialSetup

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


def run_seed_pool(setup: TrialSetup, seeds: list[int], processes: int,
                  tell: Callable[[int, str, dict], None]) -> None:
    """Run ``seeds`` on ``processes`` processes; ``tell(seed, event, row)`` hears what ``seedrun.run_one_seed``
    tells. The first Ctrl-C or SIGTERM asks every process to finish its round and stop (no seed more starts); a
    second one, or SIGTERM's grace period over, ends them at once (raised as KeyboardInterrupt)."""
    from raysim.tune.trials import _record_error

    waiting = deque(seeds)
    stopping = threading.Event()
    selector = selectors.DefaultSelector()
    pool: list[_SeedProcess] = []

    def start() -> _SeedProcess:
        worker = _SeedProcess(setup)
        selector.register(worker.events, selectors.EVENT_READ, worker)
        pool.append(worker)
        return worker

    def hand_out(worker: _SeedProcess) -> None:
        if waiting and not stopping.is_set():
            worker.run(waiting.popleft())

    def stop() -> bool:
        stopping.set()
        for worker in pool:
            if worker.seed is not None:
                worker.stop()
        return True

    killed = True
    try:
        with interrupts.graceful(stop, "the seeds' rounds in flight"):
            for _ in range(min(processes, len(seeds))):
                hand_out(start())
            while any(worker.seed is not None for worker in pool):
                for key, _ in selector.select(timeout=1.0):
                    worker = key.data
                    messages = worker.lines()
                    if messages is None:  # the process ended mid-seed (killed, out of memory): the seed failed
                        selector.unregister(worker.events)
                        pool.remove(worker)
                        worker.end(kill=True)
                        if worker.seed is not None:
                            _record_error(setup.run_dir({"seed": worker.seed}, f"seed-{worker.seed}"),
                                          RuntimeError(f"the process running it {_how_it_ended(worker.proc)}"))
                            tell(worker.seed, "failed", {})
                        if waiting and not stopping.is_set():
                            hand_out(start())  # a fresh process for the seeds left
                        continue
                    for message in messages:
                        tell(message["seed"], message["event"], message.get("row") or {})
                        if message["event"] in _ENDED or message["event"] == STOPPED:
                            worker.seed = None
                            hand_out(worker)
        killed = False
    finally:
        for worker in pool:
            worker.end(kill=killed)
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
    state: dict[str, Any] = {"control": None, "stop": False, "closed": False}

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
