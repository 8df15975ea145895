"""raysim report on run directories with known numbers: means, stds, Welch p-values, communication, plots."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from raysim.cli import main
from raysim.config import load_config, to_yaml
from raysim.errors import UserError
from raysim.report import find_runs, make_report

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# best acc_mean per seed, by (algorithm, partition)
BEST = {
    ("fedavg", "iid"): [0.90, 0.92, 0.94],
    ("local", "iid"): [0.50, 0.55, 0.60],
    ("fedavg", "dirichlet"): [0.70, 0.72, 0.74],
    ("local", "dirichlet"): [0.71, 0.73, 0.69],
}
BYTES = {"fedavg": (1000, 2000), "local": (0, 0)}


def write_run(run_dir: Path, algorithm: str, partition: str, seed: int, best: float, workers: int) -> None:
    """Three rounds: 0.4, then the best, then just below it; one second per round; FedAvg also logs k, local p on
    the dirichlet partition."""
    cfg = load_config(None, [f"algorithm.name={algorithm}", f"data.partition={partition}", f"seed={seed}",
                             f"engine.num_workers={workers}", f"name=run{seed}", f"log.dir={run_dir}"])
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(to_yaml(cfg))
    up, down = BYTES[algorithm]
    rows = []
    for rnd, acc in enumerate([0.4, best, best - 0.01], start=1):
        row = {"round": rnd, "acc_mean": acc, "acc_weighted": acc - 0.02, "loss": 1.0 / rnd, "bytes_up": up,
               "bytes_down": down,
               "bytes_up_total": up * rnd, "bytes_down_total": down * rnd, "wall_s": 1.0, "wall_s_total": float(rnd)}
        if algorithm == "fedavg":
            row["acc_global"] = acc - 0.05
            row["k"] = 8 + 5 * (rnd - 1)
        elif partition == "dirichlet":
            row["p"] = rnd / 3
        rows.append(row)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    """Runs nested like sweeps and seed sets, plus a folder that is not a run."""
    root = tmp_path / "results"
    for (algorithm, partition), values in BEST.items():
        for seed, best in enumerate(values):
            write_run(root / f"{algorithm}-{partition}" / f"seed-{seed}", algorithm, partition, seed, best,
                      workers=1 + seed % 2)
    (root / "fedavg-iid" / "tune").mkdir()
    (root / "fedavg-iid" / "tune" / "metrics.jsonl").write_text("{}\n")  # no config.yaml: not a run
    return root


def welch_p(a: list[float], b: list[float]) -> float:
    """Welch's t-test written out: t, Welch-Satterthwaite degrees of freedom, two-sided p."""
    from scipy.stats import t as student_t

    va, vb = (sum((x - sum(v) / len(v)) ** 2 for x in v) / (len(v) - 1) / len(v) for v in (a, b))
    t = (sum(a) / len(a) - sum(b) / len(b)) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    return float(2 * student_t.sf(abs(t), df))


def paired_p(a: list[float], b: list[float]) -> float:
    """The paired t-test written out: t = mean(d) / (sd(d) / sqrt(n)) on the differences, n - 1 degrees of freedom."""
    from scipy.stats import t as student_t

    d = [x - y for x, y in zip(a, b)]
    mean = sum(d) / len(d)
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (len(d) - 1))
    return float(2 * student_t.sf(abs(mean / (sd / math.sqrt(len(d)))), len(d) - 1))


