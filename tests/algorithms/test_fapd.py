"""FAPD: config and teacher-file errors, the driver-side hooks, the client loss worked by hand, and a tiny run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from conftest import crash_after, read_rows, refused_config, strip_timing, tiny_overrides
from raysim.algorithms.fapd import CALIBRATION_KEY, CLASSES_KEY, TEACHER_KEY, carve_calibration
from raysim.config import ConfigError, load_config
from raysim.curriculum.consensus import ConsensusController
from raysim.curriculum.pca import fit_pca, fit_rotation
from raysim.data import build_federated_data
from raysim.errors import UserError
from raysim.registry import get_algorithm

N_DIGITS = 1797  # scikit-learn's digits


def _cfg(tmp_path: Path, *overrides: str):
    base = ["algorithm.name=fapd", "data.name=sklearn_digits", "clients.num=4", "model.feature_dim=16",
            f"algorithm.teacher.cache_dir={tmp_path / 'cache'}", "algorithm.teacher.epochs=3"]
    return load_config(None, base + list(overrides))


def _prepare(cfg):
    algo = get_algorithm("fapd")(cfg)
    return algo, algo.prepare_data(build_federated_data(cfg))


def _npy(tmp_path: Path, name: str, arr: np.ndarray) -> str:
    path = tmp_path / name
    np.save(path, arr)
    return str(path)


@pytest.mark.parametrize("override, key", [
    ("algorithm.curriculum=cosine", "algorithm.curriculum"),
    ("algorithm.teacher.calibration_fraction=0", "algorithm.teacher.calibration_fraction"),
    ("algorithm.teacher.calibration_fraction=1.0", "algorithm.teacher.calibration_fraction"),
    ("algorithm.tau=0", "algorithm.tau"),
    ("algorithm.window=0", "algorithm.window"),
    ("algorithm.teacher.bogus=1", "algorithm.teacher.bogus"),
])
def test_config_errors_name_the_key(tmp_path, override, key):
    with pytest.raises(ConfigError, match=f"'{key}'"):
        _cfg(tmp_path, override)


def test_teacher_file_errors_are_one_line_user_errors(tmp_path):
    good = np.random.default_rng(0).normal(size=(N_DIGITS, 16)).astype(np.float32)
    npz = tmp_path / "f.npz"
    np.savez(npz, good)
    cases = [
        ([f"algorithm.teacher.features={tmp_path / 'missing.npy'}"], "algorithm.teacher.features", "not found"),
        ([f"algorithm.teacher.features={_npy(tmp_path, 'short.npy', good[:100])}"], "algorithm.teacher.features",
         "shape"),
        ([f"algorithm.teacher.features={_npy(tmp_path, 'flat.npy', good[:, 0])}"], "algorithm.teacher.features",
         "shape"),
        ([f"algorithm.teacher.features={npz}"], "algorithm.teacher.features", "shape"),
        ([f"algorithm.teacher.features={_npy(tmp_path, 'nan.npy', good * np.nan)}"], "algorithm.teacher.features",
         "NaN"),
        ([f"algorithm.teacher.features={_npy(tmp_path, 'good.npy', good)}",
          f"algorithm.teacher.class_embeddings={_npy(tmp_path, 'cls.npy', good[:10, :8])}"],
         "algorithm.teacher.class_embeddings", "shape"),
        ([f"algorithm.teacher.features={_npy(tmp_path, 'good.npy', good)}", "model.feature_dim=32"],
         "model.feature_dim", "D=16"),
        ([f"algorithm.teacher.features={_npy(tmp_path, 'good.npy', good)}", "algorithm.k0=17"], "algorithm.k0",
         "D=16"),
    ]
    for overrides, key, words in cases:
        with pytest.raises(UserError) as info:
            _prepare(_cfg(tmp_path, *overrides))
        message = str(info.value)
        assert f"'{key}'" in message and words in message and "\n" not in message, message


def test_calibration_split_is_server_held_and_deterministic(tmp_path):
    cfg = _cfg(tmp_path, "data.partition=dirichlet", "data.alpha=0.3")
    full = build_federated_data(cfg)
    before = [s.train.copy() for s in full.clients]
    calibration = carve_calibration(full, 0.2, seed=0)
    after = [s.train for s in full.clients]
    assert not np.intersect1d(calibration, np.concatenate(after)).size  # no client holds it
    assert np.array_equal(np.sort(np.concatenate(after + [calibration])), np.sort(np.concatenate(before)))
    assert all(abs(len(b) - len(a) - round(0.2 * len(b))) <= 1 and len(a) >= 1 for a, b in zip(after, before))
    again = build_federated_data(cfg)
    assert np.array_equal(carve_calibration(again, 0.2, seed=0), calibration)


def test_driver_hooks_with_a_teacher_file(tmp_path):
    """PCA on the calibration rows, the payload's projection, and k over rounds for each curriculum."""
    feats = (np.random.default_rng(1).normal(size=(N_DIGITS, 16)) * np.linspace(3, 0.1, 16)).astype(np.float32)
    path = _npy(tmp_path, "teacher.npy", feats)
    common = [f"algorithm.teacher.features={path}", "algorithm.k0=3", "algorithm.delta_k=4", "algorithm.window=2",
              "algorithm.epsilon=0.01"]
    algo, data = _prepare(_cfg(tmp_path, *common))
    calibration = data.meta[CALIBRATION_KEY]
    assert np.array_equal(data.meta[TEACHER_KEY], feats) and len(calibration) > 16
    labels = data.domains[0].y[calibration]
    np.testing.assert_allclose(data.meta[CLASSES_KEY][4], feats[calibration][labels == 4].mean(0), rtol=1e-5)
    state = algo.init_server_state({"w": torch.zeros(3)})
    assert torch.allclose(state["rotation"], fit_rotation(feats[calibration]))
    payload = algo.server_payload(state, 1)
    assert payload["projection"].shape == (3, 16)
    assert payload["projection"].untyped_storage().nbytes() == 3 * 16 * 4  # not a view of the whole rotation
    torch.save(state, tmp_path / "s.pt")
    assert torch.load(tmp_path / "s.pt", weights_only=True)["curriculum"]["k"] == 3  # checkpointable

    accs = [0.2, 0.5, 0.505, 0.51, None, 0.512, 0.7]
    expected = {"consensus": [3, 3, 3, 7, 11, 11, 15], "fixed": [16] * 7, "linear": [3, 7, 11, 15, 16, 16, 16]}
    for curriculum, ks in expected.items():
        algo, _ = _prepare(_cfg(tmp_path, *common, f"algorithm.curriculum={curriculum}"))
        state = algo.init_server_state({"w": torch.zeros(3)})
        got = []
        for rnd, acc in enumerate(accs, start=1):
            assert algo.server_payload(state, rnd)["projection"].shape[0] == state["curriculum"]["k"]
            out = algo.on_round_end(rnd, {"acc_global": acc}, state)
            got.append(out["k"])
            assert ("curriculum/stable" in out) == (acc is not None)
        assert got == ks, curriculum
    assert out["curriculum/explained_variance"] == pytest.approx(1.0)


