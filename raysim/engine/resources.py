"""Starting or joining Ray, and refusing resource requests the cluster can never satisfy.

Ray itself would leave an actor that asks for a GPU on a GPU-less cluster pending for ever, without a word; raysim
checks the request against ``ray.cluster_resources()`` and the largest node before creating anything.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import subprocess
import sys
from typing import Any, Iterator, Optional, Sequence

import ray

import raysim.interrupts as interrupts
from raysim.errors import UserError


# Ray prestarts idle worker processes; importing torch and raysim there while Ray and the driver start up takes
# ~3 s off the first round of every local run. Local training never imports torch._dynamo (which
# torch.optim.Optimizer pulls in, 1.2-2.3 s a process): raysim.algorithms.training.LocalOptimizer.
LOCAL_SYSTEM_CONFIG = {"preload_python_modules": ["torch", "raysim.engine.worker"]}


def local_ray_options(state_memory_gb: Optional[float] = None, preload: Sequence[str] = ()) -> dict[str, Any]:
    """``ray.init`` arguments for a local Ray as raysim starts one (the tests and benchmarks start theirs with them);
    ``preload``: modules its worker processes import as they start, besides torch and raysim's worker (a sweep's:
    what its trial processes need)."""
    # token authentication stays on; only the notice that it is on is silenced for a private local cluster
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    system = {**LOCAL_SYSTEM_CONFIG, "preload_python_modules": [*LOCAL_SYSTEM_CONFIG["preload_python_modules"],
                                                                *preload]}  # a new dict: ray.init writes into it
    options: dict[str, Any] = {"_system_config": system,
                               "_node_ip_address": "127.0.0.1"}  # honoured only inside loopback_only(): see there
    if state_memory_gb is not None:
        options["object_store_memory"] = int(state_memory_gb * 1024**3)
        # Ray keeps return values under 100 KB in the caller's heap, where they are never spilled; under a memory
        # budget every client state must go to the object store (and to disk beyond it), whatever its size.
        # Measured cost: ~0.7 ms more per Ray call, so only when a budget is set.
        options["_system_config"]["max_direct_call_object_size"] = 0
    return options


def plugin_runtime_env(plugins: Sequence[str]) -> dict[str, Any]:
    """Ray's runtime environment that ships the ``plugins:`` modules (their top-level package, or the single
    ``.py`` file) to every worker process on every node, so a plugin need not be installed on the cluster."""
    modules = _plugin_modules(plugins)
    return {"py_modules": modules} if modules else {}


def _plugin_modules(plugins: Sequence[str]) -> list[Any]:
    """The top-level modules of the ``plugins:`` entries that live in files (namespace packages and built-ins
    cannot be shipped, nor put on a path)."""
    import importlib

    modules = []
    for name in dict.fromkeys(str(p).split(".")[0] for p in plugins):
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            raise UserError(f"config key 'plugins': cannot import {name!r} ({exc})") from None
        if getattr(module, "__file__", None):
            modules.append(module)
    return modules


@contextlib.contextmanager
def plugins_on_path(plugins: Sequence[str]) -> Iterator[None]:
    """While a private local Ray starts, the ``plugins:`` modules' import roots on ``PYTHONPATH``, which its raylet
    and so every worker process inherits: they share this machine's disk, so nothing needs shipping.

    Why not ``py_modules`` here as on a cluster: a job with a runtime environment cannot use the worker processes
    that Ray prestarts (with torch preloaded, ``LOCAL_SYSTEM_CONFIG``), so every worker was started a second time
    after them, and four processes imported torch at once on a run of two workers."""
    import site

    roots: list[str] = []
    skip = {os.path.realpath(p) for p in site.getsitepackages()}
    for module in _plugin_modules(plugins):
        path = module.__file__
        root = os.path.dirname(os.path.dirname(path)) if os.path.basename(path) == "__init__.py" \
            else os.path.dirname(path)
        root = os.path.realpath(root)
        if root not in skip and root not in roots:
            roots.append(root)
    saved = os.environ.get("PYTHONPATH")
    if roots:
        os.environ["PYTHONPATH"] = os.pathsep.join(roots + ([saved] if saved else []))
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


@contextlib.contextmanager
def loopback_only() -> Iterator[None]:
    """Make ``ray.init`` keep a local Ray on 127.0.0.1.

    Ray 2.60 replaces a loopback ``_node_ip_address`` with the machine's routable address
    (``services.resolve_ip_for_localhost``) unless ``ray_constants.ENABLE_RAY_CLUSTER`` is false, the setting it
    uses for Windows and macOS (env ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER``, read when Ray is imported). With the node
    address at 127.0.0.1, the GCS, the raylet, the driver's and every worker's gRPC servers bind to 127.0.0.1 instead
    of all interfaces, and every process is told ``--node-ip-address=127.0.0.1``. The flag is only needed while the
    node starts; it is restored afterwards, so a later ``ray.init(address=...)`` in this process joins clusters as
    before."""
    from ray._private import ray_constants

    saved = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved


def init_local_ray(state_memory_gb: Optional[float] = None, preload: Sequence[str] = (), **kwargs: Any) -> Any:
    """``ray.init`` of a private local Ray as raysim starts one: on loopback, with ``local_ray_options()``.

    ``address="local"``: a new Ray even when ``ray start`` left a cluster's address (live or stale) in Ray's temp
    directory, which ``ray.init()`` with no address would try to join."""
    kwargs.setdefault("address", "local")
    with loopback_only():
        return ray.init(**kwargs, **local_ray_options(state_memory_gb, preload))


def start_ray(engine: Any, plugins: Sequence[str] = (), preload: Sequence[str] = ()) -> None:
    """Start a private local Ray or join a running cluster, as ``ray.init()`` would (see ``raysim.engine.connect``),
    as ``raysim run`` does; the ``plugins`` modules travel to every node with the job's runtime environment.
    ``preload``: modules a private local Ray's worker processes import as they start (:func:`local_ray_options`)."""
    from ray.exceptions import AuthenticationError

    from raysim.engine.connect import auth_error, choose_cluster

    kwargs: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": True,
                              "include_dashboard": bool(engine.dashboard)}
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    address, notice = choose_cluster(engine.address)
    if address is not None:
        runtime_env = plugin_runtime_env(plugins)
        if runtime_env:
            kwargs["runtime_env"] = runtime_env
    if engine.dashboard and address is None:
        missing = ray._private.utils.get_dashboard_dependency_error()
        if missing:
            raise UserError(f"config key 'engine.dashboard': Ray's dashboard needs packages that are not installed "
                            f"({str(missing).splitlines()[0]}): pip install 'raysim[dashboard]', or "
                            f"engine.dashboard=false")
    if notice:
        print(f"raysim: {notice}", file=sys.stderr, flush=True)
    try:
        with interrupts.deferred(), _ray_keeps_our_handlers():  # SIGTERM while Ray starts: exit 143 once it is up
            if address is None:
                with plugins_on_path(plugins):
                    init_local_ray(engine.state_memory_gb, preload, **kwargs)
            else:  # a joined cluster keeps its own settings (object store size, system config)
                ray.init(address=address, **kwargs)
            if kwargs["log_to_driver"]:
                _drop_sigterm_dumps()
    except AuthenticationError:  # RAY_AUTH_MODE=token but no token here
        raise auth_error(address or "local", "config key 'engine.address'") from None
    except ConnectionError as exc:
        raise UserError(f"config key 'engine.address': cannot reach a Ray cluster at {address!r} "
                        f"({str(exc).splitlines()[0]}); start one with `ray start --head` or use "
                        f"engine.address=null") from None
    except BaseException:  # a signal held while Ray started, or a second one: Ray's processes go too
        ray.shutdown()
        raise
    finally:
        interrupts.reclaim()  # ray.init replaced raysim's SIGTERM handler with its own (and a C++ stack dump)


