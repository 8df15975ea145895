"""Client state and checkpoints.

Per-client state (personalised parameters, whatever an algorithm keeps) lives in the executor's object store (Ray's,
or private snapshots in-process), referenced by the driver, never inside a worker: a dead worker loses nothing, and
Ray's store spills to disk past its memory budget. Under Ray every kept object is in the store of the driver's node
(``raysim.engine.pool`` moves a state made on another node there), so a lost worker node loses nothing either.
Checkpoints are written atomically and read with ``torch.load(weights_only=True)`` (no pickled code runs).

Checkpoint layout (``RUN_DIR/checkpoint``)::

    server.pt                   round, server state, totals, and which file holds each client's latest state
    clients/c000042_r00007.pt   client 42's state as of round 7 (written only when the client changed)

    history/c000042_r00007.pt   what the server kept of client 42's round-7 update (``Algorithm.server_keep``)

``server.pt`` is replaced last, so a crash mid-checkpoint leaves the previous checkpoint whole; superseded client
files are deleted only after the new ``server.pt`` is in place.

What a checkpoint knows about itself (checked on resume): ``server.pt`` holds the sha256 of every client and history
file it names (``checksums``), the resolved config it was made with (``config``, dotted keys) and ``sha256``, a
digest of its own content (every tensor's dtype, shape and bytes, every other value), so a changed bit anywhere is
refused in one line. Checkpoints made before these records (none of these keys) are read as they are.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Optional, Protocol

import torch

from raysim.errors import NotOnCPU, UserError
from raysim.fsutil import atomic_writer
from raysim.trees import tensor_leaves

FORMAT_VERSION = 1
_SAVE_CHUNK = 256  # client states fetched and written per batch (bounds the driver's memory at checkpoint time)

# the checkpoint's layout (see the module docstring): its names are spelled here and nowhere else
CHECKPOINT_DIR = "checkpoint"
SERVER_FILE = "server.pt"
CLIENTS_DIR = "clients"
HISTORY_DIR = "history"
VERSIONS_DIR = "versions"  # the asynchronous modes: one file per server version that jobs in flight hold
_ENTRY_FILE = re.compile(r"c(\d+)_r(\d+)\.pt$")


def checkpoint_dir(run_dir: Path) -> Path:
    """``RUN_DIR/checkpoint``: everything a resumed run restarts from."""
    return Path(run_dir) / CHECKPOINT_DIR


def server_file(run_dir: Path) -> Path:
    """``RUN_DIR/checkpoint/server.pt``, the commit point: a round counts as checkpointed once it is written."""
    return checkpoint_dir(run_dir) / SERVER_FILE


def has_checkpoint(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a checkpoint to resume (at least one round completed and saved)."""
    return server_file(run_dir).is_file()


def entry_name(client_id: int, round: int) -> str:
    """The file name of a client's entry as of a round: ``c000042_r00007.pt``."""
    return f"c{int(client_id):06d}_r{int(round):05d}.pt"


