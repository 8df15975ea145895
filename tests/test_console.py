"""What a run prints about privacy, simulated time and the curricula: the start line, the round lines, the summary."""

from __future__ import annotations

import pytest

from raysim.config import load_config
from raysim.console import describe_mode, format_round, privacy_delta, summary_table


def _row(rnd: int, **extra: object) -> dict:
    row = {"round": rnd, "acc_mean": 0.5 + rnd / 100, "loss": 1.0, "bytes_up": 1000, "bytes_down": 1000,
           "bytes_up_total": 1000 * rnd, "bytes_down_total": 1000 * rnd, "wall_s": 0.5, "wall_s_total": 0.5 * rnd}
    row.update(extra)
    return row


def _table(text: str) -> dict:
    return dict((s.strip() for s in line.split("  ", 1)) for line in text.splitlines()[1:-1])


def test_a_dp_run_shows_epsilon_and_delta_everywhere(tmp_path):
    cfg = load_config("privacy/dpfedavg-mnist500", [], warn=False)  # 500 clients, target ε 4, δ null: 0.01/500
    assert privacy_delta(cfg) == pytest.approx(2e-5) and privacy_delta(load_config(None, [], warn=False)) is None
    assert describe_mode(cfg) == "DP-FedAvg to ε 4 at δ 2e-05, clip 0.5"
    line = format_round(_row(3, epsilon=3.9999876), rounds=30, delta=privacy_delta(cfg))
    assert "  ε 4.00 (δ 2e-05)  " in line
    # the round's own δ wins (a resumed run keeps its checkpoint's); the loss and Poisson sampling's bytes are
    # shown from under nonprivate/
    row = {k: v for k, v in _row(3, epsilon=4.0, **{"privacy/delta": 0.002}).items() if k not in ("loss", "bytes_up")}
    line = format_round({**row, "nonprivate/loss": 1.5, "nonprivate/bytes_up": 2000}, rounds=30, delta=2e-5)
    assert "  ε 4.00 (δ 0.002)  " in line and "  loss 1.5000  " in line and "  up 2.0KB down 1.0KB  " in line
    rows = [_row(1, epsilon=2.477), _row(2, epsilon=3.384, **{"privacy/noise_multiplier": 1.6422514,
                                                               "privacy/clip": 0.5})]
    assert _table(summary_table(rows, tmp_path, cfg=cfg))["privacy"] == \
        "ε 3.38 at δ 2e-05 after round 2 (target ε 4, noise multiplier 1.642, clip 0.5)"
    cfg = load_config(None, ["privacy.enabled=true", "privacy.noise_multiplier=1.1", "privacy.delta=1e-5"], warn=False)
    assert describe_mode(cfg) == "DP-FedAvg noise multiplier 1.1 at δ 1e-05, clip 1"


def test_dp_sgd_shows_the_largest_sample_level_epsilon(tmp_path):
    row = _row(1, **{"dpsgd/epsilon_max": 3.14159, "dpsgd/epsilon_mean": 2.5})
    assert "sample ε ≤ 3.14" in format_round(row, rounds=5)
    assert _table(summary_table([row], tmp_path))["sample-level DP"] == \
        "ε ≤ 3.14 for every client that trained, mean 2.5 (DP-SGD, each client's own δ)"


def test_an_asynchronous_run_names_its_mode_and_shows_the_clock(tmp_path):
    cfg = load_config("async/fedbuff", [], warn=False)
    assert describe_mode(cfg) == ("fedbuff (40 clients in flight, a server step every 10 arrivals) on a simulated "
                                  "clock")
    fedasync = load_config("async/fedasync", [], warn=False)
    assert describe_mode(fedasync).startswith("fedasync (") and "alpha" in describe_mode(fedasync)
    deadline = load_config("async/sync-deadline", [], warn=False)
    assert describe_mode(deadline) == ("synchronous rounds (a 90 s deadline, 30% over-selection) on a simulated "
                                       "clock")
    assert describe_mode(load_config("smoke", [], warn=False)) == ""
    line = format_round(_row(2, sim_time_s=3725.0, round_sim_s=35.4), rounds=240)
    assert line.endswith("  sim 1:02:05 (+35s)")
    rows = [_row(1, sim_time_s=1800.0, acc_mean=0.7), _row(2, sim_time_s=3600.0, acc_mean=0.6)]
    assert _table(summary_table(rows, tmp_path, cfg=cfg))["simulated time"] == \
        ("1:00:00 (1 h) at round 2; best acc_mean at 0.5 h; fedbuff (40 clients in flight, a server step every 10 "
         "arrivals)")
    assert "simulated time" not in _table(summary_table([_row(1)], tmp_path))