def test_report_means_stds_and_paired_p_values(runs, tmp_path):
    assert len(find_runs([runs])) == 12
    report = make_report([runs], tmp_path / "out")
    assert report.methods == ["fedavg", "local"]
    assert set(report.settings) == {"data.partition=iid", "data.partition=dirichlet"}
    assert len(report.groups) == 4  # seeds (and engine/name/log keys) do not split groups
    for (algorithm, partition), values in BEST.items():
        g = report.group(algorithm, f"data.partition={partition}")
        assert sorted(g.values) == pytest.approx(sorted(values))
        mean = sum(values) / 3
        assert g.mean == pytest.approx(mean)
        assert g.std == pytest.approx(math.sqrt(sum((v - mean) ** 2 for v in values) / 2))
    best_iid, local_iid = report.group("fedavg", "data.partition=iid"), report.group("local", "data.partition=iid")
    assert best_iid.is_best and not best_iid.beaten
    # both methods ran seeds 0, 1, 2: the paired test; one comparison per column, so Holm leaves p as it is
    assert local_iid.test == "paired"
    assert local_iid.p_vs_best == pytest.approx(paired_p(BEST[("fedavg", "iid")], BEST[("local", "iid")]), rel=1e-9)
    assert local_iid.p_adjusted == local_iid.p_vs_best < 0.01 and local_iid.beaten
    best_dir = report.group("fedavg", "data.partition=dirichlet")
    local_dir = report.group("local", "data.partition=dirichlet")
    assert best_dir.is_best
    assert local_dir.p_vs_best == pytest.approx(paired_p(BEST[("fedavg", "dirichlet")], BEST[("local", "dirichlet")]))
    assert local_dir.p_vs_best > 0.01 and not local_dir.beaten

    md = (tmp_path / "out" / "report.md").read_text()
    assert "**92.00 ± 2.00**" in md and "55.00 ± 5.00*" in md and "71.00 ± 2.00 " in md
    table = list(csv.reader(open(tmp_path / "out" / "table.csv")))
    header = table[0]
    local_row = dict(zip(header, next(r for r in table if r[0] == "local")))
    assert local_row["data.partition=iid"] == "55.00 ± 5.00*"
    assert local_row["data.partition=dirichlet"] == "71.00 ± 2.00"
    summary = list(csv.DictReader(open(tmp_path / "out" / "summary.csv")))
    row = next(r for r in summary if r["method"] == "local" and r["setting"] == "data.partition=iid")
    assert float(row["p_vs_best"]) == pytest.approx(local_iid.p_vs_best, rel=1e-5) and row["n"] == "3"
    assert row["test"] == "paired" and float(row["p_holm"]) == pytest.approx(local_iid.p_vs_best, rel=1e-5)
    # every run ends one point below its best
    assert float(row["final_mean"]) == pytest.approx(sum(BEST[("local", "iid")]) / 3 - 0.01)
    final = {r[0]: r[1:] for r in csv.reader(open(tmp_path / "out" / "final_table.csv"))}
    assert final["method"] == header[1:] and final["local"][header.index("data.partition=iid") - 1] == "54.00 ± 5.00"
    assert "## Final-round `acc_mean`" in md and "54.00 ± 5.00" in md


def test_report_communication_to_target(runs, tmp_path):
    make_report([runs], tmp_path / "out", target=0.72, plots=False)
    rows = {(r["method"], r["setting"]): r for r in csv.DictReader(open(tmp_path / "out" / "comm.csv"))}
    fedavg = rows[("fedavg", "data.partition=iid")]
    assert float(fedavg["bytes_up_per_round"]) == 1000 and float(fedavg["bytes_down_per_round"]) == 2000
    assert float(fedavg["wall_s_per_round_median"]) == 1.0
    assert fedavg["reached"] == "3"
    assert float(fedavg["rounds_to_target_mean"]) == 2 and float(fedavg["rounds_to_target_std"]) == 0
    assert float(fedavg["mb_to_target_mean"]) == pytest.approx(2 * 3000 / 1e6)
    assert float(fedavg["wall_s_to_target_mean"]) == 2.0
    # fedavg/dirichlet peaks at 0.70, 0.72, 0.74: two of three seeds reach 0.72, both at round 2
    assert rows[("fedavg", "data.partition=dirichlet")]["reached"] == "2"
    # local/iid never reaches 0.72
    assert rows[("local", "data.partition=iid")]["reached"] == "0"
    assert rows[("local", "data.partition=iid")]["mb_to_target_mean"] == ""


def test_report_acc_global_skips_methods_without_a_global_model(runs, tmp_path):
    report = make_report([runs], tmp_path / "out", metric="acc_global", plots=False)
    assert report.group("fedavg", "data.partition=iid").mean == pytest.approx(0.87)
    assert report.group("local", "data.partition=iid").mean is None
    assert "| local " in (tmp_path / "out" / "report.md").read_text()


def test_plots_are_valid_pngs(runs, tmp_path):
    import matplotlib.image

    report = make_report([runs], tmp_path / "out")
    for name in ("acc_vs_round.png", "acc_vs_mb.png", "k_vs_round.png", "p_vs_round.png", "to_target.png"):
        path = tmp_path / "out" / name
        assert report.files[name] == path
        assert path.read_bytes()[:8] == PNG_SIGNATURE
        image = matplotlib.image.imread(path)
        assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
        assert f"]({name})" in (tmp_path / "out" / "report.md").read_text()


