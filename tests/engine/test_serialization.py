"""The fast tensor serialiser: a tensor comes back equal bit for bit, same dtype, shape and requires_grad."""

from __future__ import annotations

import pickle

import pytest
import torch

from raysim.engine.worker import _reduce_tensor, enable_fast_tensor_serialization

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int8,
          torch.uint8, torch.bool, torch.complex64]
SHAPES = [(), (0,), (1,), (7,), (3, 5), (2, 0, 4), (2, 3, 4, 5)]


def _sample(dtype: torch.dtype, shape: tuple) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) > 0.5
    if dtype.is_complex:
        return torch.randn(shape, generator=gen, dtype=dtype)
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=gen) * 100).to(dtype)
    return torch.randint(-100 if dtype != torch.uint8 else 0, 100, shape, generator=gen).to(dtype)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def _roundtrip(t: torch.Tensor) -> torch.Tensor:
    rebuild, args = _reduce_tensor(t)
    return rebuild(*pickle.loads(pickle.dumps(args, protocol=5)))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_roundtrip_over_dtypes_and_shapes(dtype):
    for shape in SHAPES:
        t = _sample(dtype, shape)
        back = _roundtrip(t)
        assert back.dtype == dtype and back.shape == t.shape and not back.requires_grad
        assert torch.equal(_bits(back), _bits(t)), (dtype, shape)  # bit for bit (NaN payloads, -0.0 too)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16], ids=str)
def test_requires_grad_survives_and_the_copy_is_a_leaf(dtype):
    t = _sample(dtype, (4, 3)).requires_grad_(True)
    back = _roundtrip(t)
    assert back.requires_grad and back.is_leaf and back.grad is None
    assert torch.equal(back.detach(), t.detach())


def test_non_contiguous_and_nan_values_roundtrip():
    t = torch.arange(24, dtype=torch.float32).reshape(4, 6).t()[1:, ::2]  # a strided view
    t[0, 0] = float("nan")
    back = _roundtrip(t)
    assert back.is_contiguous() and back.shape == t.shape
    assert torch.equal(_bits(back), _bits(t))


def test_rebuilt_tensor_is_private_and_writable():
    t = torch.ones(5)
    rebuild, (raw, *rest) = _reduce_tensor(t)
    raw.setflags(write=False)  # as a buffer in read-only shared memory would be
    back = rebuild(raw, *rest)
    back += 1  # must not raise, nor change the source
    assert torch.equal(t, torch.ones(5)) and torch.equal(back, torch.full((5,), 2.0))


def test_ray_uses_it_for_plain_tensors_only(ray_cluster):
    import ray

    enable_fast_tensor_serialization()
    tree = {"w": torch.randn(3, 2, dtype=torch.float64), "g": torch.zeros(2, requires_grad=True),
            "p": torch.nn.Parameter(torch.ones(2)), "n": [torch.tensor(7), torch.empty(0, 4)]}
    back = ray.get(ray.put(tree))
    assert torch.equal(back["w"], tree["w"]) and back["w"].dtype == torch.float64
    assert back["g"].requires_grad and isinstance(back["p"], torch.nn.Parameter)
    assert torch.equal(back["n"][0], torch.tensor(7)) and back["n"][1].shape == (0, 4)


def test_a_device_tensor_never_enters_the_object_store():
    """The serialiser refuses a tensor that is not on the CPU (a "meta" tensor stands for a GPU one here), plain or
    as a Parameter's data, with a message that names its device and shape; nothing is rebuilt on a device."""
    import ray.cloudpickle

    from raysim.errors import NotOnCPU

    enable_fast_tensor_serialization()
    for obj in ({"upload": {"w": torch.zeros(3, 2, device="meta")}}, torch.nn.Parameter(torch.zeros(4, device="meta"))):
        with pytest.raises(NotOnCPU, match=r"^a meta tensor of shape \[\d(, 2)?\] was about to enter Ray's object "
                                           r"store, which holds CPU tensors only"):
            ray.cloudpickle.dumps(obj)
    rebuild, args = _reduce_tensor(torch.ones(2))
    assert len(args) == 4 and rebuild(*args).device.type == "cpu"  # no device is recorded


def test_a_device_tensor_never_enters_a_checkpoint_nor_the_in_process_store(tmp_path):
    from raysim.config import load_config
    from raysim.engine.executor import InlineExecutor
    from raysim.engine.state import atomic_save, save_all_durably
    from raysim.errors import NotOnCPU

    state = {"server_state": {"model": {"w": torch.ones(2)}, "extra": [torch.zeros(1, device="meta")]}}
    with pytest.raises(NotOnCPU, match=r"^server.pt\['server_state'\]\['extra'\]\[0\]: a meta tensor of shape \[1\]"):
        atomic_save(state, tmp_path / "server.pt")
    with pytest.raises(NotOnCPU, match=r"^c000001_r00002.pt\['h'\]: a meta tensor"):
        save_all_durably([({"w": torch.ones(1)}, tmp_path / "c000000_r00002.pt"),
                          ({"h": torch.ones(1, device="meta")}, tmp_path / "c000001_r00002.pt")])
    assert list(tmp_path.iterdir()) == []  # refused before anything was written
    with pytest.raises(NotOnCPU, match=r"^an object put into the store\['w'\]: a meta tensor"):
        InlineExecutor(load_config(None, [])).put({"w": torch.ones(1, device="meta")})
