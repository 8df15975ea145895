"""Host side of a run: prepare the run directory, then run the driver in this process (``engine.backend=inline``)
or start or join Ray, create the driver actor and its workers, and stream its rounds (``ray``).

Used by ``raysim run``, ``raysim.run`` and each Ray Tune trial; the round loop itself lives in the driver.
"""

from __future__ import annotations

import dataclasses
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

import yaml

from raysim.config import ExperimentConfig, load_config, to_flat_dict, to_yaml
from raysim.dirlock import DirLock
from raysim.engine.executor import choose_backend
from raysim.engine.state import checkpoint_dir, has_checkpoint, read_checkpoint, server_file
from raysim.errors import RunStopped, UserError, find_user_error

# keys that may differ between a run and its resumption (how it runs, not what it computes)
_RESUMABLE_PREFIXES = ("engine.", "log.", "rounds", "eval.every")


def default_run_dir(cfg: ExperimentConfig) -> Path:
    return Path("runs") / f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"


def prepare_run_dir(cfg: ExperimentConfig, resume: bool) -> tuple[Path, bool, DirLock]:
    """Claim (or check) the run directory; returns (path, created_now, its lock). Fails before any work is done.

    The directory is locked before it is checked, so of two runs started together into one new ``log.dir``, one
    runs and the other is refused; the caller releases the lock when the run ends."""
    run_dir = Path(cfg.log.dir) if cfg.log.dir else default_run_dir(cfg)
    if resume:
        lock = DirLock(run_dir).acquire() if run_dir.is_dir() else DirLock(run_dir)
        try:
            if not has_checkpoint(run_dir):
                raise UserError(f"{run_dir} holds no checkpoint to resume (expected {server_file(run_dir)})")
            saved = load_config(run_dir / "config.yaml")
            differ = [k for k, v in to_flat_dict(saved).items()
                      if not k.startswith(_RESUMABLE_PREFIXES) and to_flat_dict(cfg).get(k) != v]
            if differ:
                raise UserError(f"{run_dir} was made by another config (differs in: {', '.join(differ[:5])}); "
                                f"resume with the same config, or start a new run")
            _check_writable(run_dir)
            read_checkpoint(run_dir)  # a damaged checkpoint is a one-line error now, before Ray starts
        except BaseException:
            lock.release()
            raise
        return run_dir, False, lock
    created = not run_dir.exists()
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"config key 'log.dir': cannot create {run_dir} ({exc.strerror})") from None
    lock = DirLock(run_dir).acquire()  # refused: another process claimed it first, and its files are its own
    try:
        if (run_dir / "metrics.jsonl").exists() or checkpoint_dir(run_dir).exists():
            raise UserError(f"log.dir {run_dir} already holds a run; continue it with --resume {run_dir} "
                            f"or choose another log.dir")
        _check_writable(run_dir)
        try:
            (run_dir / "config.yaml").write_text(to_yaml(dataclasses.replace(cfg, log=dataclasses.replace(
                cfg.log, dir=str(run_dir)))))
        except OSError as exc:
            raise UserError(f"config key 'log.dir': cannot write {run_dir / 'config.yaml'} ({exc.strerror})") \
                from None
    except BaseException:
        if created:
            shutil.rmtree(run_dir, ignore_errors=True)
        lock.release()
        raise
    return run_dir, created, lock


def _check_writable(run_dir: Path) -> None:
    probe = run_dir / ".raysim-write-test"
    try:
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise UserError(f"config key 'log.dir': {run_dir} is not writable ({exc.strerror})") from None


def run_experiment(cfg: ExperimentConfig, *, resume: bool = False,
                   on_round: Optional[Callable[[dict], None]] = None,
                   on_start: Optional[Callable[[dict], None]] = None,
                   handle_sigint: bool = False, placement_group: Any = None) -> tuple[Path, list[dict], bool]:
    """Run (or resume) one experiment; returns (run_dir, this invocation's round metrics, stopped_early)."""
    run_dir, created, lock = prepare_run_dir(cfg, resume)
    try:
        return _run_locked(cfg, run_dir, created, resume, on_round, on_start, handle_sigint, placement_group)
    finally:
        lock.release()


class RunControl:
    """What the caller of :func:`run_experiment` may ask of a running run, whichever the backend: its progress
    (for a live line), a graceful stop (finish the round, checkpoint, end) and its workers' info."""

    def __init__(self, driver: Any, remote: bool):
        self._driver, self._remote = driver, remote

    @property
    def driver(self) -> Any:
        """The driver itself: a Ray actor handle (``remote``) or the in-process object, for introspection."""
        return self._driver

    @property
    def remote(self) -> bool:
        return self._remote

    def progress(self, timeout: float = 5.0) -> tuple[int, int, int, str]:
        """(round in progress, jobs done, jobs in this phase, "train" | "evaluate" | "server")."""
        if not self._remote:
            return self._driver.progress()
        import ray

        return ray.get(self._driver.progress.remote(), timeout=timeout)

    def request_stop(self) -> None:
        if self._remote:
            self._driver.request_stop.remote()
        else:
            self._driver.request_stop()

    def worker_info(self) -> list[dict]:
        if not self._remote:
            return self._driver.worker_info()
        import ray

        return ray.get(self._driver.worker_info.remote())

    def shutdown(self, timeout: float = 30.0) -> None:
        """End the run now: its workers are released (a driver actor is then killed)."""
        if not self._remote:
            self._driver.shutdown()
            return
        import contextlib

        import ray

        with contextlib.suppress(Exception):
            ray.get(self._driver.shutdown.remote(), timeout=timeout)
        with contextlib.suppress(Exception):
            ray.kill(self._driver, no_restart=True)


