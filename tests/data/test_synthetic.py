"""FedProx's Synthetic(α, β), made per client on demand: the generator's formulas, determinism, settings."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from scipy import stats

from conftest import ROOT
from raysim.cli import main as cli_main
from raysim.config import ConfigError, load_config
from raysim.data import build_federated_data
from raysim.data.synthetic import SyntheticData


def _data(num: int = 1_000_000, **kw) -> SyntheticData:
    settings = dict(seed=3, num_clients=num, alpha=1.0, beta=1.0, dimension=60, test_fraction=0.2)
    settings.update(kw)
    return SyntheticData(**settings)


def test_shapes_split_and_labels():
    data = _data()
    x_tr, y_tr, x_te, y_te = data.client_arrays(12345)
    n = len(y_tr) + len(y_te)
    assert n >= 50 and x_tr.shape == (len(y_tr), 60) and x_te.shape == (len(y_te), 60)
    assert x_tr.dtype == np.float32 and y_tr.dtype == np.int64
    assert len(y_te) == round(0.2 * n) and data.num_test(12345) == len(y_te) and data.num_train(12345) == len(y_tr)
    assert set(np.unique(np.concatenate([y_tr, y_te]))) <= set(range(10))
    x, y, idx = data.tensors(12345, "test")
    assert tuple(x.shape) == (len(y_te), 60) and idx.tolist() == list(range(len(y_te)))
    assert data.input_shapes() == {(60,)}


def test_client_sizes_follow_the_generators_lognormal():
    """n_k = int(lognormal(4, 2)) + 50, so P(n_k - 50 <= k) = P(X < k + 1) for X ~ lognormal(4, 2)."""
    data = _data()
    sizes = np.array([data.num_samples(c) for c in range(0, 1_000_000, 250)]) - 50
    assert sizes.min() >= 0
    grid = np.array([5, 20, 55, 150, 400, 1500, 8000])
    empirical = np.array([(sizes <= k).mean() for k in grid])
    expected = stats.lognorm(s=2.0, scale=np.exp(4.0)).cdf(grid + 1)
    assert np.abs(empirical - expected).max() < 0.04, (empirical, expected)


def test_inputs_have_the_papers_covariance_and_beta_spreads_their_means():
    """Within a client x ~ N(v_k, Σ) with Σ_jj = j^-1.2; v_k ~ N(B_k, 1), B_k ~ N(0, β)."""
    data = _data(cap=300)
    centred = np.concatenate([x - x.mean(axis=0) for x, _ in (data.generate(c) for c in range(100))])
    var = centred.var(axis=0)
    for j in (1, 10, 60):
        assert var[j - 1] == pytest.approx(j ** -1.2, rel=0.1)
    for beta, low, high in ((0.0, 0.0, 0.3), (1.0, 0.6, 1.6)):
        other = _data(beta=beta, cap=60)
        spread = np.std([other.generate(c)[0].mean() for c in range(300)])
        assert low <= spread <= high, (beta, spread)


def test_labels_come_from_a_linear_model():
    """y = argmax(W_k^T x + b_k): one client's labels are separable by a linear classifier."""
    from sklearn.linear_model import LogisticRegression

    data = _data(dimension=20, cap=400)
    x, y = max((data.generate(c) for c in range(30)), key=lambda xy: len(np.unique(xy[1])))
    assert len(np.unique(y)) >= 3
    clf = LogisticRegression(C=1e4, max_iter=5000).fit(x, y)
    assert clf.score(x, y) >= 0.97


def test_determined_by_seed_and_client_only():
    a, b = _data(), _data(num=200_000)
    for cid in (0, 199_999, 77):
        for got, want in zip(a.client_arrays(cid), b.client_arrays(cid)):
            np.testing.assert_array_equal(got, want)
    assert not np.array_equal(a.generate(5)[0][:10], _data(seed=4).generate(5)[0][:10])
    with pytest.raises(IndexError):
        b.client_arrays(200_000)


def test_holds_no_samples_and_caps_sizes():
    data = _data()
    data.tensors(3)  # fills the worker-side cache, which never travels
    assert len(pickle.dumps(data)) < 4096
    capped = _data(cap=60)
    assert max(capped.num_samples(c) for c in range(500)) == 60
    assert capped.num_train(0) + capped.num_test(0) == len(capped.generate(0)[1])


def test_config_defaults_and_errors():
    cfg = load_config(None, ["data.name=synthetic", "clients.num=1000000", "clients.fraction=0.0001"])
    assert (cfg.data.alpha, cfg.data.beta, cfg.data.dimension) == (1.0, 1.0, 60)
    data = build_federated_data(cfg)
    assert data.num_clients == 1_000_000 and data.num_classes == 10
    assert load_config(None, ["data.name=synthetic", "data.alpha=0", "data.beta=0"]).data.alpha == 0.0
    assert load_config(None, []).data.alpha == 0.5  # a Dirichlet split's default is unchanged
    with pytest.raises(ConfigError, match="data.alpha"):
        load_config(None, ["data.name=synthetic", "data.alpha=-0.5"])
    with pytest.raises(ConfigError, match="data.beta"):
        load_config(None, ["data.name=synthetic", "data.beta=-1"])


def test_bad_settings_are_one_line_cli_errors(capsys, tmp_path):
    for key, value in (("data.dimension", "0"), ("data.alpha", "-1")):
        code = cli_main(["run", str(ROOT / "experiments" / "smoke.yaml"), "data.name=synthetic", f"{key}={value}",
                         f"log.dir={tmp_path / 'never'}"])
        err = capsys.readouterr().err.strip()
        assert code == 2 and err.startswith(f"raysim: error: config key '{key}'") and "\n" not in err, err
    assert not (tmp_path / "never").exists()
