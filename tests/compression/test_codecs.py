"""Each compressor's encoding and its exact byte count on a small vector, worked by hand in the comments, and error
feedback's memory over two rounds (raysim.compression)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from conftest import tiny_overrides

from raysim.compression import codecs
from raysim.compression.stage import _CompressPart
from raysim.config import load_config

X = torch.tensor([0.5, -3.0, 2.0, 0.1, -0.2, 1.0, 0.0, 4.0, -1.5, 0.3])


def test_top_k_keeps_the_largest_magnitudes_and_counts_values_and_positions():
    # ratio 0.3 of 10 entries: k = 3 (0.3 x 10 is 3.0000000000000004 in floats: still 3); the largest |x| are 4.0
    # (position 7), -3.0 (1) and 2.0 (2). Bytes: 3 float32 values (12) and the positions as the smaller of 3 int32
    # indices (12) and a 10-bit mask (2 bytes): 14
    value, size = codecs.top_k(X, 0.3)
    assert value.tolist() == [0.0, -3.0, 2.0, 0.0, 0.0, 0.0, 0.0, 4.0, 0.0, 0.0] and size == 14
    # 1 % of 100 entries: k = 1, 4 bytes of value and one int32 index (4 < a 13-byte mask): 8
    assert codecs.top_k(torch.arange(100.0), 0.01).nbytes == 8
    # every entry: dense, no positions (10 x 4 bytes)
    dense = codecs.top_k(X, 1.0)
    assert torch.equal(dense.value, X) and dense.nbytes == 40
    # ties go to the lower index: k = ceil(1.5) = 2 of |1| = |-1| = |1|
    assert codecs.top_k(torch.tensor([1.0, -1.0, 1.0]), 0.5).value.tolist() == [1.0, -1.0, 0.0]
    counter = torch.tensor([7, 9])  # an integer tensor (a batch norm's counter) goes as it is: 2 x 8 bytes
    kept = codecs.top_k(counter, 0.5)
    assert kept.value is counter and kept.nbytes == 16


def test_random_k_sends_k_values_whose_positions_the_seed_gives():
    # k = 3 of 10: 3 float32 values, 12 bytes (the positions travel as the job's seed, counted once an upload)
    value, size = codecs.random_k(X, 0.3, torch.Generator().manual_seed(5))
    chosen = torch.randperm(10, generator=torch.Generator().manual_seed(5))[:3]
    assert size == 12 and torch.count_nonzero(value) == 3
    assert torch.equal(value[chosen], X[chosen])
    assert torch.equal(codecs.random_k(X, 0.3, torch.Generator().manual_seed(5)).value, value)  # same seed, same k


def test_qsgd_rounds_each_coordinate_to_a_level_of_its_bucket_norm():
    # 2 bits: s = 2**1 - 1 = 1 level a sign. x = (3, -4), one bucket of norm 5: |x| / 5 x 1 = (0.6, 0.8); draws
    # (0.5, 0.9): 0.5 < 0.6 rounds up to level 1, 0.9 >= 0.8 stays at 0: decoded (5 x 1/1, 0). Bytes: one float32
    # norm (4) and 2 coordinates x 2 bits (1 byte): 5
    value, size = codecs.qsgd(torch.tensor([3.0, -4.0]), 2, 2, uniform=torch.tensor([0.5, 0.9], dtype=torch.float64))
    assert value.tolist() == [5.0, 0.0] and size == 5
    # 3 bits: s = 3. Buckets of 2: (3, -4) of norm 5 and (0, 12) of norm 12. |x| / norm x 3 = (1.8, 2.4 | 0, 3);
    # draws (0.7, 0.5, 0.3, 0.9): 1.8 -> 2 (0.7 < 0.8), 2.4 -> 2 (0.5 >= 0.4), 0 -> 0, 3 -> 3. Decoded: 5 x 2/3,
    # -5 x 2/3, 0, 12 x 3/3. Bytes: 2 norms (8) and 4 x 3 bits (2 bytes): 10
    value, size = codecs.qsgd(torch.tensor([3.0, -4.0, 0.0, 12.0]), 3, 2,
                              uniform=torch.tensor([0.7, 0.5, 0.3, 0.9], dtype=torch.float64))
    assert value.tolist() == pytest.approx([10 / 3, -10 / 3, 0.0, 12.0]) and size == 10
    # a scale shared by every client (secure aggregation's ring): 4, s = 3. |x| clamped to 4: (1, 4) / 4 x 3 =
    # (0.75, 3); draws (0.5, 0.1): 1 and 3, decoded (4/3, -4). No norm is sent: 2 x 3 bits, 1 byte
    value, size = codecs.qsgd(torch.tensor([1.0, -6.0]), 3, 512, scale=4.0,
                              uniform=torch.tensor([0.5, 0.1], dtype=torch.float64))
    assert value.tolist() == pytest.approx([4 / 3, -4.0]) and size == 1


def test_qsgd_is_unbiased():
    x = torch.tensor([0.3, -1.2, 0.05, 2.0])
    gen = torch.Generator().manual_seed(0)
    mean = torch.stack([codecs.qsgd(x, 2, 4, gen).value for _ in range(20000)]).mean(dim=0)
    assert torch.allclose(mean, x, atol=0.05)  # E[Q(x)] = x (Alistarh et al., Lemma 3.1)


def test_scaled_sign_and_half():
    # ||(1, -2, 0, 3)||_1 / 4 = 1.5 times the signs (sign 0 = +1); one bit an entry (1 byte) and a float32 scale: 5
    value, size = codecs.scaled_sign(torch.tensor([1.0, -2.0, 0.0, 3.0]))
    assert value.tolist() == [1.5, -1.5, 1.5, 1.5] and size == 5
    # 1/3 in float16 is 0.333251953125 (11 significant bits), 2 bytes an entry
    value, size = codecs.half(torch.tensor([1 / 3, 1.0]))
    assert value.tolist() == [0.333251953125, 1.0] and size == 4


def _part(tmp_path, **extra) -> _CompressPart:
    cfg = load_config(None, tiny_overrides(tmp_path, **extra), warn=False)
    return _CompressPart(cfg, SimpleNamespace(client_id=0, round=1, stream=()))


def test_error_feedback_keeps_what_the_compressor_dropped_over_two_rounds(tmp_path):
    on = dict(compression__up="topk", compression__ratio=0.5, compression__error_feedback="true")
    # round 1: the model downloaded is 0, the client's new model (1, -4, 2, 0.5): its change x1 = (1, -4, 2, 0.5);
    # top-2 of x1 + e0 (e0 = 0) sends (0, -4, 2, 0) and keeps e1 = (1, 0, 0, 0.5); the upload as the server
    # decodes it is the download plus what was sent: (0, -4, 2, 0). Bytes: 2 values (8) and a 4-bit mask (1): 9
    first = _part(tmp_path, **on)
    first.restore(None)
    out = first.upload({"w": torch.tensor([1.0, -4.0, 2.0, 0.5])}, {"model": {"w": torch.zeros(4)}})
    assert out["w"].tolist() == [0.0, -4.0, 2.0, 0.0] and first.upload_bytes(0) == 9
    kept = first.keep()
    assert kept["w"].tolist() == [1.0, 0.0, 0.0, 0.5]
    # round 2: downloaded (1, 1, 1, 1), new model (1.25, 1.75, 1, 1.5): x2 = (0.25, 0.75, 0, 0.5). With the memory,
    # x2 + e1 = (1.25, 0.75, 0, 1.0): top-2 sends (1.25, 0, 0, 1.0), keeps e2 = (0, 0.75, 0, 0); the upload is
    # (2.25, 1, 1, 2.0). Without it, top-2 of x2 would send (0, 0.75, 0, 0.5)
    second = _part(tmp_path, **on)
    second.restore(kept)
    out = second.upload({"w": torch.tensor([1.25, 1.75, 1.0, 1.5])}, {"model": {"w": torch.ones(4)}})
    assert out["w"].tolist() == [2.25, 1.0, 1.0, 2.0]
    assert second.keep()["w"].tolist() == [0.0, 0.75, 0.0, 0.0]
    plain = _part(tmp_path, compression__up="topk", compression__ratio=0.5)
    plain.restore(None)
    out = plain.upload({"w": torch.tensor([1.25, 1.75, 1.0, 1.5])}, {"model": {"w": torch.ones(4)}})
    assert out["w"].tolist() == [1.0, 1.75, 1.0, 1.5] and plain.keep() is None


def test_random_k_counts_its_seed_and_an_entry_outside_the_model_is_sent_as_it_is(tmp_path):
    part = _part(tmp_path, compression__up="randk", compression__ratio=0.5)
    # "w" is a model entry (its change is sent), "c" is not (sent as it is), "n" an integer (8 bytes as it is):
    # 2 of 4 values (8 bytes) + 1 of 2 (4 bytes) + 8 + the seed (8): 28
    out = part.upload({"w": torch.tensor([5.0, 5.0, 5.0, 5.0]), "c": torch.tensor([2.0, 3.0]), "n": torch.tensor(4)},
                      {"model": {"w": torch.tensor([4.0, 4.0, 4.0, 4.0])}})
    assert part.upload_bytes(0) == 28
    assert sorted(out["w"].tolist()) == [4.0, 4.0, 5.0, 5.0] and int(out["n"]) == 4
    assert sorted(out["c"].tolist()) in ([0.0, 2.0], [0.0, 3.0])
