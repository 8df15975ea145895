"""The one sum (raysim.algorithms.aggregation): sums taken where clients trained give the numbers of sums taken on
the driver, whatever the workers; by-hand arithmetic, samples and uniform weights; an algorithm's own means take
the same arithmetic; the declared aggregation, and a server_aggregate that only observes keeps the sums; every
summed algorithm end to end (inline, numbers) and the worker path on Ray (2 workers against 1 in-process)."""

from __future__ import annotations

import pytest
import torch

from conftest import read_rows, strip_timing, tiny_overrides
from raysim.algorithms.aggregation import (UploadSum, Uploads, fixed_groups, flatten, sum_in_groups,
                                          unflatten, weighted_average)
from raysim.algorithms.base import Algorithm, ClientUpdate, RoundUpdates, SummedUpload
from raysim.config import load_config
from raysim.engine.jobs import TrainResult
from raysim.engine.plan import group_size
from raysim.engine.runner import run_experiment
from raysim.registry import builtin_names, get_algorithm

def merge_all(sums) -> UploadSum:
    """The groups' sums merged in the order given, as the driver folds them (UploadSum.merge)."""
    out = UploadSum()
    for s in sums:
        out.merge(s)
    return out



def _upload(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(3, 4, generator=g), "bn": {"mean": torch.randn(5, generator=g),
                                                         "count": torch.randint(0, 100, (), generator=g)}}


def test_mean_by_hand_with_an_integer_buffer():
    total = UploadSum()
    total.add(3, {"w": torch.tensor([0.0, 2.0]), "n": torch.tensor(1)}, 1)
    total.add(5, {"w": torch.tensor([4.0, 6.0]), "n": torch.tensor(4)}, 3)
    mean = total.mean()
    assert torch.equal(mean["w"], torch.tensor([3.0, 5.0])) and mean["w"].dtype == torch.float32
    assert mean["n"].dtype == torch.int64 and int(mean["n"]) == 3  # (1 + 12) / 4 = 3.25, rounded
    assert total.clients == [3, 5] and total.weight == 4.0


def test_flatten_roundtrips_nested_dicts_and_dtypes():
    up = _upload(0) | {"half": torch.ones(2, dtype=torch.float16)}
    layout, flat = flatten(up)
    assert flat.dtype == torch.float64 and flat.numel() == 12 + 5 + 1 + 2
    back = unflatten(layout, flat)
    assert back.keys() == up.keys() and back["bn"].keys() == up["bn"].keys()
    for a, b in ((back["w"], up["w"]), (back["bn"]["mean"], up["bn"]["mean"]), (back["bn"]["count"], up["bn"]["count"]),
                 (back["half"], up["half"])):
        assert a.dtype == b.dtype and torch.equal(a, b)
    assert unflatten(*flatten({})) == {}


def test_a_client_with_another_layout_or_a_list_is_refused():
    total = UploadSum()
    total.add(0, {"w": torch.zeros(2)}, 1)
    with pytest.raises(ValueError, match="client 1: its upload's keys, shapes or dtypes differ"):
        total.add(1, {"w": torch.zeros(3)}, 1)
    with pytest.raises(TypeError, match="w: an upload that is summed .* nested dict of tensors, found list"):
        UploadSum().add(0, {"w": [torch.zeros(2)]}, 1)


def test_a_group_of_one_travels_at_its_uploads_size_and_sums_like_the_others():
    """A one-client sum keeps the upload in its own dtype (float32 does not double to float64 on the wire), and
    merged or averaged it gives the bits of one that was buffered at once."""
    import pickle

    up = {"w": torch.randn(1000, generator=torch.Generator().manual_seed(0))}
    one = UploadSum()
    one.add(4, up, 7)
    assert one.single is up and one.total is None
    assert len(pickle.dumps(one, protocol=5)) < 1.2 * 4000  # float32 values, not float64
    two = UploadSum()
    two.add(5, {"w": torch.ones(1000)}, 3)
    merged = merge_all([one, two])
    by_hand = (up["w"].double() * 7 + torch.ones(1000, dtype=torch.float64) * 3) / 10
    assert torch.equal(merged.mean()["w"], by_hand.float()) and merged.clients == [4, 5]
    alone = UploadSum()
    alone.add(4, up, 7)
    assert torch.equal(alone.mean()["w"], up["w"])  # (u·7)/7 in float64, exact