@contextlib.contextmanager
def _ray_keeps_our_handlers() -> Iterator[None]:
    """While ``ray.init`` runs, its Python SIGTERM handler (``sys.exit(15)``: exit 15, no message, and a Slurm job
    that requeues on 143 is never requeued) is not installed; raysim's stays. Its C++ handler (a stack dump, then
    the previous handler), installed with the driver's core worker in ``connect``, is replaced as soon as
    ``connect`` returns."""
    from ray._private import utils
    from ray._private import worker as ray_worker

    if not interrupts.handling():  # a notebook's or a library caller's process keeps Ray's behaviour
        yield
        return
    saved = utils.set_sigterm_handler, ray_worker.connect

    def connect(*args: Any, **kwargs: Any) -> Any:
        try:
            return saved[1](*args, **kwargs)
        finally:
            interrupts.reclaim()

    utils.set_sigterm_handler, ray_worker.connect = (lambda handler: None), connect
    try:
        yield
    finally:
        utils.set_sigterm_handler, ray_worker.connect = saved


_SIGTERM_DUMP = re.compile(r"\*\*\* SIGTERM received at time=")
_STACK_FRAME = re.compile(r"^(\[[^]]*\] logging\.cc:\d+: )?\s*(PC: )?@\s+0x[0-9a-fA-F]+")


