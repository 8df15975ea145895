"""What ``--resume`` verifies before it continues a run (issue 39): the config the checkpoint was made with, the
checksum of every checkpoint file, ``config.yaml`` itself, and the metrics of the rounds the checkpoint holds. Each
refusal is one line and exit 2, and the run directory is left as it was."""

from __future__ import annotations

import shutil

import pytest
import torch

from conftest import read_rows
from raysim.cli import main as cli_main


@pytest.fixture
def ditto_run(shared_run, tmp_path):
    """A copy of a finished two-round ditto run (ditto keeps a state per client, so there are client files)."""
    run_dir = tmp_path / "run"
    shutil.copytree(shared_run(algorithm__name="ditto")[0], run_dir)
    return run_dir


def _a_float(tree):
    """The first floating-point tensor of a nested checkpoint entry."""
    if torch.is_tensor(tree):
        return tree if tree.is_floating_point() and tree.numel() else None
    values = tree.values() if isinstance(tree, dict) else tree if isinstance(tree, (list, tuple)) else ()
    return next((t for t in map(_a_float, values) if t is not None), None)


def _refused(capsys, run_dir, *overrides: str) -> str:
    before = (run_dir / "config.yaml").read_bytes() if (run_dir / "config.yaml").exists() else None
    assert cli_main(["run", "--resume", str(run_dir), "rounds=3", *overrides]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("raysim: error: ") and err.count("\n") == 0 and "Traceback" not in err, err
    if before is not None:
        assert (run_dir / "config.yaml").read_bytes() == before  # not rewritten by a refused resume
    assert len(read_rows(run_dir)) == 2 if (run_dir / "metrics.jsonl").exists() else True
    return err


def test_a_config_yaml_cut_short_is_refused_naming_what_differs(ditto_run, capsys):
    text = (ditto_run / "config.yaml").read_text()
    (ditto_run / "config.yaml").write_text(text[:text.index("algorithm:")])
    err = _refused(capsys, ditto_run)
    assert "algorithm.name ('ditto' in the checkpoint, 'fedavg' now)" in err, err


def test_an_override_that_is_not_allowed_on_resume_is_refused(ditto_run, capsys):
    err = _refused(capsys, ditto_run, "train.lr=0.5")
    assert "train.lr" in err, err


@pytest.mark.parametrize("which", ["server", "client"])
def test_a_flipped_bit_in_a_checkpoint_file_fails_its_checksum(ditto_run, capsys, which):
    ckpt = ditto_run / "checkpoint"
    if which == "server":
        target = ckpt / "server.pt"
    else:
        target = sorted((ckpt / "clients").iterdir())[0]
    saved = torch.load(target, weights_only=True)
    tensor = _a_float(saved["server_state"] if which == "server" else saved)
    tensor.view(-1).view(torch.int32)[0] ^= 1  # the lowest bit of one float: a valid file, other numbers
    torch.save(saved, target)
    err = _refused(capsys, ditto_run)
    assert "fails its sha256 checksum" in err and target.name in err and "no older complete one" in err, err


@pytest.mark.parametrize("text", ["{{{ not: yaml", "", "- a\n- list\n"])
def test_a_damaged_config_yaml_is_one_line(ditto_run, capsys, text):
    (ditto_run / "config.yaml").write_text(text)
    err = _refused(capsys, ditto_run)
    assert "config.yaml is damaged" in err, err


def test_resume_without_metrics_jsonl_is_refused(ditto_run, capsys):
    (ditto_run / "metrics.jsonl").unlink()
    err = _refused(capsys, ditto_run)
    assert "metrics.jsonl is missing" in err and "rounds 1-2" in err, err
    assert not (ditto_run / "metrics.jsonl").exists()


def test_an_untouched_run_still_resumes(ditto_run, capsys):
    assert cli_main(["run", "--resume", str(ditto_run), "rounds=3", "--quiet"]) == 0
    assert [r["round"] for r in read_rows(ditto_run)] == [1, 2, 3]


@pytest.mark.parametrize("name", ["../../../escape", "a/b", ".."])
def test_a_run_name_is_one_path_component(tmp_path, capsys, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    assert cli_main(["run", f"name={name}", "rounds=1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "config key 'name': must be one path component" in err and err.count("\n") == 0, err
    assert list(tmp_path.iterdir()) == []  # nothing made, inside runs/ or out of it


@pytest.mark.parametrize("link", ["checkpoint", "checkpoint/clients"])
def test_checkpoint_writes_never_follow_a_symlink(ditto_run, tmp_path, capsys, link):
    outside = tmp_path / "outside"
    shutil.move(str(ditto_run / link), outside)
    (ditto_run / link).symlink_to(outside, target_is_directory=True)
    before = sorted(p.name for p in outside.rglob("*"))
    err = _refused(capsys, ditto_run)
    assert f"{ditto_run / link} is a symbolic link" in err and "writes only inside its own directory" in err, err
    assert sorted(p.name for p in outside.rglob("*")) == before


def test_a_checkpoint_folder_made_a_link_mid_run_is_not_written_through(tmp_path):
    """The checkpoint writer checks too (a link made after the run started)."""
    from raysim.engine.state import ClientStateStore
    from raysim.errors import UserError

    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "checkpoint").symlink_to(outside, target_is_directory=True)
    store = ClientStateStore(type("Store", (), {"put": staticmethod(lambda o: o),
                                                "get": staticmethod(lambda hs: list(hs))}))
    store.put(0, {"w": torch.zeros(1)})
    with pytest.raises(UserError, match="is a symbolic link"):
        store.save(tmp_path / "checkpoint", 1, {})
    assert list(outside.iterdir()) == []


def test_a_key_the_checkpoint_lacks_counts_as_its_default(tmp_path):
    """A checkpoint made before a config section existed (here: without the ``system.*`` keys) resumes while the
    section is at its defaults, and is refused once the section is switched on."""
    from raysim.config import load_config, to_flat_dict
    from raysim.engine.runner import check_checkpoint_config
    from raysim.errors import UserError

    cfg = load_config(overrides=["algorithm.name=ditto"], warn=False)
    older = {k: v for k, v in to_flat_dict(cfg).items() if not k.startswith("system.")}
    check_checkpoint_config(tmp_path, {"config": older}, cfg)
    with pytest.raises(UserError, match=r"system\.enabled \(False in the checkpoint, True now\)"):
        check_checkpoint_config(tmp_path, {"config": older}, load_config(
            overrides=["algorithm.name=ditto", "system.enabled=true"], warn=False))
