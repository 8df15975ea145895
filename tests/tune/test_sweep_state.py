"""raysim's own record of a sweep (issue 58): ``--resume`` reads ``sweep-state.json`` (plain JSON, checked field by
field) and ``sweep.yaml``, never Ray Tune's pickles. Each test plants, in a file of the sweep directory, a real
payload (a pickle that writes a marker when unpickled) and resumes; none needs Ray: every sweep here has ended, so
the resume only rewrites its tables."""

from __future__ import annotations

import csv
import json
import pickle
from pathlib import Path

import pytest
import yaml

from conftest import ROOT
from raysim.cli import main
from test_untrusted_files import Payload


def _one_line(err: str) -> str:
    err = err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err
    assert err.startswith("raysim: error: "), err
    return err


def finished_sweep(tmp_path: Path, *, record: bool = True) -> Path:
    """A sweep directory as a finished 4-trial ``smoke-lr`` sweep leaves it: its record, sweep.yaml and each
    trial's run directory (config.yaml, two rounds of metrics); Tune's own files are what each test plants.
    ``record=False``: the directory an earlier raysim left (no record of raysim's)."""
    from raysim.config import load_config, to_yaml
    from raysim.tune.spec import load_sweep
    from raysim.tune.sweepdir import _check_sweep_dir
    from raysim.tune.validate import _override

    sweep_dir = tmp_path / "sw"
    sweep_dir.mkdir(parents=True)
    spec = load_sweep(ROOT / "experiments" / "sweeps" / "smoke-lr.yaml", [f"dir={sweep_dir}", "rounds=2",
                                                                          "search.seed=0"])
    state = _check_sweep_dir(spec, sweep_dir, resume=False)
    for i, trial in enumerate(state.trials):
        run_dir = spec.trials_dir(sweep_dir) / trial.name
        run_dir.mkdir(parents=True)
        cfg = load_config(spec.base, spec.fixed + [_override(k, v) for k, v in trial.values.items()], warn=False)
        (run_dir / "config.yaml").write_text(to_yaml(cfg))
        rows = [{"round": r, "acc_mean": 0.1 * i + 0.01 * r, "loss": 1.0} for r in (1, 2)]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        state.mark(trial.name, "ended", rows[-1]["acc_mean"])
    (sweep_dir / "tune").mkdir()
    if not record:
        (sweep_dir / "sweep-state.json").unlink()
    return sweep_dir


def _table(sweep_dir: Path) -> list[tuple[str, str, str]]:
    return sorted((r["trial"], r["train.lr"], r["status"]) for r in csv.DictReader(open(sweep_dir / "results.csv")))


def _state_trials(sweep_dir: Path) -> list[tuple[str, str]]:
    record = json.loads((sweep_dir / "sweep-state.json").read_text())
    return sorted((t["name"], str(t["values"]["train.lr"])) for t in record["trials"])


# ------------------------------------------------------------------ payloads in every file a resume could read


def _cloudpickled(marker: Path) -> str:
    from ray.tune.utils.serialization import _CLOUDPICKLE_FALLBACK_TYPE
    from ray._common.utils import binary_to_hex

    return json.dumps({"_type": _CLOUDPICKLE_FALLBACK_TYPE, "value": binary_to_hex(pickle.dumps(Payload(marker)))})


def _plant(tune_dir: Path, which: str, marker: Path) -> None:
    """The payload where Ray Tune keeps ``which``, in the form Tune's own readers would unpickle."""
    if which == "experiment_state":  # each trial's fields: JSON with cloudpickled values (Trial.from_json_state)
        trial = '{"trainable_name": "run_trial", "status": "PENDING", "config": ' + _cloudpickled(marker) + "}"
        body = {"trial_data": [[trial, "{}"]], "runner_data": {}, "stats": {"start_time": 0}}
        (tune_dir / "experiment_state-2026-01-01_00-00-00.json").write_text(json.dumps(body))
    elif which == "basic_variant_state":  # BasicVariantGenerator's state: a pickle despite the name
        (tune_dir / "basic-variant-state-2026-01-01_00-00-00.json").write_bytes(pickle.dumps(Payload(marker)))
    elif which == "searcher_state":  # a Searcher's save(): a pickle (Optuna's study)
        (tune_dir / "searcher-state-2026-01-01_00-00-00.pkl").write_bytes(pickle.dumps(Payload(marker)))
    elif which == "tuner_pkl":  # Tuner.restore's first read, with the digest an earlier raysim kept rewritten
        import hashlib

        data = pickle.dumps(Payload(marker))
        (tune_dir / "tuner.pkl").write_bytes(data)
        (tune_dir.parent / "tuner.pkl.sha256").write_text(hashlib.sha256(data).hexdigest() + "\n")
    elif which == "trial_files":  # a trial's params.pkl and error.pkl under Tune's directory
        (tune_dir / "abc12_00000").mkdir()
        (tune_dir / "abc12_00000" / "params.pkl").write_bytes(pickle.dumps(Payload(marker)))
        (tune_dir / "abc12_00000" / "error.pkl").write_bytes(pickle.dumps(Payload(marker)))


