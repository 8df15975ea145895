"""Issue 58's inputs that hung, ate memory or ended in a traceback: each command from the issue gets one line and
exit 2 (or 3), no traceback, and leaves nothing behind in (or no run directory for) a run it refused. In this
process (a config is refused before Ray, the data or torch's models): a few seconds in all."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, refused_config, tiny_overrides
from raysim.cli import main


def _one_line(capsys, code: int, args: list[str]) -> str:
    assert main(args) == code
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err
    return err


# ------------------------------------------------------------------ item 5: no client can ever be available


@pytest.mark.parametrize("mode", ["fedbuff", "off"])
def test_no_client_ever_available_ends_at_once_in_one_line(tmp_path, capsys, mode):
    """``asynchronous.mode=fedbuff`` with ``on_share=1e-12`` waited minutes at 100 % CPU; synchronous rounds ran
    with no client and a NaN loss. 1,000 clients x 1e-12 = 1e-9 clients at any moment: refused before round 1."""
    run_dir = tmp_path / "run"
    err = _one_line(capsys, 2, ["run", str(ROOT / "experiments" / "async" / "sync.yaml"), f"asynchronous.mode={mode}",
                                "system.availability.on_share=1e-12", f"log.dir={run_dir}"])
    assert err.startswith("raysim: error: config key 'system.availability.on_share': no client can be expected to "
                          "be available: 1000 clients x 1e-12 of the time each = 1e-09 clients"), err
    assert not run_dir.exists()


def test_a_trace_that_makes_no_client_available_is_refused(tmp_path, capsys):
    trace = tmp_path / "trace.csv"
    trace.write_text("client_id,start_s,end_s\n0,100,100\n3,5,5\n")  # instants only: no time at all
    run_dir = tmp_path / "run"
    err = _one_line(capsys, 2, ["run", *tiny_overrides(tmp_path, system__enabled="true",
                                                        system__availability__mode="trace",
                                                        system__availability__trace=str(trace))])
    assert err.startswith("raysim: error: config key 'system.availability.trace'") and "makes no client" in err
    assert not run_dir.exists()


def test_available_share_worked_by_hand(tmp_path):
    """Period 100 s, 4 clients. Client 0: [0, 30] and [20, 50] overlap, their union [0, 50] is 0.5 of the period;
    client 1: [90, 100] is 0.1; clients 2 and 3 are never listed: 0. The mean: (0.5 + 0.1 + 0 + 0) / 4 = 0.15."""
    from raysim.config import load_config
    from raysim.system.model import SystemModel

    trace = tmp_path / "trace.csv"
    trace.write_text("client_id,start_s,end_s\n0,0,30\n0,20,50\n1,90,100\n")
    cfg = load_config(None, ["system.enabled=true", "system.availability.mode=trace", "clients.num=4",
                             f"system.availability.trace={trace}", "system.availability.period_s=100"])
    assert SystemModel(cfg.system, 0, 4).available_share() == pytest.approx(0.15)
    cfg = load_config(None, ["system.availability.mode=onoff", "system.availability.mean_on_s=10",
                             "system.availability.mean_off_s=30"])
    assert SystemModel(cfg.system, 0, 4).available_share() == pytest.approx(0.25)  # 10 / (10 + 30)


# ------------------------------------------------------------------ item 6: a huge seed list


@pytest.mark.parametrize("seeds, count", [("0-100000000", 100000001), ("0-100000", 100001), ("0-9999,20000", 10001)])
def test_a_huge_seed_list_is_refused_before_anything_is_built(tmp_path, capsys, seeds, count):
    err = _one_line(capsys, 2, ["run", str(ROOT / "experiments" / "smoke.yaml"), "--seeds", seeds,
                                f"log.dir={tmp_path / 'set'}"])
    assert f"{count} seeds, and a set runs at most 10000" in err, err
    assert not (tmp_path / "set").exists()


def test_seed_lists_are_counted_without_duplicates():
    from raysim.tune.seeds import parse_seeds

    assert parse_seeds("0-4,10,3") == [0, 1, 2, 3, 4, 10]
    assert len(parse_seeds("0-9999,0-9999,5000-9999")) == 10000


# ------------------------------------------------------------------ item 7: inputs that ended in a traceback


@pytest.mark.parametrize("override, key", [("train.lr=1e300", "train.lr"), ("train.lr=1e39", "train.lr"),
                                           ("train.weight_decay=1e300", "train.weight_decay")])
def test_factors_beyond_float32_are_refused(override, key):
    line = refused_config(key, override)
    assert "at most 3.403e+38 (float32's largest)" in line, line


def test_adam_learning_rates_beyond_float32_over_ten_are_refused():
    line = refused_config("train.lr", "train.optimizer=adam", "train.lr=1e38")
    assert "at most 3.403e+37" in line and "adam divides lr by 1 - beta1" in line, line


@pytest.mark.parametrize("override, key", [("system.speed.median=1e-300", "system.speed"),
                                           ("system.latency.median=1e300", "system.latency"),
                                           ("system.speed.spread=1e300", "system.speed")])
@pytest.mark.parametrize("mode", ["off", "fedasync"])
def test_jobs_longer_than_the_clock_counts_are_refused(tmp_path, capsys, override, key, mode):
    """Simulated time beyond 2^62 s overflowed TensorBoard's int64 step (``ValueError: Value out of range``)."""
    err = _one_line(capsys, 2, ["run", *tiny_overrides(tmp_path, system__enabled="true",
                                                        asynchronous__mode=mode), override])
    assert err.startswith(f"raysim: error: config key '{key}': client ") and "more than the clock counts" in err, err
    assert not (tmp_path / "run").exists()