def test_report_cli(runs, tmp_path, capsys):
    assert main(["report", str(runs / "fedavg-iid"), str(runs / "local-iid"), "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "55.00 ± 5.00*" in out and "report.md" in out
    # a single setting: the column is named after the dataset
    table = list(csv.reader(open(tmp_path / "o" / "table.csv")))
    assert table[0] == ["method", "sklearn_digits"]
    assert main(["report", str(runs), "--metric", "acc_global", "--target", "0.6", "--no-plots",
                 "--out", str(tmp_path / "g")]) == 0
    assert not list((tmp_path / "g").glob("*.png"))


def test_report_cli_metric_acc_weighted_and_columns(runs, tmp_path, capsys):
    # every run's acc_weighted is its acc_mean less 0.02: the best per seed is too
    assert main(["report", str(runs), "--metric", "acc_weighted", "--no-plots", "--out", str(tmp_path / "w")]) == 0
    assert "acc_weighted" in capsys.readouterr().out
    rows = {r[0]: r[1:] for r in csv.reader(open(tmp_path / "w" / "table.csv"))}
    assert rows["method"] == ["data.partition=dirichlet", "data.partition=iid"]
    assert rows["fedavg"] == ["70.00 ± 2.00", "90.00 ± 2.00"]
    assert [v.rstrip("*") for v in rows["local"]] == ["69.00 ± 2.00", "53.00 ± 5.00"]
    # --columns with a prefix that no varying key has: one column, the partition moves into the rows
    assert main(["report", str(runs), "--columns", "clients.", "--no-plots", "--out", str(tmp_path / "c")]) == 0
    rows = {r[0]: r[1:] for r in csv.reader(open(tmp_path / "c" / "table.csv"))}
    assert rows["method"] == ["sklearn_digits"]
    assert {k: v[0].rstrip("*") for k, v in rows.items() if k != "method"} == {
        "fedavg (data.partition=dirichlet)": "72.00 ± 2.00", "fedavg (data.partition=iid)": "92.00 ± 2.00",
        "local (data.partition=dirichlet)": "71.00 ± 2.00", "local (data.partition=iid)": "55.00 ± 5.00"}
    # --columns algorithm.: the methods become the columns
    assert main(["report", str(runs), "--columns", "algorithm.", "--no-plots", "--out", str(tmp_path / "a")]) == 0
    assert next(csv.reader(open(tmp_path / "a" / "table.csv"))) == ["method", "algorithm.name=fedavg",
                                                                      "algorithm.name=local"]


def test_report_from_python(runs, tmp_path):
    """``raysim.report(...)`` writes what ``raysim report`` does and lists its files."""
    import raysim

    rep = raysim.report(runs / "fedavg-iid", runs / "local-iid", out=tmp_path / "py", columns=["data."], plots=False)
    assert rep.files["report.md"] == tmp_path / "py" / "report.md" and rep.files["report.md"].is_file()
    assert main(["report", str(runs / "fedavg-iid"), str(runs / "local-iid"), "--no-plots",
                 "--out", str(tmp_path / "cli")]) == 0
    for name in ("table.csv", "summary.csv", "comm.csv"):
        assert rep.files[name].read_text() == (tmp_path / "cli" / name).read_text(), name
    assert not list((tmp_path / "py").glob("*.png"))


def test_report_errors_are_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty")]) == 2
    assert "no raysim run directories" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_many_differing_keys_are_named_in_full_in_the_legends_and_no_empty_k_panel(tmp_path, recwarn):
    """Runs differing in several method keys: the legends name them by their config names, wrapped, so a plot reads
    alone (they once read fedavg-1 ... fedavg-3, explained only in report.md); a setting where no run logs k gets no
    k panel; matplotlib does not warn about the layout."""
    from raysim.report import plot_labels

    import matplotlib.image

    root = tmp_path / "many"
    for i, (lr, mom, wd) in enumerate([(0.01, 0.0, 0.0), (0.05, 0.9, 0.001), (0.1, 0.5, 0.0001)]):
        for partition, algorithm in (("iid", "fedavg"), ("dirichlet", "local")):  # only fedavg rows log k
            run_dir = root / f"{partition}-{i}"
            write_run(run_dir, algorithm, partition, 0, 0.6 + 0.1 * i, workers=1)
            cfg = load_config(run_dir / "config.yaml", [f"train.lr={lr}", f"train.momentum={mom}",
                                                       f"train.weight_decay={wd}"])
            (run_dir / "config.yaml").write_text(to_yaml(cfg))
    report = make_report([root], tmp_path / "out")
    assert not [w for w in recwarn if "layout" in str(w.message).lower()]
    md = (tmp_path / "out" / "report.md").read_text()
    assert "## Plot labels" not in md and "fedavg-1" not in md
    label = plot_labels(report)["fedavg (train.lr=0.05, train.momentum=0.9, train.weight_decay=0.001)"]
    assert label == "fedavg (train.lr=0.05, train.momentum=0.9,\ntrain.weight_decay=0.001)"  # whole, wrapped
    k_png = matplotlib.image.imread(tmp_path / "out" / "k_vs_round.png")
    acc_png = matplotlib.image.imread(tmp_path / "out" / "acc_vs_round.png")
    assert k_png.shape[1] < 0.7 * acc_png.shape[1]  # one panel (iid, where fedavg logged k), not two
    assert len(report.methods) == 6


# ---------------------------------------------------------------------------------------------- the seeds' layout
def write_named_run(run_dir: Path, name: str, overrides: list[str], seed: int, best: float) -> None:
    """A two-round run named like the experiment files (``<setting>-<method>``)."""
    cfg = load_config(None, [f"name={name}", f"seed={seed}", f"log.dir={run_dir}", *overrides])
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(to_yaml(cfg))
    rows = [{"round": r, "acc_mean": acc, "acc_global": acc, "loss": 1.0, "bytes_up": 1, "bytes_down": 1,
             "bytes_up_total": r, "bytes_down_total": r, "wall_s": 1.0, "wall_s_total": float(r)}
            for r, acc in ((1, 0.3), (2, best))]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_report_puts_every_method_of_a_table_in_one_table_by_name(tmp_path):
    # FAPD-style runs: each method with its own algorithm keys, two settings that differ in data and model, a
    # method whose variant name extends the algorithm's (fapd-nadpt), and a sweep that shares a cell (fedprox lr)
    cifar = ["data.name=cifar10", "model.name=resnet10", "model.feature_dim=512"]
    runs = {
        ("digits", "fedavg"): ("digits-fedavg", ["algorithm.name=fedavg"], 0.90),
        ("digits", "moon"): ("digits-moon", ["algorithm.name=moon", "algorithm.mu=5"], 0.80),
        ("digits", "fapd-nadpt"): ("digits-fapd-nadpt", ["algorithm.name=fapd", "algorithm.curriculum=fixed"], 0.70),
        ("digits", "fedprox (train.lr=0.1)"): ("digits-fedprox", ["algorithm.name=fedprox", "train.lr=0.1"], 0.60),
        ("digits", "fedprox (train.lr=0.01)"): ("digits-fedprox", ["algorithm.name=fedprox", "train.lr=0.01"], 0.50),
        ("cifar10", "fedavg"): ("cifar10-fedavg", ["algorithm.name=fedavg", *cifar], 0.40),
        ("cifar10", "moon"): ("cifar10-moon", ["algorithm.name=moon", "algorithm.mu=5", *cifar], 0.45),
    }
    root = tmp_path / "runs"
    for i, (name, overrides, best) in enumerate(runs.values()):
        for seed in range(2):
            write_named_run(root / f"{i}" / f"seed-{seed}", name, overrides, seed, best + 0.01 * seed)
    report = make_report([root], tmp_path / "out", plots=False)
    assert report.layout == "name"
    assert report.settings == ["cifar10", "digits"]
    assert report.methods == sorted({m for _, m in runs})
    for (setting, method), (_, _, best) in runs.items():
        assert report.group(method, setting).mean == pytest.approx(best + 0.005)
    table = list(csv.reader(open(tmp_path / "out" / "table.csv")))
    assert table[0] == ["method", "cifar10", "digits"]
    rows = {r[0]: r[1:] for r in table[1:]}
    # two seeds a method: no significance mark (a paired test on two seeds has 1 degree of freedom), though the
    # p-values are there: on cifar10 fedavg is 5 points behind moon on both seeds, which the paired test finds
    # (p ~ 4e-16) where Welch's would not (p > 0.01)
    assert rows["moon"] == ["45.50 ± 0.71", "80.50 ± 0.71"] and rows["fapd-nadpt"] == ["-", "70.50 ± 0.71"]
    assert rows["fedavg"] == ["40.50 ± 0.71", "90.50 ± 0.71"]
    behind = report.group("fedavg", "cifar10")
    assert behind.test == "paired" and behind.p_adjusted < 1e-10 and not behind.beaten
    assert "configs' names" in (tmp_path / "out" / "report.md").read_text()
    # the key layout on the same runs: columns from the varying data/model keys, rows cluttered with every
    # algorithm's own keys; asking for the name layout where names do not fit is a one-line error
    keyed = make_report([root], tmp_path / "out2", plots=False, layout="keys")
    assert keyed.layout == "keys" and "cifar10" in keyed.settings[0] + keyed.settings[1]
    with pytest.raises(UserError, match="layout must be one of"):
        make_report([root], tmp_path / "out3", layout="rows")


def test_report_falls_back_to_keys_when_names_do_not_say(runs, tmp_path):
    # the runs of the first tests are named run0, run1, ...: not '<setting>-<method>'
    assert make_report([runs], tmp_path / "out", plots=False).layout == "keys"
    with pytest.raises(UserError, match="is not '<setting>-<method>'"):
        make_report([runs], tmp_path / "out", plots=False, layout="name")


@pytest.mark.parametrize("name,algorithm,cell", [
    ("digits-moon", "moon", ("digits", "moon")),
    ("cifar100-fapd-ncont", "fapd", ("cifar100", "fapd-ncont")),
    ("digits-niid1-cpu-unideal-l1", "unideal", ("digits-niid1-cpu", "unideal-l1")),
    ("fedavg-on-fedavg", "fedavg", ("fedavg-on", "fedavg")),  # the last place
    ("digits-fedavg2", "fedavg", None), ("fedavg", "fedavg", None), ("t", "fedavg", None),
])
def test_split_name(name, algorithm, cell):
    from raysim.report import split_name

    assert split_name(name, algorithm) == cell


# ---------------------------------------------------------------------------------------------- tests, final, clients
def test_holm_by_hand():
    from raysim.report_stats import holm

    # sorted: 0.01 x 3 = 0.03; 0.03 x 2 = 0.06; 0.04 x 1 = 0.04, raised to 0.06 (never below an earlier one)
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, 0.6]) == [1.0, 1.0] and holm([]) == []


