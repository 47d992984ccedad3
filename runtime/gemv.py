"""A decode-sized matrix-vector kernel for vLLM's CPU linear layers (patch `decode-gemv`, #17).

At batch 1 every linear layer of a decode step multiplies one token's activations (M = 1) by a weight
matrix that is read once from memory: the step is a stream of weights, and what decides its time is how
close each matmul comes to the machine's read bandwidth. vLLM's CPU linear runs oneDNN's matmul whatever
M is; runtime/gemv_bench.py measured it at 34-52% of the read bandwidth per weight shape on the AVX2 host
(fp32), and oneDNN has no bf16 matmul there (ATen's takes over). llama.cpp's own dot products reach ~70%.

The kernel: each thread takes a contiguous block of weight rows (at::parallel_for, torch's own OpenMP
threads, so the bind list and thread count of the run apply), and streams four rows at a time against
the token's activations with AVX2 FMA, accumulating in fp32 (bf16 weights are widened in registers:
half the bytes of fp32 for the same arithmetic). Up to MAX_M tokens share each pass over a row block, so a
row is read from memory once per call.

Built on first use with torch.utils.cpp_extension (g++, -O3 -mavx2 -mfma -fopenmp), cached outside the
checkout under <cache>/ext/, keyed by the sha256 of the source, the flags, torch's version and the Python ABI; a
finished build is loaded as it is (load()).
"""

from __future__ import annotations

import hashlib
import os
import platform
import time

MAX_M = 4  # tokens per call routed to the kernel; above it (prefill) the layer keeps a matmul path
CFLAGS = ("-O3", "-mavx2", "-mfma", "-fopenmp")

SOURCE_TEMPLATE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <atomic>
#include <chrono>
#include <immintrin.h>
#include <type_traits>
#include <vector>

constexpr int64_t MAX_M = @MAX_M@;

namespace {

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const at::BFloat16* p) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_hadd_ps(s, s);
  s = _mm_hadd_ps(s, s);
  return _mm_cvtss_f32(s);
}

// y[m, n] = sum_k x[m, k] * w[n, k] (+ b[n]) for rows n in [n0, n1): w is N x K row-major (vLLM's layout)
template <typename T>
void rows(const T* x, const T* w, const T* b, T* y, int64_t M, int64_t K, int64_t N, int64_t n0, int64_t n1) {
  const int64_t K8 = K & ~int64_t(7);
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) {
    const T* w0 = w + n * K;
    const T* w1 = w0 + K;
    const T* w2 = w1 + K;
    const T* w3 = w2 + K;
    for (int64_t m = 0; m < M; ++m) {
      const T* xm = x + m * K;
      __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      for (int64_t k = 0; k < K8; k += 8) {
        const __m256 xv = load8(xm + k);
        a0 = _mm256_fmadd_ps(load8(w0 + k), xv, a0);
        a1 = _mm256_fmadd_ps(load8(w1 + k), xv, a1);
        a2 = _mm256_fmadd_ps(load8(w2 + k), xv, a2);
        a3 = _mm256_fmadd_ps(load8(w3 + k), xv, a3);
      }
      float s[4] = {hsum(a0), hsum(a1), hsum(a2), hsum(a3)};
      for (int64_t k = K8; k < K; ++k) {
        const float xv = static_cast<float>(xm[k]);
        s[0] += static_cast<float>(w0[k]) * xv;
        s[1] += static_cast<float>(w1[k]) * xv;
        s[2] += static_cast<float>(w2[k]) * xv;
        s[3] += static_cast<float>(w3[k]) * xv;
      }
      for (int r = 0; r < 4; ++r)
        y[m * N + n + r] = static_cast<T>(s[r] + (b ? static_cast<float>(b[n + r]) : 0.f));
    }
  }
  for (; n < n1; ++n) {
    const T* wr = w + n * K;
    for (int64_t m = 0; m < M; ++m) {
      const T* xm = x + m * K;
      __m256 a0 = _mm256_setzero_ps();
      for (int64_t k = 0; k < K8; k += 8) a0 = _mm256_fmadd_ps(load8(wr + k), load8(xm + k), a0);
      float s = hsum(a0);
      for (int64_t k = K8; k < K; ++k) s += static_cast<float>(wr[k]) * static_cast<float>(xm[k]);
      y[m * N + n] = static_cast<T>(s + (b ? static_cast<float>(b[n]) : 0.f));
    }
  }
}

