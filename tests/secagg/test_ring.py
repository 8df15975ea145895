"""Secure aggregation's arithmetic by hand (raysim.secagg.ring): fixed point, the ring, masks that cancel bit for
bit with and without a dropped client, SecAgg+'s graph, the recovery threshold, the papers' traffic, and a round's
uploads through the client parts, the one float64 sum and the server's unmasking."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import tiny_overrides

from raysim.algorithms.aggregation import UploadSum
from raysim.config import load_config
from raysim.secagg import ring
from raysim.secagg.stage import RoundGroup, SecAggStage, _MaskPart


def test_fixed_point_and_the_ring_by_hand():
    # step 1/4, R = 1: (0.3, -0.6, 2, -0.125, 1.1) -> clamped (0.3, -0.6, 1, -0.125, 1) -> /0.25 = (1.2, -2.4, 4,
    # -0.5, 4) -> rounded to the nearest, halves to even: (1, -2, 4, 0, 4); the clamp changed one value's level (2
    # would be 8; 1.1 would round to 4 anyway: within half a step of R)
    q, clamped = ring.fixed_point(np.array([0.3, -0.6, 2.0, -0.125, 1.1]), 0.25, 1.0)
    assert q.tolist() == [1, -2, 4, 0, 4] and clamped == 1
    # Z_256: -1 is 255, 127 the largest positive, 128 reads back as -128
    assert ring.to_ring(np.array([-1, 127, -128]), 8).tolist() == [255, 127, 128]
    assert ring.from_ring(np.array([255, 127, 128], dtype=np.uint64), 8).tolist() == [-1, 127, -128]
    # 40 bits travel as two limbs: 2**33 + 5 = (5, 2) (lowest first); summed limbs carry back: (5 + 7, 2 + 1)
    assert ring.to_limbs(np.array([2 ** 33 + 5], dtype=np.uint64), 40).tolist() == [[5.0, 2.0]]
    assert ring.from_limbs(np.array([[12.0, 3.0]]), 40).tolist() == [3 * 2 ** 32 + 12]


GROUP = [3, 5, 8, 11]
BITS = 16


def _plain(seed: int = 7) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {u: rng.integers(-50, 50, size=6) for u in GROUP}


def _mask_all(plain, peers, bits=BITS):
    return {u: ring.masked(ring.to_ring(plain[u], bits), u, peers[u], 0, 2, bits) for u in plain}


def test_masks_cancel_bit_for_bit():
    plain = _plain()
    peers = ring.graph(GROUP, None, 0, 2)
    assert peers[5] == [3, 8, 11]  # SecAgg: every other client
    masked = _mask_all(plain, peers)
    assert all(not np.array_equal(masked[u], ring.to_ring(plain[u], BITS)) for u in GROUP)  # each one hidden
    total = sum(masked.values()) & ring.ring_mask(BITS)
    expected = ring.to_ring(sum(plain.values()), BITS)  # the plain fixed-point sum, in the ring
    # the pairwise masks cancel in the sum: what is left is the plain sum and the four self masks
    selfless = total.copy()
    for u in GROUP:
        selfless -= ring.prg(ring.self_seed(0, 2, u), 6, BITS)
    assert np.array_equal(selfless & ring.ring_mask(BITS), expected)
    unmasked = ring.unmask(total, GROUP, [], peers, 0, 2, BITS)
    assert np.array_equal(unmasked, expected)
    assert ring.from_ring(unmasked, BITS).tolist() == sum(plain.values()).tolist()


def test_a_dropped_client_s_masks_are_removed_through_its_neighbours():
    plain = _plain()
    peers = ring.graph(GROUP, None, 0, 2)
    masked = _mask_all(plain, peers)
    survivors = [3, 5, 11]  # client 8 masked its vector and never sent it
    total = sum(masked[u] for u in survivors) & ring.ring_mask(BITS)
    unmasked = ring.unmask(total, survivors, [8], peers, 0, 2, BITS)
    assert ring.from_ring(unmasked, BITS).tolist() == sum(plain[u] for u in survivors).tolist()
    # without removing client 8's pairwise masks the sum is garbage
    assert not np.array_equal(ring.unmask(total, survivors, [], peers, 0, 2, BITS),
                              ring.to_ring(sum(plain[u] for u in survivors), BITS))


def test_secagg_plus_graph_and_dropouts():
    group = [1, 2, 4, 6, 7, 9]
    peers = ring.graph(group, 2, 3, 5)  # each client with the one before and the one after it on a seeded ring
    assert all(len(v) == 2 for v in peers.values()) and all(u in peers[v] for u in group for v in peers[u])
    assert peers[4] == ring.neighbours_of(4, group, 2, 3, 5)
    rng = np.random.default_rng(1)
    plain = {u: rng.integers(-9, 9, size=5) for u in group}
    masked = {u: ring.masked(ring.to_ring(plain[u], 12), u, peers[u], 3, 5, 12) for u in group}
    survivors = [u for u in group if u != 6]
    total = sum(masked[u] for u in survivors) & ring.ring_mask(12)
    unmasked = ring.unmask(total, survivors, [6], peers, 3, 5, 12)
    assert ring.from_ring(unmasked, 12).tolist() == sum(plain[u] for u in survivors).tolist()


def test_the_threshold_of_surviving_holders():
    peers = ring.graph(GROUP, None, 0, 1)
    # complete graph of 4: each secret has 4 holders, t = ceil(0.5 x 4) = 2
    assert ring.unrecoverable(GROUP, [3, 5], peers, 0.5) is None
    assert ring.unrecoverable(GROUP, [3], peers, 0.5) == (3, 1, 2)


def test_the_traffic_is_bonawitz_et_al_s():
    # §7.1: 2n a_K + (5n - 4) a_S + m R bits, a_K = a_S = 256. 2**10 clients, 2**20 coordinates of 16-bit inputs
    # in a ring of 16 + 10 = 26 bits: 2 x 1024 x 256 + 5116 x 256 + 2**20 x 26 = 29,096,960 bits, 1.73x the
    # 2**20 x 16 bits of the inputs; 2**14 clients, 2**24 coordinates, 30 bits: 1.98x (the paper's figures)
    up, down = ring.traffic(2 ** 10 - 1, 2 ** 20, 26)
    assert (up + down) * 8 == 29_096_960 and round((up + down) * 8 / (2 ** 20 * 16), 2) == 1.73
    up, down = ring.traffic(2 ** 14 - 1, 2 ** 24, 30)
    assert round((up + down) * 8 / (2 ** 24 * 16), 2) == 1.98
    # SecAgg+ with 4 neighbours: n = 5 in the formula, whatever the round's size
    assert sum(ring.traffic(4, 10, 32)) * 8 == 2 * 5 * 256 + 21 * 256 + 10 * 32


def test_a_round_through_the_client_parts_the_one_sum_and_the_unmasking(tmp_path):
    """Two clients, step 1/4, uniform weights: (0.5, -0.25) and (0.75, 1) are (2, -1) and (3, 4) in fixed point,
    summed (5, 3), decoded (1.25, 0.75) with weight 2: the plain mean (0.625, 0.375), exactly; client 9, which
    started the round and dropped, leaves no mask behind."""
    cfg = load_config(None, tiny_overrides(tmp_path, secagg__enabled="true", secagg__bits=20), warn=False)
    stage = SecAggStage(cfg)
    stage.step, stage.sum_weighting = 0.25, "uniform"
    stage.begin_round(1, [2, 9, 4])
    keys = stage.job_params(1)
    assert keys == RoundGroup(1, (2, 4, 9), 0.25, "uniform")
    uploads = {2: torch.tensor([0.5, -0.25]), 4: torch.tensor([0.75, 1.0])}
    total = UploadSum()
    for cid, w in uploads.items():
        part = _MaskPart(cfg, SimpleNamespace(client_id=cid, round=1, stream=()), keys)
        part.setup(SimpleNamespace(train_data=(None, torch.zeros(3), None)))
        sent = part.upload({"w": w}, {})
        assert sent["w"]["float32"].dtype == torch.float64 and sent["w"]["float32"].shape == (2, 1)
        assert part.upload_bytes(0) == ring.traffic(2, 3, 20)[0]  # 2 values and the weight, 20 bits each
        total.add(cid, sent, 1.0)
    ctx = SimpleNamespace(round=1, shared={})
    decoded = stage.decode(total, ctx)
    assert decoded.weight == 2.0 and decoded.total.tolist() == [1.25, 0.75]
    assert decoded.mean()["w"].tolist() == [0.625, 0.375]


def test_samples_weights_and_a_model_entry_sent_as_its_change(tmp_path):
    """Weights 3 and 1 (training samples), the download w = 1: the changes 0.5 and -1 in fixed point of step 1/2
    are 1 and -2, times the weights 3 and -2, summed 1, read as 0.5; with Σw = 4 the sum of the uploads is
    4 x 1 + 0.5 = 4.5 and their mean 1.125 = 1 + (3 x 0.5 + 1 x -1) / 4."""
    cfg = load_config(None, tiny_overrides(tmp_path, secagg__enabled="true"), warn=False)
    stage = SecAggStage(cfg)
    stage.step, stage.sum_weighting = 0.5, "samples"
    stage.begin_round(3, [0, 1])
    keys = stage.job_params(3)
    total = UploadSum()
    for cid, (value, samples) in {0: (1.5, 3), 1: (0.0, 1)}.items():
        part = _MaskPart(cfg, SimpleNamespace(client_id=cid, round=3, stream=()), keys)
        part.setup(SimpleNamespace(train_data=(None, torch.zeros(samples), None)))
        total.add(cid, part.upload({"w": torch.tensor([value])}, {"model": {"w": torch.tensor([1.0])}}), 1.0)
    decoded = stage.decode(total, SimpleNamespace(round=3, shared={"model": {"w": torch.tensor([1.0])}}))
    assert decoded.weight == 4.0 and decoded.total.tolist() == [4.5]
    assert decoded.mean()["w"].tolist() == [pytest.approx(1.125)]


def test_the_algorithms_secure_aggregation_refuses_answer_from_the_torch_free_table_as_their_classes_do():
    """A built-in's refusal comes from raysim.capabilities (no algorithm imported); it must say what the
    class says: uploads kept apart, uploads kept on the server, or server-side training from them."""
    from raysim.registry import builtin_names, get_algorithm
    from raysim.sections.secagg import algorithm_refusal

    for name in builtin_names("algorithm"):
        cls = get_algorithm(name)
        needs_each = (cls.declared_uploads().kind == "apart" or cls.server_history > 0
                      or cls.server_train.__qualname__ != "Algorithm.server_train")
        assert (algorithm_refusal(name) is not None) == needs_each, name
    assert algorithm_refusal("scaffold") is None and algorithm_refusal("fedbn") is None  # statistics, a mean
    assert "Uploads.apart" in algorithm_refusal("fedcda")
