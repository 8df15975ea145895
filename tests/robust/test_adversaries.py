"""The defences and attacks of issue 54 as stages of the round: non-finite rows (issue 58's overflowing attack),
every new attack and stateful rule the same after a resume and (slow) on two Ray workers, the distributed backdoor
where clients train, FLTrust's root dataset."""

from __future__ import annotations

import contextlib
import io

import pytest
import torch

from conftest import crash_after, read_rows, strip_timing, tiny_overrides
from raysim.algorithms.base import ClientUpdate
from raysim.config import load_config
from raysim.engine.runner import run_experiment
from raysim.robust.attacks import dba_bars, malicious_clients
from raysim.robust.rows import UpdateRows


def config(tmp_path, **extra):
    return load_config(None, tiny_overrides(tmp_path, **extra), warn=False)


def cli(*args: str) -> tuple[int, list[str]]:
    """``raysim run ARGS`` in this process: (exit code, the stderr lines raysim wrote)."""
    from raysim.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["run", *args])
    return code, [line for line in err.getvalue().splitlines() if line.startswith("raysim:")]


def test_an_overflowing_attack_stops_the_run_in_one_line(tmp_path):
    """Issue 58: sign flipping at scale 1e300 is finite in float64 and inf in the float32 model: a non-finite
    upload, caught after the attack, before the server step."""
    code, lines = cli("experiments/robust/digits-20.yaml", "rounds=1", "attack.name=sign_flip",
                      "attack.scale=1e300", f"log.dir={tmp_path / 'stop'}", "log.tensorboard=false")
    stopped = [line for line in lines if line.startswith("raysim: stopped:")]
    assert code == 3 and len(stopped) == 1, lines
    first = min(malicious_clients(0, 20, 0.2))
    assert f"client {first}'s update in round 1 is not finite after attack.name=sign_flip" in stopped[0]
    assert "Traceback" not in "\n".join(lines) and not (tmp_path / "stop" / "checkpoint").exists()


def test_skip_leaves_the_overflowing_rows_out_and_names_their_clients(tmp_path):
    code, lines = cli("experiments/robust/digits-20.yaml", "rounds=2", "attack.name=sign_flip", "attack.scale=1e300",
                      "engine.on_nonfinite=skip", f"log.dir={tmp_path / 'skip'}", "log.tensorboard=false")
    assert code == 0
    rows = read_rows(tmp_path / "skip")
    bad = malicious_clients(0, 20, 0.2)
    assert [r["skipped"] for r in rows] == [bad, bad]
    assert all(0.0 < r["acc_global"] <= 1.0 for r in rows if r["acc_global"] is not None)
    assert sum(f"dropped non-finite updates of clients {bad}" in line for line in lines) == 2


def test_update_rows_flag_what_overflows_the_models_dtype():
    glob = {"w": torch.tensor([1.0, 2.0]), "d": torch.tensor([0.0], dtype=torch.float64)}
    ups = [ClientUpdate(client_id=c, upload={"w": torch.tensor([1.0, 2.0]), "d": torch.tensor([0.0],
                                                                                              dtype=torch.float64)},
                        num_samples=1) for c in range(4)]
    rows = UpdateRows(ups, glob, "samples")
    rows.rows[1, 0] = 1e300  # finite in float64, inf once cast to w's float32
    rows.rows[2, 2] = 1e300  # d is float64: still finite
    rows.rows[3, 1] = float("nan")
    assert rows.nonfinite() == [1, 3]
    rows.drop([1, 3])
    assert rows.clients == [0, 2] and len(rows) == 2 and [u.client_id for u in rows.updates] == [0, 2]


TINY = dict(rounds=3, clients__num=8, clients__fraction=1.0, attack__fraction=0.25, data__server_holdout=0.2,
            attack__dba_size=3)
CASES = {
    "minmax-geomed": dict(attack__name="minmax", aggregator__name="geomed"),
    "minsum-foolsgold": dict(attack__name="minsum", aggregator__name="foolsgold"),
    "fang_krum-krum-nnm": dict(attack__name="fang_krum", aggregator__name="krum", aggregator__nnm="true"),
    "fang_trim-trimmed-bucket": dict(attack__name="fang_trim", aggregator__name="trimmed_mean", aggregator__f=1,
                                     aggregator__bucket=2),
    "mimic-fltrust": dict(attack__name="mimic", aggregator__name="fltrust", aggregator__root="server_holdout",
                          aggregator__root_samples=20, attack__mimic_warmup=2),
    "dba-median": dict(attack__name="dba", aggregator__name="median"),
}


