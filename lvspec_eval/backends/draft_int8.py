"""The draft's linear layers in int8 (model_arg `draft_dtype=int8`, CPU only).

An exact method's output never depends on the draft's numerics (the target verifies every token it
commits), only how many drafted tokens are accepted. On a CPU the draft's step is bound by the bytes
its weights take to read: int8 weights read a quarter of float32's and half of bfloat16's. Each
linear layer of the draft's language model and LM head is replaced by `Int8Linear`: weights rounded
per output channel (symmetric, scale = max |w| / 127), run by torch's dynamic quantized linear
(`torch.ops.quantized.linear_dynamic`: the activations quantized per call, int8 products, float
output), the kernels torch's quantized engine packs for this CPU (x86/fbgemm, or qnnpack on Arm).
The rest of the model (embeddings, norms, attention) stays in float32.

Measured 2026-12-06 (idle 2-core Xeon with AMX, the Qwen2.5 0.5B's 24 layers of linear shapes,
weights out of cache, one call per layer): float32 `F.linear` 53 ms for one row, 109 ms for four;
bfloat16 `F.linear` 48 / 50 ms, bfloat16 through oneDNN's packed weights 38 / 37 ms; int8 here
20 / 27 ms (the floor for 358 MB of int8 weights at this machine's 29.7 GB/s is 12 ms).

Memory: the quantized copy (1 byte a weight plus a float scale per row) replaces the float weight,
which is freed, except where the weight is shared (an LM head tied to the input embeddings keeps
the embedding's storage).
"""
from __future__ import annotations

import functools
import warnings

import torch


def supported(device: torch.device) -> bool:
    """Whether this torch has a quantized engine and the dynamic int8 linear ops on this device."""
    try:
        ops = torch.ops.quantized.linear_prepack, torch.ops.quantized.linear_dynamic
    except (AttributeError, RuntimeError):
        return False
    return device.type == "cpu" and all(ops) and any(
        e in torch.backends.quantized.supported_engines for e in ("x86", "fbgemm", "qnnpack", "onednn"))


def quantize_weight(weight: torch.Tensor) -> torch.Tensor:
    """weight [out, in] -> a per-output-channel symmetric int8 tensor (torch's quantized layout)."""
    w = weight.detach().float()
    scales = (w.abs().amax(dim=1) / 127).clamp_min(1e-12).double()
    zero_points = torch.zeros(w.shape[0], dtype=torch.long)
    with warnings.catch_warnings():  # torch marks quantized tensors deprecated; `supported` checks the ops
        warnings.simplefilter("ignore", UserWarning)
        return torch.quantize_per_channel(w, scales, zero_points, 0, torch.qint8)


@functools.cache
def reduce_range() -> bool:
    """Whether the dynamic int8 linear must quantize its input to 7 bits on this CPU (measured once).

    x86 kernels without VNNI multiply u8 x s8 pairs with an instruction that adds two products into a
    saturating int16 (AVX2's vpmaddubsw): with 8-bit activations the sums overflow and the output is
    wrong by far more than rounding (seen on an AMD EPYC with AVX2 only; tests/test_draft_precision.py).
    With VNNI (or AMX, or Arm) 8 bits are exact up to rounding. Which
    one this CPU runs is measured, not read from its flags: a probe layer whose every pair of products
    overflows int16, 8 bits kept where its output is within 1 % of the exact product.
    """
    # large inputs times full-scale weights of one sign: every pair of products overflows int16 in a
    # kernel that saturates, and costs only rounding (well under 1 %) in one that does not
    x = torch.linspace(0.5, 1.0, 256).repeat(4, 1)
    w = torch.ones(16, 256) * torch.linspace(0.5, 1.0, 16)[:, None]
    packed = torch.ops.quantized.linear_prepack(quantize_weight(w), None)
    exact = torch.nn.functional.linear(x, torch.ops.quantized.linear_unpack(packed)[0].dequantize())
    error = (torch.ops.quantized.linear_dynamic(x, packed, False) - exact).abs() / exact.abs()
    return bool(error.max() > 0.01)


class Int8Linear(torch.nn.Module):
    """An `nn.Linear` run in int8: the same input and output shapes and float dtype.

    `weight` is a stand-in of the original shape and dtype that holds one element (code reading
    `layer.weight` for its shape, dtype or device sees what it saw); `dequantized()` gives the
    weights the layer computes with."""

    def __init__(self, layer: torch.nn.Linear):
        super().__init__()
        self.in_features, self.out_features = layer.in_features, layer.out_features
        bias = None if layer.bias is None else layer.bias.detach().float()
        # the packed copy is the only one kept: one byte a weight (and a scale per row)
        self.packed = torch.ops.quantized.linear_prepack(quantize_weight(layer.weight), bias)
        self.out_dtype = layer.weight.dtype
        self.weight = torch.zeros(1, dtype=layer.weight.dtype).expand(self.out_features, self.in_features)
        self.bias = None if layer.bias is None else layer.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        out = torch.ops.quantized.linear_dynamic(x.reshape(rows, self.in_features).float(), self.packed,
                                                 reduce_range())
        return out.to(self.out_dtype).reshape(*x.shape[:-1], self.out_features)

    def dequantized(self) -> torch.Tensor:
        return torch.ops.quantized.linear_unpack(self.packed)[0].dequantize()

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per channel"


def quantize(modules) -> int:
    """Replace every `nn.Linear` inside `modules` (a language model, an LM head) by an `Int8Linear`;
    returns how many were replaced. A module given that is itself a linear layer is replaced in place
    of its own forward (its parent is not known here)."""
    count = 0
    for root in modules:
        if isinstance(root, torch.nn.Linear):
            int8 = Int8Linear(root)
            root.forward = int8.forward
            root._int8 = int8  # kept alive; the float weight stays (it may be tied to the embeddings)
            count += 1
            continue
        for parent in list(root.modules()):
            for name, child in list(parent.named_children()):
                if isinstance(child, torch.nn.Linear):
                    setattr(parent, name, Int8Linear(child))
                    count += 1
    return count
