"""The pinned llama.cpp build: from the source vendored in the llama-cpp-python sdist.

Built once with cmake + ninja into a cache outside the checkout, keyed by the sdist's
sha256 plus the build flags; a manifest records commit, flags, compiler and binary hashes.
Run by `harness build` (and so by `make`).
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from functools import lru_cache
from pathlib import Path

from harness.errors import UserError
from harness.paths import cache_root, downloads_dir, sha256_file

SDIST_NAME = "llama-cpp-python"
SDIST_VERSION = "0.3.36"
SDIST_FILE = "llama_cpp_python-0.3.36.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
EXPECTED_COMMIT = "0c1e570"

TOOL_KEY = "llama.cpp"  # the tools' name in the keys of what they make (the model zoo's GGUF forms)
TARGETS = ("llama-bench", "llama-completion", "llama-quantize", "llama-perplexity", "llama-tokenize")
VARIANT_TARGETS = ("llama-bench",)  # an ISA variant serves runs only (models come from the native build)

CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=ON",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
)


_OFF = ("-DGGML_AVX=OFF", "-DGGML_AVX2=OFF", "-DGGML_FMA=OFF", "-DGGML_F16C=OFF", "-DGGML_BMI2=OFF", "-DGGML_AVX_VNNI=OFF",
        "-DGGML_AVX512=OFF", "-DGGML_AVX512_VNNI=OFF", "-DGGML_AVX512_BF16=OFF")


def _on(*names: str) -> tuple[str, ...]:
    on = {f"-DGGML_{n}=OFF" for n in names}
    return tuple(f.replace("=OFF", "=ON") if f in on else f for f in _OFF)


# Builds capped at an x86 ISA tier (hardware emulation, docs/hardware.md): GGML_NATIVE off, the tier's
# instruction sets on and every higher one off; the project's tools compiled for the same tier.
ISA_VARIANTS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "baseline": (("-DGGML_NATIVE=OFF", "-DGGML_SSE42=ON", *_OFF), ("-march=x86-64-v2",)),
    "avx2": (("-DGGML_NATIVE=OFF", "-DGGML_SSE42=ON", *_on("AVX", "AVX2", "FMA", "F16C", "BMI2")), ("-march=x86-64-v3",)),
    "avx512": (("-DGGML_NATIVE=OFF", "-DGGML_SSE42=ON", *_on("AVX", "AVX2", "FMA", "F16C", "BMI2", "AVX512")),
               ("-march=x86-64-v4",)),
    "avx512-bf16": (("-DGGML_NATIVE=OFF", "-DGGML_SSE42=ON", *_on("AVX", "AVX2", "FMA", "F16C", "BMI2", "AVX512",
                                                               "AVX512_VNNI", "AVX512_BF16")),
                    ("-march=x86-64-v4", "-mavx512vnni", "-mavx512bf16")),
}
# The ISA variant in use (None: the native build). Set with `variant(tier)`; every path below follows it.
_VARIANT: contextvars.ContextVar[str | None] = contextvars.ContextVar("llamacpp_isa_variant", default=None)


@contextlib.contextmanager
def variant(tier: str | None):
    """Use the build capped at an ISA tier (None: native) inside the block."""
    if tier is not None and tier not in ISA_VARIANTS:
        raise UserError(tier, "no llama.cpp build variant for this ISA tier", f"known: {', '.join(ISA_VARIANTS)}")
    token = _VARIANT.set(tier)
    try:
        yield
    finally:
        _VARIANT.reset(token)


def cmake_flags() -> tuple[str, ...]:
    v = _VARIANT.get()
    if v is None:
        return CMAKE_FLAGS
    return tuple(f for f in CMAKE_FLAGS if f != "-DGGML_NATIVE=ON") + ISA_VARIANTS[v][0]


def tool_march() -> tuple[str, ...]:
    v = _VARIANT.get()
    return ("-march=native",) if v is None else ISA_VARIANTS[v][1]


def native_isa() -> str:
    """GGML_NATIVE compiles for this CPU: its ISA flags are part of what the binaries are."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return hashlib.sha256(" ".join(sorted(line.split(":", 1)[1].split())).encode()).hexdigest()[:12]
    return "unknown"