TUNE_FILES = ["experiment_state", "basic_variant_state", "searcher_state", "tuner_pkl", "trial_files"]


def test_the_planted_payloads_are_real(tmp_path):
    """The control: Tune's own readers of these files run the payload (so a resume that read them would)."""
    from ray.tune.utils.serialization import _loads_with_cloudpickle

    marker = tmp_path / "ran"
    _plant(tmp_path, "experiment_state", marker)
    state = json.loads((tmp_path / "experiment_state-2026-01-01_00-00-00.json").read_text())
    _loads_with_cloudpickle(state["trial_data"][0][0])  # what Trial.from_json_state does first
    assert marker.read_text() == "ran"
    marker.unlink()
    _plant(tmp_path, "searcher_state", marker)
    pickle.loads((tmp_path / "searcher-state-2026-01-01_00-00-00.pkl").read_bytes())  # Searcher.restore
    assert marker.read_text() == "ran"


@pytest.mark.parametrize("which", TUNE_FILES)
def test_a_payload_in_tunes_files_stays_inert_on_resume(tmp_path, capsys, which):
    """A sweep with raysim's record: the resume reads the record, not Tune's files; the planted payload never
    runs, and the table holds the sweep's own four trials with their values."""
    sweep_dir = finished_sweep(tmp_path)
    marker = tmp_path / "code-ran"
    _plant(sweep_dir / "tune", which, marker)
    before = _state_trials(sweep_dir)
    assert main(["tune", "--resume", str(sweep_dir), "--quiet"]) == 0, capsys.readouterr().err
    assert not marker.exists()
    table = _table(sweep_dir)
    assert sorted((name, float(lr)) for name, lr, _ in table) == sorted((n, float(v)) for n, v in before)
    assert {status for *_, status in table} == {"done"}


@pytest.mark.parametrize("which", TUNE_FILES)
def test_a_sweep_with_only_tunes_state_is_refused_in_one_line(tmp_path, capsys, which):
    """A sweep directory without raysim's record (an earlier raysim's, or not raysim's), its Tune files carrying a
    payload: one line, exit 2, the marker never written, nothing in the directory changed."""
    sweep_dir = finished_sweep(tmp_path, record=False)
    marker = tmp_path / "code-ran"
    _plant(sweep_dir / "tune", which, marker)
    files = {p: p.read_bytes() for p in sweep_dir.rglob("*") if p.is_file()}
    assert main(["tune", "--resume", str(sweep_dir), "--quiet"]) == 2
    err = _one_line(capsys.readouterr().err)
    assert "holds no raysim sweep record (sweep-state.json), only Ray Tune's state" in err, err
    assert not marker.exists()
    assert {p: p.read_bytes() for p in sweep_dir.rglob("*") if p.is_file()} == files


def test_the_record_is_json_that_runs_nothing(tmp_path, capsys):
    """A cloudpickled value written into the record itself is a string that does not fit the sweep's space:
    refused in one line, nothing runs."""
    sweep_dir = finished_sweep(tmp_path)
    marker = tmp_path / "code-ran"
    record = json.loads((sweep_dir / "sweep-state.json").read_text())
    record["trials"][0]["values"]["train.lr"] = json.loads(_cloudpickled(marker))
    (sweep_dir / "sweep-state.json").write_text(json.dumps(record))
    assert main(["tune", "--resume", str(sweep_dir), "--quiet"]) == 2
    err = _one_line(capsys.readouterr().err)
    assert "sweep-state.json is damaged: trial" in err and "train.lr=" in err, err
    assert not marker.exists()


def test_a_plugin_written_into_sweep_yaml_is_never_imported(tmp_path, capsys, monkeypatch):
    """``fixed: [plugins=[...]]`` added to sweep.yaml: it differs from the record, refused before any config
    (and so any plugin) is loaded."""
    sweep_dir = finished_sweep(tmp_path)
    marker = _plugin_that_marks(tmp_path, monkeypatch)
    spec = yaml.safe_load((sweep_dir / "sweep.yaml").read_text())
    spec["fixed"].append("plugins=[marks_when_imported]")
    (sweep_dir / "sweep.yaml").write_text(yaml.safe_dump(spec))
    assert main(["tune", "--resume", str(sweep_dir), "--quiet"]) == 2
    err = _one_line(capsys.readouterr().err)
    assert "sweep.yaml differs from the sweep recorded in" in err and "(in fixed)" in err, err
    assert not marker.exists()