def test_groups_depend_on_the_client_list_alone():
    assert fixed_groups([9, 2, 5, 7, 1], 2) == [[1, 2], [5, 7], [9]]
    # auto: ceil(√(2n)) groups (4 for 7 clients: groups of 2; 10 for 50: groups of 5; 45 for 1,000: of 23)
    assert group_size("auto", 7) == 2 and group_size("auto", 50) == 5 and group_size("auto", 1000) == 23
    assert group_size("auto", 1) == 1 and group_size("auto", 2) == 1 and group_size("3", 50) == 3


def test_sums_taken_in_groups_equal_the_drivers_bit_for_bit():
    """The workers' path (add_results per group, merged in group order) and the driver's (sum_in_groups from
    per-client updates) give identical bits, a non-finite client left out of both; the mean agrees with the
    per-client formula Σ u·(n/Σn) to float64 round-off."""
    clients = [11, 2, 7, 4, 9, 30, 5]
    n = {c: 10 + 7 * c for c in clients}
    uploads = {c: _upload(c) for c in clients}
    bad = 9
    results = {c: TrainResult(client_id=c, round=1, upload=uploads[c], num_samples=n[c], finite=c != bad, loss=0.0)
               for c in clients}
    groups = fixed_groups(clients, 3)
    on_workers = merge_all(UploadSum().add_results([results[c] for c in g]) for g in groups)
    assert all(r.upload == {} for r in results.values())  # only the sums travel on
    updates = [ClientUpdate(c, uploads[c], n[c]) for c in sorted(clients) if c != bad]
    on_driver = sum_in_groups(updates, clients, 3)
    assert on_workers.clients == on_driver.clients == sorted(c for c in clients if c != bad)
    assert torch.equal(on_workers.total, on_driver.total) and on_workers.weight == on_driver.weight
    mean = on_workers.mean()
    weight = sum(n[c] for c in clients if c != bad)
    expect = sum(uploads[c]["w"].double() * (n[c] / weight) for c in clients if c != bad)
    assert torch.allclose(mean["w"].double(), expect, rtol=0, atol=1e-6)


WEIGHTED_SUM = [name for name in builtin_names("algorithm")  # built-ins only: other modules register test plugins
                if get_algorithm(name)(load_config(None, [f"algorithm.name={name}"])).sums_uploads]


def test_the_summed_algorithms_are_those_that_declare_it():
    assert {"fedavg", "fedprox", "local", "partialavg", "unideal", "fapd", "moon", "fedrod", "fedavgm", "fedadam",
            "fedbn", "ditto", "scaffold"} <= set(WEIGHTED_SUM)
    assert not {"fedcda", "fedpac", "fedgen", "fedpcl", "fednh", "fedproto", "fedkd", "feddyn"} & set(WEIGHTED_SUM)
    for name in builtin_names("algorithm"):  # declared, never inferred from which hooks a class overrides
        cls = get_algorithm(name)
        # a class with a server_aggregate of its own declares its uploads apart, or the statistics it reads
        if cls.server_aggregate is not Algorithm.server_aggregate:
            assert cls.declared_uploads().kind in ("apart", "stats"), name


