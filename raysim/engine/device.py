"""A job process's device: CUDA only where a GPU share was reserved and CUDA works, determinism, memory, and
out-of-memory errors as one line. Ray-free: the worker (``raysim.engine.worker``) and the in-process executor call it.

- :func:`cuda_unusable` says why CUDA cannot be used here (no driver, a driver too old for this torch's CUDA,
  a CPU-only build, no visible device), in torch's own words; a worker that holds a GPU share then refuses to start
  with that cause and its node's name, instead of training on the CPU in silence.
- :func:`configure` sets the process up for its device once, before CUDA is initialised: with ``engine.deterministic``
  (the default) cuDNN's deterministic algorithms, ``torch.use_deterministic_algorithms``, cuBLAS's fixed workspace
  (``CUBLAS_WORKSPACE_CONFIG``) and no TF32, so a GPU run gives the same numbers on every run and worker count; and
  a cap of the process's CUDA memory at its GPU fraction, so one worker cannot take its neighbours' share. A CPU
  process is left as it is (its kernels are deterministic for a fixed thread count).
- :func:`job_guard` turns an out-of-memory error of a job into :class:`~raysim.errors.OutOfMemory`: one line
  naming the job and the process, with what to change (and an operation that has no deterministic CUDA kernel
  into one line naming ``engine.deterministic``).
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from typing import Any, Callable, Iterator, Optional, Union

import torch

from raysim.errors import OutOfMemory, UserError

CUBLAS_WORKSPACE = ":4096:8"  # what cuBLAS needs to be deterministic (CUDA's reproducibility notes)


def cuda_unusable() -> Optional[str]:
    """None when this process can use CUDA, else why not (one line, torch's own words where it has them)."""
    if not torch.backends.cuda.is_built():
        return f"this torch ({torch.__version__}) was built without CUDA"
    try:
        torch.cuda.init()
    except Exception as exc:  # noqa: BLE001 - whatever CUDA says is the cause to report
        text = str(exc).strip().splitlines()
        return text[0] if text else type(exc).__name__
    if torch.cuda.device_count() == 0:
        return f"no CUDA device is visible (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})"
    return None


def node_name() -> str:
    """This machine as a user finds it in a cluster: its host name and, under Ray, its node's IP address."""
    host = socket.gethostname()
    ray = sys.modules.get("ray")  # never imported for this (the in-process executor runs without Ray)
    try:
        if ray is not None and ray.is_initialized():
            return f"{host} ({ray.util.get_node_ip_address()})"
    except Exception:  # noqa: BLE001 - a name without the address is still a name
        pass
    return host


def refuse_gpu_share(gpus: float, gpu_ids: list, cause: str, where: str) -> str:
    """The one-line message of a process that holds a GPU share but cannot use CUDA."""
    ids = ", ".join(map(str, gpu_ids))
    return (f"config key 'engine.gpus_per_worker': a worker on {where} holds {gpus:g} GPU (GPU {ids} of its node) "
            f"but cannot use CUDA: {cause}; install a torch build that matches the node's NVIDIA driver, or set "
            f"engine.gpus_per_worker=0")


def _settings() -> dict[str, Any]:
    return {"cudnn.deterministic": torch.backends.cudnn.deterministic,
            "cudnn.benchmark": torch.backends.cudnn.benchmark,
            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "matmul": torch.backends.cuda.matmul.fp32_precision, "conv": torch.backends.cudnn.conv.fp32_precision,
            "rnn": torch.backends.cudnn.rnn.fp32_precision}


def configure(device: torch.device, deterministic: bool, gpu_fraction: float = 1.0) -> dict[str, Any]:
    """Set this process up for jobs on ``device`` (call before its first CUDA operation); returns the settings it
    replaced, for :func:`restore` (a notebook's own process, on the in-process executor). On a CPU: nothing."""
    if device.type != "cuda":
        return {}
    previous = _settings()
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)  # read when cuBLAS starts
    torch.backends.cudnn.deterministic = deterministic
    torch.backends.cudnn.benchmark = not deterministic  # benchmarking picks algorithms by timing
    torch.use_deterministic_algorithms(deterministic)
    precision = "ieee" if deterministic else "tf32"  # TF32 rounds float32 matmuls and convolutions to 10 bits
    torch.backends.cuda.matmul.fp32_precision = precision  # torch's new TF32 API only: mixing in the legacy
    torch.backends.cudnn.conv.fp32_precision = precision  # allow_tf32 flags makes torch raise when they are read
    torch.backends.cudnn.rnn.fp32_precision = precision
    if 0 < gpu_fraction < 1:
        torch.cuda.set_per_process_memory_fraction(gpu_fraction, device.index if device.index is not None else 0)
    return previous


