"""Faster forwards for the shared model's layers, same maths: LoRA folded into the base weight, and
GPT-2's eight-op GELU as one fused kernel (`fuse_tanh_gelu`).

    fuse_lora_layers(peft_model)   # every eligible LoRA layer now runs `_FusedLoRA`
    fuse_tanh_gelu(model)          # NewGELUActivation -> torch's tanh-GELU

peft computes a LoRA layer as two products added to the base output,

    y = x W + b + s (x A^T) B^T                             (W: (in, out), A: (r, in), B: (out, r))

which on a small model means two extra thin matrix products, a scale and an add per layer and
pass, and three more products in backward. The same function with the low-rank update folded
into the weight first,

    y = x W' + b,      W' = W + s A^T B^T                    (one (in, out) matrix, cheap to build)

needs one product forward, and backward gives exactly peft's gradients:

    dL/dx = g W'^T,    dL/dB = s g^T (x A^T),    dL/dA = s (g B)^T x      (g = dL/dy)

Outputs differ from peft's only by float rounding (about 1e-7 relative) and only in float32: in
bf16/fp16 folding a small update into a large weight would round most of it away, so those
layers keep peft's forward, as do layers with dropout, DoRA, a LoRA bias, merged weights, several
active adapters or extra arguments. The base weight itself is never modified (W' is a new tensor),
so disabling the adapters gives the exact base model.
"""

from __future__ import annotations

from typing import Any

import torch
from peft.tuners.lora.layer import Linear as LoraLinear
from torch import nn
from transformers.activations import GELUTanh, NewGELUActivation
from transformers.pytorch_utils import Conv1D


def _folded_matmul(x: torch.Tensor, merged: torch.Tensor,
                   bias: torch.Tensor | None) -> torch.Tensor:
    """x W' + b for x (..., in) and W' (in, out) -> (..., out)."""
    x2 = x.reshape(-1, x.shape[-1])  # (N, in)
    y = torch.addmm(bias, x2, merged) if bias is not None else x2 @ merged  # (N, out)
    return y.reshape(*x.shape[:-1], merged.shape[1])


class _FusedLoRA(torch.autograd.Function):
    """y = x W' + b with W' = W + s A^T B^T; gradients for x, A and B (base W, b stay frozen)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                lora_a: torch.Tensor, lora_b: torch.Tensor, scaling: float) -> torch.Tensor:
        # weight: the base weight as (in, out); lora_a: (r, in); lora_b: (out, r)
        merged = torch.addmm(weight, lora_a.t(), lora_b.t(), alpha=scaling)  # (in, out): W'
        x2 = x.reshape(-1, x.shape[-1])  # (N, in)
        # (x A^T)^T as A x^T: a product with N as its wide side runs several times faster on a CPU
        # than the thin (N, r) layout (benchmarks/README.md, "thin products")
        a_x = lora_a @ x2.t() if ctx.needs_input_grad[4] else None  # (r, N), kept for dL/dB
        # W' is rebuilt in backward rather than saved: one (in, out) copy per layer less memory
        ctx.save_for_backward(x2, weight, lora_a, lora_b, a_x)
        ctx.scaling = scaling
        ctx.x_shape = x.shape
        return _folded_matmul(x, merged, bias)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        x2, weight, lora_a, lora_b, a_x = ctx.saved_tensors
        g = grad.reshape(-1, grad.shape[-1])  # (N, out)
        dx = da = db = None
        if ctx.needs_input_grad[0]:
            merged = torch.addmm(weight, lora_a.t(), lora_b.t(), alpha=ctx.scaling)  # (in, out)
            dx = (g @ merged.t()).reshape(ctx.x_shape)  # dL/dx = g W'^T
        if ctx.needs_input_grad[3]:
            b_g = lora_b.t() @ g.t()  # (r, N) = (g B)^T
            da = ctx.scaling * (b_g @ x2)  # (r, in): s (g B)^T x
        if ctx.needs_input_grad[4]:
            db = ctx.scaling * (a_x @ g).t()  # (out, r): s g^T (x A^T) = s ((A x^T) g)^T
        return dx, None, None, da, db, None


class _FusedForward:
    """A LoRA layer's folded forward, called as `layer.forward(x)`. A callable object rather than a
    closure, so that `copy.deepcopy` of the model gives the copy a forward of its own layer (a
    closure would keep calling the original's)."""

    def __init__(self, layer: nn.Module, original: Any, is_conv1d: bool) -> None:
        self.layer, self.original, self.is_conv1d = layer, original, is_conv1d

    def __call__(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        layer, original = self.layer, self.original
        active = layer.active_adapters
        if (args or kwargs or layer.disable_adapters or layer.merged or len(active) != 1
                or active[0] not in layer.lora_A or x.dtype != torch.float32):
            return original(x, *args, **kwargs)  # peft's own path for everything else
        name = active[0]
        if (name in layer.lora_variant or layer.lora_bias.get(name, False)
                or not isinstance(layer.lora_dropout[name], nn.Identity)):
            return original(x, *args, **kwargs)
        base = layer.get_base_layer()
        weight = base.weight if self.is_conv1d else base.weight.t()  # (in, out)
        lora_a, lora_b = layer.lora_A[name].weight, layer.lora_B[name].weight  # (r, in), (out, r)
        if not weight.dtype == lora_a.dtype == lora_b.dtype == torch.float32:
            return original(x, *args, **kwargs)
        scaling = float(layer.scaling[name])
        if not torch.is_grad_enabled():  # sampling and rollout passes: the folded product alone
            merged = torch.addmm(weight, lora_a.t(), lora_b.t(), alpha=scaling)  # (in, out)
            return _folded_matmul(x, merged, base.bias)
        return _FusedLoRA.apply(x, weight, base.bias, lora_a, lora_b, scaling)


def fuse_lora_layers(model: nn.Module) -> int:
    """Give every peft LoRA `Linear` layer of `model` whose base is an `nn.Linear` or a GPT-2
    `Conv1D` the folded forward (calls that do not qualify use peft's). Returns how many."""
    count = 0
    for module in model.modules():
        if type(module) is not LoraLinear or getattr(module, "_fused_lora", False):
            continue
        base = module.get_base_layer()
        if type(base) not in (nn.Linear, Conv1D):
            continue
        # GPT-2's Conv1D stores (in, out), peft marks it fan_in_fan_out; nn.Linear stores (out, in)
        if module.fan_in_fan_out != (type(base) is Conv1D):
            continue
        # an instance attribute: nn.Module.__call__ finds it before the class's forward
        module.forward = _FusedForward(module, module.forward, type(base) is Conv1D)
        module._fused_lora = True
        count += 1
    return count


def fuse_tanh_gelu(model: nn.Module) -> int:
    """Swap transformers' `NewGELUActivation` (GPT-2's "gelu_new") for torch's fused tanh-GELU.

    gelu(x) = x / 2 * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3)))    (same formula on both sides)

    gelu_new evaluates it as eight separate tensor ops, each reading and writing the (B, L, 4H) MLP
    activation and saving it for backward; `F.gelu(approximate="tanh")` is one kernel forward and
    one backward. Outputs differ only by float rounding (about 1e-7). Swaps in place; returns how
    many modules were swapped.
    """
    targets = [(name, module) for name, module in model.named_modules()
               if type(module) is NewGELUActivation]
    for name, _ in targets:
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, GELUTanh())
    return len(targets)