template <typename T>
void run(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b, torch::Tensor& y) {
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  const T* xp = x.data_ptr<T>();
  const T* wp = w.data_ptr<T>();
  const T* bp = b.defined() ? b.data_ptr<T>() : nullptr;
  T* yp = y.data_ptr<T>();
  at::parallel_for(0, N, 64, [&](int64_t n0, int64_t n1) { rows<T>(xp, wp, bp, yp, M, K, N, n0, n1); });
}

}  // namespace

// The kernel's own clock: calls and nanoseconds since the extension loaded (two steady_clock reads a call),
// read by the step-attribution instrument as the "linear_kernel" part inside the forward.
std::atomic<int64_t> g_calls{0}, g_ns{0};

std::vector<int64_t> counters() { return {g_calls.load(), g_ns.load()}; }

torch::Tensor linear_small_m(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias) {
  const auto t0 = std::chrono::steady_clock::now();
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous(), "edge_gemv: the weight must be a contiguous 2-D tensor");
  TORCH_CHECK(x.scalar_type() == w.scalar_type(), "edge_gemv: input and weight dtypes differ");
  const int64_t N = w.size(0), K = w.size(1);
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) == K, "edge_gemv: the input's last dimension is not the weight's K");
  torch::Tensor xc = x.reshape({-1, K}).contiguous();
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = N;
  torch::Tensor y = torch::empty({xc.size(0), N}, x.options());
  torch::Tensor b;
  if (bias.has_value() && bias->defined()) b = bias->to(x.scalar_type()).contiguous();
  if (x.scalar_type() == at::kFloat) run<float>(xc, w, b, y);
  else if (x.scalar_type() == at::kBFloat16) run<at::BFloat16>(xc, w, b, y);
  else TORCH_CHECK(false, "edge_gemv: float32 and bfloat16 only");
  g_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  ++g_calls;
  return y.view(shape);
}

// The routing as one operator of the dispatcher (torch.ops.edge_harness.linear_small_m), for the compiled
// forward: inductor's wrapper calls it with no Python in between.
torch::Tensor linear_routed(const torch::Tensor& x, const torch::Tensor& w, const c10::optional<torch::Tensor>& bias) {
  if (w.dim() == 2 && w.is_contiguous() && x.scalar_type() == w.scalar_type() && x.numel() <= MAX_M * w.size(1) &&
      (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16))
    return linear_small_m(x, w, bias);
  return at::linear(x, w, bias);
}

TORCH_LIBRARY(edge_harness, m) { m.def("linear_small_m(Tensor x, Tensor weight, Tensor? bias=None) -> Tensor"); }
TORCH_LIBRARY_IMPL(edge_harness, CPU, m) { m.impl("linear_small_m", &linear_routed); }
"""
SOURCE = SOURCE_TEMPLATE.replace("@MAX_M@", str(MAX_M))


def build_key() -> str:
    import sys

    import torch
    h = hashlib.sha256(SOURCE.encode())
    h.update(repr((CFLAGS, torch.__version__, sys.implementation.cache_tag, platform.machine())).encode())
    return h.hexdigest()


def unavailable() -> str | None:
    """None when the kernel can run here; else why not (it is then never used, and the manifest says so)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"the kernel is x86 AVX2 code; this machine is {platform.machine()}"
    import torch
    cap = torch.backends.cpu.get_cpu_capability()
    if cap not in ("AVX2", "AVX512"):
        # also what a hardware class below AVX2 caps torch to (ATEN_CPU_CAPABILITY): the kernel honours it
        return f"torch's CPU capability is {cap}: the kernel needs AVX2 and FMA"
    return None