class _Identity(nn.Module):
    """features(x) = x, head = the identity: logits are the features (the hand-worked cases below)."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(2, 2)
        with torch.no_grad():
            self.head.weight.copy_(torch.eye(2))
            self.head.bias.zero_()

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return x


# Worked by hand: D = 2, k = 2 (P = I), tau = 0.5, kd_tau = 1, class embeddings e_0 = (1, 0), e_1 = (0, 1).
# Sample a: x = (1, 0), y = 0, index 3, teacher row 3 = (0, 1). Sample b: x = (0, 1), y = 1, index 0, row 0 = (1, 0).
#   CE: logits = x: log(1 + e^-1) = 0.3132616875 for each sample.
#   KD: z_S = x, z_T its teacher row: KL(softmax(z_T) || softmax(z_S)) = (s(1) - s(-1)) * log(s(1) / s(-1))
#       = tanh(1/2) * 1 = 0.4621171573 for each (s the logistic function; s(1)/s(-1) = e).
#       Had a sample been given the other one's row, z_T = z_S and KD = 0.
#   CL: cos(z_S, e_c) / tau = (2, 0) for a, (0, 2) for b: log(1 + e^-2) = 0.1269280110 for each.
CE, KD, CL = 0.3132616875, 0.4621171573, 0.1269280110


@pytest.mark.parametrize("lambda_kd, lambda_cl", [(0.5, 0.5), (2.0, 0.25), (0.0, 0.5), (0.5, 0.0)])
def test_client_loss_by_hand(lambda_kd, lambda_cl):
    from helpers import context

    cfg = load_config(None, ["algorithm.name=fapd", "algorithm.tau=0.5", f"algorithm.lambda_kd={lambda_kd}",
                             f"algorithm.lambda_cl={lambda_cl}", "model.feature_dim=2"])
    algo = get_algorithm("fapd")(cfg)
    teacher = np.array([[1, 0], [1, 0], [1, 0], [0, 1]], dtype=np.float32)  # rows 0..3 of the domain
    ctx = context(payload={"projection": torch.eye(2)}, sample_idx=torch.tensor([3, 0]),
                  meta={TEACHER_KEY: teacher, CLASSES_KEY: np.eye(2, dtype=np.float32)})
    x, y = torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 1])
    loss, parts = algo.client_loss(_Identity(), x, y, ctx)
    assert parts["ce"].item() == pytest.approx(CE, abs=1e-6)
    assert ("kd" in parts) == (lambda_kd > 0) and ("cl" in parts) == (lambda_cl > 0)  # a zero weight: no term
    if lambda_kd > 0:
        assert parts["kd"].item() == pytest.approx(KD, abs=1e-6)
    if lambda_cl > 0:
        assert parts["cl"].item() == pytest.approx(CL, abs=1e-6)
    assert loss.item() == pytest.approx(CE + lambda_kd * KD + lambda_cl * CL, abs=1e-6)
    loss.backward()  # gradients reach the student


def test_fapd_and_fedpcl_refuse_data_made_on_demand(tmp_path):
    """data.name=synthetic makes each client's samples on demand: no shared sample index to distil or carve."""
    for algorithm in ("fapd", "fedpcl"):
        line = refused_config("data.name", *tiny_overrides(tmp_path, algorithm__name=algorithm,
                                                            data__name="synthetic"))
        assert algorithm in line and "synthetic" in line, line
        assert not (tmp_path / "run").exists()


