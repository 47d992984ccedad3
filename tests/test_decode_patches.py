"""The decode patches on trial (#17): decode-gemv's kernel against ATen's linear, its routing by M, the CPU
norm kernels' provider against vLLM's native composition, their selection and their detectors. The real
engine runs them in tests/test_engines_real.py (applied, read back) and tests/test_fidelity.py (greedy
output against the same build without them)."""

import json
import subprocess
import sys

import pytest

from runtime import gemv, patches


def _in_subprocess(code: str, timeout: int = 600) -> dict:
    """vLLM's IR ops and torch's extension loader are process-global: each check runs in its own process."""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_candidates_are_opt_in():
    for name in ("decode-gemv", "cpu-norm-kernels"):
        assert name in patches.NAMES and name not in patches.FIXES
        assert patches.selected({"EDGE_HARNESS_PATCHES": f"all,{name}"}) == patches.FIXES + (name,)
    p = {x.name: x for x in patches.PATCHES}
    assert p["decode-gemv"].candidate and not p["decode-gemv"].instrument


def test_routing_by_number_of_tokens():
    """Up to MAX_M tokens go to the kernel, more to the fallback, both with the layer's own weight."""
    import torch
    calls = []
    w = torch.zeros(3, 8)
    lin = gemv.routed_linear(lambda x, wt, b: calls.append(("kernel", x.shape[0], wt is w)),
                             w, lambda x, wt, b: calls.append(("fallback", x.shape[0], wt is w)))
    for m in (1, gemv.MAX_M, gemv.MAX_M + 1, 128):
        lin(torch.zeros(m, 8), None, None)
    assert calls == [("kernel", 1, True), ("kernel", gemv.MAX_M, True), ("fallback", gemv.MAX_M + 1, True),
                     ("fallback", 128, True)]


@pytest.mark.skipif(gemv.unavailable() is not None, reason="needs an x86 CPU with AVX2 (torch's capability)")
def test_gemv_kernel_matches_aten_linear():
    """fp32 within float rounding of ATen's linear (errors against the largest output); bf16 within one bf16
    rounding of the fp32 product (2^-8); row
    tails (N not a multiple of 4), K tails (not a multiple of 8), M up to MAX_M + 1, bias, 3-D input; and the C++
    operator the compiled forward calls routes the same way and traces as one node; a second load in the process
    reads the finished build without compiling."""
    got = _in_subprocess("""
import json, torch
from runtime import gemv
torch.manual_seed(0)
k = gemv.load().linear_small_m
worst = {}
for dt in (torch.float32, torch.bfloat16):
    for n, kk in ((13, 37), (960, 576), (64, 8), (5, 3)):
        for m in (1, 2, gemv.MAX_M + 1):
            for bias in (False, True):
                x = torch.randn(m, kk).to(dt)
                w = (torch.randn(n, kk) * 0.05).to(dt)
                b = torch.randn(n).to(dt) if bias else None
                ref = torch.nn.functional.linear(x.float(), w.float(), None if b is None else b.float())
                y = k(x, w, b)
                assert y.dtype == dt and y.shape == (m, n)
                err = float((y.float() - ref).abs().max() / ref.abs().max())  # against the output's scale
                key = str(dt)
                worst[key] = max(worst.get(key, 0.0), err)
x3 = torch.randn(1, 1, 576)
w = torch.randn(96, 576)
assert k(x3, w, None).shape == (1, 1, 96)
# the dispatcher's operator (what a compiled forward calls): the kernel up to MAX_M tokens, ATen's linear above,
# traceable as one node (its fake gives the shape)
op = gemv.traced_op()
x1, xm = torch.randn(1, 576), torch.randn(gemv.MAX_M + 1, 576)
assert torch.equal(op(x1, w, None), k(x1, w, None))
assert torch.equal(op(xm, w, None), torch.nn.functional.linear(xm, w))
f = torch.compile(lambda x: op(x, w, None) * 2, fullgraph=True, backend="aot_eager")
assert torch.equal(f(x1), 2 * k(x1, w, None))
# a finished build is loaded as it is: load_inline (whose ninja recompiled in every fresh virtual environment, the
# torch headers being newer than the object) is not called again
import torch.utils.cpp_extension as ce
gemv._EXT, ce.load_inline = None, None
assert torch.equal(gemv.load().linear_small_m(x1, w, None), k(x1, w, None))
print(json.dumps(worst))
""")
    assert got["torch.float32"] < 1e-5, got
    assert got["torch.bfloat16"] < 2 ** -8, got


def test_norm_provider_matches_native_and_goes_first():
    got = _in_subprocess("""
import json, torch
from runtime import norms
from vllm import ir
from vllm.config.kernel import IrOpPriorityConfig
reg = norms.register()
prio = IrOpPriorityConfig.with_default(["native"])
lists = norms.priority(prio)
x, w = torch.randn(2, 576), torch.ones(576)
with ir.ops.rms_norm.set_priority(lists["rms_norm"]):
    used = ir.ops.rms_norm.dispatch(x, w, 1e-5, None).provider
    odd = ir.ops.rms_norm.dispatch(x.t(), torch.ones(2), 1e-5, None).provider  # non-contiguous: native
print(json.dumps({"reg": reg, "lists": lists, "used": used, "odd": odd}))
""")
    assert "declined" not in got["reg"], got["reg"]
    assert got["reg"]["max_abs_diff_vs_native"]["float32"] < 1e-4
    assert got["lists"] == {"rms_norm": ["edge_cpu_c", "native"], "fused_add_rms_norm": ["edge_cpu_c", "native"]}
    assert got["used"] == "edge_cpu_c" and got["odd"] == "native"


def test_detectors_find_both_defects_in_this_vllm(vllm_process):
    """Each detector's verdict as the runtime's manifest records it (the manifest runs every detector, once per
    process: conftest's vllm_process)."""
    got = {m["name"]: m["detector"] for m in vllm_process["manifest"]}
    assert got["decode-gemv"]["defective"] is True, got["decode-gemv"]
    assert got["cpu-norm-kernels"]["defective"] is True, got["cpu-norm-kernels"]
