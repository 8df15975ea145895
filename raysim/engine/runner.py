"""Host side of a run: prepare the run directory, then run the driver in this process (``engine.backend=inline``)
or start or join Ray and its workers and run the driver here too (``ray``).

Used by ``raysim run``, ``raysim.run`` and each Ray Tune trial; the round loop itself lives in the driver.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

from raysim.config import ExperimentConfig, load_config, to_flat_dict, to_yaml
from raysim.dirlock import DirLock
from raysim.engine.backend import choose_backend
from raysim.engine.resume_config import (check_named_plugins, load_resume_config,  # noqa: F401 - raysim.api
                                         saved_mapping)  # imports load_resume_config from here
from raysim.engine.state import checkpoint_dir, has_checkpoint, read_checkpoint, server_file, verify_files
from raysim.errors import RunStopped, UserError, find_user_error
import raysim.interrupts as interrupts

# keys that may differ between a run and its resumption (how it runs, not what it computes)
_RESUMABLE_PREFIXES = ("engine.", "log.", "rounds", "eval.every", "eval.chunk")


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
            check_same_config(run_dir, cfg)
            check_no_links(run_dir)
            _check_writable(run_dir)
            ckpt = read_checkpoint(run_dir)  # a damaged checkpoint is a one-line error now, before Ray starts
            check_checkpoint_config(run_dir, ckpt, cfg)
            verify_files(run_dir, ckpt)
            check_metrics_kept(run_dir, int(ckpt["round"]))
            record_resumed_config(run_dir, cfg)
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
        check_no_links(run_dir)
        if (run_dir / "metrics.jsonl").exists() or checkpoint_dir(run_dir).exists():
            raise UserError(f"log.dir {run_dir} already holds a run; continue it with --resume {run_dir}, start it "
                            f"over with --overwrite, or choose another log.dir")
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


def check_same_config(run_dir: Path, cfg: ExperimentConfig) -> None:
    """Refuse to continue a run with a config other than its ``config.yaml`` (keys a resume may change aside)."""
    check_named_plugins(run_dir, saved_mapping(run_dir))  # before load_config imports them
    saved = load_config(run_dir / "config.yaml")
    differ = [k for k, v in to_flat_dict(saved).items()
              if not k.startswith(_RESUMABLE_PREFIXES) and to_flat_dict(cfg).get(k) != v]
    if differ:
        raise UserError(f"{run_dir} was made by another config (differs in: {', '.join(differ[:5])}); "
                        f"resume with the same config, or start a new run")


def check_no_links(run_dir: Path) -> None:
    """A run writes only inside its own directory: refuse one whose checkpoint folders or ``config.yaml`` are
    symbolic links (a write would follow them out). ``metrics.jsonl`` and ``client_metrics.jsonl`` need no check:
    a resume replaces them with files of its own before it appends. The run directory itself may be a link."""
    from raysim.engine.state import CLIENTS_DIR, HISTORY_DIR, VERSIONS_DIR

    ckpt = checkpoint_dir(run_dir)
    for path in (ckpt, ckpt / CLIENTS_DIR, ckpt / HISTORY_DIR, ckpt / VERSIONS_DIR, ckpt / "server.pt",
                 run_dir / "config.yaml"):
        if path.is_symlink():
            raise UserError(f"{path} is a symbolic link (to {os.readlink(path)}); a run writes only inside its own "
                            f"directory: replace the link with what it points to")


def check_checkpoint_config(run_dir: Path, ckpt: dict, cfg: ExperimentConfig) -> None:
    """Refuse to continue a checkpoint with a config other than the one it was made with, but for the keys a
    resume may change (``engine.*``, ``log.*``, ``rounds``, ``eval.every``): ``config.yaml`` may have been edited or
    damaged since, and compared only with itself it would pass. A checkpoint older than this record is trusted; a
    key it lacks (a config section added since it was made) counts as that key's default."""
    made = ckpt.get("config")
    if not isinstance(made, dict):
        return
    now = to_flat_dict(cfg)
    defaults = to_flat_dict(type(cfg)(algorithm=type(cfg.algorithm)(), model=type(cfg.model)(),
                                      data=type(cfg.data)()))
    made = {**{k: v for k, v in defaults.items() if k not in made}, **made}
    differ = [k for k in dict.fromkeys([*made, *now])
              if not k.startswith(_RESUMABLE_PREFIXES) and made.get(k, "<absent>") != now.get(k, "<absent>")]
    if differ:
        shown = ", ".join(f"{k} ({made.get(k, 'absent')!r} in the checkpoint, {now.get(k, 'absent')!r} now)"
                          for k in differ[:4])
        more = f" and {len(differ) - 4} more" if len(differ) > 4 else ""
        raise UserError(f"{server_file(run_dir)} was made with another config than {run_dir / 'config.yaml'} and "
                        f"the overrides give: {shown}{more}; only engine.*, log.*, rounds, eval.every and eval.chunk "
                        f"may change on resume (restore config.yaml, or start a new run)")