def test_fapd_run_follows_the_consensus_rule_and_resumes(tmp_path):
    """epsilon = 1 (accuracies always agree within 1): the network is stable from the round its window of N = 2
    accuracies is full, so k is k0 = 2 for rounds 1 and 2, then grows by delta_k = 3 every round."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from raysim.engine.runner import run_experiment

    k0, delta_k, window, dim = 2, 3, 2, 16
    extra = dict(rounds=5, algorithm__name="fapd", algorithm__k0=k0, algorithm__delta_k=delta_k,
                 algorithm__epsilon=1.0, algorithm__window=window, algorithm__teacher__epochs=5,
                 algorithm__teacher__cache_dir=str(tmp_path / "cache"))
    cfg = load_config(None, tiny_overrides(tmp_path, **extra))
    run_dir, rows, _ = run_experiment(cfg)
    logged = read_rows(run_dir)
    accs = [r["acc_global"] for r in logged]
    ks = [r["k"] for r in logged]
    assert ks == [2, 2, 5, 8, 11]
    assert [r["curriculum/stable"] for r in logged] == [0, 1, 1, 1, 1]
    assert [r["curriculum/k_next"] for r in logged] == [2, 5, 8, 11, 14]
    # P_t travels with the model: 4 clients x k x D float32s more down than up
    assert [r["bytes_down"] - r["bytes_up"] for r in logged] == [4 * k * dim * 4 for k in (2, 2, 5, 8, 11)]
    for r in logged:
        assert r["loss_kd"] > 0 and r["loss_cl"] > 0 and 0 < r["curriculum/explained_variance"] <= 1
    assert logged[-1]["loss"] < logged[0]["loss"] and accs[-1] > accs[0]  # it learns

    events = EventAccumulator(str(run_dir))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"Curriculum/k", "curriculum/stable", "curriculum/explained_variance", "acc/global",
            "loss/kd", "loss/cl"} <= tags  # k is the curriculum's own chart, first in TensorBoard (runlog.TB_TAGS)
    assert [e.value for e in events.Scalars("Curriculum/k")] == ks

    # the checkpoint holds the controller where the run left it: a resumed run continues the curriculum
    saved = torch.load(run_dir / "checkpoint" / "server.pt", weights_only=True)["server_state"]
    ctrl = ConsensusController(k0, delta_k, 1.0, window, dim)
    ctrl.load_state_dict(saved["curriculum"])
    assert ctrl.k == logged[-1]["curriculum/k_next"] and ctrl.history == accs[-window:]
    teacher = torch.load(next((tmp_path / "cache").glob("*.pt")), weights_only=True)["features"].numpy()
    calibration = carve_calibration(build_federated_data(cfg), cfg.algorithm.teacher.calibration_fraction, cfg.seed)
    assert torch.allclose(saved["rotation"], fit_pca(teacher[calibration])[0])

    # interrupted after round 3 and resumed: the same k staircase and the same metrics as the whole run
    part = load_config(None, tiny_overrides(tmp_path, log__dir=str(tmp_path / "part"), **extra))
    crash_after(part, 3)
    run_experiment(part, resume=True)
    assert strip_timing(read_rows(tmp_path / "part")) == strip_timing(logged)


@pytest.mark.parametrize("setting", ["digits", "cifar10", "cifar100"])
def test_experiment_configs_compare_like_with_like(setting):
    """Every method of a setting runs the same experiment (only ``name`` and ``algorithm.*`` differ from FAPD's
    file), and each ablation differs from FAPD in exactly the switch it names."""
    from raysim.config import to_flat_dict

    root = Path(__file__).resolve().parents[2] / "experiments" / "fapd"
    fapd = to_flat_dict(load_config(root / f"{setting}-fapd.yaml"))
    paths = sorted(root.glob(f"{setting}-*.yaml"))
    assert len(paths) >= 5
    for path in paths:
        flat = to_flat_dict(load_config(path))
        differ = {k for k in fapd.keys() | flat.keys() if fapd.get(k) != flat.get(k)} - {"name"}
        assert all(k.startswith("algorithm.") for k in differ), (path.name, differ)
        if path.stem == f"{setting}-fapd-nadpt":  # no adaptive curriculum: a fixed k
            assert differ == {"algorithm.curriculum"} and flat["algorithm.curriculum"] == "fixed"
        if path.stem == f"{setting}-fapd-ncont":  # no contrastive term
            assert differ == {"algorithm.lambda_cl"} and flat["algorithm.lambda_cl"] == 0
        if path.stem == f"{setting}-fapd-ce-cl":  # Table I row 2: CE + CL, no HKD, no curriculum (k = D)
            assert differ == {"algorithm.curriculum", "algorithm.lambda_kd"} and flat["algorithm.lambda_kd"] == 0
            assert flat["algorithm.curriculum"] == "fixed" and flat["algorithm.k_fixed"] is None
        if path.stem == f"{setting}-fapd-hkd-kd":  # Table I row 3: HKD + KD without curriculum, no CL
            assert differ == {"algorithm.curriculum", "algorithm.lambda_cl"} and flat["algorithm.lambda_cl"] == 0
            assert flat["algorithm.curriculum"] == "fixed" and flat["algorithm.k_fixed"] is None


def test_contrastive_term_at_k_equal_d_is_the_unprojected_one():
    """Ablation row 2 (CE + CL without HKD) runs as curriculum=fixed, k = D: the projection is then the whole
    orthogonal rotation R, which leaves the cosines, and so the contrastive loss, as they are without any projection."""
    from raysim.curriculum.pkd import semantic_contrastive_loss

    gen = torch.Generator().manual_seed(0)
    rotation, _ = torch.linalg.qr(torch.randn(6, 6, generator=gen, dtype=torch.float64))
    feats, classes = torch.randn(5, 6, generator=gen, dtype=torch.float64), torch.randn(3, 6, generator=gen,
                                                                                        dtype=torch.float64)
    labels = torch.tensor([0, 1, 2, 1, 0])
    full = semantic_contrastive_loss(feats, classes, labels, rotation, 0.04)
    plain = semantic_contrastive_loss(feats, classes, labels, torch.eye(6, dtype=torch.float64), 0.04)
    assert full.item() == pytest.approx(plain.item(), rel=1e-9)
    # a proper subspace (HKD's first k directions) does change it
    assert semantic_contrastive_loss(feats, classes, labels, rotation[:2], 0.04).item() != pytest.approx(plain.item())
