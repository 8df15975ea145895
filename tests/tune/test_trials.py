"""A trial's failures: lost with a Ray process or node (Tune restarts the trial), or its own (it is not restarted)."""

from __future__ import annotations

import sys

from ray.exceptions import ActorDiedError, NodeDiedError, RayTaskError, WorkerCrashedError

from raysim.errors import RunStopped, UserError
from raysim.tune.trials import lost_with_a_process


def _through_ray(cause: BaseException) -> BaseException:
    """``cause`` as ``ray.get`` raises it from a task that raised it (a RayTaskError that is also a ``cause``)."""
    return RayTaskError("run_trial", "Traceback ...", cause).as_instanceof_cause()


def test_lost_with_a_process_tells_ray_losses_from_a_trials_own_failures():
    for lost in (ActorDiedError(), WorkerCrashedError(), NodeDiedError("node gone")):
        assert lost_with_a_process(lost) and lost_with_a_process(_through_ray(lost)), lost
    try:
        raise RuntimeError("the stream ended") from ActorDiedError()
    except RuntimeError as exc:
        assert lost_with_a_process(exc)  # raised because a process was lost
    for own in (RunStopped("client 3 returned a non-finite update in round 2"), UserError("bad value"),
                RuntimeError("a hook's bug"), ValueError("nan")):
        assert not lost_with_a_process(own) and not lost_with_a_process(_through_ray(own)), own
    try:
        raise RunStopped("worker died 4 times (engine.max_retries=3)") from ActorDiedError()
    except RunStopped as exc:
        assert not lost_with_a_process(exc)  # the run gave up on its own terms: not restarted


def test_a_trial_process_drops_sigterm_exits_reported_as_unraisable(monkeypatch):
    """Tune ending a trial's actor: Ray's SIGTERM handler raises SystemExit, and inside a weakref callback Python
    reports it through sys.unraisablehook ("Exception ignored in ... Traceback", forwarded to the user's terminal).
    The trial's hook drops exits and passes every other report to the previous hook."""
    from types import SimpleNamespace

    from raysim.tune.trials import quiet_exit_on_sigterm

    seen = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    quiet_exit_on_sigterm()
    installed = sys.unraisablehook
    quiet_exit_on_sigterm()  # a second trial in the same process: the hook is not wrapped again
    assert sys.unraisablehook is installed
    exit_report = SimpleNamespace(exc_value=SystemExit(1), exc_type=SystemExit)
    error_report = SimpleNamespace(exc_value=ValueError("real"), exc_type=ValueError)
    sys.unraisablehook(exit_report)
    sys.unraisablehook(error_report)
    assert seen == [error_report]


def test_raysims_ray_processes_drop_sigterm_exits(ray_cluster, monkeypatch):
    """Ray ends a run's ClientWorkers and a trial's host with SIGTERM, whose handler raises SystemExit(1): each
    installs the hook above as it starts (here built in this process, as Ray builds them in theirs), so a successful
    sweep or run prints no "Exception ignored" report."""
    from raysim.config import load_config
    from raysim.engine.placement import TrialHost
    from raysim.engine.worker import ClientWorker

    import torch

    cfg = load_config(None, ["engine.backend=ray", "engine.num_workers=1"])
    threads = torch.get_num_threads()  # a worker sets its process's torch threads: this one's are given back
    try:
        for make in (lambda: ClientWorker(cfg), TrialHost):
            monkeypatch.setattr(sys, "unraisablehook", sys.__unraisablehook__)
            make()
            assert getattr(sys.unraisablehook, "drops_sigterm_exits", False), make
    finally:
        torch.set_num_threads(threads)


SIGTERM_IN_A_CALLBACK = """
import os, signal, sys, time, weakref
from raysim.interrupts import quiet_exit_on_sigterm
if sys.argv[1] == "quiet":
    quiet_exit_on_sigterm()
def ray_handler(signum, frame):  # what Ray's worker installs: sys.exit(1) with a message
    raise SystemExit(1)
signal.signal(signal.SIGTERM, ray_handler)
class Held:
    pass
def callback(ref):  # a weakref callback (torch and Ray run many) that SIGTERM interrupts
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.5)
held = Held()
ref = weakref.ref(held, callback)
del held
print("went on")
"""


def test_sigterm_inside_a_weakref_callback_prints_no_report_in_raysims_processes():
    """The mechanism of the 9-line report itself, without Ray: the SIGTERM handler's SystemExit raised inside a
    weakref callback is "Exception ignored in ... SystemExit: 1" on stderr; with the hook, nothing."""
    import subprocess

    def run(mode: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", SIGTERM_IN_A_CALLBACK, mode], capture_output=True, text=True,
                              timeout=60)

    loud, quiet = run("loud"), run("quiet")
    assert "Exception ignored" in loud.stderr and "SystemExit: 1" in loud.stderr, loud.stderr
    assert quiet.stderr == "" and quiet.stdout == "went on\n", quiet.stderr
