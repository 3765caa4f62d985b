"""Which floating-point dtype each part of the course computes in, and which it stores weights in.

    compute_dtype("cuda")            # A100/L4/H100: "bfloat16"; T4: "float16"; CPU: "float32"
    resolve_dtype("auto", "cuda")    # the same; an explicit "float32"/"bfloat16"/"float16" wins
    describe_dtype("float16", "cuda")  # "float16 (Tesla T4, compute capability 7.5: no bf16 in hw)"
    amp_flags(profile)               # {"bf16": ..., "fp16": ...} for TrainingArguments / SFTConfig
    master_dtype()                   # torch.float32: the dtype of every weight an optimiser updates
    make_grad_scaler("cuda", needs_grad_scaler(model))   # PPO's loss scaler: on for a float16 base

Compute dtype, by device:
- CPU: float32. CPUs have no fast half-precision matmul worth the lost digits.
- CUDA with bf16 in hardware (compute capability >= 8.0: A100, L4, H100): bfloat16. It has float32's
  exponent range (no overflow, no loss scaling) and runs on the tensor cores.
- CUDA without it (T4, V100: capability 7.x): float16, with autocast and a gradient scaler. A T4
  runs fp16 matmuls on its tensor cores at ~65 TFLOPS against ~8 TFLOPS in float32 (about 8x), and
  decoding one token at a time is memory-bound: 2-byte weights halve the bytes read per step. Its
  catch is the range: float16's largest number is 65504 and its smallest normal one 6.1e-5, so small
  gradients underflow to 0. The scaler multiplies the loss by S before backward (the gradients by
  S), divides them by S again before the optimiser step, skips a step whose gradients overflowed to
  inf/NaN and halves S then (torch.amp.GradScaler).
  `torch.cuda.is_bf16_supported()` cannot make this choice: it returns True on a T4, where bf16 is
  emulated (and slow). The compute capability says what the hardware does.

Master weights: every weight an optimiser updates stays float32 (full SFT weights, LoRA matrices,
value and score heads). A bf16 weight has an 8-bit mantissa: an Adam update of relative size 1e-4
is below half its spacing (2^-9 ~ 2e-3) and rounds away, so most entries of a full bf16 model never
move at lr 5e-5. Low precision is for the arithmetic (autocast) and for frozen weights only.

Nothing heavy is imported at module level (profiles.py imports this module); torch is imported
inside the functions that need it.
"""

from __future__ import annotations

from typing import Any

#: The dtype names a profile may name explicitly.
DTYPE_NAMES = ("float32", "bfloat16", "float16")
#: The profile value that asks for `compute_dtype(device)`.
AUTO = "auto"
#: Dtype name of every weight an optimiser updates (master weights), whatever the compute dtype.
MASTER_DTYPE_NAME = "float32"
#: Lowest CUDA compute capability with bf16 arithmetic in hardware (Ampere, 8.0).
BF16_MIN_CAPABILITY = (8, 0)
#: What `compute_dtype("cuda")` answers where no CUDA device is visible (a CPU test of the gpu
#: profile): the nominal choice of a bf16-capable GPU, so the profile still names a real dtype.
NOMINAL_CUDA_DTYPE = "bfloat16"
#: Initial loss scale S of the fp16 gradient scaler. torch's default 2^16 overflows float16 as soon
#: as an activation gradient exceeds 65504 / 2^16 = 1, and every overflow costs a skipped step; 2^12
#: leaves room for activation gradients up to 16 and still lifts a gradient of 1e-9 to 4e-6, above
#: float16's smallest subnormal 6e-8.
GRAD_SCALER_INIT_SCALE = 2.0**12
#: Steps without overflow before S doubles (torch's default 2000 is longer than most PPO runs).
GRAD_SCALER_GROWTH_INTERVAL = 100
#: Below this loss scale a non-finite gradient is not an fp16 overflow any more but a broken run
#: (S has been halved log2(2^12) = 12 times in a row, or the unscaled gradient itself is inf/NaN).
MIN_LOSS_SCALE = 1.0


def check_dtype_name(dtype: str, allow_auto: bool = True) -> str:
    """`dtype` itself if it is one of DTYPE_NAMES (or "auto"), else ValueError naming the allowed
    values."""
    allowed = ((AUTO,) if allow_auto else ()) + DTYPE_NAMES
    if dtype not in allowed:
        raise ValueError(f"dtype must be one of {allowed}, got {dtype!r}")
    return dtype