# ------------------------------------------------------------------ a damaged record (item 2)


@pytest.mark.parametrize("damage", ["truncated", "empty", "a trial lost", "a name that leaves the directory",
                                    "NaN", "garbage"])
def test_a_damaged_record_is_refused_never_a_sweep_that_did_not_happen(tmp_path, capsys, damage):
    sweep_dir = finished_sweep(tmp_path)
    path = sweep_dir / "sweep-state.json"
    text = path.read_text()
    record = json.loads(text)
    if damage == "truncated":
        text = text[: len(text) // 2]
    elif damage == "empty":
        text = ""
    elif damage == "a trial lost":
        record["trials"].pop()
        text = json.dumps(record)
    elif damage == "a name that leaves the directory":
        record["trials"][0]["name"] = "../../elsewhere"
        text = json.dumps(record)
    elif damage == "NaN":
        text = text.replace('"value": 0.', '"value": NaN, "x": 0.', 1)
    else:
        text = "\x00\xff" * 20
    path.write_text(text, errors="surrogateescape")
    (sweep_dir / "results.csv").write_text("untouched\n")
    assert main(["tune", "--resume", str(sweep_dir), "--quiet"]) == 2
    err = _one_line(capsys.readouterr().err)
    assert f"{path} is damaged" in err, err
    assert (sweep_dir / "results.csv").read_text() == "untouched\n"  # no table of a sweep that did not happen


def test_a_damaged_tune_searcher_state_changes_nothing(tmp_path, capsys):
    """Issue 58's case: ``basic-variant-state-*.json`` truncated. Tune's searcher state is not read: the resume
    reports the sweep's own trials with their searched values, and no trial without them."""
    sweep_dir = finished_sweep(tmp_path)
    (sweep_dir / "tune" / "basic-variant-state-2026-01-01_00-00-00.json").write_bytes(pickle.dumps({"x": 1})[:5])
    assert main(["tune", "--resume", str(sweep_dir), "--quiet"]) == 0, capsys.readouterr().err
    table = _table(sweep_dir)
    assert len(table) == 4 and all(lr for _, lr, _ in table)
    assert sorted(name for name, *_ in table) == [name for name, _ in _state_trials(sweep_dir)]


def test_the_record_lists_every_drawn_trial_before_tune_starts(tmp_path):
    """A random sweep draws all its trials when it starts (seeded: the same ones again), each with a directory
    name and values within the space."""
    from raysim.tune.state import read_state

    first = read_state(finished_sweep(tmp_path / "a")).trials
    again = read_state(finished_sweep(tmp_path / "b")).trials
    assert len(first) == 4 and [t.values for t in first] == [t.values for t in again]
    assert all(0.01 <= t.values["train.lr"] <= 0.5 and t.values["train.momentum"] in (0.0, 0.9) for t in first)


# ------------------------------------------------------------------ plugins named by a run directory (item 3)


def _plugin_that_marks(tmp_path: Path, monkeypatch) -> Path:
    """A module on sys.path that writes a marker when imported (what ``plugins: [this]`` did, visibly)."""
    folder = tmp_path / "plugins"
    folder.mkdir()
    marker = tmp_path / "plugin-imported"
    (folder / "marks_when_imported.py").write_text(f"open({str(marker)!r}, 'w').write('imported')\n")
    monkeypatch.syspath_prepend(str(folder))
    return marker


def test_a_plugin_written_into_a_runs_config_is_never_imported_on_resume(tmp_path, capsys, monkeypatch):
    """``plugins: [...]`` written into a run's config.yaml: the checkpoint (its own digest checked) records no
    plugin, so the resume refuses in one line before importing anything; the run directory is unchanged."""
    import raysim
    from conftest import tiny_overrides

    run_dir = raysim.run(None, *tiny_overrides(tmp_path / "run", rounds=1)).run_dir
    marker = _plugin_that_marks(tmp_path, monkeypatch)
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    saved["plugins"] = ["marks_when_imported"]
    (run_dir / "config.yaml").write_text(yaml.safe_dump(saved))
    files = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.name != ".raysim.lock"}
    for command in (["run", "--resume", str(run_dir), "rounds=2"], ["run", "--resume", str(run_dir)]):
        assert main(command) == 2
        err = _one_line(capsys.readouterr().err)
        assert "names plugins (marks_when_imported) other than the ones" in err and "restore config.yaml" in err, err
    with pytest.raises(raysim.UserError, match="names plugins"):
        raysim.load_run(run_dir)
    assert not marker.exists()
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.name != ".raysim.lock"} == files
    import marks_when_imported  # noqa: F401 - the control: importing it writes the marker

    assert marker.read_text() == "imported"