def restore(previous: dict[str, Any]) -> None:
    """Put back what :func:`configure` replaced (the memory cap stays: it lasts as long as the process's CUDA)."""
    if not previous:
        return
    torch.backends.cudnn.deterministic = previous["cudnn.deterministic"]
    torch.backends.cudnn.benchmark = previous["cudnn.benchmark"]
    torch.use_deterministic_algorithms(previous["deterministic_algorithms"])
    torch.backends.cuda.matmul.fp32_precision = previous["matmul"]
    torch.backends.cudnn.conv.fp32_precision = previous["conv"]
    torch.backends.cudnn.rnn.fp32_precision = previous["rnn"]


def memory_info(device: torch.device) -> dict[str, Any]:
    """This process's peak CUDA memory (what ``torch.cuda.max_memory_reserved`` says; none on a CPU)."""
    if device.type != "cuda":
        return {}
    return {"gpu_max_reserved_mib": torch.cuda.max_memory_reserved(device) / 2**20,
            "gpu_max_allocated_mib": torch.cuda.max_memory_allocated(device) / 2**20}


def _is_out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or (
        isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc))  # the CPU allocator's words


def _first_sentences(exc: BaseException, n: int = 2) -> str:
    text = " ".join(str(exc).split())
    parts = text.split(". ")
    return ". ".join(parts[:n]).rstrip(".") if text else type(exc).__name__


def out_of_memory_message(exc: BaseException, what: str, where: str, engine: Any, eval_chunk: int) -> str:
    """One line: which job ran out of memory where, torch's first words, and what to change."""
    if engine.gpus_per_worker > 0:
        fewer = (f"fewer workers per GPU (engine.gpus_per_worker={min(1.0, 2 * engine.gpus_per_worker):g} instead of "
                 f"{engine.gpus_per_worker:g})")
    else:
        fewer = f"fewer workers per machine (engine.num_workers, now {engine.num_workers})"
    return (f"out of memory in {what} on {where}: {_first_sentences(exc)}; try {fewer} or a smaller evaluation "
            f"chunk (eval.chunk={max(1, eval_chunk // 4)} instead of {eval_chunk})")


@contextlib.contextmanager
def job_guard(what: Union[str, Callable[[], str]], where: str, cfg: Any) -> Iterator[None]:
    """Around a job: an out-of-memory error becomes :class:`OutOfMemory` (a one-line ``RunStopped``: the run keeps
    its last checkpoint), an operation without a deterministic CUDA kernel a one-line ``UserError`` naming
    ``engine.deterministic``. ``what`` names the job (a callable: asked once it failed)."""
    try:
        yield
    except Exception as exc:
        if callable(what):
            what = what()
        if _is_out_of_memory(exc):
            raise OutOfMemory(out_of_memory_message(exc, what, where, cfg.engine, cfg.eval.chunk)) from None
        if isinstance(exc, RuntimeError) and "does not have a deterministic implementation" in str(exc):
            raise UserError(f"config key 'engine.deterministic': in {what} on {where}: {_first_sentences(exc, 1)}; "
                            f"set engine.deterministic=false (GPU results then vary from run to run) or avoid that "
                            f"operation") from None
        raise
