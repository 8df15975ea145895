"""``raysim data show``: a partition's label counts per client, printed and drawn as a heat map."""

from __future__ import annotations

import numpy as np

from raysim.cli import main
from raysim.config import load_config
from raysim.data import build_federated_data
from raysim.data.show import label_counts

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_data_show_prints_counts_per_client_and_writes_the_heat_map(tmp_path, capsys):
    import matplotlib.image

    png = tmp_path / "out" / "p.png"
    overrides = ["data.partition=pathological", "data.classes_per_client=2", f"data.cache_dir={tmp_path}"]
    assert main(["data", "show", "smoke", *overrides, "--out", str(png)]) == 0
    out = capsys.readouterr().out
    assert png.read_bytes()[:8] == PNG_SIGNATURE and matplotlib.image.imread(png).shape[1] > 300
    assert f"heat map of label counts per client: {png}" in out
    data = build_federated_data(load_config("smoke", overrides))
    counts = label_counts(data)
    assert counts.shape == (8, 10) and (np.count_nonzero(counts, axis=1) <= 2).all()
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| ") and "client" not in line]
    assert len(rows) == 8
    for cid, cells in enumerate(rows):  # client, samples, classes, top share, one count per class
        assert int(cells[0]) == cid and int(cells[1]) == counts[cid].sum() == data.num_train(cid) + data.num_test(cid)
        assert [int(c) for c in cells[4:]] == counts[cid].tolist()


def test_data_show_bad_config_is_one_line(tmp_path, capsys):
    assert main(["data", "show", "smoke", "data.partition=nope", "--out", str(tmp_path / "p.png")]) == 2
    assert capsys.readouterr().err.startswith("raysim: error: config key 'data.partition'")
    assert not (tmp_path / "p.png").exists()