def _key_payload() -> dict:
    if _VARIANT.get() is None:  # the native build's key, unchanged by variants existing
        return {"sdist_sha256": SDIST_SHA256, "flags": list(CMAKE_FLAGS), "targets": list(TARGETS),
                "native_isa": native_isa()}
    return {"sdist_sha256": SDIST_SHA256, "flags": list(cmake_flags()), "targets": list(VARIANT_TARGETS),
            "isa_variant": _VARIANT.get()}


def code_key() -> str:
    """What the binaries compute: the sdist's content hash, every flag that changes the binaries, and the
    native ISA. Files the build makes (the model zoo's GGUF conversions and quantizations) key on this."""
    return hashlib.sha256(json.dumps(_key_payload()).encode()).hexdigest()[:16]


def build_key() -> str:
    """Cache key of the build directory: the code key, and what the build keeps (its static libraries)."""
    payload = json.dumps({**_key_payload(), "keeps_static_libs": True})
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def llamacpp_root() -> Path:
    """Where every build lives (outside the checkout), one folder per build key."""
    return cache_root() / TOOL_KEY


def build_dir() -> Path:
    return llamacpp_root() / build_key()


def manifest_path() -> Path:
    return build_dir() / "manifest.json"


def ensure_sdist() -> Path:
    """The pinned sdist in the download cache, fetched with pip if absent, verified by sha256."""
    dl = downloads_dir()
    dl.mkdir(parents=True, exist_ok=True)
    path = dl / SDIST_FILE
    if path.exists():
        digest = sha256_file(path)
        if digest == SDIST_SHA256:
            return path
        raise UserError(
            str(path),
            f"sha256 {digest[:12]}... does not match the pinned {SDIST_SHA256[:12]}... (truncated or corrupted download)",
            f"delete {path} and run `make` again",
        )
    print(f"[llama.cpp] downloading {SDIST_NAME}=={SDIST_VERSION} sdist", file=sys.stderr)
    with tempfile.TemporaryDirectory(dir=dl) as tmp:
        # pip prepares the sdist's metadata in an isolated build env (scikit-build-core): ~45 s, once
        r = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
             f"{SDIST_NAME}=={SDIST_VERSION}", "-d", tmp],
            capture_output=True, text=True,
        )
        got = Path(tmp) / SDIST_FILE
        if r.returncode != 0 and not got.exists():
            last = (r.stderr.strip().splitlines() or ["no output"])[-1]
            raise UserError(
                f"pip download {SDIST_NAME}=={SDIST_VERSION}",
                f"failed: {last}",
                "check the network to PyPI, or place the sdist in " + str(dl),
            )
        digest = sha256_file(got)
        if digest != SDIST_SHA256:
            raise UserError(str(got), f"downloaded sdist sha256 {digest[:12]}... is not the pinned one", "retry `make`")
        os.replace(got, path)
    return path


def _require_tool(name: str, fix: str) -> str:
    exe = shutil.which(name)
    if not exe:
        raise UserError(name, "not found on PATH; it is needed to build llama.cpp", fix)
    return exe


def _first_line(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, check=False).stdout
    except OSError:
        return "unknown"
    return (out.strip().splitlines() or ["unknown"])[0]


def load_manifest(verify: bool = False) -> dict:
    """The build manifest; with verify, every binary's sha256 is checked against it."""
    mp = manifest_path()
    if not mp.exists():
        raise UserError(str(mp), "llama.cpp is not built", "run `make llama.cpp` (or `make test`)")
    try:
        manifest = json.loads(mp.read_text())
    except (OSError, ValueError) as e:
        raise UserError(str(mp), f"unreadable build manifest: {e}", "run `make llama.cpp REBUILD=1`") from e
    if verify:
        for name, info in manifest["binaries"].items():
            p = Path(info["path"])
            if not p.exists():
                raise UserError(str(p), f"binary {name} is missing from the cached build", "run `make llama.cpp REBUILD=1`")
            if sha256_file(p) != info["sha256"]:
                raise UserError(str(p), f"binary {name} sha256 differs from the build manifest (corrupted build)",
                                "run `make llama.cpp REBUILD=1`")
    return manifest


def binary(name: str) -> Path:
    manifest = load_manifest()
    try:
        return Path(manifest["binaries"][name]["path"])
    except KeyError as e:
        raise UserError(str(manifest_path()), f"binaries.{name}: not in the build", f"known: {sorted(manifest['binaries'])}") from e


def source_dir() -> Path:
    return build_dir() / "src"


