"""The seeds' data protocol (issue 14): official CIFAR test split, augmentation, one input shape, the shared tabular
column space, the server's holdout for every method, and the warnings for settings that mean less than they seem."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import torch

from conftest import ROOT, read_rows, strip_timing, tiny_overrides
from raysim.checks import config_warnings
from raysim.config import load_config
from raysim.data import build_federated_data
from raysim.data.augment import BatchAugment
from raysim.engine.runner import run_experiment
from raysim.errors import UserError
from raysim.models import build_model
from raysim.registry import get_algorithm
from raysim.tune import candidate_overrides


def _tiny_cifar10(root: Path) -> np.ndarray:
    """CIFAR-10's python batches with 8 images per training batch and 13 in test_batch; returns test labels."""
    rng = np.random.default_rng(3)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for name, n in [(f"data_batch_{i}", 8) for i in range(1, 6)] + [("test_batch", 13)]:
        labels = rng.integers(0, 10, n)
        with open(folder / name, "wb") as f:
            pickle.dump({"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                         "labels": [int(v) for v in labels]}, f)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": [f"c{i}" for i in range(10)]}, f)
    return labels


def test_cifar_official_test_split_and_augmentation_deterministic_for_any_worker_count(ray_cluster, tmp_path):
    """Clients train on the training batches, acc_global is the global model's accuracy on test_batch, and with
    data.augment on the metrics are the same in this process and on two Ray workers."""
    _tiny_cifar10(tmp_path / "data")
    # eval.chunk=4: on two workers the 13 test rows are predicted as two calls of whole 4-row blocks
    extra = dict(data__name="cifar10", data__root=str(tmp_path / "data"), data__augment="true", rounds=2,
                 data__cache_dir=str(tmp_path / "cache"), model__hidden="[8]", model__feature_dim=8, eval__chunk=4)
    runs = {}
    for name, over in (("w1", {}), ("w2", {"engine__backend": "ray", "engine__num_workers": 2})):
        cfg = load_config(None, tiny_overrides(tmp_path, log__dir=str(tmp_path / name), **{**extra, **over}))
        runs[name] = run_experiment(cfg)[0]
    one, two = strip_timing(read_rows(runs["w1"])), strip_timing(read_rows(runs["w2"]))
    assert one == two

    cfg = load_config(runs["w1"] / "config.yaml")
    data = build_federated_data(cfg)
    x, y, _ = data.tensors(data.server_client_id, "test")
    assert len(y) == 13  # test_batch, no client's
    model = build_model(cfg, cfg.model.name, data.input_shape(0), data.num_classes, 0, get_algorithm("fedavg")(cfg))
    server = torch.load(runs["w1"] / "checkpoint" / "server.pt", weights_only=True)["server_state"]
    model.load_state_dict(server["model"])
    model.eval()
    with torch.no_grad():
        correct = int((model(x).argmax(1) == y).sum())
    assert one[-1]["acc_global"] == pytest.approx(correct / 13)


def test_worker_augments_training_batches_reproducibly(tmp_path):
    """A real client job in this process: data.augment changes what the client trains on, and the same job gives the
    same upload twice (its draws come from (seed, client, round), not from the worker)."""
    from raysim.engine.core import ClientJobs
    from raysim.engine.jobs import TrainJob

    _tiny_cifar10(tmp_path / "data")
    cfg = load_config(None, tiny_overrides(tmp_path, data__name="cifar10", data__root=str(tmp_path / "data"),
                                           model__hidden="[8]", model__feature_dim=8,
                                           data__cache_dir=str(tmp_path / "cache")))
    data = build_federated_data(cfg)
    algo = get_algorithm("fedavg")(cfg)
    initial = build_model(cfg, "mlp", data.input_shape(0), 10, algorithm=algo).state_dict()
    payload = algo.server_payload(algo.init_server_state(initial), 1)
    uploads = {}
    jobs = ClientJobs(cfg, data)  # the client-job core, in this process
    for augment in (False, True, True):
        jobs.cfg.data.augment = augment
        result, _ = jobs.train(TrainJob(client_id=1, round=1, payload_ref=None), payload, None, None)
        uploads.setdefault(augment, []).append(result.upload["head.weight"])
    assert torch.equal(uploads[True][0], uploads[True][1])
    assert not torch.equal(uploads[True][0], uploads[False][0])