def test_capabilities_follow_from_the_declaration():
    """A model upload serves DP-FedAvg, FedAsync/FedBuff and robust rules; a class that overrides a hook of the
    server step without declaring its uploads again is a weighted mean, still summed, and says what to declare."""
    from raysim.algorithms.fedavg import FedAvg

    fedavg = get_algorithm("fedavg")
    assert fedavg.declared_uploads() == Uploads.model() and fedavg.refusal("privacy") is None
    assert "needs every upload" in get_algorithm("fedcda").refusal("async")
    assert "named statistics" in get_algorithm("scaffold").refusal("privacy")
    assert get_algorithm("unideal").refusal("async") is None and "part of the model" in \
        get_algorithm("unideal").refusal("robust")

    class OwnStep(FedAvg):
        def server_aggregate_mean(self, mean, server_state, round):
            return server_state

    class Redeclared(OwnStep):
        uploads = Uploads.model()

    assert OwnStep.declared_uploads() == Uploads.mean() and "OwnStep overrides server_aggregate_mean" in \
        OwnStep.refusal("async")
    assert Redeclared.declared_uploads() == Uploads.model() and Redeclared.refusal("async") is None


def test_named_statistics_each_with_their_own_weights_by_hand():
    """Uploads.stats: clients of 1 and 3 samples upload m = 0 and 4, d = 2 and 6: m by samples (1·0 + 3·4)/4 = 3,
    d uniformly (2 + 6)/2 = 4; summed in two groups and merged, or at once, the same."""
    rows = [(0.0, 2.0, 1), (4.0, 6.0, 3)]
    results = [TrainResult(client_id=c, round=1, upload={"m": torch.tensor([m]), "d": torch.tensor([d])},
                           num_samples=n, finite=True, loss=0.0) for c, (m, d, n) in enumerate(rows)]
    weighting = Uploads.stats(m="algorithm", d="uniform").weights(None)
    assert weighting == {"m": "samples", "d": "uniform"}
    at_once = UploadSum().add_results([TrainResult(**{**vars(r), "upload": dict(r.upload)}) for r in results],
                                      weighting).mean()
    groups = merge_all([UploadSum().add_results(results[:1], weighting), UploadSum().add_results(results[1:],
                                                                                                  weighting)]).mean()
    for mean in (at_once, groups):
        assert mean["m"].tolist() == [3.0] and mean["d"].tolist() == [4.0]


def test_uniform_weights_by_hand_three_clients_of_unequal_size():
    """Clients of 1, 2 and 7 samples: by samples the mean is (1·0 + 2·3 + 7·6) / 10 = 4.8; uniformly (0 + 3 + 6) / 3
    = 3, on the workers' path and on the driver's alike."""
    uploads = {c: {"w": torch.tensor([float(v)])} for c, v in ((1, 0), (2, 3), (3, 6))}
    sizes = {1: 1, 2: 2, 3: 7}
    for weighting, expect in (("samples", 4.8), ("uniform", 3.0)):
        results = [TrainResult(client_id=c, round=1, upload=dict(uploads[c]), num_samples=sizes[c], finite=True,
                               loss=0.0) for c in (1, 2, 3)]
        on_workers = merge_all([UploadSum().add_results(results[:2], weighting),
                                UploadSum().add_results(results[2:], weighting)]).mean()
        on_driver = sum_in_groups([ClientUpdate(c, uploads[c], sizes[c]) for c in (1, 2, 3)], [1, 2, 3], 2,
                                  weighting).mean()
        assert float(on_workers["w"]) == float(on_driver["w"]) == pytest.approx(expect, abs=1e-6)


def test_an_algorithms_own_average_is_the_one_sum():
    """weighted_average (SCAFFOLD's, FedDyn's, FedNH's means) is an UploadSum in the order given: the same bits."""
    ups = [_upload(s) for s in range(5)]
    weights = [3.0, 1.0, 4.0, 1.0, 5.0]
    total = UploadSum()
    for i, (u, w) in enumerate(zip(ups, weights)):
        total.add(i, u, w)
    mean, expect = weighted_average(ups, weights), total.mean()
    assert torch.equal(mean["w"], expect["w"]) and torch.equal(mean["bn"]["mean"], expect["bn"]["mean"])
    assert torch.equal(mean["bn"]["count"], expect["bn"]["count"])