def build(rebuild: bool = False) -> dict:
    """Build (or reuse) the pinned llama.cpp; returns the manifest."""
    out = build_dir()
    if out.exists() and not rebuild:
        if manifest_path().exists():
            return load_manifest(verify=True)
        shutil.rmtree(out)  # an interrupted earlier build: no manifest means it never finished
    cmake = _require_tool("cmake", "apt-get install cmake")
    ninja = _require_tool("ninja", "apt-get install ninja-build")
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not cxx:
        raise UserError("c++", "no C++ compiler found", "apt-get install g++")
    sdist = ensure_sdist()
    root = llamacpp_root()
    root.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f"{build_key()}.tmp-", dir=root))
    t0 = time.time()
    try:
        with tarfile.open(sdist) as tf:
            members = [m for m in tf.getmembers() if "/vendor/llama.cpp/" in m.name or m.name.endswith(
                "/.git/modules/vendor/llama.cpp/HEAD")]
            tf.extractall(stage / "x", members=members, filter="data")
        top = stage / "x" / f"llama_cpp_python-{SDIST_VERSION}"
        commit_full = (top / ".git/modules/vendor/llama.cpp/HEAD").read_text().strip()
        commit = commit_full[:7]
        if commit != EXPECTED_COMMIT:
            raise UserError(str(sdist), f"vendored llama.cpp commit {commit} is not the pinned {EXPECTED_COMMIT}",
                            "check SDIST_SHA256 in harness/engines/llamacpp/build.py")
        src = stage / "src"
        os.replace(top / "vendor" / "llama.cpp", src)
        shutil.rmtree(stage / "x")
        bdir = stage / "build"
        flags = list(cmake_flags()) + [f"-DLLAMA_BUILD_COMMIT={commit}", "-DLLAMA_BUILD_NUMBER=0"]
        targets = TARGETS if _VARIANT.get() is None else VARIANT_TARGETS
        print(f"[llama.cpp] configuring {commit} in {stage}", file=sys.stderr)
        subprocess.run([cmake, "-S", str(src), "-B", str(bdir), "-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}", *flags],
                       check=True, stdout=subprocess.DEVNULL)
        print(f"[llama.cpp] building {', '.join(targets)} (a cold build takes ~6-13 min on 2 cores)", file=sys.stderr)
        subprocess.run([cmake, "--build", str(bdir), "--target", *targets, "-j", str(os.cpu_count() or 1)], check=True)
        bins = stage / "bin"
        bins.mkdir()
        final_bins = out / "bin"
        binaries = {}
        for t in targets:
            p = bdir / "bin" / t
            shutil.copy2(p, bins / t)
            binaries[t] = {"path": str(final_bins / t), "sha256": sha256_file(bins / t), "size": (bins / t).stat().st_size}
        # The static libraries stay, so that the project's own tools (harness/engines/llamacpp/native/) link against
        # exactly the code the binaries above run, without a second llama.cpp build.
        libs = stage / "lib"
        libs.mkdir()
        for a in sorted(bdir.rglob("*.a")):
            shutil.copy2(a, libs / a.name)
        cache = _read_cmake_cache(bdir / "CMakeCache.txt")
        shutil.rmtree(bdir)
        manifest = {
            "engine": "llama.cpp",
            "source": {"package": SDIST_NAME, "version": SDIST_VERSION, "sdist": SDIST_FILE, "sdist_sha256": SDIST_SHA256},
            "build_commit": commit,
            "build_commit_full": commit_full,
            "build_key": build_key(),
            "flags": flags,
            "generator": "Ninja " + _first_line([ninja, "--version"]),
            "cmake": _first_line([cmake, "--version"]),
            "compiler": _first_line([cache.get("CMAKE_CXX_COMPILER", cxx), "--version"]),
            "compiler_path": cache.get("CMAKE_CXX_COMPILER", cxx),
            "native": _VARIANT.get() is None,
            "native_isa": native_isa() if _VARIANT.get() is None else None,
            "isa_variant": _VARIANT.get(),
            "binaries": binaries,
            "static_libs": sorted(a.name for a in libs.iterdir()),
            "source_dir": str(out / "src"),
            "convert_script": str(out / "src" / "convert_hf_to_gguf.py"),
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "build_seconds": round(time.time() - t0, 1),
        }
        (stage / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        if out.exists():
            shutil.rmtree(out)
        os.replace(stage, out)
    except subprocess.CalledProcessError as e:
        shutil.rmtree(stage, ignore_errors=True)
        raise UserError("llama.cpp build", f"`{' '.join(map(str, e.cmd[:3]))} ...` exited {e.returncode}",
                        "read the compiler output above; install the missing tool and run `make` again") from e
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    print(f"[llama.cpp] built in {manifest['build_seconds']} s -> {out}", file=sys.stderr)
    return manifest


def engine_block(name: str, m: dict | None = None) -> dict:
    """The artifact's engine block for an engine running this build: version, commit, flags, compiler, keys."""
    m = m or load_manifest()
    return {"name": name, "version": f"{m['source']['package']}=={m['source']['version']} (vendored)",
            "build_commit": m["build_commit"],
            "build": {"flags": m["flags"], "compiler": m["compiler"], "build_key": m["build_key"],
                      "native_isa": m.get("native_isa", "unknown"), "sdist_sha256": m["source"]["sdist_sha256"],
                      **({"isa_variant": m["isa_variant"]} if m.get("isa_variant") else {})}}


NATIVE_DIR = Path(__file__).resolve().parent / "native"
# Link order matters for static archives: each one after the ones that use it.
TOOL_LIBS = ("libllama.a", "libggml.a", "libggml-cpu.a", "libggml-base.a")


def tool(name: str) -> Path:
    """A project tool (harness/engines/llamacpp/native/NAME.cpp) linked against the pinned build's static libraries.

    Cached beside the build, keyed by the tool's source sha256: editing the tool recompiles only it.
    Verified (or compiled) once per process.
    """
    return _tool(name, str(build_dir()), sha256_file(NATIVE_DIR / f"{name}.cpp"), tool_march())


@lru_cache(maxsize=None)
def _tool(name: str, _build_dir: str, digest: str, march: tuple[str, ...]) -> Path:
    src = NATIVE_DIR / f"{name}.cpp"
    manifest = load_manifest()
    if "static_libs" not in manifest:
        raise UserError(str(manifest_path()), "static_libs: this build kept no libraries", "run `make llama.cpp REBUILD=1`")
    out_dir = build_dir() / "tools" / digest[:16]
    exe = out_dir / name
    meta = out_dir / "tool.json"
    if exe.exists() and meta.exists():
        info = json.loads(meta.read_text())
        if sha256_file(exe) != info["sha256"]:
            raise UserError(str(exe), "sha256 differs from its tool.json (corrupted build)", f"delete {out_dir} and rerun")
        return exe
    cxx = manifest.get("compiler_path") or shutil.which("c++") or shutil.which("g++")
    if not cxx:
        raise UserError("c++", "no C++ compiler found", "apt-get install g++")
    srcdir = Path(manifest["source_dir"])
    libdir = build_dir() / "lib"
    stage = Path(tempfile.mkdtemp(prefix=f"{name}.tmp-", dir=build_dir()))
    cmd = [cxx, "-O2", "-std=c++17", *march, f"-I{srcdir / 'include'}", f"-I{srcdir / 'ggml' / 'include'}",
           f"-I{srcdir / 'vendor'}", str(src), *[str(libdir / lib) for lib in TOOL_LIBS],
           "-fopenmp", "-lpthread", "-ldl", "-lm", "-o", str(stage / name)]
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        shutil.rmtree(stage, ignore_errors=True)
        last = (r.stderr.strip().splitlines() or ["no output"])[-1]
        raise UserError(str(src), f"compiling {name} failed: {last}", "see the compiler message; `make llama.cpp REBUILD=1` "
                        "if the libraries are missing")
    info = {"name": name, "source": str(src.relative_to(NATIVE_DIR.parent.parent)), "source_sha256": digest,
            "sha256": sha256_file(stage / name), "build_key": build_key(), "command": cmd,
            "compile_seconds": round(time.time() - t0, 1)}
    (stage / "tool.json").write_text(json.dumps(info, indent=2) + "\n")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(stage, out_dir)
    return exe


def tool_info(name: str) -> dict:
    """The tool's record: source and binary sha256, the compile command and its duration."""
    return json.loads((tool(name).parent / "tool.json").read_text())


def _read_cmake_cache(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in path.read_text(errors="replace").splitlines():
        if "=" in line and ":" in line and not line.startswith(("//", "#")):
            k, v = line.split("=", 1)
            out[k.split(":", 1)[0]] = v
    return out