def test_a_name_or_log_dir_too_long_for_the_file_system_is_refused(tmp_path):
    line = refused_config("name", "name=" + "n" * 300)
    assert "path component of 316 bytes" in line, line
    line = refused_config("log.dir", f"log.dir={tmp_path / ('d' * 300)}")
    assert "path component of 300 bytes" in line, line
    assert not any(tmp_path.iterdir())


def test_a_sweep_dir_too_long_for_the_file_system_is_refused(tmp_path, capsys):
    err = _one_line(capsys, 2, ["tune", str(ROOT / "experiments" / "sweeps" / "smoke-lr.yaml"),
                                f"dir={tmp_path / ('d' * 300)}"])
    assert err.startswith("raysim: error: sweep key 'dir': cannot be a directory: a path component of 300"), err


def test_dp_sgd_on_a_model_with_batch_norm_is_refused():
    pytest.importorskip("opacus")  # the privacy extra: without it privacy.dpsgd is refused for that first
    line = refused_config("privacy.dpsgd", "model.name=cnn_bn", "privacy.dpsgd=true")
    assert "model.name=cnn_bn has batch norm layers" in line, line


def test_every_torchvision_model_declares_its_batch_norm():
    """The declaration the DP-SGD check reads agrees with the layers each built-in model has."""
    import torch.nn as nn

    from raysim.config import load_config
    from raysim.registry import get_model

    cfg = load_config(None, [])
    for name in ("mlp", "cnn", "cnn_bn", "resnet18", "resnet10", "mobilenet_v3_small", "mobilenet_v2", "vgg11_bn"):
        model = get_model(name)(input_shape=(3, 32, 32), cfg=cfg.model, client_id=0, seed=0)
        has = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
        assert bool(getattr(get_model(name), "batch_norm", False)) == has, name


# ------------------------------------------------------------------ item 8: the smaller ones


def test_metrics_lines_are_strict_json():
    """NaN and infinities (a loss with no client, a diverged value) are written as null."""
    from raysim.runlog import json_line

    def strict(text: str) -> dict:
        return json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c} in {text}"))

    row = strict(json_line({"round": 1, "loss": math.nan, "acc_mean": 0.5, "p_epochs": [0.1, math.inf]}))
    assert row == {"round": 1, "loss": None, "acc_mean": 0.5, "p_epochs": [0.1, None]}