def test_welch_when_seeds_differ_and_holm_over_the_column(tmp_path):
    """fedavg (seeds 0-2) is best; local ran seeds 0-2 too (paired), fedprox ran seeds 3-5 (Welch); the stars come
    from the Holm-adjusted p-values of the column's two comparisons."""
    values = {"fedavg": ([0, 1, 2], [0.90, 0.92, 0.94]), "local": ([0, 1, 2], [0.85, 0.88, 0.89]),
              "fedprox": ([3, 4, 5], [0.80, 0.85, 0.83])}
    for method, (seeds, bests) in values.items():
        for seed, best in zip(seeds, bests):
            write_named_run(tmp_path / "runs" / method / f"s{seed}", f"digits-{method}", [f"algorithm.name={method}"],
                            seed, best)
    report = make_report([tmp_path / "runs"], tmp_path / "out", plots=False)
    local, fedprox = report.group("local"), report.group("fedprox")
    assert (local.test, fedprox.test) == ("paired", "welch")
    p_local = paired_p(values["fedavg"][1], values["local"][1])
    p_prox = welch_p(values["fedavg"][1], values["fedprox"][1])
    assert local.p_vs_best == pytest.approx(p_local, rel=1e-9) and fedprox.p_vs_best == pytest.approx(p_prox, rel=1e-9)
    lo, hi = sorted([p_local, p_prox])
    adjusted = {p_local: None, p_prox: None}
    adjusted[lo], adjusted[hi] = 2 * lo, max(2 * lo, hi)
    assert local.p_adjusted == pytest.approx(adjusted[p_local])
    assert fedprox.p_adjusted == pytest.approx(adjusted[p_prox])
    assert local.beaten == (adjusted[p_local] < 0.01) and fedprox.beaten == (adjusted[p_prox] < 0.01)
    # both raw p-values are below 0.01 (0.0051 and 0.0084), but not after Holm's correction for two comparisons
    assert max(p_local, p_prox) < 0.01 <= min(adjusted.values()) and not local.beaten and not fedprox.beaten