def parse_entry_name(name: str) -> Optional[tuple[int, int]]:
    """(client, round) of an entry's file name, or None for any other name."""
    m = _ENTRY_FILE.match(name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def client_file(ckpt_dir: Path, client_id: int, round: int) -> Path:
    """The file holding ``client_id``'s kept state as of ``round``, in the checkpoint directory ``ckpt_dir``."""
    return Path(ckpt_dir) / CLIENTS_DIR / entry_name(client_id, round)


def version_file(ckpt_dir: Path, version: int) -> Path:
    """The file of a server version's payload in an asynchronous run's checkpoint: ``versions/v000007.pt``."""
    return Path(ckpt_dir) / VERSIONS_DIR / f"v{int(version):06d}.pt"


def history_file(ckpt_dir: Path, client_id: int, round: int) -> Path:
    """The file holding what the server kept of ``client_id``'s update of ``round`` (``Algorithm.server_keep``)."""
    return Path(ckpt_dir) / HISTORY_DIR / entry_name(client_id, round)


def require_cpu(tree: Any, what: str, path: str = "") -> None:
    """Raise :class:`~raysim.errors.NotOnCPU` naming the entry when a tensor of ``tree`` (nested dicts, lists,
    tuples) is not on the CPU: a checkpoint must load, and a stored object be read, where that device is not."""
    for keys, t in tensor_leaves(tree):
        if t.device.type != "cpu":
            where = path + "".join(f"[{k!r}]" for k in keys)
            raise NotOnCPU(f"{what}{where}: a {t.device} tensor of shape {list(t.shape)}, where only CPU "
                           f"tensors may go (a checkpoint, the object store)")


class CheckpointCorrupt(UserError):
    """A checkpoint file whose content no longer matches the checksum recorded when it was written."""


def _corrupt(path: Path) -> CheckpointCorrupt:
    return CheckpointCorrupt(f"checkpoint file {path} fails its sha256 checksum (changed or damaged since raysim "
                             f"wrote it); raysim keeps only the last checkpoint, so no older complete one exists to "
                             f"resume from: restore the file or start a new run")


_PLAIN = (int, float, str, bool, type(None))  # exactly these types (no subclass): hashed as their repr


def _plain(obj: Any) -> str:
    return f"{type(obj).__name__}:{obj!r};"


def _feed(h: Any, obj: Any) -> None:
    """Hash ``obj`` (what a checkpoint holds: tensors, dicts, lists, tuples, plain values) by content and structure.
    A list, tuple or dict of plain values goes in as one string: the same bytes, so the same digest, as one
    ``update`` per value (the asynchronous queue's rows, a run's file maps)."""
    if type(obj) in (list, tuple) and all(type(v) in _PLAIN for v in obj):
        h.update((f"{'L' if type(obj) is list else 'U'}{len(obj)};" + "".join(map(_plain, obj))).encode())
    elif type(obj) is dict and all(type(k) in _PLAIN and type(v) in _PLAIN for k, v in obj.items()):
        h.update((f"D{len(obj)};" + "".join(_plain(k) + _plain(v) for k, v in obj.items())).encode())
    elif isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy())  # the tensor's own buffer: the same bytes, no copy
    elif isinstance(obj, dict):
        h.update(f"D{len(obj)};".encode())
        for k, v in obj.items():
            _feed(h, k)
            _feed(h, v)
    elif isinstance(obj, (list, tuple)):
        h.update(f"{'L' if isinstance(obj, list) else 'U'}{len(obj)};".encode())
        for v in obj:
            _feed(h, v)
    else:
        h.update(f"{type(obj).__name__}:{obj!r};".encode())


def content_digest(obj: Any) -> str:
    """sha256 of a checkpoint's content (the same for the object saved and the object loaded back)."""
    h = hashlib.sha256()
    _feed(h, obj)
    return h.hexdigest()


def _serialized(obj: Any) -> tuple[bytes, str]:
    buf = io.BytesIO()
    torch.save(obj, buf)
    data = buf.getvalue()
    return data, hashlib.sha256(data).hexdigest()


def _no_link(folder: Path) -> None:
    """Checkpoint writes never follow a symbolic link: refuse a checkpoint folder (or its parent, the checkpoint
    directory) that is one (the run directory itself may be a link)."""
    for f in (folder, folder.parent) if folder.parent.name == CHECKPOINT_DIR else (folder,):
        if f.is_symlink():
            raise UserError(f"{f} is a symbolic link (to {os.readlink(f)}); a run writes only inside its own "
                            f"directory: replace the link with what it points to")


def atomic_save(obj: Any, path: Path) -> None:
    """torch.save to a temporary file in the same directory, fsync, then rename over ``path``.

    fsync: a checkpoint is what a resumed run restarts from, so it must be on disk before the round counts as saved.
    """
    require_cpu(obj, str(path.name))
    _no_link(path.parent)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_writer(path, fsync=True) as fh:
        torch.save(obj, fh)