def _without_sigterm_dumps(lines: list[str]) -> list[str]:
    """``lines`` less every SIGTERM stack dump (its header and the stack frames that follow it)."""
    out, dumping = [], False
    for line in lines:
        if _SIGTERM_DUMP.search(line):
            dumping = True
        elif not (dumping and _STACK_FRAME.match(line)):
            dumping = False
            out.append(line)
    return out


def _drop_sigterm_dumps() -> None:
    """Ray ends worker processes with SIGTERM (a Tune trial's actor stopped while it starts, idle workers); Ray's C++
    handler in each prints a stack dump, which Ray forwards to this terminal with the workers' output. Those dumps
    are dropped on the way; a crash's dump (SIGSEGV, SIGABRT) still shows."""
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    for name, handle in list(dispatcher.handlers):
        if name != "ray_print_logs":
            continue

        def forward(data: dict, handle: Any = handle) -> None:
            lines = _without_sigterm_dumps(list(data.get("lines", [])))
            if lines:
                handle({**data, "lines": lines})

        dispatcher.remove_handler(name)
        dispatcher.add_handler(name, forward)


@contextlib.contextmanager
def ray_session(engine: Any, plugins: Sequence[str] = (), preload: Sequence[str] = ()) -> Iterator[bool]:
    """Use an already initialised Ray (tests, notebooks, Tune), else start/join one; shut down only what we started.
    ``preload``: see :func:`start_ray`."""
    if ray.is_initialized():
        yield False
        return
    start_ray(engine, plugins, preload)
    try:
        yield True
    finally:
        pool = sys.modules.get("raysim.engine.pool")  # no kept workers unless it was imported (it imports torch)
        if pool is not None:
            pool.release_warm_workers()  # their handles end with this Ray
        end_private_ray()


def end_private_ray() -> None:
    """``ray.shutdown()`` of a Ray this process started, less the second it spends waiting for Ray's autoscaler
    monitor (a private local Ray has nothing to autoscale), which takes 1.0 s to leave after its SIGTERM, where the
    raylet, GCS and dashboard take 0.02 s each: the monitor is killed outright first. Ray's other processes end as
    ``ray.shutdown()`` ends them. A process that joined a cluster started none of the cluster's processes (its
    node lists none), so nothing is killed there: it only disconnects."""
    from ray._private import worker as ray_worker

    node = getattr(ray_worker, "_global_node", None)
    for info in (getattr(node, "all_processes", None) or {}).get("monitor", []):
        process = getattr(info, "process", None)
        if process is not None and process.poll() is None:
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                process.kill()
                process.wait(timeout=5)
    ray.shutdown()


def required_resources(engine: Any) -> dict[str, float]:
    return {"CPU": engine.num_workers * engine.cpus_per_worker + engine.driver_cpus,
            "GPU": engine.num_workers * engine.gpus_per_worker}


RAY_UNITS = 10_000  # Ray counts fractional resources in units of 1/10,000