def test_a_summed_upload_cannot_be_read_and_an_observer_keeps_the_sums(tmp_path):
    with pytest.raises(RuntimeError, match=r"summed where the clients trained.*Uploads.apart\(\)"):
        SummedUpload()["model"]
    mean = {"w": torch.ones(2)}
    updates = RoundUpdates([ClientUpdate(0, SummedUpload(), 5)], lambda: mean)
    cfg = load_config(None, [])
    assert Algorithm(cfg).server_aggregate(updates, {"model": {}}, 1)["model"] is mean

    class Observer(get_algorithm("fedavg")):  # logs the round's clients, then FedAvg's aggregation
        def server_aggregate(self, updates, server_state, round):
            print("clients", [u.client_id for u in updates])
            return super().server_aggregate(updates, server_state, round)

    assert Observer(cfg).sums_uploads  # overriding to observe turns nothing off


def _algorithm_extra(name: str, tmp_path) -> dict:
    if name == "fapd":  # a quick teacher, cached in the test's directory
        return {"algorithm__teacher__epochs": 1, "algorithm__teacher__cache_dir": str(tmp_path / "cache")}
    if name == "fedbn":  # batch norm to keep local
        return {"model__name": "cnn_bn", "model__width": 4}
    return {}


@pytest.mark.parametrize("name", WEIGHTED_SUM)
def test_partial_sums_change_no_metric(name, tmp_path):
    """Every weighted-sum algorithm: sums taken in groups of 3 where the clients trained, and every upload sent to
    the driver (today's per-client path), give identical metrics (accuracy, loss parts, bytes)."""
    rows = {}
    for where in ("true", "false"):
        cfg = load_config(None, tiny_overrides(tmp_path / where, algorithm__name=name, engine__backend="inline",
                                               engine__partial_sums=where, engine__sum_group=3, clients__num=7,
                                               data__partition="dirichlet", log__tensorboard="false",
                                               **_algorithm_extra(name, tmp_path)))
        rows[where] = strip_timing(run_experiment(cfg)[1])
    assert rows["true"] == rows["false"]
    assert len(rows["true"]) == 2 and rows["true"][-1]["bytes_up"] > 0 or name == "local"


def test_the_worker_path_on_two_workers(ray_cluster, tmp_path):
    """On Ray, groups spread over two workers give the metrics of the in-process runs (one worker) that sum the same
    groups where the clients trained or on the driver."""
    common = dict(algorithm__name="fedrod", clients__num=7, rounds=2, engine__sum_group=2, log__tensorboard="false",
                  data__partition="dirichlet", engine__clients_per_call=4)  # on Ray, two groups to a call
    rows = []
    for d, extra in (("ray", {"engine__num_workers": 2}), ("inline", {"engine__backend": "inline"}),
                     ("driver", {"engine__backend": "inline", "engine__partial_sums": "false"})):
        cfg = load_config(None, tiny_overrides(tmp_path / d, **common, **extra))
        rows.append(strip_timing(run_experiment(cfg)[1]))
    assert rows[0] == rows[1] == rows[2]
    assert read_rows(tmp_path / "ray" / "run")[-1]["round"] == 2


def test_bad_group_settings_are_one_line_naming_the_key():
    from conftest import refused_config

    assert "must be auto or a whole number of clients >= 1, got '0'" in refused_config(
        "engine.sum_group", "experiments/smoke.yaml", "engine.sum_group=0")
    assert "is not a valid bool" in refused_config("engine.partial_sums", "experiments/smoke.yaml",
                                                   "engine.partial_sums=x")
    assert "whole number >= 1, got 0" in refused_config("eval.chunk", "experiments/smoke.yaml", "eval.chunk=0")