def write_clients(run_dir: Path, rounds: dict[int, list[tuple[int, int]]]) -> None:
    from raysim.runlog import CLIENT_METRICS, client_row

    (run_dir / CLIENT_METRICS).write_text("".join(
        json.dumps(client_row(r, dict(enumerate(counts)))) + "\n" for r, counts in rounds.items()))


def test_client_spread_mean_std_and_worst_ten_percent(tmp_path, capsys):
    for seed, shift in ((0, 0), (1, 1)):
        run_dir = tmp_path / "runs" / f"s{seed}"
        write_named_run(run_dir, "digits-fedavg", ["algorithm.name=fedavg"], seed, 0.9)
        # the last round counts: 11 clients with 10 test samples each, correct 2+shift, 3+shift, ..., 10 (capped)
        last = [(min(10, c + shift), 10) for c in range(0, 11)]
        write_clients(run_dir, {1: [(1, 10)] * 11, 2: last})
    report = make_report([tmp_path / "runs"], tmp_path / "out", plots=False)
    md = (report.files["report.md"]).read_text()
    rows = list(csv.DictReader(open(tmp_path / "out" / "clients.csv")))
    assert len(rows) == 1 and rows[0]["clients"] == "11" and rows[0]["runs"] == "2"
    import numpy as np

    per_run = []
    for shift in (0, 1):
        acc = np.array([min(10, c + shift) / 10 for c in range(11)])
        # worst 10% of 11 clients: ceil(1.1) = 2 lowest
        per_run.append((acc.mean(), acc.std(), np.sort(acc)[:2].mean(), acc.min()))
    for i, key in enumerate(("mean", "std", "worst10", "min")):
        assert float(rows[0][key]) == pytest.approx(np.mean([r[i] for r in per_run]), rel=1e-5)
    assert float(rows[0]["worst10"]) == pytest.approx((0.05 + 0.15) / 2)
    assert "## Client spread" in md and "| digits " in md
    # a torn last line (a run killed mid-write) is skipped with a warning, as for metrics.jsonl
    with open(tmp_path / "runs" / "s0" / "client_metrics.jsonl", "a") as fh:
        fh.write('{"round": 3, "client": [0, 1')
    capsys.readouterr()
    make_report([tmp_path / "runs"], tmp_path / "out", plots=False)
    assert "client_metrics.jsonl: skipped an incomplete last line" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- rough edges (#27)
def _boxes_overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_to_target_plot_labels_neither_overlap_nor_leave_the_figure(runs, tmp_path):
    """fedavg beside local, which sends nothing: the traffic axis once labelled every minor tick down to 1e-6 (the
    labels lay on top of each other), and the rightmost point's label was cut at the figure's edge."""
    import matplotlib.pyplot as plt

    from raysim.report import target_figure

    report = make_report([runs / "fedavg-iid", runs / "local-iid"], tmp_path / "out", target=0.5)
    assert "to_target.png" in report.files
    fig = target_figure(report)
    try:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        figure_box = fig.bbox
        (ax,) = [a for a in fig.axes if a.get_visible()]
        ticks = [t for t in ax.get_xticklabels(which="both") if t.get_visible() and t.get_text()]
        boxes = [t.get_window_extent(renderer) for t in ticks]
        assert len(ticks) >= 2
        for i, a in enumerate(boxes):
            for b in boxes[i + 1:]:
                assert not _boxes_overlap(a, b), [t.get_text() for t in ticks]
        assert "0" in [t.get_text() for t in ticks]  # local's 0 bytes is on the axis, not at 1e-6
        labels = [t for t in ax.texts if "(" in t.get_text()]
        assert {t.get_text().split(" (")[0] for t in labels} == {"fedavg", "local"}
        for t in labels:
            box = t.get_window_extent(renderer)
            assert figure_box.x0 <= box.x0 and box.x1 <= figure_box.x1, t.get_text()
            assert figure_box.y0 <= box.y0 and box.y1 <= figure_box.y1, t.get_text()
    finally:
        plt.close(fig)


def test_report_of_a_folder_says_what_it_found_and_keeps_figures_readable(tmp_path, capsys):
    """`raysim report /tmp` once collected every run below silently and drew one panel per setting in a row (a
    15,400-pixel-wide PNG). Now it says how many runs it found where, and leaves out plots with more panels than a
    figure can show, saying why."""
    root = tmp_path / "tmp"
    for n in range(2, 16):  # 14 settings (clients.num), unrelated runs scattered over folders
        write_run(root / f"job{n % 3}" / f"pytest-{n}" / "run", "fedavg", "iid", 0, 0.8, workers=1)
        cfg = load_config(root / f"job{n % 3}" / f"pytest-{n}" / "run" / "config.yaml", [f"clients.num={n}"])
        (root / f"job{n % 3}" / f"pytest-{n}" / "run" / "config.yaml").write_text(to_yaml(cfg))
    (root / "job0" / "pytest-3" / "run" / "report").mkdir()  # a report inside a run is not searched
    assert main(["report", str(root), "--out", str(tmp_path / "out")]) == 0
    captured = capsys.readouterr()
    assert f"14 run directories under {root}" in captured.err
    assert "plots left out: 14 settings (at most 12)" in captured.err
    assert not list((tmp_path / "out").glob("*.png"))
    assert "plots left out" in captured.out


def test_report_grids_panels_instead_of_one_endless_row(runs, tmp_path):
    import matplotlib.image

    root = tmp_path / "six"
    for n in range(2, 8):  # six settings: two rows of panels, at most four across
        write_run(root / f"n{n}", "fedavg", "iid", 0, 0.8, workers=1)
        cfg = load_config(root / f"n{n}" / "config.yaml", [f"clients.num={n}"])
        (root / f"n{n}" / "config.yaml").write_text(to_yaml(cfg))
    make_report([root], tmp_path / "out")
    image = matplotlib.image.imread(tmp_path / "out" / "acc_vs_round.png")
    assert image.shape[1] <= 4 * 5.0 * 110 + 10 and image.shape[0] > 2 * 3.6 * 110 * 0.9


def test_report_any_metric_with_its_direction(runs, tmp_path, capsys):
    """--metric loss was refused (only acc_* was); a loss is best at its minimum and shown as it is, not in %."""
    assert main(["report", str(runs), "--metric", "loss", "--target", "0.6", "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "best loss, mean ± std over seeds (best: the lowest)" in out
    assert "0.3333 ± 0" in out  # each run's lowest loss is its third round's 1/3
    report = make_report([runs], tmp_path / "o2", metric="loss", target=0.6, plots=False)
    assert report.mode == "min" and report.group("fedavg", "data.partition=iid").mean == pytest.approx(1 / 3)
    assert report.group("fedavg", "data.partition=iid").runs[0].to_target("loss", 0.6, "min")["round"] == 2
    assert make_report([runs], tmp_path / "o3", metric="k", plots=False).mode == "max"


@pytest.mark.parametrize("metric, mode", [("attack/asr", "min"), ("epsilon", "min"), ("dpsgd/epsilon_max", "min"),
                                          ("sim_time_s", "min"), ("round_sim_s", "min"), ("wall_s_total", "min"),
                                          ("loss_ce", "min"), ("loss/kd", "min"), ("bytes_up_total", "min"),
                                          ("staleness_mean", "min"), ("acc_global", "max"), ("acc_weighted", "max"),
                                          ("k", "max"), ("p", "max"), ("curriculum/teacher_acc", "max"),
                                          ("partial", None), ("privacy/clip", None), ("audit/epsilon", "min"),
                                          ("nonprivate/loss", "min"), ("nonprivate/loss_ce", "min"),
                                          ("nonprivate/bytes_up_total", "min"), ("nonprivate/clients", None),
                                          ("privacy/delta", None)])
def test_every_metric_raysim_logs_has_a_direction(metric, mode):
    """`report --metric attack/asr` gave the mean rule's 0.9969 as its best: round 1's rate, the maximum."""
    from raysim.report.model import metric_direction

    assert metric_direction(metric) == mode


def test_report_of_the_attack_success_rate_picks_the_lowest(tmp_path, capsys):
    for seed, rates in enumerate(([0.9969, 0.6, 0.4], [0.99, 0.5, 0.45])):
        run_dir = tmp_path / "runs" / f"s{seed}"
        write_run(run_dir, "fedavg", "iid", seed, 0.9, workers=1)
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps({**r, "attack/asr": a}) + "\n"
                                                       for r, a in zip(rows, rates)))
    report = make_report([tmp_path / "runs"], tmp_path / "out", metric="attack/asr", plots=False)
    assert report.mode == "min" and report.groups[0].values == [0.4, 0.45]  # each run's lowest rate
    report = make_report([tmp_path / "runs"], tmp_path / "out2", metric="loss", plots=False, mode="max")
    assert report.mode == "max" and not report.notes  # --mode overrides the direction, without a note


def test_a_metric_of_unknown_direction_is_said_to_be_taken_as_higher_is_better(tmp_path):
    run_dir = tmp_path / "runs" / "a"
    write_run(run_dir, "fedavg", "iid", 0, 0.9, workers=1)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({**r, "my/score": i}) + "\n" for i, r in enumerate(rows)))
    report = make_report([tmp_path / "runs"], tmp_path / "out", metric="my/score", plots=False)
    assert report.mode == "max" and any("does not know whether more or less is better" in n for n in report.notes)