def _run_locked(cfg: ExperimentConfig, run_dir: Path, created: bool, resume: bool,
                on_round: Optional[Callable[[dict], None]], on_start: Optional[Callable[[dict], None]],
                handle_sigint: bool, placement_group: Any) -> tuple[Path, list[dict], bool]:
    if resume:  # the resolved config of the original run, with this invocation's engine/log/rounds
        cfg = dataclasses.replace(cfg, log=dataclasses.replace(cfg.log, dir=str(run_dir)))
    rows: list[dict] = []
    stop_requested = threading.Event()

    def started(control: RunControl, start_round: int) -> Any:
        """Tell the caller the run started; from now on the first Ctrl-C asks for a graceful stop. Returns the
        SIGINT handler to restore (None: none was installed)."""
        if on_start:  # run_dir, the round it starts after, and the run's control (progress, request_stop)
            on_start({"run_dir": run_dir, "start_round": start_round, "control": control})
        if not (handle_sigint and threading.current_thread() is threading.main_thread()):
            return None

        def _on_sigint(signum, frame):  # first Ctrl-C: finish the round, checkpoint, stop
            if stop_requested.is_set():
                raise KeyboardInterrupt
            stop_requested.set()
            control.request_stop()
        return signal.signal(signal.SIGINT, _on_sigint)

    def record(metrics: dict) -> None:
        rows.append(metrics)
        if on_round:
            on_round(metrics)

    try:
        if placement_group is None and choose_backend(cfg.engine) == "inline":
            _run_inline(cfg, run_dir, resume, started, record)
        else:
            _run_on_ray(cfg, run_dir, resume, placement_group, started, record)
    except BaseException as exc:
        found = find_user_error(exc)
        if isinstance(found, RunStopped):
            found.run_dir = run_dir  # for the resume hint
        if created and not has_checkpoint(run_dir):
            shutil.rmtree(run_dir, ignore_errors=True)  # nothing half-written: a run that never completed a round
        raise
    return run_dir, rows, stop_requested.is_set() and (not rows or rows[-1]["round"] < cfg.rounds)


def _run_inline(cfg: ExperimentConfig, run_dir: Path, resume: bool, started: Callable[[RunControl, int], Any],
                record: Callable[[dict], None]) -> None:
    """The whole run in this process (``engine.backend=inline``): no Ray, the user's own frames in every error.
    torch's thread count is restored afterwards (the driver works on one thread, jobs on cpus_per_worker)."""
    import torch

    from raysim.engine.driver import Driver
    from raysim.engine.executor import inline_device

    threads = torch.get_num_threads()
    driver: Optional[Driver] = None
    previous = None
    try:
        driver = Driver(cfg, str(run_dir), resume, inline=True, device=inline_device(cfg.engine))
        start_round = driver.start()
        previous = started(RunControl(driver, remote=False), start_round)
        for metrics in driver.run():
            record(metrics)
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
        if driver is not None:
            driver.shutdown()
        torch.set_num_threads(threads)


def _run_on_ray(cfg: ExperimentConfig, run_dir: Path, resume: bool, placement_group: Any,
                started: Callable[[RunControl, int], Any], record: Callable[[dict], None]) -> None:
    """The driver as a Ray actor on this node, its workers as actors (``engine.backend=ray``)."""
    import ray

    from raysim.engine.pool import spawn_workers
    from raysim.engine.resources import check_resources, ray_session

    with ray_session(cfg.engine, cfg.plugins):
        if placement_group is None:
            check_resources(cfg.engine)
        # the driver first (it takes a prestarted process), then its workers: all their processes start now
        driver = _spawn_driver(cfg, run_dir, resume, placement_group)
        workers = spawn_workers(cfg, placement_group)
        previous = None
        try:  # from here on, the actors are ended whatever happens (a setup error included)
            start_round = ray.get(driver.start.remote(workers))
            previous = started(RunControl(driver, remote=True), start_round)
            for ref in driver.run.options(num_returns="streaming").remote():
                record(ray.get(ref))
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
            _kill_quietly(driver, workers)


def _kill_quietly(driver: Any, workers: list[Any]) -> None:
    """End the driver and the workers: those this process created and the replacements the driver created."""
    import ray

    from raysim.engine.pool import kill_quietly

    try:
        ray.get(driver.shutdown.remote(), timeout=30)
    except Exception:  # noqa: BLE001 - a dead or hung driver is killed below all the same
        pass
    kill_quietly([driver, *workers])


def _spawn_driver(cfg: ExperimentConfig, run_dir: Path, resume: bool, placement_group: Any) -> Any:
    """The driver writes the run directory, so it runs on this node, the one that holds the directory (in a Tune
    trial too: see ``raysim.engine.placement``); there the trial's first bundle already holds its CPUs."""
    import ray

    from raysim.engine.driver import Driver
    from raysim.engine.placement import pinned_to, this_node

    options: dict[str, Any] = {"num_cpus": cfg.engine.driver_cpus if placement_group is None else 0,
                               "max_concurrency": 2, "max_restarts": 0, **pinned_to(this_node())}
    return ray.remote(Driver).options(**options).remote(cfg, str(run_dir), resume, placement_group)


def load_resume_config(run_dir: Path, overrides: list[str]) -> ExperimentConfig:
    """The config of an existing run, with engine/log/rounds overrides allowed."""
    if not (run_dir / "config.yaml").is_file():
        raise UserError(f"{run_dir} is not a raysim run directory (no config.yaml)")
    base = yaml.safe_load((run_dir / "config.yaml").read_text())
    data = base.get("data") if isinstance(base, dict) else None
    if isinstance(data, dict) and "test_split" not in data:
        data["test_split"] = "pooled"  # a run made before data.test_split existed pooled train and test: keep it so
    return load_config(None, overrides, base=base)