def check_metrics_kept(run_dir: Path, round: int) -> None:
    """A checkpoint of round N continues a ``metrics.jsonl`` of rounds 1..N: refuse to continue without them (the
    record of those rounds cannot be rebuilt from a checkpoint)."""
    from raysim.runlog import read_metrics

    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise UserError(f"{path} is missing, while the checkpoint holds round {round}: resuming would leave rounds "
                        f"1-{round} out of the record; restore the file, or start a new run")
    rounds = {int(r["round"]) for r in read_metrics(path) if isinstance(r.get("round"), int)}
    lost = [r for r in range(1, round + 1) if r not in rounds]
    if lost:
        raise UserError(f"{path} lacks round{'s' if len(lost) > 1 else ''} "
                        f"{', '.join(map(str, lost[:5]))}{' ...' if len(lost) > 5 else ''} of the {round} the "
                        f"checkpoint holds; restore the file, or start a new run")


def record_resumed_config(run_dir: Path, cfg: ExperimentConfig) -> None:
    """A resume may change what the run is (``rounds``) and how it runs (``engine.*``, ``log.*``): ``config.yaml``
    says what the run now is, so reports and ``load_run`` agree with it (the driver rewrites TensorBoard's HParams)."""
    from raysim.fsutil import atomic_write_text

    cfg = dataclasses.replace(cfg, log=dataclasses.replace(cfg.log, dir=str(run_dir)))
    try:
        atomic_write_text(run_dir / "config.yaml", to_yaml(cfg), fsync=True)
    except OSError as exc:
        raise UserError(f"config key 'log.dir': cannot write {run_dir / 'config.yaml'} ({exc.strerror})") from None


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
                   handle_signals: bool = False, placement_group: Any = None,
                   in_process: bool = False) -> tuple[Path, list[dict], bool]:
    """Run (or resume) one experiment; returns (run_dir, this invocation's round metrics, stopped_early).

    ``handle_signals``: the first Ctrl-C or SIGTERM finishes the round, checkpoints it and ends the run (stopped
    early); see ``raysim.interrupts`` for the bound after SIGTERM. ``in_process``: run it in this process whatever
    ``engine.backend`` resolves to here (a Tune trial whose run needs one worker: the trial's own process, which is
    on Ray and would otherwise resolve to ``ray``)."""
    from raysim.engine.sampling import check_cohort_fits

    with interrupts.handled() if handle_signals else contextlib.nullcontext():
        check_cohort_fits(cfg)  # a cohort that cannot fit in memory: refused before anything starts
        run_dir, created, lock = prepare_run_dir(cfg, resume)
        try:
            return _run_locked(cfg, run_dir, created, resume, on_round, on_start, handle_signals, placement_group,
                               in_process)
        finally:
            lock.release()


class RunControl:
    """What the caller of :func:`run_experiment` may ask of a running run (from another thread, such as a live
    progress line or Tune's trial host): its progress, a graceful stop (finish the round, checkpoint, end), its
    workers' info, and an immediate end."""

    def __init__(self, driver: Any):
        self._driver = driver

    @property
    def driver(self) -> Any:
        """The driver itself (``raysim.engine.driver.Driver``), for introspection."""
        return self._driver

    def progress(self, timeout: float = 5.0) -> tuple[int, int, int, str]:
        """(round in progress, jobs done, jobs in this phase, "train" | "evaluate" | "server")."""
        return self._driver.progress()

    def request_stop(self) -> None:
        self._driver.request_stop()

    def worker_info(self) -> list[dict]:
        return self._driver.worker_info()

    def vectorize_choice(self) -> tuple[Optional[int], str]:
        """(clients per stack, None until ``auto``'s probe has run; why): ``engine.vectorize``'s choice."""
        return self._driver.stack_size, self._driver.vectorize_why

    def shutdown(self, timeout: float = 30.0) -> None:
        """End the run now: its workers are released, and the round in progress stops with an error."""
        self._driver.shutdown()