@pytest.mark.parametrize("case", CASES)
def test_a_resumed_run_equals_the_whole_run(tmp_path, case):
    """Mimic's direction and target and FoolsGold's histories are checkpointed; the rest is drawn from the seed."""
    extra = {**TINY, **CASES[case]}
    full, _, _ = run_experiment(config(tmp_path, log__dir=str(tmp_path / "full"), **extra))
    rows = read_rows(full)
    assert len(rows) == 3 and all(r["loss"] == r["loss"] for r in rows)
    cfg = config(tmp_path, log__dir=str(tmp_path / "part"), **extra)
    crash_after(cfg, 2)
    run_experiment(cfg, resume=True)
    assert strip_timing(read_rows(tmp_path / "part")) == strip_timing(rows)
    if case == "dba-median":
        assert all(0.0 <= r["attack/asr"] <= 1.0 for r in rows)


def test_the_stateful_stages_checkpoint_their_state(tmp_path):
    from raysim.engine.state import read_checkpoint

    run_dir, _, _ = run_experiment(config(tmp_path, log__dir=str(tmp_path / "fg"), **{**TINY, "rounds": 1},
                                          **CASES["minsum-foolsgold"]))
    saved = read_checkpoint(run_dir)["aggregator_foolsgold"]
    assert saved["clients"].tolist() == list(range(8)) and saved["history"].dtype == torch.float64
    run_dir, _, _ = run_experiment(config(tmp_path, log__dir=str(tmp_path / "mimic"), **{**TINY, "rounds": 1},
                                          **CASES["mimic-fltrust"]))
    mimic = read_checkpoint(run_dir)["attack_mimic"]
    assert mimic["t"] == 1 and mimic["target"] not in malicious_clients(0, 8, 0.25)


def test_each_dba_client_plants_its_own_part_of_the_trigger(tmp_path):
    from raysim.data import build_federated_data
    from raysim.engine.core import ClientJobs
    from raysim.engine.jobs import TrainJob

    cfg = config(tmp_path, clients__num=8, attack__name="dba", attack__fraction=0.5, attack__dba_size=3,
                 attack__poison_share=1.0)
    data = build_federated_data(cfg)
    core = ClientJobs(cfg, data)
    malicious = sorted(core.stages.by_name["attack"].malicious)
    assert len(malicious) == 4
    bars = dba_bars(3, 2)
    for cid in range(8):
        x = core.start(TrainJob(client_id=cid, round=1, payload_ref=None), {}, None, None).ctx.train_data[0]
        clean = data.tensors(cid, "train")[0]
        if cid not in malicious:
            assert torch.equal(x, clean)
            continue
        row, col = bars[malicious.index(cid)]  # the k-th malicious client plants part k: only that bar is set
        bright = float(clean.max())
        assert (x[:, 0, row, col:col + 3] == bright).all()
        others = [b for b in bars if b != (row, col)]
        assert all(torch.equal(x[:, 0, r, c:c + 3], clean[:, 0, r, c:c + 3]) for r, c in others)


@pytest.mark.slow
def test_the_new_attacks_are_the_same_on_two_ray_workers(ray_cluster, tmp_path):
    """The distributed backdoor (poisoned where clients train) and Fang et al.'s trimmed-mean attack (each
    attacker's own draws) against bucketing, in process and on two Ray workers."""
    for name, extra in (("dba", CASES["dba-median"]), ("trim", CASES["fang_trim-trimmed-bucket"])):
        inline = read_rows(run_experiment(config(tmp_path, log__dir=str(tmp_path / f"{name}-inline"),
                                                 **{**TINY, **extra}))[0])
        on_ray = read_rows(run_experiment(config(tmp_path, log__dir=str(tmp_path / f"{name}-ray"),
                                                 engine__backend="ray", engine__num_workers=2,
                                                 **{**TINY, **extra}))[0])
        assert strip_timing(on_ray) == strip_timing(inline)


def test_fltrusts_server_takes_the_median_clients_local_steps():
    from raysim.robust.server_update import local_steps

    # batches of 32, 2 epochs: 65 samples -> (0, 32), (32, 65) (the trailing single sample joins) = 4 steps;
    # 100 -> 4 batches = 8; 68 -> 3 = 6; 32 -> 1 = 2; 33 -> 1 = 2: sorted 2, 2, 4, 6, 8 -> 4
    assert local_steps([65, 100, 68, 32, 33], 32, 2) == 4
    assert local_steps([65, 100], 32, 1) == 2  # even count: the lower middle