def test_a_run_writes_strict_json(tmp_path):
    import raysim

    run_dir = raysim.run(None, *tiny_overrides(tmp_path, rounds=1)).run_dir
    for name in ("metrics.jsonl", "client_metrics.jsonl"):
        for line in (run_dir / name).read_text().splitlines():
            json.loads(line, parse_constant=lambda c, name=name: pytest.fail(f"bare {c} in {name}"))


@pytest.mark.parametrize("target", ["/etc/passwd", "passwd.yaml"])
def test_extends_never_prints_the_file_it_names(tmp_path, capsys, target):
    """``extends: /etc/passwd`` printed the file in the error; a .yaml that is no config is named, not shown."""
    (tmp_path / "passwd.yaml").write_text("root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1::/usr/sbin:/bin/false\n")
    config = tmp_path / "exp.yaml"
    config.write_text(f"extends: {target}\nrounds: 1\n")
    err = _one_line(capsys, 2, ["config", "show", str(config)])
    assert "x:0:0" not in err and "/bin/" not in err, err
    err = _one_line(capsys, 2, ["config", "show", str(tmp_path / "passwd.yaml")])
    assert "not a raysim config" in err and "x:0:0" not in err, err


@pytest.mark.parametrize("where", ["file", "override"])
def test_environment_values_never_reach_a_run_directory(tmp_path, capsys, monkeypatch, where):
    """``${oc.env:VAR}`` would be resolved into the saved config.yaml: refused, naming the key, value unshown."""
    monkeypatch.setenv("RAYSIM_TEST_TOKEN", "s3cr3t-token")
    config = tmp_path / "exp.yaml"
    config.write_text("rounds: 1\n" + ("name: ${oc.env:RAYSIM_TEST_TOKEN}\n" if where == "file" else ""))
    extra = ["name=${oc.env:RAYSIM_TEST_TOKEN}"] if where == "override" else []
    err = _one_line(capsys, 2, ["run", str(config), *extra, f"log.dir={tmp_path / 'run'}"])
    assert err.startswith("raysim: error: config key 'name': ${oc.env:...} reads an environment variable"), err
    assert "s3cr3t" not in err and not (tmp_path / "run").exists()


def test_resuming_a_finished_run_with_another_config_names_the_difference(tmp_path, capsys):
    import raysim

    run_dir = raysim.run(None, *tiny_overrides(tmp_path, rounds=1)).run_dir
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({**yaml.safe_load((run_dir / "config.yaml").read_text()), "seed": 5}))
    files = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.name != ".raysim.lock"}
    capsys.readouterr()
    err = _one_line(capsys, 2, ["run", "--resume", str(run_dir), str(other)])
    assert "was made by another config (differs in: seed)" in err and "nothing to run" not in err, err
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.name != ".raysim.lock"} == files


def test_a_run_stopped_before_any_checkpoint_says_so_once(tmp_path, capsys):
    """``train.lr=1e38``: the first round's updates are not finite; the line no longer says "round 0
    checkpointed" beside "no round was checkpointed"."""
    err = _one_line(capsys, 3, ["run", *tiny_overrides(tmp_path, train__lr="1e38")]).splitlines()[-1]
    assert "round 0 checkpointed" not in err and err.endswith("no round was checkpointed: start the run again"), err


def test_a_full_disk_before_any_checkpoint_says_start_again():
    from raysim.fsutil import WriteFailed, run_dir_write

    with pytest.raises(WriteFailed) as info, run_dir_write(Path("/nonexistent"), "metrics.jsonl", 0):
        raise OSError(28, "No space left on device")
    assert str(info.value).endswith("No space left on device; the run stopped (free some space first)")
    with pytest.raises(WriteFailed) as info, run_dir_write(Path("/nonexistent"), "metrics.jsonl", 2):
        raise OSError(28, "No space left on device")
    assert "the run stopped with round 2 checkpointed (free some space, then resume)" in str(info.value)