def _run_locked(cfg: ExperimentConfig, run_dir: Path, created: bool, resume: bool,
                on_round: Optional[Callable[[dict], None]], on_start: Optional[Callable[[dict], None]],
                handle_signals: bool, placement_group: Any, in_process: bool = False) -> tuple[Path, list[dict], bool]:
    if resume:  # the resolved config of the original run, with this invocation's engine/log/rounds
        cfg = dataclasses.replace(cfg, log=dataclasses.replace(cfg.log, dir=str(run_dir)))
    rows: list[dict] = []
    stop_requested = threading.Event()

    def started(control: RunControl, start_round: int) -> contextlib.AbstractContextManager:
        """Tell the caller the run started; returns the context in which the first Ctrl-C or SIGTERM asks for a
        graceful stop (finish the round, checkpoint, end)."""
        if on_start:  # run_dir, the round it starts after, and the run's control (progress, request_stop)
            on_start({"run_dir": run_dir, "start_round": start_round, "control": control})
        if not handle_signals:
            return contextlib.nullcontext()

        def stop() -> None:
            stop_requested.set()
            control.request_stop()
        return interrupts.graceful(stop)

    def record(metrics: dict) -> None:
        rows.append(metrics)
        if on_round:
            on_round(metrics)

    try:
        if in_process or (placement_group is None and choose_backend(cfg.engine) == "inline"):
            _run_inline(cfg, run_dir, resume, started, record)
        else:
            _run_on_ray(cfg, run_dir, resume, placement_group, started, record)
    except BaseException as exc:
        found = find_user_error(exc)
        if isinstance(found, RunStopped):
            found.run_dir = run_dir  # for the resume hint
        elif isinstance(exc, KeyboardInterrupt):  # Ctrl-C or SIGTERM before the run started (Ray starting)
            exc.run_dir = run_dir  # type: ignore[attr-defined]
        if created and not has_checkpoint(run_dir):
            shutil.rmtree(run_dir, ignore_errors=True)  # nothing half-written: a run that never completed a round
        raise
    return run_dir, rows, stop_requested.is_set() and (not rows or rows[-1]["round"] < cfg.rounds)


def _run_inline(cfg: ExperimentConfig, run_dir: Path, resume: bool,
                started: Callable[[RunControl, int], contextlib.AbstractContextManager],
                record: Callable[[dict], None]) -> None:
    """The whole run in this process (``engine.backend=inline``): no Ray, the user's own frames in every error."""
    from raysim.engine.executor import inline_device

    _drive(cfg, run_dir, resume, started, record, inline=True, device=inline_device(cfg.engine))


def _run_on_ray(cfg: ExperimentConfig, run_dir: Path, resume: bool, placement_group: Any,
                started: Callable[[RunControl, int], contextlib.AbstractContextManager],
                record: Callable[[dict], None]) -> None:
    """The driver in this process, its jobs on Ray worker actors (``engine.backend=ray``). The workers are created
    first, so that their processes start (importing torch) while the driver builds the data and the model."""
    from raysim.engine.pool import end_workers, spawn_workers
    from raysim.engine.resources import check_resources, ray_session

    with ray_session(cfg.engine, cfg.plugins):
        if placement_group is None:
            check_resources(cfg.engine)
        workers = spawn_workers(cfg, placement_group)
        try:  # from here on, the workers are ended whatever happens (a setup error included)
            _drive(cfg, run_dir, resume, started, record, placement_group=placement_group, workers=workers)
        finally:
            end_workers(workers)  # the driver's pool ended (or kept) them and its replacements; for a setup error


def _drive(cfg: ExperimentConfig, run_dir: Path, resume: bool,
           started: Callable[[RunControl, int], contextlib.AbstractContextManager], record: Callable[[dict], None], *,
           inline: bool = False, device: str = "cpu", placement_group: Any = None,
           workers: Optional[list[Any]] = None) -> None:
    """Make the driver, start it, stream its rounds to ``record`` (the first Ctrl-C or SIGTERM meanwhile asks for a
    graceful stop); restore torch's thread count (the driver works on one thread, in-process jobs on
    engine.cpus_per_worker) whatever happens."""
    import torch

    from raysim.engine.driver import Driver

    threads = torch.get_num_threads()
    driver: Optional[Driver] = None
    try:
        driver = Driver(cfg, str(run_dir), resume, placement_group, inline=inline, device=device, workers=workers)
        start_round = driver.start()
        with started(RunControl(driver), start_round):
            for metrics in driver.run():
                record(metrics)
    finally:
        if driver is not None:
            driver.shutdown()
        torch.set_num_threads(threads)


def already_complete(run_dir: Path, cfg: ExperimentConfig) -> Optional[int]:
    """The checkpointed round of a run that ``--resume`` would have nothing to do for (it reached ``rounds``), so the
    caller can say so without starting Ray; None when there is a round left to run (or no checkpoint)."""
    from raysim.engine.state import checkpoint_round

    done = checkpoint_round(run_dir)
    if done is None or done < cfg.rounds:
        return None
    check_same_config(run_dir, cfg)  # --resume DONE_DIR other.yaml: the mismatch, not "nothing to run"
    return done
