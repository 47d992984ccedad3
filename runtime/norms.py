"""vLLM's own C++ RMSNorm kernels on the CPU (patch `cpu-norm-kernels`, #17).

vLLM routes RMSNorm through its IR ops (vllm.ir.ops.rms_norm and fused_add_rms_norm), each with
providers chosen by a per-platform priority. Its C++ provider ("vllm_c": torch.ops._C.rms_norm and
fused_add_rms_norm) is registered as supported on CUDA-alike and XPU devices only, and the CPU platform's
priority is ["native"]: on the CPU every norm of every layer runs the PyTorch-native composition, about
ten eager ATen calls (casts, add, pow, mean, rsqrt, two multiplies) for two per layer at batch 1, although
vLLM's CPU build ships the same kernels (csrc/cpu: rms_norm, fused_add_rms_norm).

The patch registers a provider "edge_cpu_c" that calls those CPU kernels (for contiguous 2-D inputs with a
weight of the input's dtype and no variance-size override, the shapes a decoder's norms have; anything else
falls through to native), and the runtime's platform puts it first in the CPU priority. Before it is
used, the provider is checked against native on a random input in this process: a mismatch declines it.
"""

# no `from __future__ import annotations`: vLLM infers each provider's op schema from its live annotations
PROVIDER = "edge_cpu_c"
OPS = ("rms_norm", "fused_add_rms_norm")


def unavailable():
    import torch
    from vllm.platforms import current_platform
    current_platform.import_kernels()  # loads vLLM's compiled ops (torch.ops._C) where nothing has yet
    missing = [n for n in OPS if not hasattr(torch.ops._C, n)]
    if missing:
        return f"this vLLM build has no CPU kernel torch.ops._C.{missing[0]}"
    return None


def register() -> dict:
    """Register the provider on both IR ops (once per process); returns what the check found."""
    import torch
    from torch import Tensor
    from vllm import ir

    why = unavailable()
    if why:
        return {"declined": why}
    if PROVIDER in ir.ops.rms_norm.impls:
        return REGISTERED

    def plain(x, weight, variance_size) -> bool:
        return (variance_size is None and weight is not None and weight.dtype == x.dtype and x.dim() == 2
                and x.is_contiguous() and x.device.type == "cpu")

    def rms_supports(x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None) -> bool:
        return plain(x, weight, variance_size)

    def add_supports(x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float,
                     variance_size: int | None = None) -> bool:
        return plain(x, weight, variance_size) and x_residual.is_contiguous() and x_residual.shape == x.shape

    @ir.ops.rms_norm.register_impl(PROVIDER, supports_args=rms_supports)
    def rms_norm(x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None) -> Tensor:
        out = torch.empty_like(x)
        torch.ops._C.rms_norm(out, x, weight, epsilon)
        return out

    @ir.ops.fused_add_rms_norm.register_impl(PROVIDER, supports_args=add_supports, inplace=True)
    def fused_add_rms_norm(x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float,
                           variance_size: int | None = None) -> tuple[Tensor, Tensor]:
        torch.ops._C.fused_add_rms_norm(x, x_residual, weight, epsilon)
        return x, x_residual

    try:
        REGISTERED.update(check())
    except Exception as e:  # noqa: BLE001 - a kernel that cannot run its check is declined, not fatal
        REGISTERED.update({"declined": f"the check against native raised {type(e).__name__}: {e}"})
    return REGISTERED


REGISTERED: dict = {}


def check(hidden: int = 576, tokens: int = 3) -> dict:
    """The provider against native on one random input per op and dtype: the largest absolute difference."""
    import torch
    from vllm import ir
    g = torch.Generator().manual_seed(0)
    worst = {}
    for dt in (torch.float32, torch.bfloat16):
        x = torch.randn(tokens, hidden, generator=g).to(dt)
        r = torch.randn(tokens, hidden, generator=g).to(dt)
        w = (1 + 0.1 * torch.randn(hidden, generator=g)).to(dt)
        want = ir.ops.rms_norm.impls["native"].impl_fn(x, w, 1e-5)
        got = ir.ops.rms_norm.impls[PROVIDER].impl_fn(x, w, 1e-5)
        wo, wr = ir.ops.fused_add_rms_norm.impls["native"].impl_fn(x.clone(), r.clone(), w, 1e-5)
        go, gr = ir.ops.fused_add_rms_norm.impls[PROVIDER].impl_fn(x.clone(), r.clone(), w, 1e-5)
        worst[str(dt).replace("torch.", "")] = max(float((a.float() - b.float()).abs().max())
                                                   for a, b in ((want, got), (wo, go), (wr, gr)))
    tol = {"float32": 1e-4, "bfloat16": 0.07}  # bf16: one rounding step of values up to ~4 apart
    bad = [d for d, v in worst.items() if v > tol[d]]
    out = {"max_abs_diff_vs_native": worst}
    if bad:
        out["declined"] = f"the CPU kernel differs from native by {worst[bad[0]]:.3g} in {bad[0]}"
    return out


def priority(prio) -> dict:
    """Put the provider first for both ops in an IrOpPriorityConfig (the platform's default); returns the lists."""
    for name in OPS:
        setattr(prio, name, [PROVIDER] + [p for p in (getattr(prio, name) or ["native"]) if p != PROVIDER])
    return {name: list(getattr(prio, name)) for name in OPS}


def detect_native_norms_on_cpu() -> dict:
    """Defective while the CPU platform's IR priority leaves both norms to the native composition."""
    try:
        from vllm.platforms.cpu import CpuPlatform
        from vllm.kernels import vllm_c  # noqa: F401 - registers vLLM's own providers
        from vllm import ir
    except Exception as e:  # noqa: BLE001 - a detector reports, never raises
        return {"defective": None, "evidence": f"cannot import vLLM's CPU platform or IR ops: {e}"}
    try:
        prio = CpuPlatform.get_default_ir_op_priority(None)
    except Exception as e:  # noqa: BLE001
        return {"defective": None, "evidence": f"cannot read the CPU platform's IR priority: {e}"}
    lists = {n: list(getattr(prio, n, None) or []) for n in OPS}
    native_only = all(lst[:1] in ([], ["native"]) for lst in lists.values())
    c_on_cpu = {n: getattr(ir.ops, n).impls.get("vllm_c") is not None and getattr(ir.ops, n).impls["vllm_c"].supported
                for n in OPS}
    if native_only and not any(c_on_cpu.values()):
        return {"defective": True, "evidence": f"CPU priority {lists}; vLLM's C provider unsupported on CPU"}
    return {"defective": False, "evidence": f"CPU priority {lists}; vLLM's C provider on CPU: {c_on_cpu}"}
