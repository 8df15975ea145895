"""The asynchronous server's event queue: the jobs in flight and the slots waiting for a client, earliest first
in simulated time (``raysim.engine.asynchronous``), and its record in a checkpoint."""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Flight:
    """A job in flight: client ``client`` started at ``start`` on server version ``version`` (its download), done
    at ``finish`` (or, for one that never reports, when the server frees its slot); ``dropped``: 0 when it reports,
    else why it never does (``raysim.system.presence``: DROPPED, LEFT, LATE)."""

    seq: int
    client: int
    start: float
    finish: float
    version: int
    bytes_down: int
    bytes_up: int
    dropped: int


@dataclass
class Wait:
    """A slot with no client to start: it draws again at ``time`` (job ``seq``'s ``attempt``-th draw)."""

    seq: int
    time: float
    attempt: int


class EventQueue:
    """Jobs in flight and waiting slots, earliest first: ordered by (simulated time, client id, job sequence); a
    waiting slot counts as client -1. Job sequences are unique, so the order is total."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, Any]] = []
        self._busy: dict[int, int] = {}  # client -> its jobs in flight, kept as jobs come and go (no scan per draw)

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, item: Flight | Wait) -> None:
        if isinstance(item, Flight):
            heapq.heappush(self._heap, (item.finish, item.client, item.seq, item))
            self._busy[item.client] = self._busy.get(item.client, 0) + 1
        else:
            heapq.heappush(self._heap, (item.time, -1, item.seq, item))

    def peek(self) -> Flight | Wait:
        return self._heap[0][3]

    def pop(self) -> Flight | Wait:
        item = heapq.heappop(self._heap)[3]
        if isinstance(item, Flight):
            left = self._busy[item.client] - 1
            if left:
                self._busy[item.client] = left
            else:
                del self._busy[item.client]
        return item

    def flights(self) -> list[Flight]:
        """The jobs in flight, in queue order."""
        return [entry[3] for entry in sorted(self._heap) if isinstance(entry[3], Flight)]

    def busy(self) -> dict[int, int]:
        """The clients in flight (client -> jobs), live: read it, do not keep it."""
        return self._busy

    def record(self) -> dict[str, torch.Tensor]:
        """What a checkpoint keeps, in queue order, as four tensors: the jobs in flight, (seq, client, version,
        bytes_down, bytes_up, dropped) and (start, finish); the waiting slots, (seq, attempt) and time. (As rows of
        plain values, 100 jobs in flight cost a checkpoint 0.6 ms to hash and pickle; as tensors, 0.2 ms.)"""
        entries = [e for *_, e in sorted(self._heap)]
        flights = [e for e in entries if isinstance(e, Flight)]
        waits = [e for e in entries if isinstance(e, Wait)]
        return {"flights": torch.tensor([[f.seq, f.client, f.version, f.bytes_down, f.bytes_up, int(f.dropped)]
                                         for f in flights], dtype=torch.int64).reshape(-1, 6),
                "flight_times": torch.tensor([[f.start, f.finish] for f in flights],
                                             dtype=torch.float64).reshape(-1, 2),
                "waits": torch.tensor([[w.seq, w.attempt] for w in waits], dtype=torch.int64).reshape(-1, 2),
                "wait_times": torch.tensor([w.time for w in waits], dtype=torch.float64)}

    @classmethod
    def from_record(cls, record: dict | list) -> EventQueue:
        """The queue :meth:`record` kept (or, from a checkpoint of raysim before it kept tensors, one row of plain
        values per entry: ``["flight", seq, client, start, finish, version, down, up, dropped]`` or ``["wait", seq,
        time, attempt]``)."""
        queue = cls()
        if isinstance(record, list):
            for kind, *values in record:
                if kind == "flight":
                    seq, client, start, finish, version, down, up, dropped = values
                    queue.push(Flight(int(seq), int(client), float(start), float(finish), int(version), int(down),
                                      int(up), bool(dropped)))
                else:
                    seq, at, attempt = values
                    queue.push(Wait(int(seq), float(at), int(attempt)))
            return queue
        for (seq, client, version, down, up, dropped), (start, finish) in zip(record["flights"].tolist(),
                                                                             record["flight_times"].tolist()):
            queue.push(Flight(seq, client, start, finish, version, down, up, int(dropped)))
        for (seq, attempt), at in zip(record["waits"].tolist(), record["wait_times"].tolist()):
            queue.push(Wait(seq, at, attempt))
        return queue
