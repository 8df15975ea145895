"""The asynchronous server's event queue: its order (time, then client, then job) and its record, through a
checkpoint file and from the rows an older raysim kept."""

from __future__ import annotations

import json

from raysim.engine.events import EventQueue, Flight, Wait
from raysim.engine.state import atomic_save, safe_load


def test_event_queue_orders_by_time_then_client_then_sequence():
    q = EventQueue()
    q.push(Flight(seq=5, client=3, start=0.0, finish=2.0, version=0, bytes_down=1, bytes_up=1, dropped=False))
    q.push(Flight(seq=2, client=7, start=0.0, finish=1.0, version=0, bytes_down=1, bytes_up=1, dropped=False))
    q.push(Flight(seq=4, client=3, start=0.5, finish=1.0, version=1, bytes_down=1, bytes_up=1, dropped=True))
    q.push(Flight(seq=1, client=3, start=0.2, finish=1.0, version=0, bytes_down=1, bytes_up=1, dropped=False))
    q.push(Wait(seq=9, time=1.0, attempt=2))  # a waiting slot counts as client −1
    assert set(q.busy()) == {3, 7} and q.busy()[3] == 3 and len(q) == 5
    copy = EventQueue.from_record(q.record())  # what a checkpoint keeps gives it back
    order = []
    while len(q):
        e = q.pop()
        order.append((e.time, -1, e.seq) if isinstance(e, Wait) else (e.finish, e.client, e.seq))
    # time 1.0: the wait (−1), client 3's jobs by sequence (1, then 4), client 7; then time 2.0
    assert order == [(1.0, -1, 9), (1.0, 3, 1), (1.0, 3, 4), (1.0, 7, 2), (2.0, 3, 5)]
    assert [e.seq for e in [copy.pop() for _ in range(5)]] == [9, 1, 4, 2, 5]
    assert q.busy() == {} and set(copy.busy()) == set()  # the clients in flight follow the pops


def test_the_queues_record_gives_back_every_entry_through_a_checkpoint_file_and_from_old_rows(tmp_path):
    q = EventQueue()
    q.push(Flight(seq=5, client=3, start=0.25, finish=2.0, version=0, bytes_down=210_000, bytes_up=7, dropped=False))
    q.push(Flight(seq=4, client=3, start=0.5, finish=1.0 / 3.0, version=1, bytes_down=1, bytes_up=1, dropped=True))
    q.push(Wait(seq=9, time=1e-300, attempt=2))
    entries = [e for *_, e in sorted(q._heap)]
    atomic_save({"queue": q.record()}, tmp_path / "q.pt")
    back = EventQueue.from_record(safe_load(tmp_path / "q.pt")["queue"])
    assert [e for *_, e in sorted(back._heap)] == entries and back.busy() == {3: 2}
    rows = [["flight", 5, 3, 0.25, 2.0, 0, 210_000, 7, False], ["flight", 4, 3, 0.5, 1.0 / 3.0, 1, 1, 1, True],
            ["wait", 9, 1e-300, 2]]  # a checkpoint of raysim before the record was tensors
    assert [e for *_, e in sorted(EventQueue.from_record(json.loads(json.dumps(rows)))._heap)] == entries
    assert EventQueue.from_record(EventQueue().record())._heap == []
