"""raysim run CONFIG --seeds: one config over several seeds, each an ordinary run under a common parent."""

from __future__ import annotations

import csv

import yaml

from conftest import TINY, read_rows, strip_timing
from raysim.cli import main
from raysim.config import load_config, to_flat_dict


def test_seeds_run_each_seed_in_its_own_directory(ray_cluster, shared_run, tmp_path, capsys):
    """A seed set on Ray Tune (engine.backend=ray); tests/test_crash_safety.py runs them in this process."""
    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump(TINY))
    parent = tmp_path / "seeds"
    # three rounds: the plain seed-1 run below is test_crash_safety's killed seed set's reference too
    assert main(["run", str(config), "--seeds", "0,1", f"log.dir={parent}", "rounds=3", "engine.backend=ray",
                 "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "2/2 seeds done" in printed
    table = (parent / "results.md").read_text()
    assert table.split("\n\n")[-1].strip() in printed  # the table printed is the one written
    results_csv = (parent / "results.csv").read_text()

    for seed in (0, 1):
        run_dir = parent / f"seed-{seed}"
        assert load_config(run_dir / "config.yaml").seed == seed
        assert [m["round"] for m in read_rows(run_dir)] == [1, 2, 3]
    rows = list(csv.DictReader(open(parent / "results.csv")))
    assert sorted(r["seed"] for r in rows) == ["0", "1"] and all(r["status"] == "done" for r in rows)

    # a seed's run is the same run that `raysim run` would make with that seed (here in-process: the same numbers)
    plain, rows_plain = shared_run(name=TINY["name"], seed=1, rounds=3)  # = load_config(config, ["seed=1", ...])
    what = [{k: v for k, v in to_flat_dict(load_config(d / "config.yaml")).items()
             if not k.startswith("log.") and k != "engine.backend"} for d in (plain, parent / "seed-1")]
    assert what[0] == what[1]
    assert strip_timing(rows_plain) == strip_timing(read_rows(parent / "seed-1"))

    # the parent is what `raysim report` takes: one group, two seeds
    assert main(["report", str(parent), "--out", str(tmp_path / "report")]) == 0
    summary = list(csv.DictReader(open(tmp_path / "report" / "summary.csv")))
    assert len(summary) == 1 and summary[0]["n"] == "2"

    # --resume on a finished set restores it and reports the same table (nothing is run again)
    capsys.readouterr()
    assert main(["run", "--resume", str(parent), "--quiet"]) == 0
    assert (parent / "results.md").read_text() == table and (parent / "results.csv").read_text() == results_csv
    assert table.split("\n\n")[-1].strip() in capsys.readouterr().out
    for seed in (0, 1):
        assert [m["round"] for m in read_rows(parent / f"seed-{seed}")] == [1, 2, 3]


def test_bad_seeds_are_a_user_error(tmp_path, capsys):
    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump(TINY))
    assert main(["run", str(config), "--seeds", "5-1"]) == 2
    assert "--seeds" in capsys.readouterr().err


def test_seeds_done_line_averages_only_seeds_that_ended(capsys):
    """Two seeds running side by side: when seed 0 ends, seed 1 is still running; "1/2 seeds done" must not fold
    seed 1's best so far into the mean (it said "over 2 seeds")."""
    from types import SimpleNamespace

    from raysim.tune import _Progress, seeds_spec

    spec = seeds_spec(None, ["rounds=3"], [0, 1])
    progress = _Progress(spec, total=2, rounds=3, quiet=True)
    seed = [SimpleNamespace(trial_id=f"t{s}", config={"seed": s}, last_result={"round": 3}) for s in (0, 1)]
    progress.result(seed[0], {"round": 3, "acc_mean": 0.8})
    progress.result(seed[1], {"round": 2, "acc_mean": 0.4})
    progress.finished(seed[0], failed=False)
    line = capsys.readouterr().out
    assert "1/2 seeds done" in line and "so far 0.8000 ± 0.0000 over 1 seed" in line
    progress.result(seed[1], {"round": 3, "acc_mean": 0.6})
    progress.finished(seed[1], failed=False)
    line = capsys.readouterr().out
    assert "2/2 seeds done" in line and "so far 0.7000 ± 0.1414 over 2 seeds" in line