def cuda_capability() -> tuple[int, int] | None:
    """(major, minor) compute capability of the current CUDA device, None where CUDA is not
    available or its capability cannot be read (a CPU-only torch build asked anyway raises
    AssertionError)."""
    # keeps this module free of torch: profiles, data and the world import in a blink
    import torch

    if not torch.cuda.is_available():
        return None
    try:
        major, minor = torch.cuda.get_device_capability()
    except (AssertionError, RuntimeError):
        return None
    return int(major), int(minor)


def compute_dtype(device: str) -> str:
    """The dtype name to compute in on `device` ("cpu", "cuda", "cuda:1"...): see the module
    docstring.

    "float32" on the CPU; on CUDA "bfloat16" from compute capability 8.0, "float16" below it, and
    NOMINAL_CUDA_DTYPE when no CUDA device is visible.
    """
    kind = str(device).split(":", 1)[0]
    if kind == "cpu":
        return "float32"
    if kind != "cuda":
        raise ValueError(f"device must be 'cpu' or 'cuda[:index]', got {device!r}")
    capability = cuda_capability()
    if capability is None:
        return NOMINAL_CUDA_DTYPE
    return "bfloat16" if capability >= BF16_MIN_CAPABILITY else "float16"


def resolve_dtype(dtype: str, device: str) -> str:
    """An explicit dtype name unchanged; "auto" -> `compute_dtype(device)`. Bad names raise
    ValueError."""
    check_dtype_name(dtype)
    return compute_dtype(device) if dtype == AUTO else dtype


def describe_dtype(dtype: str, device: str) -> str:
    """`dtype` and why it fits `device`, in one line for a notebook header, e.g.
    "float16 (Tesla T4, compute capability 7.5: no bf16 in hardware)"."""
    kind = str(device).split(":", 1)[0]
    capability = cuda_capability() if kind == "cuda" else None
    if kind == "cpu":
        why = "CPU"
    elif capability is None:
        why = "no CUDA device visible: the nominal GPU choice"
    else:
        # keeps this module free of torch: profiles, data and the world import in a blink
        import torch

        has_bf16 = capability >= BF16_MIN_CAPABILITY
        why = (
            f"{torch.cuda.get_device_name()}, compute capability {capability[0]}.{capability[1]}: "
            + ("bf16 in hardware" if has_bf16 else "no bf16 in hardware"))
    if dtype != compute_dtype(device):
        why += f"; set explicitly, the automatic choice is {compute_dtype(device)}"
    return f"{dtype} ({why})"


def master_dtype() -> Any:
    """torch.float32 (MASTER_DTYPE_NAME): the dtype every trained weight is stored in; load a model
    whose full weights train (SFT) or whose head trains (the reward model) with it."""
    # keeps this module free of torch: profiles, data and the world import in a blink
    import torch

    return getattr(torch, MASTER_DTYPE_NAME)


def amp_flags(profile: Any) -> dict[str, bool]:
    """Hugging Face TrainingArguments' mixed-precision flags for `profile` (its `dtype` and
    `device`).

    {"bf16": True} for bfloat16 and {"fp16": True} for float16 (autocast + GradScaler around float32
    master weights); for float32 both False. The CPU computes in float32 unless a profile names a
    16-bit dtype: then it autocasts as a GPU would (torch has bf16 and fp16 autocast and a
    GradScaler on the CPU), which is how the tests run the gpu profile's mixed-precision paths
    without a GPU.
    """
    dtype = resolve_dtype(profile.dtype, profile.device)
    return {"bf16": dtype == "bfloat16", "fp16": dtype == "float16"}


def needs_grad_scaler(module: Any) -> bool:
    """True when any parameter of `module` is float16: its activations (and their gradients) are
    float16 then, and small gradients underflow without loss scaling. bf16 and float32 need none."""
    # keeps this module free of torch: profiles, data and the world import in a blink
    import torch

    return any(param.dtype == torch.float16 for param in module.parameters())


def make_grad_scaler(device_type: str, enabled: bool) -> Any:
    """A `torch.amp.GradScaler` for `device_type` ("cpu"/"cuda") starting at GRAD_SCALER_INIT_SCALE;
    disabled (every call a pass-through: `scale` returns the loss, `step` just steps) unless
    `enabled`."""
    # keeps this module free of torch: profiles, data and the world import in a blink
    import torch

    return torch.amp.GradScaler(device_type, init_scale=GRAD_SCALER_INIT_SCALE,
                                growth_interval=GRAD_SCALER_GROWTH_INTERVAL, enabled=enabled)