def test_weighting_is_an_option_of_the_summed_path(tmp_path):
    """algorithm.weighting=uniform keeps partial sums (the same metrics summed where the clients trained and on the
    driver) and changes the mean where client sizes differ; an algorithm that aggregates every upload its own way
    refuses it in one line, and a bad value names the key."""
    from conftest import refused_config

    def rows(where: str, weighting: str) -> list[dict]:
        cfg = load_config(None, tiny_overrides(tmp_path / f"{where}-{weighting}", engine__partial_sums=where,
                                               engine__sum_group=2, clients__num=6, data__partition="dirichlet",
                                               algorithm__weighting=weighting, log__tensorboard="false"))
        return strip_timing(run_experiment(cfg)[1])

    uniform = rows("true", "uniform")
    assert uniform == rows("false", "uniform") and uniform != rows("true", "samples")
    assert get_algorithm("fedavg")(load_config(None, ["algorithm.weighting=uniform"])).weighting == "uniform"
    assert get_algorithm("scaffold")(load_config(None, ["algorithm.name=scaffold",
                                                        "algorithm.weighting=uniform"])).weighting == "uniform"
    assert "aggregates every upload its own way" in refused_config(
        "algorithm.weighting", "experiments/smoke.yaml", "algorithm.name=fedpac", "algorithm.weighting=uniform")
    assert "must be samples or uniform" in refused_config(
        "algorithm.weighting", "experiments/smoke.yaml", "algorithm.weighting=equal")


def test_the_fused_add_gives_the_bits_of_the_unfused_one():
    """A float32 upload times a whole weight is exact in float64, so add_(u, alpha=w) rounds once, as u·w then +
    does: the same bits on random uploads spanning 40 orders of magnitude, weights up to 2**28."""
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        ups = [(torch.randn(300, generator=g) * 10.0 ** int(torch.randint(-20, 20, (1,), generator=g))).float()
               for _ in range(5)]
        weights = [float(torch.randint(1, 2 ** 28, (1,), generator=g)) for _ in range(5)]
        total = UploadSum()
        for i, (u, w) in enumerate(zip(ups, weights)):
            total.add(i, {"w": u}, w)
        expect = ups[0].double() * weights[0]
        for u, w in zip(ups[1:], weights[1:]):
            expect = expect + u.double() * w
        total.merge(UploadSum())  # buffers a single upload, as mean() would
        assert torch.equal(merge_all([total]).total, expect)


def test_a_sum_read_from_the_object_store_is_mapped_then_copied_before_a_write():
    """An UploadSum travels as a numpy buffer, out of band (pickle 5, as Ray ships it): the reader maps it read-only
    without a copy, merging it reads it, and adding to it copies it first, leaving the shared buffer as it was."""
    import pickle

    from raysim.algorithms.aggregation import UploadSum

    g = torch.Generator().manual_seed(0)
    ups = [{"w": torch.randn(4, 3, generator=g), "b": torch.randn(3, generator=g)} for _ in range(3)]
    group = UploadSum()
    for c, u in enumerate(ups[:2]):
        group.add(c, u, 2.0 + c)
    buffers: list = []
    data = pickle.dumps(group, protocol=5, buffer_callback=buffers.append)
    assert buffers  # the float64 buffer went out of band
    frozen = [memoryview(bytes(b.raw())) for b in buffers]  # read-only, like the object store's memory
    shared = pickle.loads(data, buffers=frozen)
    assert shared._shared and torch.equal(shared.total, group.total) and shared.clients == [0, 1]
    merged = UploadSum()
    merged.merge(shared)
    merged.merge(shared)
    assert torch.equal(merged.total, group.total * 2)
    before = shared.total.clone()
    shared.add(2, ups[2], 4.0)  # a write: the mapped buffer is copied first
    group.add(2, ups[2], 4.0)
    assert not shared._shared and torch.equal(shared.total, group.total)
    assert torch.equal(torch.frombuffer(bytearray(frozen[0]), dtype=torch.float64), before)


def test_the_torch_free_capability_table_is_what_the_classes_declare():
    """raysim.capabilities answers the config checks without importing an algorithm; it is derived from
    the classes (``python -m raysim.capabilities`` writes it), and must say what they say."""
    from raysim import capabilities

    assert capabilities.TABLE == capabilities.derived_table(), "run: python -m raysim.capabilities"
    cfg = load_config(None, ["algorithm.name=ditto", "algorithm.select_lam=true"])
    assert capabilities.refusal("ditto", "stack") is None
    assert "select_lam" in capabilities.refusal("ditto", "stack", cfg)
