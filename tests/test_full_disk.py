"""A full disk mid-run (issue 39): the run stops with exit 3 and its one line, and TensorBoard's writer thread adds
no traceback. A real full filesystem needs a mount this test cannot make, so the fault is injected at the write of
TensorBoard's event records (the first thing a run writes once per round besides metrics.jsonl)."""

from __future__ import annotations

import errno
import threading


from conftest import tiny_overrides
from raysim.cli import main


def test_a_full_disk_under_tensorboard_is_one_line(tmp_path, capsys, monkeypatch):
    from tensorboard.summary.writer import record_writer

    real = record_writer.RecordWriter.write
    written = []

    def write(self, data):
        if len(written) >= 3:  # the run header's records go through, then the disk is full
            raise OSError(errno.ENOSPC, "No space left on device")
        written.append(len(data))
        return real(self, data)

    monkeypatch.setattr(record_writer.RecordWriter, "write", write)
    unhandled = []  # what would print "Exception in thread ..." with its traceback
    monkeypatch.setattr(threading, "excepthook", lambda args: unhandled.append(args.exc_value))
    code = main(["run", *tiny_overrides(tmp_path, rounds=4, log__tensorboard="true"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 3, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err and "Exception in thread" not in err, err
    assert unhandled == []
    assert lines[0].startswith("raysim: stopped: cannot write") and "No space left on device" in lines[0], err