def test_the_summary_says_when_k_moved(tmp_path):
    rows = [_row(r, k=8 if r < 18 else 13 if r < 25 else 18) for r in range(1, 31)]
    assert _table(summary_table(rows, tmp_path))["curriculum k"] == "8 -> 13 (round 18) -> 18 (round 25); 2 moves"
    assert _table(summary_table(rows[:10], tmp_path))["curriculum k"].startswith(
        "8 throughout rounds 1-10: the curriculum has not moved yet")


def test_tensorboard_is_named_only_where_it_has_events(tmp_path):
    assert "tensorboard" not in _table(summary_table([_row(1)], tmp_path))  # log.tensorboard: false
    (tmp_path / "events.out.tfevents.1.host").write_bytes(b"")
    assert _table(summary_table([_row(1)], tmp_path))["tensorboard"] == f"tensorboard --logdir {tmp_path}"


def test_the_summary_takes_the_last_round_whatever_the_order_of_lines(tmp_path):
    table = _table(summary_table([_row(1), _row(3), _row(2)], tmp_path))
    assert table["rounds"] == "3" and table["final acc_mean"] == "0.5300"


# ---------------------------------------------------------------------------------------------- the CLI around a run
def _cli(args: list[str], capsys) -> tuple[int, str, str]:
    from raysim.cli import main

    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_a_dp_run_without_tensorboard_prints_epsilon_and_no_tensorboard_line(tmp_path, capsys):
    from tests.helpers import tiny_overrides

    code, out, err = _cli(["run", *tiny_overrides(tmp_path, clients__num=10, rounds=2), "privacy.enabled=true",
                           "privacy.noise_multiplier=1.0", "privacy.clip=1.0", "log.tensorboard=false"], capsys)
    assert code == 0, err
    assert "DP-FedAvg noise multiplier 1 at δ 0.001, clip 1" in out  # δ = 0.01 / clients.num
    rounds = [line for line in out.splitlines() if line.startswith("round ")]
    assert len(rounds) == 2 and all(" (δ 0.001)  " in line and "  ε " in line for line in rounds)
    table = _table(out[out.index("\n-"):].strip())
    assert table["privacy"].startswith("ε ") and " at δ 0.001 after round 2 (noise multiplier 1" in table["privacy"]
    assert "tensorboard" not in table


def test_overwrite_starts_a_run_over_and_refuses_what_is_not_a_run(tmp_path, capsys):
    from tests.helpers import tiny_overrides

    args = ["run", *tiny_overrides(tmp_path, rounds=1), "log.tensorboard=false", "--quiet"]
    assert _cli(args, capsys)[0] == 0
    code, _, err = _cli(args, capsys)
    assert code == 2 and "start it over with --overwrite" in err
    code, _, err = _cli([*args, "--overwrite"], capsys)
    assert code == 0 and f"--overwrite: removed the run in {tmp_path / 'run'}" in err
    other = tmp_path / "notes"
    other.mkdir()
    (other / "mine.txt").write_text("keep")
    code, _, err = _cli([*args, f"log.dir={other}", "--overwrite"], capsys)
    assert code == 2 and "is not one (no config.yaml)" in err and (other / "mine.txt").read_text() == "keep"
    assert _cli(["run", "--resume", str(tmp_path / "run"), "--overwrite"], capsys)[0] == 2


def test_a_run_that_fails_in_its_first_round_says_its_directory_is_gone(tmp_path, capsys, monkeypatch):
    from raysim.engine.driver import Driver
    from raysim.errors import UserError
    from tests.helpers import tiny_overrides

    def fail(self):
        raise UserError("config key 'train.lr': too hot")
        yield  # a generator, as Driver.run

    monkeypatch.setattr(Driver, "run", fail)
    code, out, err = _cli(["run", *tiny_overrides(tmp_path), "log.tensorboard=false"], capsys)
    assert code == 2 and f"run directory {tmp_path / 'run'}" in out and not (tmp_path / "run").exists()
    assert err.strip().count("\n") == 0  # one line, which says where the announced directory went
    assert err.startswith("raysim: error: config key 'train.lr': too hot (")
    assert f"{tmp_path / 'run'} was removed: no round completed" in err


def test_a_seed_set_or_sweep_names_tensorboard_only_where_it_has_events(tmp_path, capsys):
    from raysim.cli.tune import _sweep_outcome
    from raysim.tune.results import SweepResult

    result = SweepResult(sweep_dir=tmp_path, rows=[], best=None, table_md="| trial |")
    assert _sweep_outcome(result, "raysim run --resume", "seeds") == 0
    assert "tensorboard" not in capsys.readouterr().out  # every run had log.tensorboard: false
    (tmp_path / "seed-0").mkdir()
    (tmp_path / "seed-0" / "events.out.tfevents.1.host").write_bytes(b"")
    _sweep_outcome(result, "raysim run --resume", "seeds")
    assert f"compare: tensorboard --logdir {tmp_path}; " in capsys.readouterr().out