def workers_on_node(engine: Any, node: dict) -> int:
    """How many workers fit on a node with these resources (``{"CPU": 8, "GPU": 2}``): a worker's CPUs must all sit
    on one node and a fractional GPU share on one GPU, so 0.4 GPU packs two to a GPU, not two and a half."""
    eps = 1e-9
    fit = math.floor(node.get("CPU", 0.0) / engine.cpus_per_worker + eps)
    if engine.gpus_per_worker > 0:
        gpus = math.floor(node.get("GPU", 0.0) + eps)  # whole GPUs: Ray gives a fraction from one GPU
        if engine.gpus_per_worker < 1:
            per_gpu = RAY_UNITS // round(engine.gpus_per_worker * RAY_UNITS)
            fit = min(fit, gpus * per_gpu)
        else:
            fit = min(fit, math.floor(gpus / engine.gpus_per_worker + eps))
    return fit


def check_resources(engine: Any, total: dict | None = None, nodes: list[dict] | None = None) -> None:
    """Raise a one-line UserError if the config asks for more than the cluster has: in all, on its largest node,
    or once the workers are packed node by node and GPU by GPU (``workers_on_node``). Ray would otherwise accept
    the config, place the workers that fit, and leave the rest (or a Tune trial's placement group) waiting for ever.
    ``nodes``: each alive node's resources (default: ``ray.nodes()``)."""
    total = ray.cluster_resources() if total is None else total
    if nodes is None:
        nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    need = required_resources(engine)
    have_cpu, have_gpu = total.get("CPU", 0.0), total.get("GPU", 0.0)
    if engine.gpus_per_worker > 0 and have_gpu == 0:
        raise UserError(f"config key 'engine.gpus_per_worker': asks for {engine.gpus_per_worker} GPU per worker, "
                        f"but the Ray cluster has no GPU (CPU={have_cpu:g}); set engine.gpus_per_worker=0")
    if need["GPU"] > have_gpu + 1e-9:
        raise UserError(f"config key 'engine.gpus_per_worker': {engine.num_workers} workers x "
                        f"{engine.gpus_per_worker:g} GPU = {need['GPU']:g} GPU, but the cluster has {have_gpu:g}")
    if need["CPU"] > have_cpu + 1e-9:
        raise UserError(f"config key 'engine.num_workers': {engine.num_workers} workers x {engine.cpus_per_worker:g} "
                        f"CPU (+{engine.driver_cpus:g} for the driver) = {need['CPU']:g} CPU, "
                        f"but the cluster has {have_cpu:g}")
    for resource, key in (("CPU", "cpus_per_worker"), ("GPU", "gpus_per_worker")):  # one worker fits on one node
        per_worker = getattr(engine, key)
        biggest = max((n.get(resource, 0.0) for n in nodes), default=total.get(resource, 0.0))
        if per_worker > biggest + 1e-9:
            raise UserError(f"config key 'engine.{key}': {per_worker:g} {resource} per worker, but the largest node "
                            f"has {biggest:g}")
    if not nodes:
        return
    fits = [workers_on_node(engine, n) for n in nodes]
    if sum(fits) >= engine.num_workers:
        return
    layout = ", ".join(f"CPU {n.get('CPU', 0.0):g}" + (f" GPU {n.get('GPU', 0.0):g}" if engine.gpus_per_worker else "")
                       for n in nodes)
    if engine.gpus_per_worker > 0 and sum(fits) < sum(math.floor(n.get("CPU", 0.0) / engine.cpus_per_worker + 1e-9)
                                                      for n in nodes):
        per_gpu = RAY_UNITS // round(engine.gpus_per_worker * RAY_UNITS) if engine.gpus_per_worker < 1 else None
        how = (f"a share must sit on one GPU, so each GPU takes {per_gpu}" if per_gpu is not None
               else "a worker's GPUs must sit on one node")
        raise UserError(f"config key 'engine.gpus_per_worker': {engine.num_workers} workers x "
                        f"{engine.gpus_per_worker:g} GPU do not fit: {how}, and the nodes ({layout}) take "
                        f"{sum(fits)}; ask for fewer workers or a share that divides a GPU (0.5, 0.25, ...)")
    raise UserError(f"config key 'engine.num_workers': {engine.num_workers} workers x {engine.cpus_per_worker:g} CPU "
                    f"do not fit: a worker's CPUs must sit on one node, and the nodes ({layout}) take {sum(fits)}")