def test_rounds_out_of_order_end_at_the_highest_round(tmp_path, capsys):
    """`report` took the last line as the final round even when the rounds were out of order."""
    run_dir = tmp_path / "runs" / "a"
    write_run(run_dir, "fedavg", "iid", 0, 0.9, workers=1)
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    (run_dir / "metrics.jsonl").write_text("\n".join([lines[2], lines[0], lines[1], lines[0]]) + "\n")
    report = make_report([tmp_path / "runs"], tmp_path / "out", plots=False)
    run = report.groups[0].runs[0]
    assert [r["round"] for r in run.rows] == [1, 2, 3]
    assert report.groups[0].final_values == [json.loads(lines[2])["acc_mean"]]
    assert "its rounds are not in order (1 repeated: the last line of each kept)" in capsys.readouterr().err


def test_report_metric_no_run_logged_says_why(runs, tmp_path, capsys):
    """--metric acc_global on local runs printed '-' and 'plots: none' without a word of why."""
    assert main(["report", str(runs / "local-iid"), "--metric", "acc_global", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "--metric acc_global: none of the 3 runs logged it (local: it keeps no global model" in err
    assert "acc_mean" in err and "loss" in err  # what they did log
    assert main(["report", str(runs), "--metric", "acc_global", "--no-plots", "--out", str(tmp_path / "m")]) == 0
    assert "local has no acc_global (it keeps no global model to evaluate)" in capsys.readouterr().err
    assert main(["report", str(runs), "--metric", "nope", "--out", str(tmp_path / "n")]) == 2
    assert "--metric nope: none of the 12 runs logged it" in capsys.readouterr().err


@pytest.mark.parametrize("bad", [1e308, "high", {"a": {"b": [1]}}, "deep", math.nan, math.inf])
def test_values_that_are_not_finite_numbers_are_dropped_with_one_warning(tmp_path, capsys, bad):
    """Never a traceback, and never a best: 1e308, a string, nested JSON (a line nested too deep to read is a
    damaged line), NaN and Inf are dropped from the comparison, and one line says how many and where."""
    write_run(tmp_path / "r", "fedavg", "iid", 0, 0.9, 1)
    path = tmp_path / "r" / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    if bad == "deep":  # a metrics line no JSON reader can nest into, as its last (torn) line
        text = path.read_text() + '{"round": 4, "acc_mean": ' + "[" * 100_000 + "]" * 100_000 + "}\n"
    else:
        rows[1]["acc_mean"] = bad  # the round that holds the best
        rows[2]["bytes_up"] = bad
        text = "".join(json.dumps(r) + "\n" for r in rows)
    path.write_text(text)
    assert main(["report", str(tmp_path / "r"), "--out", str(tmp_path / "out"), "--no-plots"]) == 0
    captured = capsys.readouterr()
    warnings = [line for line in captured.err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "Traceback" not in captured.err, captured.err
    if bad != "deep":
        assert "dropped 2 values that are not finite numbers: acc_mean (round 2); bytes_up (round 3)" in warnings[0]
        best = make_report([tmp_path / "r"], tmp_path / "out2", plots=False).groups[0].runs[0].best("acc_mean")
        assert best == pytest.approx(0.89)  # the round after: the dropped value is no best
    capsys.readouterr()
