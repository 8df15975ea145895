"""runlog: the console's round line, byte units and summary table; metrics.jsonl reading and resume truncation."""

from __future__ import annotations

import json

import pytest

from raysim.errors import UserError
from raysim.runlog import RunLog, format_round, human_bytes, read_metrics, summary_table


def _row(rnd: int, **extra: object) -> dict:
    row = {"round": rnd, "acc_mean": 0.5 + rnd / 100, "acc_global": None, "loss": 1.0 / rnd, "bytes_up": 12_345,
           "bytes_down": 2_500_000, "bytes_up_total": 12_345 * rnd, "bytes_down_total": 2_500_000 * rnd,
           "wall_s": 0.25, "wall_s_total": 0.25 * rnd}
    row.update(extra)
    return row


@pytest.mark.parametrize("n, text", [(0, "0B"), (999, "999B"), (1000, "1.0KB"), (12_345, "12.3KB"),
                                     (2_500_000, "2.5MB"), (7.1e9, "7.1GB"), (3e12, "3000.0GB")])
def test_human_bytes_uses_decimal_units(n, text):
    assert human_bytes(n) == text


def test_round_line_pads_the_round_and_shows_only_what_the_round_has():
    line = format_round(_row(3), rounds=120)
    assert line == "round   3/120  acc_mean 0.5300  loss 0.3333  up 12.3KB down 2.5MB  0.25s"
    line = format_round(_row(3, acc_global=0.61234, k=13, p=0.456), rounds=5)
    assert line == ("round 3/5  acc_mean 0.5300  acc_global 0.6123  loss 0.3333  k 13  p 0.46  up 12.3KB down 2.5MB  "
                    "0.25s")
    assert "acc_mean" not in format_round(_row(2, acc_mean=None), rounds=5)  # a round without evaluation


def test_summary_table_reports_best_and_final_and_totals(tmp_path):
    rows = [_row(1), _row(2, acc_mean=0.9, acc_global=0.8), _row(3, acc_mean=0.7)]
    lines = summary_table(rows, tmp_path).splitlines()
    assert lines[0] == lines[-1] and set(lines[0]) == {"-"} and len(lines[0]) == max(map(len, lines[1:-1]))
    table = dict((part.strip() for part in line.split("  ", 1)) for line in lines[1:-1])  # key, two spaces, value
    assert table["rounds"] == "3"
    assert table["best acc_mean"] == "0.9000 (round 2)" and table["final acc_mean"] == "0.7000"
    assert table["best acc_global"] == "0.8000 (round 2)"
    assert table["bytes up / down"] == "37.0KB / 7.5MB"
    assert table["wall time"] == "0.8s (0.25s per round)"
    assert table["run directory"] == str(tmp_path)
    assert summary_table([], tmp_path) == f"no rounds completed; run directory: {tmp_path}"


def test_read_metrics_skips_a_torn_last_line_and_refuses_damage_before_it(tmp_path):
    path = tmp_path / "metrics.jsonl"
    assert read_metrics(path) == []  # no file yet
    good = [json.dumps(_row(r)) for r in (1, 2)]
    path.write_text("\n".join(good) + '\n{"round": 3, "acc_me')
    warnings: list[str] = []
    assert [r["round"] for r in read_metrics(path, warn=warnings.append)] == [1, 2]
    assert len(warnings) == 1 and "line 3" in warnings[0]
    path.write_text(good[0] + "\n[1, 2]\n" + good[1] + "\n")
    with pytest.raises(UserError, match="damaged at line 2 of 3"):
        read_metrics(path)


def test_resume_keeps_whole_rounds_up_to_the_checkpoint(tmp_path):
    log = RunLog(tmp_path, tensorboard=False, per_client_max=0)
    for r in (1, 2, 3):
        log.write(_row(r))
    log.close()
    with open(tmp_path / "metrics.jsonl", "a") as fh:
        fh.write('{"round": 4, "lo')  # killed mid-write
    log = RunLog(tmp_path, tensorboard=False, per_client_max=0, resume_round=2)
    log.write(_row(3, acc_mean=0.99))
    log.close()
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [(r["round"], r["acc_mean"]) for r in rows] == [(1, 0.51), (2, 0.52), (3, 0.99)]
    # no temporary file left behind (client_metrics.jsonl is the run's per-client file, empty here)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["client_metrics.jsonl", "metrics.jsonl"]


def test_a_resumed_tensorboard_file_sorts_after_the_files_it_resumes(tmp_path):
    """TensorBoard reads event files in name order (second, host, pid, counter; pid and counter as text): a resume
    in the same second as the file it resumes must still sort last, or its purge is read before the old points."""
    import time

    log = RunLog(tmp_path, tensorboard=False, per_client_max=0)
    log.write(_row(1))
    log.close()
    # stamped a second ahead, so the resume's writer opens within its second however slow the import ("~" sorts after
    # any host name): without the wait it sorts first
    old = tmp_path / f"events.out.tfevents.{int(time.time()) + 1:010d}.~.99999.9"
    old.write_bytes(b"")
    log = RunLog(tmp_path, tensorboard=True, per_client_max=0, resume_round=1)
    log.close()
    files = sorted(p.name for p in tmp_path.glob("events.out.tfevents.*"))
    assert len(files) == 2 and files[0] == old.name
