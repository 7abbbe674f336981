"""float8 (e4m3) linear layers through ``torch._scaled_mm``, for ``model.dtype: float8_e4m3fn``.

Every ``nn.Linear`` (the LM head included) is replaced by :class:`Float8Linear`: its weight is
stored in ``torch.float8_e4m3fn`` with one scale per tensor (``amax / 448``, 448 being the
largest e4m3 value), and each call quantizes its input the same way on the fly (dynamic
per-tensor scaling) and multiplies in float8 with ``torch._scaled_mm``, accumulating and
returning the compute dtype (bfloat16 on CUDA, float32 on the CPU). Embeddings, norms and
everything else stay in the compute dtype.

Whether this runs depends on the torch build and the device: CUDA needs a GPU of compute
capability 8.9 or newer (Ada, Hopper: L4, L40, H100, RTX 40xx); recent CPU builds run it too
(slowly: it is for checking numerics, not speed). :func:`float8_status` probes it with one tiny
matmul, so that an unsupported machine gets a clear message before any model is loaded.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

E4M3_MAX = 448.0


def _quantize(t: Any, fp8: Any) -> tuple[Any, Any]:
    """``t`` as float8 and its per-tensor scale (float32 scalar tensor)."""
    import torch

    amax = t.detach().abs().amax().float().clamp(min=1e-12)
    scale = amax / E4M3_MAX
    q = (t.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(fp8)
    return q, scale.to(torch.float32)


def float8_status(device: str) -> tuple[bool, str]:
    """Whether a float8 e4m3 ``_scaled_mm`` runs on ``device`` with this torch build, and why not."""
    try:
        import torch
    except ImportError:
        return False, "torch is not installed"
    fp8 = getattr(torch, "float8_e4m3fn", None)
    if fp8 is None or not hasattr(torch, "_scaled_mm"):
        return False, f"torch {torch.__version__} has no float8_e4m3fn dtype or no _scaled_mm"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            return False, "no CUDA device"
        major, minor = torch.cuda.get_device_capability(torch.device(device))
        if (major, minor) < (8, 9):
            name = torch.cuda.get_device_name(torch.device(device))
            return False, (f"{name} has compute capability {major}.{minor}; float8 matmuls need 8.9 or newer "
                           "(L4, L40, H100, RTX 40xx)")
    try:
        a = torch.ones(16, 32, device=device)
        b = torch.ones(16, 32, device=device)
        qa, sa = _quantize(a, fp8)
        qb, sb = _quantize(b, fp8)
        out = torch._scaled_mm(qa, qb.t(), scale_a=sa, scale_b=sb, out_dtype=compute_dtype(device))
        if float(out[0, 0]) != 32.0:
            return False, f"torch._scaled_mm on {device} gave {float(out[0, 0])} for 32.0"
    except Exception as exc:  # unsupported device/dtype combinations raise RuntimeError or NotImplementedError
        return False, f"torch {torch.__version__} cannot run float8 matmuls on {device}: {type(exc).__name__}: {exc}"
    return True, f"torch {torch.__version__} runs float8 e4m3 matmuls (torch._scaled_mm) on {device}"


def compute_dtype(device: str) -> Any:
    """The dtype a float8 model computes and returns in: bfloat16 on CUDA, float32 elsewhere."""
    import torch

    return torch.bfloat16 if device.startswith("cuda") else torch.float32


def _linear_class() -> Any:
    import torch
    from torch import nn

    class Float8Linear(nn.Module):
        """A linear layer with a float8 e4m3 weight (per-tensor scale) and float8 matmuls."""

        def __init__(self, linear: nn.Linear) -> None:
            super().__init__()
            self.in_features = linear.in_features
            self.out_features = linear.out_features
            q, scale = _quantize(linear.weight.data, torch.float8_e4m3fn)
            self.register_buffer("weight_fp8", q.contiguous())
            self.register_buffer("weight_scale", scale)
            self.bias = None if linear.bias is None else nn.Parameter(linear.bias.data.clone(), requires_grad=False)

        def forward(self, x: Any) -> Any:
            shape = x.shape
            x2 = x.reshape(-1, self.in_features)
            qx, sx = _quantize(x2, torch.float8_e4m3fn)
            weight: Any = self.weight_fp8
            scale: Any = self.weight_scale
            y = torch._scaled_mm(qx, weight.t(), scale_a=sx, scale_b=scale, out_dtype=x.dtype)
            if self.bias is not None:
                y = y + self.bias.to(y.dtype)
            return y.reshape(*shape[:-1], self.out_features)

        def extra_repr(self) -> str:
            return f"in_features={self.in_features}, out_features={self.out_features}, weight=float8_e4m3fn"

    return Float8Linear


@lru_cache(maxsize=1)
def float8_linear_class() -> Any:
    """The :class:`Float8Linear` module class (built on first use: torch is imported lazily)."""
    return _linear_class()


def quantize_float8(model: Any) -> Any:
    """Replace every ``nn.Linear`` of ``model`` in place by a float8 one; returns ``model``.

    Tied weights (an LM head sharing the embedding matrix) are untied: the embedding keeps
    its compute-dtype copy, the head gets a float8 one.
    """
    from torch import nn

    cls = float8_linear_class()
    for _, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, child_name, cls(child))
    return model