_EXT = None


def load():
    """The compiled extension (built once per source/flags/torch version, then loaded from the cache)."""
    global _EXT
    if _EXT is None:
        key = build_key()
        name = f"edge_gemv_{key[:12]}"
        d = _cache_dir()
        _EXT = _load_built(d, name, key)
        if _EXT is None:
            from torch.utils.cpp_extension import load_inline
            d.mkdir(parents=True, exist_ok=True)
            _EXT = load_inline(name=name, cpp_sources=[SOURCE], functions=["linear_small_m", "counters"],
                               extra_cflags=list(CFLAGS), extra_ldflags=["-fopenmp"], build_directory=str(d),
                               verbose=False)
            (d / f"{name}.ok.tmp").write_text(key + "\n")
            os.replace(d / f"{name}.ok.tmp", d / f"{name}.ok")
    return _EXT


def _load_built(d, name: str, key: str):
    """The library a finished build left (its .ok file, holding the build key, is written after load_inline loaded
    it), loaded as it is: load_inline would run ninja again, which recompiles whenever the torch headers' timestamps
    are newer than the object (every fresh virtual environment)."""
    import importlib.util
    ok, lib = d / f"{name}.ok", d / f"{name}.so"
    if not (ok.is_file() and lib.is_file() and ok.read_text().strip() == key):
        return None
    import torch  # noqa: F401 - the library links against the process's libtorch
    spec = importlib.util.spec_from_file_location(name, lib)
    try:
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    except ImportError:
        return None
    return mod


def routed_linear(kernel, weight, fallback, max_m: int = MAX_M, traced=None):
    """A layer's cpu_linear: the kernel for up to max_m tokens, `fallback(x, weight, bias)` above. Under
    torch.compile (`eager: false`) the layer calls `traced` instead, one opaque op that routes inside
    (torch.ops.edge_harness.linear_small_m): the graph then holds no branch on the number of tokens."""
    import torch
    k = weight.shape[-1]
    compiling = torch.compiler.is_compiling  # bound once: cpu_linear runs for every layer of every step

    def cpu_linear(x, _weight, bias=None):
        if traced is not None and compiling():
            return traced(x, _weight, bias)  # the layer's own parameter, as vLLM passes it: a graph input
        if x.numel() <= max_m * k:
            return kernel(x, weight, bias)
        return fallback(x, weight, bias)
    return cpu_linear


_FAKE = False


def kernel_seconds() -> float | None:
    """Seconds the kernel has run in this process (its C++ clock), or None when it is not loaded here."""
    if _EXT is None:
        return None
    return _EXT.counters()[1] / 1e9


def traced_op():
    """torch.ops.edge_harness.linear_small_m, registered in C++ by the extension (the routing of cpu_linear:
    the kernel up to MAX_M tokens, ATen's linear above), with a shape-only fake registered here once per
    process, so that dynamo traces a layer's call as one node and inductor's wrapper calls the C++ op."""
    global _FAKE
    import torch
    load()
    if not _FAKE:
        @torch.library.register_fake("edge_harness::linear_small_m")
        def _(x, weight, bias=None):
            return x.new_empty((*x.shape[:-1], weight.shape[0]))
        _FAKE = True
    return torch.ops.edge_harness.linear_small_m.default


