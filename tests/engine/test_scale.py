"""A million virtual clients on demand (many clients per call: tests/engine/test_plan.py and test_pool.py; the
killed-worker guarantee under batching is tests/engine/test_faults.py::test_killed_worker_changes_no_metric)."""

from __future__ import annotations

from conftest import tiny_overrides
from raysim.config import load_config
from raysim.engine.sampling import fixed_eval_clients
from raysim.engine.runner import run_experiment


def test_million_clients_keep_the_drivers_bookkeeping_small(tmp_path):
    cfg = load_config(None, tiny_overrides(
        tmp_path, data__name="synthetic", clients__num=1_000_000, clients__fraction=1e-5, algorithm__name="partialavg",
        eval__clients=25, data__samples_per_domain=200, log__tensorboard="false"))
    seen: dict = {}

    def on_round(metrics: dict) -> None:
        if metrics["round"] == 2:
            seen.update(seen["driver"].footprint())  # the in-process driver (engine.backend=inline)

    run_dir, rows, _ = run_experiment(cfg, on_start=lambda info: seen.update(driver=info["control"].driver),
                                      on_round=on_round)
    assert [r["round"] for r in rows] == [1, 2] and all(r["clients"] == 10 for r in rows)
    assert seen["client_states"] <= 20 and seen["eval_clients"] == 25  # the sampled clients, the seeded evaluated
    assert seen["data_bytes"] < 4096  # the dataset object holds settings, not a million clients' samples
    assert len(list((run_dir / "checkpoint" / "clients").iterdir())) == seen["client_states"]
    # the 25 evaluated clients never train (10 of a million a round): learning shows on the clients that trained.
    # Evaluated right after their round, their models beat chance (0.1) by far: 0.53 to 0.81 a round on seeds 0-4,
    # where untrained models (train.lr=1e-9) score 0.00 to 0.17
    trained = run_experiment(load_config(None, tiny_overrides(
        tmp_path, log__dir=str(tmp_path / "sampled"), data__name="synthetic", clients__num=1_000_000,
        clients__fraction=1e-5, algorithm__name="partialavg", eval__clients="sampled", data__samples_per_domain=200,
        log__tensorboard="false")))[1]
    assert all(r["acc_mean"] > 0.4 for r in trained), [r["acc_mean"] for r in trained]


def test_the_evaluated_clients_are_fixed_and_today_s_for_small_federations():
    assert fixed_eval_clients(0, 10, "auto") == list(range(10)) == fixed_eval_clients(0, 10, "all")
    assert fixed_eval_clients(0, 10, "50") == list(range(10))
    assert fixed_eval_clients(0, 10, "sampled") is None
    big = fixed_eval_clients(0, 1_000_000, "auto")
    assert len(big) == 1000 and big == sorted(set(big)) and big == fixed_eval_clients(0, 1_000_000, "1000")
    assert big != fixed_eval_clients(1, 1_000_000, "auto")
