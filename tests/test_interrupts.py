"""raysim.interrupts in this process, with real signals: the first Ctrl-C or SIGTERM asks the work in flight to stop,
SIGTERM's grace period then abandons it, a second signal abandons at once, and the handlers are put back after."""

from __future__ import annotations

import os
import signal
import time

import pytest

import raysim.interrupts as interrupts


def _deliver(sig: int) -> None:
    """Send ``sig`` to this process and give its handler the chance to run (it runs between bytecodes)."""
    os.kill(os.getpid(), sig)
    time.sleep(0.05)


def test_sigterm_asks_for_a_graceful_stop_then_abandons_after_the_grace_period(monkeypatch):
    monkeypatch.setenv("RAYSIM_TERM_GRACE_S", "0.3")
    asked = []
    with interrupts.handled():
        with pytest.raises(interrupts.Terminated, match=r"^the round in flight did not end within 0\.3 s$"):
            with interrupts.graceful(lambda: asked.append(True)):
                _deliver(signal.SIGTERM)
                assert asked == [True] and interrupts.terminated()  # asked, not interrupted
                time.sleep(5)  # a round that does not end
        assert interrupts.exit_status() == 143
        assert interrupts.abandoned() == "the round in flight did not end within 0.3 s"


def test_a_graceful_stop_that_ends_in_time_disarms_the_deadline(monkeypatch):
    monkeypatch.setenv("RAYSIM_TERM_GRACE_S", "0.3")
    with interrupts.handled():
        with interrupts.graceful(lambda: None):
            _deliver(signal.SIGTERM)
        time.sleep(0.6)  # past the grace period: nothing is raised once the work has stopped
        assert interrupts.terminated() and interrupts.abandoned() == ""


def test_a_second_signal_abandons_at_once_and_sigint_means_130():
    with interrupts.handled():
        with pytest.raises(KeyboardInterrupt) as info:
            with interrupts.graceful(lambda: None):
                _deliver(signal.SIGINT)  # Ctrl-C: asked to stop
                _deliver(signal.SIGINT)  # again: now
        assert not isinstance(info.value, interrupts.Terminated)
        assert interrupts.exit_status() == 130 and interrupts.abandoned() == "a second signal"


def test_sigterm_with_nothing_to_stop_gracefully_ends_at_once():
    with interrupts.handled():
        with pytest.raises(interrupts.Terminated):
            _deliver(signal.SIGTERM)  # before any work is under way (setup, Ray starting)
        with pytest.raises(interrupts.Terminated):  # work that cannot stop gently yet (Tune's loop not started)
            with interrupts.graceful(lambda: False):
                _deliver(signal.SIGTERM)


def test_handlers_are_put_back_after_the_command_and_reclaimed_after_ray_init():
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM)}
    with interrupts.handled():
        signal.signal(signal.SIGTERM, lambda *a: None)  # what ray.init does
        interrupts.reclaim()
        assert signal.getsignal(signal.SIGTERM) is interrupts._on_signal
    assert {sig: signal.getsignal(sig) for sig in before} == before
    interrupts.reclaim()  # outside a command: changes nothing
    assert signal.getsignal(signal.SIGTERM) == before[signal.SIGTERM]