def install() -> dict:
    """Route vLLM's CPU linear layers (and the LM head) through the kernel at decode-sized M.

    Wraps vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm, which vLLM's linear and
    vocab-embedding methods import and call once per layer after loading its weights. An eligible layer
    (a contiguous 2-D float32 or bfloat16 weight) keeps its weight and gets a cpu_linear that runs the
    kernel up to MAX_M tokens and torch.nn.functional.linear above (vLLM's own fallback path); oneDNN's
    prepacked copy is not made, so the weights are in memory once. Any other layer goes to vLLM's dispatch.
    Returns the effect record; `layers` and `shapes` fill in as the model loads."""
    why = unavailable()
    if why:
        return {"declined": why}
    import torch
    from vllm.model_executor.layers import utils
    original = utils.dispatch_cpu_unquantized_gemm
    if getattr(original, "edge_gemv", False):
        return original.edge_gemv_effect
    t0 = time.perf_counter()
    cached = any(_cache_dir().glob("*.so"))
    kernel = load().linear_small_m
    op = traced_op()
    effect = {"kernel": "edge_gemv.linear_small_m (AVX2 FMA, fp32 accumulate)", "max_m": MAX_M,
              "above_max_m": "torch.nn.functional.linear on the same weight",
              "compiled": "torch.ops.edge_harness.linear_small_m (the same routing as one C++ operator)",
              "build": {"key": build_key()[:16], "cflags": list(CFLAGS), "cached": cached,
                        "load_s": round(time.perf_counter() - t0, 3)},
              "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(), "layers": 0, "shapes": {},
              "passed_to_vllm": 0}

    def dispatch(layer, remove_weight: bool) -> None:
        w = layer.weight
        if w.is_meta or w.dim() != 2 or w.dtype not in (torch.float32, torch.bfloat16) or not w.is_contiguous():
            effect["passed_to_vllm"] += 1
            return original(layer, remove_weight)
        layer.cpu_linear = routed_linear(kernel, w, torch.nn.functional.linear, traced=op)
        effect["layers"] += 1
        shape = f"{w.shape[0]}x{w.shape[1]} {str(w.dtype).replace('torch.', '')}"
        effect["shapes"][shape] = effect["shapes"].get(shape, 0) + 1

    dispatch.edge_gemv = True
    dispatch.edge_gemv_effect = effect
    dispatch.edge_gemv_original = original
    utils.dispatch_cpu_unquantized_gemm = dispatch
    return effect


def _cache_dir():
    from harness.paths import cache_root
    return cache_root() / "ext" / f"edge_gemv-{build_key()[:16]}"


def detect_no_decode_gemv() -> dict:
    """Defective while vLLM's CPU linear dispatch has no path of its own for decode-sized M (one oneDNN
    or ATen matmul whatever the number of tokens)."""
    import inspect
    import re
    try:
        from vllm.model_executor.layers import utils
    except Exception as e:  # noqa: BLE001 - a detector reports, never raises
        return {"defective": None, "evidence": f"cannot import vLLM's layer utils: {e}"}
    fn = getattr(utils, "dispatch_cpu_unquantized_gemm", None)
    fn = getattr(fn, "edge_gemv_original", fn)  # vLLM's own, also once this patch is installed
    if fn is None:
        return {"defective": False, "evidence": "vLLM no longer has dispatch_cpu_unquantized_gemm (nothing to route)"}
    src = inspect.getsource(fn) + inspect.getsource(getattr(utils, "cpu_unquantized_gemm", fn))
    small_m = re.search(r"gemv|\.size\(0\)\s*(<|<=|==)|shape\[0\]\s*(<|<=|==)|numel\(\)\s*(<|<=)", src)
    if small_m:
        return {"defective": False, "evidence": f"the CPU linear dispatch has a small-M path ({small_m.group(0)!r})"}
    kind = "oneDNN (create_onednn_mm)" if "create_onednn_mm" in src else "ATen"
    return {"defective": True, "evidence": f"every CPU linear layer runs {kind} whatever M: no decode-sized path"}


if __name__ == "__main__":  # build the extension ahead of a measured series: python -m runtime.gemv
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    t = time.perf_counter()
    load()
    print(f"edge_gemv {build_key()[:16]} ready in {time.perf_counter() - t:.1f} s under {_cache_dir()}")