def test_batch_augment_crops_and_flips_per_sample():
    aug = BatchAugment([0.5, 0.5, 0.5], [0.25, 0.25, 0.25], padding=1)
    x = torch.arange(64 * 3 * 5 * 5, dtype=torch.float32).reshape(64, 3, 5, 5)
    out = aug(x, torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(0)
    dy, dx = torch.randint(0, 3, (64,), generator=gen), torch.randint(0, 3, (64,), generator=gen)
    flip = torch.rand(64, generator=gen) < 0.5
    padded = torch.nn.functional.pad(x, (1, 1, 1, 1), value=-2.0)  # raw black (0) normalised: (0 - 0.5) / 0.25
    for i in range(64):
        ref = padded[i, :, dy[i]:dy[i] + 5, dx[i]:dx[i] + 5]
        assert torch.equal(out[i], ref.flip(-1) if flip[i] else ref)
    assert 0 < int(flip.sum()) < 64 and len({(int(a), int(b)) for a, b in zip(dy, dx)}) > 1


def test_image_size_and_channels_give_every_digits_domain_one_shape(tmp_path):
    cfg = load_config(ROOT / "experiments/unideal/digits-niid1-cpu/fedavg.yaml",
                      ["data.samples_per_domain=20", f"data.cache_dir={tmp_path}"])
    data = build_federated_data(cfg)
    assert [d.name for d in data.domains] == ["mnist", "mnistm", "synth"] and cfg.clients.num == 3
    assert {data.input_shape(c) for c in range(3)} == {(3, 32, 32)}
    get_algorithm("fedavg")(cfg).check(cfg, data)  # averaging accepts it
    mnist = data.domains[0]
    assert np.array_equal(mnist.x[:, 0], mnist.x[:, 2]) and mnist.mean.shape == (3,)
    with pytest.raises(UserError, match="data.image_size"):
        build_federated_data(load_config(None, ["data.name=wine", "data.image_size=8", "clients.num=2"]))


def test_shared_feature_layout_places_columns_at_their_global_index():
    over = ["data.name=wine", "clients.num=3", "data.partition=niid1", "data.clients_per_domain=3"]
    sliced = build_federated_data(load_config(None, over))
    shared = build_federated_data(load_config(None, over + ["data.feature_layout=shared"]))
    for c in range(3):
        cols = shared.clients[c].features
        assert shared.input_shape(c) == (13,) and sliced.input_shape(c) == (len(cols),)
        wide, narrow = shared.tensors(c)[0], sliced.tensors(c)[0]
        assert torch.equal(wide[:, torch.from_numpy(cols)], narrow)
        absent = np.setdiff1d(np.arange(13), cols)
        assert len(absent) and not wide[:, torch.from_numpy(absent)].any()


def test_fapd_and_fedavg_configs_train_clients_on_the_same_data(tmp_path):
    """The shipped pair holds the same server split out of the clients for both methods."""
    from raysim.algorithms.fapd import CALIBRATION_KEY

    sizes = {}
    for method in ("fedavg", "fapd"):
        over = ["algorithm.teacher.epochs=1", f"algorithm.teacher.cache_dir={tmp_path}"] if method == "fapd" else []
        cfg = load_config(ROOT / f"experiments/fapd/digits-{method}.yaml", over)
        data = get_algorithm(method)(cfg).prepare_data(build_federated_data(cfg))  # FAPD carves nothing more
        sizes[method] = [len(s.train) for s in data.clients]
        if method == "fapd":
            assert np.array_equal(data.meta[CALIBRATION_KEY], data.holdout)
    assert sizes["fedavg"] == sizes["fapd"] and sum(sizes["fapd"]) < 1797 * 0.8 * 0.85
    held_twice = load_config(ROOT / "experiments/fapd/digits-fapd.yaml", ["algorithm.teacher.calibration_fraction=0.1"])
    with pytest.raises(UserError, match="calibration_fraction"):
        get_algorithm("fapd")(held_twice).prepare_data(build_federated_data(held_twice))


def test_warnings_for_settings_that_mean_less_than_they_seem(capsys):
    cfg = load_config(None, ["data.partition=niid2", "clients.num=1", "data.name=sklearn_digits"])
    assert "exactly niid1" in capsys.readouterr().err
    assert len(config_warnings(cfg)) == 1
    load_config(None, ["algorithm.name=unideal", "train.local_epochs=1"])
    assert "raysim: warning: unideal's p-schedule" in capsys.readouterr().err
    load_config(None, ["algorithm.name=unideal", "train.local_epochs=2"])
    load_config(None, ["algorithm.name=unideal", "train.local_epochs=1", "algorithm.schedule.over=rounds"])
    assert capsys.readouterr().err == ""
    load_config(None, ["algorithm.name=unideal", "train.local_epochs=1"], warn=False)  # checked, not run
    assert capsys.readouterr().err == ""


def test_sweep_validation_does_not_warn_about_candidates(capsys):
    """A sweep's validation loads combinations of its searched values, not trials: a combination that would
    warn (local_epochs=1 with the schedule over local epochs) says nothing until a trial draws it."""
    from raysim.tune import load_sweep, validate_sweep

    spec = load_sweep(ROOT / "experiments/sweeps/study-unideal-niid1.yaml")
    assert any("train.local_epochs=1" in c for trial in candidate_overrides(spec) for c in trial)
    validate_sweep(spec)
    assert capsys.readouterr().err == ""


def test_shipped_unideal_configs_follow_the_seed_and_warn_about_nothing(capsys):
    """NIID-2 in the UNIDEAL seed is NIID-1 (three clients, one per domain) with labels redistributed; every
    shipped Digits file has three clients on three domains."""
    for path in sorted((ROOT / "experiments/unideal").glob("digits-niid*/*.yaml")):
        if path.stem in ("base", "fedavg", "fedrep", "unideal"):
            cfg = load_config(path)
            assert cfg.clients.num == 3 and not cfg.data.domains, path
    assert capsys.readouterr().err == ""


def test_niid2_subsample_gives_each_single_client_a_dirichlet_class_mix():
    from raysim.data import federate
    from raysim.data.base import Domain

    rng = np.random.default_rng(0)
    domains = [Domain(f"d{i}", rng.random((600, 2)).astype(np.float32), np.arange(600) % 10) for i in range(3)]
    over = ["data.partition=niid2", "clients.num=3", "data.alpha=0.5", "data.label_skew=subsample"]
    data = federate(domains, load_config(None, over), num_classes=10)
    again = federate(domains, load_config(None, over), num_classes=10)
    for c, split in enumerate(data.clients):
        held = np.concatenate([split.train, split.test])
        counts = np.bincount(domains[c].y[held], minlength=10)
        assert split.domain == c and 10 <= len(held) < 600 and counts.max() > 2 * max(counts.min(), 1)
        assert counts.max() == 60
        assert np.array_equal(held, np.concatenate([again.clients[c].train, again.clients[c].test]))


def test_synthdigits_from_either_published_mat_release(tmp_path):
    from raysim.data.digits import load_domain

    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (32, 32, 3, 12), dtype=np.uint8)  # Ganin & Lempitsky's release: [H, W, C, N]
    y = np.array([[10], [1], [2], [3], [4], [5], [6], [7], [8], [9], [10], [1]], dtype=np.uint8)  # 10 is digit 0
    (tmp_path / "SynthDigits").mkdir()
    scipy.io.savemat(tmp_path / "SynthDigits" / "synth_train_32x32.mat", {"X": x, "y": y})
    cfg = load_config(None, ["data.name=synthdigits", f"data.root={tmp_path}", f"data.cache_dir={tmp_path / 'c'}"])
    domain = load_domain("synth", cfg)
    assert np.array_equal(domain.x, x.transpose(3, 2, 0, 1)) and list(domain.y[:3]) == [0, 1, 2]
    digit_five = tmp_path / "d5"
    digit_five.mkdir()
    scipy.io.savemat(digit_five / "syn_number.mat", {"train_data": x.transpose(3, 0, 1, 2)[:8],
                                                     "train_label": y[:8], "test_data": x.transpose(3, 0, 1, 2)[8:],
                                                     "test_label": y[8:]})
    cfg = load_config(None, ["data.name=synthdigits", f"data.root={digit_five}", f"data.cache_dir={tmp_path / 'c'}"])
    assert np.array_equal(load_domain("synth", cfg).x, domain.x)
    (digit_five / "syn_number.mat").write_bytes(b"no mat file")
    with pytest.raises(UserError, match="syn_number.mat"):
        load_domain("synth", cfg)


def test_a_run_made_before_test_split_existed_resumes_pooled(tmp_path):
    """``data.test_split`` defaults to official; a run directory written before the key existed pooled train and
    test, and its resumption must keep doing so rather than silently switch splits."""
    import yaml

    from raysim.config import load_config, to_yaml
    from raysim.engine.runner import load_resume_config

    saved = yaml.safe_load(to_yaml(load_config(None, ["data.name=cifar10", "data.root=/nowhere"])))
    del saved["data"]["test_split"]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(saved))
    assert load_resume_config(tmp_path, []).data.test_split == "pooled"
    saved["data"]["test_split"] = "official"
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(saved))
    assert load_resume_config(tmp_path, []).data.test_split == "official"
