"""Issue 40, a newcomer's first hour: one test per row of its table (the demo's curriculum, reports, TensorBoard,
discovery, arguments, console lines). In process and tiny: each run here is the scikit-learn digits run of
``tiny_overrides``."""

from __future__ import annotations

import sys

import pytest
from conftest import ROOT, tiny_overrides

import raysim
from raysim.runlog import format_round, read_metrics, summary_table


def _scalars(run_dir, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return [(e.step, round(e.value, 4)) for e in acc.Scalars(tag)] if tag in acc.Tags()["scalars"] else []


@pytest.fixture(scope="module")
def curriculum_run(tmp_path_factory):
    """UNIDEAL over 3 local epochs (the demo's schedule: 1/B -> 1 within each round), 2 rounds, TensorBoard on;
    run as 1 round, then resumed to 2 (the resume's purge must not cost round 1 its per-epoch points)."""
    d = tmp_path_factory.mktemp("curriculum")
    over = tiny_overrides(d, algorithm__name="unideal", train__local_epochs=3, train__batch_size=4, rounds=1,
                          clients__num=2, log__tensorboard="true")
    run_dir = raysim.run(None, *over).run_dir
    raysim.run(None, *[o for o in over if not o.startswith("rounds=")], "rounds=2", resume=run_dir)
    return run_dir


def test_demo_shows_p_moving_within_each_round(curriculum_run):
    """`make demo`: p's course inside the round on the console, in TensorBoard, in the summary and the report."""
    rows = read_metrics(curriculum_run / "metrics.jsonl")
    assert [r["p_epochs"] for r in rows] == [[0.25, 0.625, 1.0]] * 2  # 1/B -> 1 over the local epochs, each round
    assert rows[0]["p"] == pytest.approx(0.625)  # the round's mean, as before
    assert "p 0.25->1.00" in format_round(rows[0], rounds=2)
    table = summary_table(rows, curriculum_run).splitlines()[1:-1]
    line = dict((s.strip() for s in part.split("  ", 1)) for part in table)
    assert line["curriculum p"] == ("share of each batch distilled from the global head, easiest samples first: "
                                    "0.25 -> 1.00 over each round's 3 local epochs")
    # 100 steps a round, each of the 3 local epochs held over 33 of them (steps 1-33, 34-66, 67-99 in round 1,
    # 101-133 ... in round 2), both rounds (round 1's survived the resume's purge from step 2)
    epochs = [(s, v) for r in (0, 100) for e, v in enumerate((0.25, 0.625, 1.0)) for s in range(r + 33 * e + 1,
                                                                                               r + 33 * e + 34)]
    assert _scalars(curriculum_run, "Curriculum/p_epoch") == epochs and len(epochs) == 198
    assert [s for s, _ in _scalars(curriculum_run, "Curriculum/p")] == [1, 2]


def test_report_plots_p_per_local_epoch(curriculum_run, tmp_path):
    from raysim.report import _epoch_curve, load_run, make_report

    xs, ys, _ = _epoch_curve([load_run(curriculum_run)], "p_epochs")
    assert list(xs) == pytest.approx([1 / 3, 2 / 3, 1, 4 / 3, 5 / 3, 2])
    assert list(ys) == pytest.approx([0.25, 0.625, 1.0] * 2)
    report = make_report([curriculum_run], tmp_path, metric="acc_mean")
    assert "p_vs_round.png" in report.files


# ---------------------------------------------------------------------------------------------- raysim report runs
def _runs(root, specs):
    """specs: (folder, name, overrides, seed, best) -> run directories under root (two rounds each)."""
    from test_report import write_named_run

    for folder, name, overrides, seed, best in specs:
        write_named_run(root / folder, name, overrides, seed, best)
    return root


def test_report_warns_of_runs_that_share_a_seed(tmp_path, capsys):
    from raysim.report import make_report

    root = _runs(tmp_path / "runs", [(f"w{w}", "t", [f"engine.num_workers={w}"], 0, 0.5) for w in (1, 2, 3, 4)])
    report = make_report([root], tmp_path / "out", plots=False)
    assert len(report.groups) == 1 and len(report.groups[0].runs) == 4
    warning = "fedavg on sklearn_digits: 4 runs share seed 0 and differ only in engine.num_workers"
    assert warning in capsys.readouterr().err and any(warning in n for n in report.notes)
    assert warning in (tmp_path / "out" / "report.md").read_text()


def test_report_marks_no_significance_from_fewer_than_3_seeds(tmp_path):
    from raysim.report import make_report

    specs = [(f"{a}{s}", "t", [f"algorithm.name={a}"], s, best + 0.001 * s)
             for a, best in (("fedavg", 0.9), ("local", 0.5)) for s in (0, 1)]
    two = make_report([_runs(tmp_path / "two", specs)], tmp_path / "o2", plots=False).group("local")
    assert two.test == "paired" and two.p_adjusted < 0.01 and not two.beaten  # 1 degree of freedom: no star
    specs += [(f"{a}2", "t", [f"algorithm.name={a}"], 2, best + 0.003) for a, best in (("fedavg", 0.9), ("local", 0.5))]
    specs[-1] = ("local2", "t", ["algorithm.name=local"], 2, 0.5 + 0.0015)
    three = make_report([_runs(tmp_path / "three", specs)], tmp_path / "o3", plots=False).group("local")
    assert three.p_adjusted < 0.01 and three.beaten


def test_report_labels_name_only_what_differs_and_rounds_do_not_split(tmp_path):
    from raysim.report import make_report

    specs = [("a3", "t", ["algorithm.name=fedavg", "rounds=3"], 0, 0.6),
             ("a4", "t", ["algorithm.name=fedavg", "rounds=4"], 1, 0.6),
             ("p1", "t", ["algorithm.name=fedprox", "algorithm.mu=0.1"], 0, 0.5),
             ("f1", "t", ["algorithm.name=fapd"], 0, 0.4)]
    report = make_report([_runs(tmp_path / "runs", specs)], tmp_path / "out", plots=False)
    # one fedavg (rounds=3 and rounds=4 pooled, with a note); fedprox's mu and fapd's own keys differ only between
    # algorithms, which the name already tells apart
    assert report.methods == ["fapd", "fedavg", "fedprox"]
    assert any("different numbers of rounds (3, 4)" in n for n in report.notes)
    specs.append(("p2", "t", ["algorithm.name=fedprox", "algorithm.mu=0.01"], 0, 0.5))
    report = make_report([_runs(tmp_path / "more", specs)], tmp_path / "out2", plots=False)
    assert report.methods == ["fapd", "fedavg", "fedprox (algorithm.mu=0.01)", "fedprox (algorithm.mu=0.1)"]


# ---------------------------------------------------------------------------------------------- discovery
def _cli(capsys, *argv):
    from raysim.cli import main

    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_list_without_a_kind_prints_a_summary(capsys):
    code, out, _ = _cli(capsys, "list")
    assert code == 0
    lines = out.splitlines()
    assert [line.split()[0] for line in lines] == ["algorithms", "models", "datasets", "experiments"]
    assert "fedavg" in lines[0] and "needing data.root" in lines[3] and "needing a GPU" in lines[3]


def test_list_experiments_filters_tags_and_hides_base_files(capsys):
    code, out, _ = _cli(capsys, "list", "experiments", "moon")
    assert code == 0
    rows = {line.split()[0]: " ".join(line.split()[1:]) for line in out.splitlines() if not line.startswith(" ")}
    assert set(rows) and all("moon" in name for name in rows)
    assert rows["fapd/digits-moon"].startswith("[embedded data, CPU]")
    assert rows["fapd/cifar10-moon"].startswith("[needs data.root, needs a GPU]")
    _, everything, _ = _cli(capsys, "list", "experiments")
    names = [line.split()[0] for line in everything.splitlines() if not line.startswith(" ")]
    assert "smoke" in names and not [n for n in names if n.endswith("/base")]
    _, with_bases, _ = _cli(capsys, "list", "experiments", "digits-niid1-cpu/", "--all")
    assert "unideal/digits-niid1-cpu/base" in with_bases
    assert _cli(capsys, "list", "experiments", "no-such-thing")[0] == 2


def test_no_description_is_cut_off():
    from raysim.catalog import describe_experiments, first_sentence

    assert first_sentence("The setting (FAPD, Liu et al. 2026), FedAvg. More.") == \
        "The setting (FAPD, Liu et al. 2026), FedAvg."
    text = dict(describe_experiments("fapd/cifar10-fedavg"))["fapd/cifar10-fedavg"]
    assert text.count("(") == text.count(")") and "Liu et al. 2026)" in text


@pytest.mark.parametrize("override, suggestion", [("algorithm.name=fedavgg", "did you mean 'fedavg'"),
                                                  ("model.name=cnm", "did you mean 'cnn'"),
                                                  ("data.name=minst", "did you mean 'mnist'")])
def test_a_mistyped_name_gets_a_suggestion(override, suggestion):
    from raysim.config import load_config
    from raysim.errors import UserError

    with pytest.raises(UserError, match=suggestion):
        load_config(None, [override])


def test_config_show_and_keys_import_no_torch():
    """`raysim config show` (every built-in algorithm's section) and `config keys` as a fresh process runs them: no
    torch, Ray or data/engine package imported (torch alone took 1.5-4 s of the 2.2-4.4 s)."""
    import subprocess

    code = ("import contextlib, io, sys\n"
            "from raysim.cli import main\n"
            "from raysim.registry import builtin_names\n"
            "names = builtin_names('algorithm')\n"
            "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
            "    codes = [main(['config', 'show', 'smoke', f'algorithm.name={n}']) for n in names]\n"
            "    codes += [main(['config', 'keys']), main(['config', 'keys', '--algorithm', 'fapd'])]\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'ray', 'torchvision')\n"
            "               or m.startswith(('raysim.engine', 'raysim.data', 'raysim.models')))\n"
            "print(set(codes), 'algorithm.lam' in out.getvalue(), heavy)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split("\n")[0] == "{0} True []"


def test_config_errors_of_run_import_no_torch(tmp_path):
    """Every config error of `raysim run` (a bad value, an unknown key, an unknown algorithm, a wrong override of a
    resume) fails with exit 2 before the engine is imported: raysim.engine.runner imports torch, which took 5 s
    under load before the config was checked (benchmarks/cli_latency.py --only errors)."""
    import subprocess

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("name: x\nrounds: 2\n")
    code = ("import contextlib, io, sys\n"
            "from raysim.cli import main\n"
            "with contextlib.redirect_stderr(io.StringIO()) as err:\n"
            "    codes = [main(['run', 'smoke', o]) for o in ('rounds=abc', 'trian.lr=0.1', 'algorithm.name=fedavgg',\n"
            "                                                 'engine.num_workers=-1')]\n"
            f"    codes.append(main(['run', '--resume', {str(run_dir)!r}, 'rounds=abc']))\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'ray', 'torchvision')\n"
            "               or m.startswith(('raysim.engine.runner', 'raysim.data', 'raysim.models')))\n"
            "print(codes, err.getvalue().count('raysim: error: config key'), heavy)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1] == "[2, 2, 2, 2, 2] 5 []"


def test_a_local_ray_start_is_announced_with_its_cost(capsys, monkeypatch, tmp_path):
    """The shipped small configs run in this process (no Ray to start); where a run starts a Ray of its own, one
    line says so and what it costs, before it starts."""
    from raysim.config import load_config
    from raysim.engine import runner
    from raysim.engine.backend import choose_backend
    from raysim.errors import UserError

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))  # no `ray start` cluster in sight
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    shipped = ["smoke", "default", *(f"beyond/{p.stem}" for p in (ROOT / "experiments" / "beyond").glob("tiny-*.yaml"))]
    assert len(shipped) > 5
    for name in shipped:
        assert choose_backend(load_config(name, [], warn=False).engine) == "inline", name

    def stop(*_, **__):
        raise UserError("stopped where the run would start")

    monkeypatch.setattr(runner, "run_experiment", stop)
    code, out, err = _cli(capsys, "run", "smoke", "engine.num_workers=2", f"log.dir={tmp_path / 'run'}")
    assert code == 2 and "stopped where the run would start" in err
    (line,) = [line for line in out.splitlines() if "local Ray" in line]
    assert "its start costs about" in line and "engine.num_workers=1 runs in this process" in line
    code, out, _ = _cli(capsys, "run", "smoke", f"log.dir={tmp_path / 'run2'}")
    assert code == 2 and "local Ray" not in out


# ---------------------------------------------------------------------------------------------- --resume overrides
def test_resume_applies_an_override_or_refuses_it_in_one_line_for_runs_seed_sets_and_sweeps(tmp_path, capsys):
    run, seeds, sweep = tmp_path / "run", tmp_path / "seeds", tmp_path / "sweep"
    for d in (run, seeds / "seed-0", sweep / "trials" / "t0"):
        d.mkdir(parents=True)
    (seeds / "sweep.yaml").write_text("base: null\n")
    code, _, err = _cli(capsys, "run", "--resume", str(run), "train.lr=0.5")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "train.lr=0.5 would change what the run computes" in err and "rounds, eval.every" in err
    for argv, what, one in ((["run", "--resume", str(seeds)], "seed set", seeds / "seed-0"),
                            (["tune", "--resume", str(sweep)], "sweep", sweep / "trials" / "t0")):
        for override in ("rounds=6", "train.lr=0.5"):
            code, _, err = _cli(capsys, *argv, override)
            assert code == 2 and len(err.strip().splitlines()) == 1, err
            assert f"a {what} resumes its runs with the config they started with" in err
            assert err.strip().endswith(f"raysim run --resume {one} {override}")


# ---------------------------------------------------------------------------------------------- small lines
def test_vectorize_error_echoes_the_users_word():
    from raysim.config import load_config
    from raysim.errors import UserError

    for word in ("yes", "on", "maybe"):
        with pytest.raises(UserError, match=f"got '{word}'"):
            load_config(None, [f"engine.vectorize={word}"])
    assert load_config(None, ["engine.vectorize=off"]).engine.vectorize == "off"


def test_a_resumes_summary_has_times_that_add_up(tmp_path):
    rows = [{"round": r, "acc_mean": 0.5, "loss": 1.0, "bytes_up": 1, "bytes_down": 1, "bytes_up_total": r,
             "bytes_down_total": r, "wall_s": 2.0 if r <= 2 else 1.5,
             "wall_s_total": 2.0 * min(r, 2) + 1.5 * max(0, r - 2)} for r in (1, 2, 3, 4)]
    table = dict((s.strip() for s in line.split("  ", 1))
                 for line in summary_table(rows, tmp_path, elapsed=4.5, resumed_after=2).splitlines()[1:-1])
    assert table["wall time"] == "4.5s from launch to the end of this resume (3.0s in its 2 rounds)"
    assert table["whole run"] == "7.0s in all 4 rounds (1.75s per round)"


def test_ctrl_c_and_sigterm_are_acknowledged_at_once(capfd):
    import signal

    from raysim import interrupts

    stopped = []
    with interrupts.handled(), interrupts.graceful(lambda: stopped.append(1), "round 3"):
        signal.raise_signal(signal.SIGINT)
        assert stopped  # the round goes on; the line is already out
    err = capfd.readouterr().err
    assert "raysim: Ctrl-C: finishing round 3, then checkpointing (Ctrl-C again stops at once)" in err
    with interrupts.handled(), interrupts.graceful(lambda: None, "round 5"):
        signal.raise_signal(signal.SIGTERM)
        err = capfd.readouterr().err
    assert "raysim: got SIGTERM: finishing round 5 (at most 10 s), then checkpointing" in err


def test_auto_vectorize_choice_is_printed(tmp_path, capsys):
    code, out, _ = _cli(capsys, "run", *tiny_overrides(tmp_path, rounds=1, engine__vectorize="auto"))
    assert code == 0 and "raysim: engine.vectorize=auto: " in out


# ---------------------------------------------------------------------------------------------- one validation pass
def test_every_problem_in_one_message_before_anything_starts(capsys, monkeypatch, tmp_path):
    """`raysim run fapd/cifar10-fapd rounds=1` on a 2-CPU machine without a GPU or CIFAR-10: three problems, one
    message, one line of overrides to paste; nothing started (no Ray, no data). The machine has no Ray cluster in
    sight (none recorded, no RAY_ADDRESS, none this test session started), so the run would start its own Ray."""
    import os
    import sys

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr("raysim.preflight._local_gpus", lambda: 0)
    code, _, err = _cli(capsys, "run", "fapd/cifar10-fapd", "rounds=1", "data.root=")
    assert code == 2
    lines = err.strip().splitlines()
    assert lines[0] == "raysim: error: 3 problems before anything starts:"
    assert [line.split("'")[1] for line in lines[1:4]] == ["engine.gpus_per_worker", "engine.num_workers",
                                                           "data.root"]
    assert lines[4] == ("  to run here: raysim run fapd/cifar10-fapd rounds=1 engine.gpus_per_worker=0 "
                        "engine.num_workers=1 data.root=/path/to/datasets")
    import sys

    assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()


# ---------------------------------------------------------------------------------------------- the README
def test_readme_opens_with_a_first_hour_and_links_the_reference():
    readme = (ROOT / "README.md").read_text().splitlines()
    start = readme.index("## Your first hour")
    first_hour = readme[start:next(i for i in range(start + 1, len(readme)) if readme[i].startswith("## "))]
    # the first hour, then the four measured tables the issues ask the README to carry (privacy, Byzantine
    # robustness, simulated time, what travels: about 65 lines), then the reference
    assert len(first_hour) <= 55 and len(readme) <= 125
    text = "\n".join(readme)
    for step in ("make demo", "raysim run smoke", "--seeds 0-2", "raysim report", "raysim tune", "tensorboard"):
        assert step in text, step
    assert "(docs/reference.md)" in text and (ROOT / "docs" / "reference.md").is_file()


def test_every_wrong_override_in_one_message(capsys):
    code, _, err = _cli(capsys, "run", "smoke", "train.nope=1", "algorithm.name=fedprox", "algorithm.mu=0.1",
                        "model.name=cnm", "rounds=-1")
    assert code == 2
    lines = err.strip().splitlines()
    assert lines[0] == "raysim: error: 3 problems in the overrides:"
    assert [line.split("'")[1] for line in lines[1:]] == ["model.name", "train.nope", "rounds"]  # mu=0.1 is fine
