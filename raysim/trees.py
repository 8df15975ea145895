"""Nested containers of tensors (payloads, uploads, kept states): one walker, and what the engine builds on it.

A tree is a tensor, a dict, list or tuple of trees, or any other value (a leaf that is not a tensor). Every helper
here goes through :func:`tree_map` or :func:`tensor_leaves`, so the containers a tree may hold are named once.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator

import torch


def tree_map(fn: Callable[[torch.Tensor], Any], tree: Any, *, records: bool = False) -> Any:
    """The tree with ``fn`` applied to every tensor (dicts, lists and tuples rebuilt, other values as they are;
    ``records``: dataclass instances too, such as a ``TrainResult``, rebuilt field by field)."""
    if isinstance(tree, torch.Tensor):
        return fn(tree)
    if isinstance(tree, dict):
        return {k: tree_map(fn, v, records=records) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(tree_map(fn, v, records=records) for v in tree)
    if records and dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        return dataclasses.replace(tree, **{f.name: tree_map(fn, getattr(tree, f.name), records=records)
                                            for f in dataclasses.fields(tree) if f.init})
    return tree


def tensor_leaves(tree: Any, path: tuple = ()) -> Iterator[tuple[tuple, torch.Tensor]]:
    """(key path, tensor) of every tensor in the tree, in order (a list's positions are its keys)."""
    if isinstance(tree, torch.Tensor):
        yield path, tree
    elif isinstance(tree, dict):
        for k, v in tree.items():
            yield from tensor_leaves(v, path + (k,))
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            yield from tensor_leaves(v, path + (i,))


def nbytes(tree: Any) -> int:
    """Bytes of every tensor in the tree: what crosses the network for that object."""
    return sum(t.numel() * t.element_size() for _, t in tensor_leaves(tree))


def all_finite(tree: Any) -> bool:
    """True when no floating tensor in the tree holds NaN/Inf; one host sync for the whole tree, not one per tensor.

    Each tensor's sum first: NaN and ±Inf survive every addition, so a finite sum means finite elements, found in
    one pass with no mask (``isfinite().all()`` takes ~40 times as long on a 1.6 M-parameter model here). Only a
    tensor whose sum is not finite (a NaN, an Inf, or finite values whose sum overflowed) is checked element by
    element."""
    floats = [t for _, t in tensor_leaves(tree) if t.is_floating_point()]
    if not floats:
        return True
    sums = [t.detach().sum().to(torch.float64) for t in floats]
    if len({t.device for t in floats}) == 1:
        finite = torch.stack(sums).isfinite().tolist()
    else:
        finite = [bool(v.isfinite()) for v in sums]
    return all(ok or bool(t.isfinite().all()) for ok, t in zip(finite, floats))


def copy_tree(tree: Any) -> Any:
    """Fresh tensors (and containers, and records) with the same values: what a job may change without anyone
    else seeing it."""
    return tree_map(torch.Tensor.clone, tree, records=True)


def to_device(tree: Any, device: torch.device) -> Any:
    """The tree with its tensors on ``device`` (unchanged on the CPU: no copy)."""
    if device.type == "cpu" or tree is None:
        return tree
    return tree_map(lambda t: t.to(device, non_blocking=True), tree)


def detached_cpu(tree: Any, copy: bool = False) -> Any:
    """The tree with every tensor detached and on the CPU (``copy``: a private copy even where it already was)."""
    def move(t: torch.Tensor) -> torch.Tensor:
        out = t.detach()
        if out.device.type != "cpu":
            return out.cpu()
        return out.clone() if copy else out

    return tree_map(move, tree)


def signature(tree: Any) -> Any:
    """A tree's structure, shapes and dtypes (plain values as themselves); None for anything else."""
    if isinstance(tree, torch.Tensor):
        return ("tensor", tuple(tree.shape), tree.dtype)
    if isinstance(tree, dict):
        return {k: signature(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [signature(v) for v in tree]
    return ("value", tree) if isinstance(tree, (int, float, str, bool, type(None))) else None


def _plain(sig: Any) -> bool:
    if isinstance(sig, dict):
        return all(_plain(v) for v in sig.values())
    if isinstance(sig, list):
        return all(_plain(v) for v in sig)
    return sig is not None


def stack_trees(trees: list[Any]) -> Any:
    """The trees as one tree of stacked tensors (first dimension: which tree); None where they differ in structure,
    shape or dtype, or hold anything but tensors and plain values."""
    first = signature(trees[0])
    if not _plain(first) or any(signature(t) != first for t in trees[1:]):
        return None
    by_path = [dict(tensor_leaves(tree)) for tree in trees]  # by key path: dicts may list their keys in any order
    stacked = iter([torch.stack([leaves[path] for leaves in by_path]) for path in by_path[0]])
    return tree_map(lambda _: next(stacked), trees[0])


def change_reference(key: Any, value: Any, model: dict) -> Any:
    """The downloaded model's entry that an upload's top-level entry ``key`` is a new value of (a tensor of the same
    name and shape), or None: a stage that encodes an upload as its change (compression, secure aggregation) sends
    such an entry as ``value - reference`` and any other (a clipped delta, a statistic) as it is."""
    ref = model.get(key) if isinstance(value, torch.Tensor) else None
    return ref if isinstance(ref, torch.Tensor) and ref.shape == value.shape else None
