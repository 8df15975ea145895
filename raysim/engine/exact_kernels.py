"""Bit-exact kernels for stacked clients: inside a stacked step, the operations whose batched rule sums in
another order than one client alone are computed as one client computes them.

vmap's own rules sum in other orders than one client alone (a linear layer's weight gradient as (xᵀg)ᵀ rather than
gᵀx, a batch's mean cross-entropy, a grouped convolution over the clients). Inside the step, :class:`OneClientOrder`
computes those as one client does, so an MLP's stack (and, on a CPU, a CNN's) gives every client its own numbers
bit for bit; what it does not cover (batch norm, other reductions) agrees within float32 rounding.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode


def _tiny_product(rows: int, features: int, outputs: int) -> bool:
    """Matrix products small enough that torch's batched kernel takes another path than one client's (a plain loop
    below ~400 multiply-adds, a matrix-vector product for one row): computed client by client instead."""
    return rows <= 1 or rows * features * outputs < 400


def _save_layer_inputs(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    """``setup_context`` of the stacked layers (linear and convolution): their backward needs the input, the weight
    and whether a bias came."""
    x, weight, bias = inputs[:3]
    ctx.save_for_backward(x, weight)
    ctx.has_bias = bias is not None


class _StackedLinear(torch.autograd.Function):
    """A linear layer of K stacked clients (x [K, N, in], weight [K, out, in], bias [K, out] or None) computed as
    each client's alone: the forward as ``baddbmm``, and the weight's gradient as gᵀx, the orientation of torch's
    layout-aware backward of one linear layer (vmap's own rule takes (xᵀg)ᵀ, another summation order)."""

    @staticmethod
    def forward(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        if _tiny_product(x.shape[1], weight.shape[2], weight.shape[1]):
            return torch.stack([F.linear(x[c].clone(), weight[c].clone(), None if bias is None else bias[c])
                                for c in range(x.shape[0])])
        if bias is None:
            return torch.bmm(x, weight.transpose(1, 2))
        return torch.baddbmm(bias.unsqueeze(1), x, weight.transpose(1, 2))

    setup_context = staticmethod(_save_layer_inputs)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        x, weight = ctx.saved_tensors
        grad = grad.contiguous()  # as one client's: vmap may hand it over in another memory order
        k = x.shape[0]
        tiny = _tiny_product(x.shape[1], weight.shape[2], weight.shape[1])
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = torch.stack([grad[c].clone().mm(weight[c].clone()) for c in range(k)]) if tiny \
                else torch.bmm(grad, weight)
        if ctx.needs_input_grad[1]:
            grad_w = torch.stack([grad[c].clone().t().mm(x[c].clone()) for c in range(k)]) if tiny \
                else torch.bmm(grad.transpose(1, 2), x)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = grad.sum(1)
        return grad_x, grad_w, grad_b


class _SerialLinear(torch.autograd.Function):
    """``F.linear`` inside a vectorised step: under vmap, clients' own weights go through :class:`_StackedLinear`;
    a weight shared by every client (a payload's, such as UNIDEAL's teacher head) is one plain layer over all
    clients' rows. With it a stacked MLP's forward and gradients equal one-at-a-time ones bit for bit when its
    layers' input widths are multiples of 4 (measured: otherwise the BLAS kernels' results depend on where each client's
    rows start in memory, and agree within float32 rounding)."""

    @staticmethod
    def forward(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        return F.linear(x, weight, bias)

    setup_context = staticmethod(_save_layer_inputs)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:  # outside vmap: one linear layer, as torch computes it
        x, weight = ctx.saved_tensors
        flat = grad.reshape(-1, grad.shape[-1])
        grad_x = grad.matmul(weight) if ctx.needs_input_grad[0] else None
        grad_w = flat.t().mm(x.reshape(-1, x.shape[-1])) if ctx.needs_input_grad[1] else None
        grad_b = flat.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return grad_x, grad_w, grad_b

    @staticmethod
    def vmap(info: Any, in_dims: tuple, x: torch.Tensor, weight: torch.Tensor,
             bias: Optional[torch.Tensor]) -> tuple[torch.Tensor, Optional[int]]:
        x_dim, w_dim, b_dim = in_dims
        if w_dim is None and b_dim is None:
            return (F.linear(x, weight, bias), None) if x_dim is None else \
                (F.linear(x.movedim(x_dim, 0), weight, bias), 0)
        k = info.batch_size
        x = x.movedim(x_dim, 0) if x_dim is not None else x.expand(k, *x.shape)
        weight = weight.movedim(w_dim, 0) if w_dim is not None else weight.expand(k, *weight.shape)
        if bias is not None:
            bias = bias.movedim(b_dim, 0) if b_dim is not None else bias.expand(k, *bias.shape)
        rows = x.reshape(k, -1, x.shape[-1])
        out = _StackedLinear.apply(rows, weight, bias)
        return out.reshape(*x.shape[:-1], out.shape[-1]), 0


def _pair(value: Any) -> list[int]:
    return [int(v) for v in value] if isinstance(value, (tuple, list)) else [int(value)] * 2


class _StackedConv2d(torch.autograd.Function):
    """K clients' 2-d convolutions (x [K, N, C, H, W], weight [K, O, C/groups, kh, kw], bias [K, O] or None), each
    computed as alone: its own convolution forward and backward (torch's ``convolution_backward``, as autograd
    calls it for one client), one client after another. On a CPU a convolution's arithmetic dominates its dispatch,
    so a stack gives nothing away by it, while vmap's own rule (one grouped convolution over the clients) is slower
    there and sums in another order; the rest of the step (dense layers, loss, optimiser) stays batched."""

    @staticmethod
    def forward(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], stride: list[int],
                padding: list[int], dilation: list[int], groups: int) -> torch.Tensor:
        return torch.stack([F.conv2d(x[c].clone(), weight[c].clone(), None if bias is None else bias[c].clone(),
                                     stride, padding, dilation, groups) for c in range(x.shape[0])])

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
        _save_layer_inputs(ctx, inputs, output)
        ctx.conv = tuple(inputs[3:])  # stride, padding, dilation, groups

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        x, weight = ctx.saved_tensors
        stride, padding, dilation, groups = ctx.conv
        mask = [ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.has_bias and ctx.needs_input_grad[2]]
        parts = [torch.ops.aten.convolution_backward(
            grad[c].contiguous(), x[c].clone(), weight[c].clone(), [weight.shape[1]] if ctx.has_bias else None,
            stride, padding, dilation, False, [0, 0], groups, mask) for c in range(x.shape[0])]
        grads = [torch.stack([part[i] for part in parts]) if mask[i] else None for i in range(3)]
        return (*grads, None, None, None, None)


class _SerialConv2d(torch.autograd.Function):
    """``F.conv2d`` inside a vectorised step on a CPU: clients' own weights through :class:`_StackedConv2d`, so a
    CNN's stack computes each client's numbers bit for bit as alone (as far as the dense layers do)."""

    @staticmethod
    def forward(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], stride: list[int],
                padding: list[int], dilation: list[int], groups: int) -> torch.Tensor:
        return F.conv2d(x, weight, bias, stride, padding, dilation, groups)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
        pass

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        raise RuntimeError("_SerialConv2d runs under vmap only")

    @staticmethod
    def vmap(info: Any, in_dims: tuple, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
             stride: list[int], padding: list[int], dilation: list[int], groups: int) -> tuple[torch.Tensor, int]:
        x_dim, w_dim, b_dim = in_dims[:3]
        k = info.batch_size
        x = x.movedim(x_dim, 0) if x_dim is not None else x.expand(k, *x.shape)
        weight = weight.movedim(w_dim, 0) if w_dim is not None else weight.expand(k, *weight.shape)
        if bias is not None:
            bias = bias.movedim(b_dim, 0) if b_dim is not None else bias.expand(k, *bias.shape)
        return _StackedConv2d.apply(x, weight, bias, stride, padding, dilation, groups), 0


def _serial_conv2d(args: tuple, kwargs: dict) -> Optional[torch.Tensor]:
    """``F.conv2d`` of one client's batch through :class:`_SerialConv2d` (None: leave it as it is: string padding,
    an input without a batch dimension, or an accelerator, where vmap's grouped convolution is the fast way)."""
    a = {"bias": None, "stride": 1, "padding": 0, "dilation": 1, "groups": 1,
         **dict(zip(("input", "weight", "bias", "stride", "padding", "dilation", "groups"), args)), **kwargs}
    x = a["input"]
    if isinstance(a["padding"], str) or x.dim() != 4 or x.device.type != "cpu":
        return None
    return _SerialConv2d.apply(x, a["weight"], a["bias"], _pair(a["stride"]), _pair(a["padding"]),
                               _pair(a["dilation"]), int(a["groups"]))


_NLL_LEVELS, _NLL_POWER = 8, 4  # the cascade of torch's CPU nll_loss kernel: 8 levels of 2**4 samples


def _nll_order_sum(values: torch.Tensor) -> torch.Tensor:
    """-Σ values over the last dimension, added in the order of torch's nll_loss kernel (a cascade of partial sums,
    each in float32), so that the mean cross-entropy of one client's batch has the kernel's value bit for bit."""
    zero = values.new_zeros(values.shape[:-1])
    parts = [zero] * _NLL_LEVELS
    mask = (1 << _NLL_POWER) - 1
    for b in range(values.shape[-1]):
        parts[0] = parts[0] - values[..., b]
        for j in range(_NLL_LEVELS - 1):
            if b & (mask << (j * _NLL_POWER)):
                break
            parts[j + 1] = parts[j + 1] + parts[j]
            parts[j] = zero
    total = zero
    for part in parts:
        total = total + part
    return total


_CE_PLAIN = {"weight": None, "size_average": None, "reduce": None, "ignore_index": -100, "label_smoothing": 0.0}
_CE_ARGS = ("input", "target", "weight", "size_average", "ignore_index", "reduce", "reduction", "label_smoothing")


def _serial_cross_entropy(args: tuple, kwargs: dict) -> Optional[torch.Tensor]:
    """``F.cross_entropy`` of one client's [B, C] logits and class targets with the value torch's CPU kernel gives
    (vmap's own rule sums the batch in another order); None for any other use (weights, smoothing, soft targets, an
    accelerator), which then runs as it is."""
    a = {**_CE_PLAIN, "reduction": "mean", **dict(zip(_CE_ARGS, args)), **kwargs}  # F.cross_entropy's signature
    logits, target = a["input"], a["target"]
    if logits.device.type != "cpu":  # the cascade is the CPU kernel's order; an accelerator's kernel has its own
        return None
    if any(a[k] != v for k, v in _CE_PLAIN.items()) or a["reduction"] not in ("mean", "sum") \
            or logits.dim() != 2 or target.dim() != 1 or target.is_floating_point():
        return None
    picked = F.log_softmax(logits, dim=1).gather(1, target.unsqueeze(1)).squeeze(1)
    fast = -picked.sum()  # the gradient (-1 each, as the kernel's), not the value
    with torch.no_grad():
        exact = _nll_order_sum(picked)
    total = exact + (fast - fast.detach())  # the kernel's value, the gradient of a sum
    return total / picked.shape[0] if a["reduction"] == "mean" else total


class OneClientOrder(TorchFunctionMode):
    """Inside a vectorised step: linear layers through :class:`_SerialLinear`, 2-d convolutions on a CPU through
    :class:`_SerialConv2d` and plain cross-entropies through :func:`_serial_cross_entropy`, so that a client's
    numbers are those it gets alone."""

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        if func is F.linear:
            x, weight, *rest = args
            return _SerialLinear.apply(x, weight, rest[0] if rest else kwargs.get("bias"))
        if func is F.conv2d:
            out = _serial_conv2d(args, kwargs)
            if out is not None:
                return out
        if func is F.cross_entropy:
            out = _serial_cross_entropy(args, kwargs)
            if out is not None:
                return out
        return func(*args, **kwargs)