def save_all_durably(items: list[tuple[Any, Path]]) -> dict[str, str]:
    """``atomic_save`` for many files at once: write every temporary file, then fsync and rename each.

    The same guarantee as one ``atomic_save`` per file (each final file is whole and on disk before this returns),
    but the first fsync commits the whole batch and the rest find little left to flush: 100 client files a round
    cost ~40 ms each with one fsync per write, a few ms each batched. Returns each file's name -> its sha256.
    """
    for obj, path in items:
        require_cpu(obj, str(path.name))
    for folder in {path.parent for _, path in items}:
        _no_link(folder)
    pending: list[tuple[str, Path]] = []
    sums: dict[str, str] = {}
    try:
        for obj, path in items:
            path.parent.mkdir(parents=True, exist_ok=True)
            data, sums[path.name] = _serialized(obj)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            pending.append((tmp, path))
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
        while pending:
            tmp, path = pending[0]
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
            pending.pop(0)
    except BaseException:
        for tmp, _ in pending:
            Path(tmp).unlink(missing_ok=True)
        raise
    return sums


def safe_load(path: Path, sha256: Optional[str] = None) -> Any:
    """Load a checkpoint file without executing pickled code; a damaged file, or one whose bytes do not match
    ``sha256`` (the checksum recorded when it was written), is a one-line UserError."""
    try:
        if sha256 is None:
            return torch.load(path, map_location="cpu", weights_only=True)
        data = Path(path).read_bytes()
        if hashlib.sha256(data).hexdigest() != sha256:
            raise _corrupt(path)
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except CheckpointCorrupt:
        raise
    except FileNotFoundError:
        raise UserError(f"checkpoint file missing: {path}") from None
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means a damaged checkpoint
        raise UserError(f"checkpoint {path} is damaged or not a raysim checkpoint "
                        f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from None


class Objects(Protocol):
    """Where objects live: ``put`` returns a handle, ``get`` the values of handles (an executor)."""

    def put(self, obj: Any) -> Any: ...

    def get(self, handles: list) -> list: ...


class ClientStateStore:
    """Every client's kept state (``Algorithm.client_keep``), held by the driver as object references.

    States live in Ray's object store, never in a worker, so a dead worker loses none. Only the states changed since
    the last checkpoint are written at the next one (``c<client>_r<round>.pt``, fsynced in batches); ``server.pt``
    names the file of every client, so the checkpoint is whole once it is written, and ``load`` puts the states
    back and removes what no checkpoint names (files of rounds after a crash, temporary files).
    """

    def __init__(self, objects: Objects) -> None:
        self._objects = objects
        self._refs: dict[int, Any] = {}
        self._dirty: set[int] = set()
        self._file_round: dict[int, int] = {}  # client -> round of its state file in the last checkpoint
        self.checksums: dict[str, str] = {}  # file name -> sha256, of every file the last checkpoint names

    def __len__(self) -> int:
        return len(self._refs)

    def get(self, client_id: int) -> Optional[Any]:
        """The client's state handle, or None for a client that has not trained yet (initial weights)."""
        return self._refs.get(client_id)

    def put(self, client_id: int, ref: Any) -> None:
        self._refs[client_id] = ref
        self._dirty.add(client_id)

    # ------------------------------------------------------------------ checkpoints
    def save(self, ckpt_dir: Path, round: int, server: dict, checksums: Optional[dict[str, str]] = None) -> None:
        """Write changed client states, then ``server.pt`` (the commit point), then drop superseded files.

        ``checksums``: more files' sha256 for ``server.pt`` to record (the history entries the server keeps)."""
        new_rounds = dict(self._file_round)
        sums = {name: digest for name, digest in self.checksums.items()
                if not (e := parse_entry_name(name)) or e[0] not in self._dirty}
        dirty = sorted(self._dirty)
        for start in range(0, len(dirty), _SAVE_CHUNK):  # one object-store round trip and one fsync batch a chunk
            chunk = dirty[start:start + _SAVE_CHUNK]
            states = self._objects.get([self._refs[cid] for cid in chunk])
            sums.update(save_all_durably([(st, client_file(ckpt_dir, cid, round)) for cid, st in zip(chunk, states)]))
            new_rounds.update({cid: round for cid in chunk})
        record = {"format": FORMAT_VERSION, "round": round, "client_files": new_rounds, **server,
                  "checksums": {"clients": sums, "history": dict(checksums or {})}}
        atomic_save({**record, "sha256": content_digest(record)}, ckpt_dir / SERVER_FILE)
        for cid in self._dirty:
            old = self._file_round.get(cid)
            if old is not None and old != round:
                client_file(ckpt_dir, cid, old).unlink(missing_ok=True)
        self._file_round = new_rounds
        self.checksums = sums
        self._dirty.clear()

    def load(self, ckpt_dir: Path, client_files: dict[int, int], checksums: Optional[dict[str, str]] = None) -> None:
        """Put every client's checkpointed state back into the object store (each file checked against its
        checksum, where the checkpoint records one); remove files no checkpoint names."""
        clients_dir = Path(ckpt_dir) / CLIENTS_DIR
        self.checksums = dict(checksums or {})
        for cid, rnd in sorted(client_files.items()):
            path = client_file(ckpt_dir, cid, rnd)
            self._refs[int(cid)] = self._objects.put(safe_load(path, self.checksums.get(path.name)))
        self._file_round = {int(c): int(r) for c, r in client_files.items()}
        self._dirty.clear()
        if clients_dir.is_dir():
            for f in clients_dir.iterdir():
                entry = parse_entry_name(f.name)
                if f.name.startswith(".") or (entry and self._file_round.get(entry[0]) != entry[1]):
                    f.unlink(missing_ok=True)


class ClientHistoryStore:
    """What the server keeps per client (``Algorithm.server_keep``): each client's newest ``limit`` objects.

    The driver holds only object references (oldest first); the objects live in the object store, which spills them
    to disk past its memory budget, so the driver's heap never holds clients x limit models. An entry is immutable
    once kept, so a checkpoint writes each entry once (``history/cCLIENT_rROUND.pt``), and files of entries that
    dropped out of the window are deleted after the new ``server.pt`` names the remaining ones.
    """

    def __init__(self, limit: int, objects: Objects) -> None:
        self.limit = int(limit)
        self._objects = objects
        self._entries: dict[int, list[tuple[int, Any]]] = {}  # client -> [(round, ref)], oldest first
        self._on_disk: set[tuple[int, int]] = set()  # (client, round) files written by earlier checkpoints
        self.checksums: dict[str, str] = {}  # file name -> sha256 of the files on disk

    def push(self, client_id: int, round: int, ref: Any) -> None:
        if self.limit < 1:
            return
        entries = self._entries.setdefault(client_id, [])
        entries.append((round, ref))
        del entries[:-self.limit]

    def refs(self, client_id: int) -> list[Any]:
        return [ref for _, ref in self._entries.get(client_id, [])]

    def index(self) -> dict[int, list[int]]:
        """client -> rounds of its kept entries, oldest first (what ``server.pt`` records)."""
        return {cid: [r for r, _ in entries] for cid, entries in sorted(self._entries.items()) if entries}

    def save(self, ckpt_dir: Path) -> dict[int, list[int]]:
        """Write the entries no checkpoint holds yet; returns the index to record in ``server.pt``."""
        new = [(cid, r, ref) for cid, entries in sorted(self._entries.items()) for r, ref in entries
               if (cid, r) not in self._on_disk]
        for start in range(0, len(new), _SAVE_CHUNK):
            chunk = new[start:start + _SAVE_CHUNK]
            objs = self._objects.get([ref for _, _, ref in chunk])
            self.checksums.update(save_all_durably([(obj, history_file(ckpt_dir, cid, r))
                                                    for (cid, r, _), obj in zip(chunk, objs)]))
            self._on_disk.update((cid, r) for cid, r, _ in chunk)
        return self.index()

    def prune(self, ckpt_dir: Path) -> None:
        """Delete the files of entries that are no longer kept (after ``server.pt`` has been replaced)."""
        live = {(cid, r) for cid, rounds in self.index().items() for r in rounds}
        for cid, r in sorted(self._on_disk - live):
            history_file(ckpt_dir, cid, r).unlink(missing_ok=True)
            self.checksums.pop(entry_name(cid, r), None)
        self._on_disk &= live

    def load(self, ckpt_dir: Path, index: dict[int, list[int]], checksums: Optional[dict[str, str]] = None) -> None:
        """Put the checkpointed entries back into the object store (each file checked against its checksum, where
        the checkpoint records one); remove files the checkpoint does not name."""
        folder = Path(ckpt_dir) / HISTORY_DIR
        sums = dict(checksums or {})

        def read(cid: int, r: int) -> Any:
            return safe_load(history_file(ckpt_dir, cid, r), sums.get(entry_name(cid, r)))
        self._entries = {int(cid): [(int(r), self._objects.put(read(cid, r))) for r in rounds][-self.limit:]
                         if self.limit else [] for cid, rounds in sorted(index.items())}
        self.checksums = {name: d for name, d in sums.items()
                          if (e := parse_entry_name(name)) and e in {(c, r) for c, es in self._entries.items()
                                                                    for r, _ in es}}
        self._on_disk = {(cid, r) for cid, entries in self._entries.items() for r, _ in entries}
        if folder.is_dir():
            for f in folder.iterdir():
                entry = parse_entry_name(f.name)
                if f.name.startswith(".") or (entry and entry not in self._on_disk):
                    f.unlink(missing_ok=True)


def read_checkpoint(run_dir: Path) -> dict:
    """``server.pt``, checked against the digest of its own content it records (a checkpoint older than that
    record is read as it is)."""
    ckpt = safe_load(server_file(run_dir))
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT_VERSION or "round" not in ckpt:
        raise UserError(f"{server_file(run_dir)} is not a raysim checkpoint of format {FORMAT_VERSION}")
    if "sha256" in ckpt:
        recorded = ckpt.pop("sha256")
        if recorded != content_digest(ckpt):
            raise _corrupt(server_file(run_dir))
    return ckpt


def verify_files(run_dir: Path, ckpt: dict) -> None:
    """Check every client, history and server-version file ``ckpt`` names against its recorded sha256 (a one-line
    UserError for the first that is missing or fails), so that a resume refuses before it changes anything."""
    ckpt_dir = checkpoint_dir(run_dir)
    named: list[tuple[str, str, Optional[str]]] = []  # (folder, file name, its recorded sha256)
    for kind, names in ((CLIENTS_DIR, [entry_name(c, r) for c, r in sorted(ckpt.get("client_files", {}).items())]),
                        (HISTORY_DIR, [entry_name(c, r) for c, rs in sorted(ckpt.get("history", {}).items())
                                       for r in rs])):
        sums = checksums(ckpt, kind)
        named += [(kind, name, sums.get(name)) for name in names]
    versions = (ckpt.get("asynchronous") or {}).get("versions") or {}  # version -> [file, sha256]
    named += [(VERSIONS_DIR, version_file(ckpt_dir, int(v)).name, str(entry[1]))  # (an older checkpoint holds
              for v, entry in sorted(versions.items()) if isinstance(entry, (list, tuple))]  # each payload itself)
    for kind, name, recorded in named:
        path = ckpt_dir / kind / name
        if recorded is None:
            continue
        try:
            with open(path, "rb") as fh:
                digest = hashlib.file_digest(fh, "sha256").hexdigest()
        except FileNotFoundError:
            raise UserError(f"checkpoint file missing: {path}") from None
        if digest != recorded:
            raise _corrupt(path)


def checksums(ckpt: dict, kind: str) -> dict[str, str]:
    """The sha256 of each ``kind`` ("clients" or "history") file a checkpoint recorded ({} for an older one)."""
    return dict((ckpt.get("checksums") or {}).get(kind) or {})


def checkpoint_round(run_dir: Path) -> Optional[int]:
    """The round of a run directory's checkpoint (None without one): a resume continues after it."""
    if not has_checkpoint(run_dir):
        return None
    return int(read_checkpoint(Path(run_dir))["round"])
