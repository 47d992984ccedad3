"""The pinned llama.cpp build: from the source vendored in the llama-cpp-python sdist; and a user's own.

Built once with cmake + ninja into a cache outside the checkout, keyed by the sdist's
sha256 plus the build flags; a manifest records commit, flags, compiler and binary hashes.
Run by `harness build` (and so by `make`).

A grid's llama.cpp arm may name its own build (`options.build`, docs/harness.md): `source: DIR`, a llama.cpp
tree built here with the same flags (plus its `flags:`), cached by a hash of the tree's content, its git
commit and dirty state recorded; or `bin: DIR`, prebuilt binaries, their sha256s and `--version` recorded and
marked not built by the harness. Inside `user_build(...)` every path below follows that build.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from functools import lru_cache
from pathlib import Path

from harness.errors import UserError
from harness.engines.llamacpp import releases
from harness.paths import cache_root, sha256_file
from harness.engines.llamacpp.usertree import (PINNED, SKIP_IN_TREE, BuildOption, UserBuild,  # noqa: F401
                                              check_user_build, git_state, tree_sha256)

SDIST_NAME = "llama-cpp-python"
SDIST_VERSION = "0.3.36"
SDIST_FILE = "llama_cpp_python-0.3.36.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
EXPECTED_COMMIT = "0c1e570"

TOOL_KEY = "llama.cpp"  # the tools' name in the keys of what they make (the model zoo's GGUF forms)
TARGETS = ("llama-bench", "llama-completion", "llama-quantize", "llama-perplexity", "llama-tokenize")
VARIANT_TARGETS = ("llama-bench",)  # an ISA variant serves runs only (models come from the native build)
# llama-server (the llama-server engine, harness/engines/server): the same source and flags with the server on, a
# build of its own so that the native build's key (and the model zoo's GGUF files keyed on it) stays as it is
SERVER_TARGETS = ("llama-server",)

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


# A release's build adds these: llama.cpp of mid-2025 builds libcurl in by default and stops where it is missing
RELEASE_FLAGS = ("-DLLAMA_CURL=OFF",)

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
# Whether the server build is the one in use (`server()`); it is always native and pinned.
_SERVER: contextvars.ContextVar[bool] = contextvars.ContextVar("llamacpp_server_build", default=False)
# The ISA variant in use (None: the native build). Set with `variant(tier)`; every path below follows it.
_VARIANT: contextvars.ContextVar[str | None] = contextvars.ContextVar("llamacpp_isa_variant", default=None)


def user_build_of(grid_path: str, opt: "BuildOption | None") -> UserBuild | None:
    """The arm's build, its paths resolved against the grid file's folder."""
    if opt is None or (opt.version == SDIST_VERSION and not opt.flags):  # the pinned release is the pinned build
        return None
    base = Path(grid_path).resolve().parent

    def where(p: str) -> Path:
        if p == PINNED:
            with user_build(None), variant(None):
                return source_dir()
        return (base / Path(p).expanduser()).resolve()
    return UserBuild(source=where(opt.source) if opt.source else None, bin=where(opt.bin) if opt.bin else None,
                     flags=tuple(opt.flags), release=opt.version)


_USER: contextvars.ContextVar[UserBuild | None] = contextvars.ContextVar("llamacpp_user_build", default=None)


@contextlib.contextmanager
def user_build(ub: UserBuild | None):
    """Use a user's build inside the block (None: the pinned one)."""
    token = _USER.set(ub)
    try:
        yield
    finally:
        _USER.reset(token)


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


@contextlib.contextmanager
def server():
    """Use the server build (the pinned source, native, with llama-server) inside the block."""
    token = _SERVER.set(True)
    v, u = _VARIANT.set(None), _USER.set(None)
    try:
        yield
    finally:
        _USER.reset(u)
        _VARIANT.reset(v)
        _SERVER.reset(token)


_NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


def amx_off(cpuinfo: str | None = None) -> tuple[str, ...]:
    """On a CPU with AMX the native builds leave ggml's AMX buffer type out (the compiler's AMX macros off, which
    an explicit -mno-* keeps against -march=native): with it, every quantized GGUF (q4_0, q8_0) dies with SIGSEGV
    in this pin (0c1e570; upstream llama.cpp issue 20824, in ggml_backend_amx_mul_mat). Elsewhere nothing, so the
    keys of hosts without AMX are unchanged."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return ()
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), [])
    if "amx_int8" not in flags and "amx_tile" not in flags:
        return ()
    return (f"-DCMAKE_C_FLAGS={_NO_AMX}", f"-DCMAKE_CXX_FLAGS={_NO_AMX}")


def cmake_flags() -> tuple[str, ...]:
    v = _VARIANT.get()
    ub = _USER.get()
    extra = ub.flags if ub is not None else ()
    if _SERVER.get():
        return tuple("-DLLAMA_BUILD_SERVER=ON" if f == "-DLLAMA_BUILD_SERVER=OFF" else f for f in CMAKE_FLAGS) \
            + amx_off()
    if v is None:
        return CMAKE_FLAGS + amx_off() + (RELEASE_FLAGS if ub is not None and ub.release else ()) + extra
    # amx_off() here too: the variants then compile libllama and common with the native build's very commands, and
    # share those objects through the compiler cache (an ISA-capped ggml leaves AMX out anyway)
    return tuple(f for f in CMAKE_FLAGS if f != "-DGGML_NATIVE=ON") + amx_off() + ISA_VARIANTS[v][0] + extra


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
    ub = _USER.get()
    if ub is not None and ub.release:  # a release: its sdist as the index stated it when fetched, llama-bench only
        sd = release_sdist(ub.release)
        return {"sdist_sha256": releases.expected_sha256(sd) or "not fetched", "release": ub.release,
                "flags": list(cmake_flags()), "targets": list(VARIANT_TARGETS), "native_isa": native_isa()}
    if ub is not None and ub.source is not None:  # a user's tree: its content, every flag, this CPU
        return {"tree_sha256": tree_sha256(ub.source), "flags": list(cmake_flags()), "targets": list(TARGETS),
                "native_isa": native_isa()}
    if _SERVER.get():
        return {"sdist_sha256": SDIST_SHA256, "flags": list(cmake_flags()), "targets": list(SERVER_TARGETS),
                "native_isa": native_isa()}
    if _VARIANT.get() is None:  # the native build's key, unchanged by variants existing
        return {"sdist_sha256": SDIST_SHA256, "flags": list(CMAKE_FLAGS + amx_off()), "targets": list(TARGETS),
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


def pinned_sdist() -> releases.Sdist:
    return releases.Sdist(SDIST_VERSION, SDIST_SHA256)


def release_sdist(version: str) -> releases.Sdist:
    """A release's sdist: the pinned one checked against its pinned sha256, any other against the index's."""
    return pinned_sdist() if version == SDIST_VERSION else releases.Sdist(version, None)


def ensure_sdist() -> Path:
    """The pinned sdist in the download cache, fetched if absent, verified by sha256 (releases.py)."""
    return releases.ensure(pinned_sdist())


def _require_tool(name: str, fix: str) -> str:
    exe = shutil.which(name)
    if not exe:
        raise UserError(name, "not found on PATH; it is needed to build llama.cpp", fix)
    return exe


VERSION_TIMEOUT_S = 30.0  # a tool's `--version` answers in milliseconds


def _version_output(cmd: list[str]) -> tuple[str, str] | None:
    """A tool's `--version` (stdout, stderr), run contained (its own session: what it starts is killed when it
    exits, and an output held open by such a child does not hold the harness) with a bound; None: it did not run
    or did not exit within VERSION_TIMEOUT_S."""
    from harness.engines.base import run_process
    try:
        r = run_process(cmd, dict(os.environ), VERSION_TIMEOUT_S, poll_s=None, stdout_limit=1 << 20)
    except OSError:
        return None
    if r.timed_out:
        return None
    return r.stdout, r.stderr


def _first_line(cmd: list[str]) -> str:
    got = _version_output(cmd)
    return ((got[0].strip().splitlines() if got else None) or ["unknown"])[0]


def _prebuilt_manifest(ub: UserBuild) -> dict:
    """What a folder of prebuilt binaries is: their sha256s and llama-bench's --version (not built here);
    hashed and asked once per process while the binaries' size, mtime and inode stay the same."""
    stamps = tuple((t, st.st_size, st.st_mtime_ns, st.st_ino) for t in TARGETS
                   if (ub.bin / t).is_file() and (st := (ub.bin / t).stat()))
    return json.loads(_prebuilt(str(ub.bin), stamps))


@lru_cache(maxsize=8)
def _prebuilt(bindir: str, stamps: tuple) -> str:
    ub = UserBuild(bin=Path(bindir))
    binaries = {t: {"path": str(ub.bin / t), "sha256": sha256_file(ub.bin / t), "size": size}
                for t, size, _, _ in stamps}
    got = _version_output([str(ub.bin / "llama-bench"), "--version"])
    if got is None:
        raise UserError(f"build.bin {ub.bin}", f"llama-bench --version did not answer within {VERSION_TIMEOUT_S:.0f} s",
                        "give a folder of llama.cpp's own binaries (it prints its version and exits)")
    version = " | ".join(line.strip() for line in (got[0] + got[1]).splitlines() if "version" in line.lower())
    found = re.search(r"\bcommit ([0-9a-f]{6,40})\b", version) or re.search(r"\(([0-9a-f]{6,40})\)", version)
    commit = found.group(1) if found else "unknown (prebuilt)"
    key = hashlib.sha256(json.dumps({t: b["sha256"] for t, b in binaries.items()}, sort_keys=True).encode())
    return json.dumps({  # text: each caller gets a dict of its own
        "engine": "llama.cpp", "source": {"prebuilt": str(ub.bin), "version_output": version or "none"},
        "build_commit": commit, "build_key": "prebuilt-" + key.hexdigest()[:16], "flags": ["unknown (prebuilt)"],
        "compiler": "unknown (prebuilt)", "native_isa": "unknown (prebuilt)", "binaries": binaries,
        "built_by_harness": False})


def load_manifest(verify: bool = False) -> dict:
    """The build manifest; with verify, every binary's sha256 is checked against it."""
    ub = _USER.get()
    if ub is not None and ub.bin is not None:
        return _prebuilt_manifest(ub)
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
    """Build (or reuse) the pinned llama.cpp, or the user's build in effect; returns the manifest."""
    ub = _USER.get()
    if ub is not None and ub.bin is not None:
        return _prebuilt_manifest(ub)
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
    if ub is not None and ub.release:
        releases.ensure(release_sdist(ub.release))  # first: the build's key names its sha256
        out = build_dir()
        if out.exists() and manifest_path().exists() and not rebuild:
            return load_manifest(verify=True)
    sdist = ensure_sdist() if ub is None else None
    root = llamacpp_root()
    root.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f"{build_key()}.tmp-", dir=root))
    log = stage / "build.log"
    t0 = time.time()
    try:
        commit, commit_full, src, source = _source(ub, sdist, stage)
        bdir = stage / "build"
        flags = list(cmake_flags()) + [f"-DLLAMA_BUILD_COMMIT={commit}", "-DLLAMA_BUILD_NUMBER=0"]
        targets = SERVER_TARGETS if _SERVER.get() else VARIANT_TARGETS if _VARIANT.get() is not None or (
            ub is not None and ub.release) else TARGETS
        launch, env, launcher = compiler_cache(stage)
        print(f"[llama.cpp] configuring {commit} in {stage}", file=sys.stderr)
        _logged([cmake, "-S", str(src), "-B", str(bdir), "-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}", *flags,
                 *launch], log, env)
        print(f"[llama.cpp] building {', '.join(targets)} (minutes cold on 2 cores; log {log})",
              file=sys.stderr)
        _logged([cmake, "--build", str(bdir), "--target", *targets, "-j", str(os.cpu_count() or 1)], log, env)
        binaries, static_libs = _keep_outputs(bdir, stage, out, targets)
        cache = _read_cmake_cache(bdir / "CMakeCache.txt")
        shutil.rmtree(bdir)
        manifest = {
            "engine": "llama.cpp",
            "source": source,
            "build_commit": commit,
            "build_commit_full": commit_full,
            "build_key": build_key(),
            "flags": flags,
            "generator": "Ninja " + _first_line([ninja, "--version"]),
            "cmake": _first_line([cmake, "--version"]),
            "compiler": _first_line([cache.get("CMAKE_CXX_COMPILER", cxx), "--version"]),
            "compiler_path": cache.get("CMAKE_CXX_COMPILER", cxx),
            "compiler_launcher": launcher,
            "native": _VARIANT.get() is None,
            "native_isa": native_isa() if _VARIANT.get() is None else None,
            "isa_variant": _VARIANT.get(),
            "binaries": binaries,
            "static_libs": static_libs,
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
        raise _failed(e, root, log, stage, ub) from e
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    print(f"[llama.cpp] built in {manifest['build_seconds']} s -> {out}", file=sys.stderr)
    return manifest


def _source(ub: UserBuild | None, sdist: Path | None, stage: Path) -> tuple[str, str, Path, dict]:
    """The tree to build, under the stage: (commit label, full commit, source dir, the manifest's source record)."""
    if ub is not None and ub.release:
        sd = release_sdist(ub.release)
        commit, commit_full, src = releases.extract(sd, releases.ensure(sd), stage)
        return commit, commit_full, src, {"package": SDIST_NAME, "version": ub.release, "sdist": sd.file,
                                          "sdist_sha256": releases.expected_sha256(sd), "release": True}
    if ub is not None:
        return _copy_user_tree(ub, stage)
    commit, commit_full, src = releases.extract(pinned_sdist(), sdist, stage, EXPECTED_COMMIT)
    return commit, commit_full, src, {"package": SDIST_NAME, "version": SDIST_VERSION, "sdist": SDIST_FILE,
                                      "sdist_sha256": SDIST_SHA256}


def _keep_outputs(bdir: Path, stage: Path, out: Path, targets: tuple[str, ...]) -> tuple[dict, list[str]]:
    """The built targets and static libraries copied into the stage: (each binary's final path, sha256 and size,
    the libraries' names). The static libraries stay, so that the project's own tools (native/) link against
    exactly the code the binaries run, without a second llama.cpp build."""
    bins = stage / "bin"
    bins.mkdir()
    binaries = {}
    for t in targets:
        shutil.copy2(bdir / "bin" / t, bins / t)
        binaries[t] = {"path": str(out / "bin" / t), "sha256": sha256_file(bins / t), "size": (bins / t).stat().st_size}
    libs = stage / "lib"
    libs.mkdir()
    for a in sorted(bdir.rglob("*.a")):
        shutil.copy2(a, libs / a.name)
    return binaries, sorted(a.name for a in libs.iterdir())


def _failed(e: subprocess.CalledProcessError, root: Path, log: Path, stage: Path, ub: UserBuild | None) -> UserError:
    """A failed build step: its log kept under failed-builds/ (it outlives the stage it was written in), the stage
    removed, and the one-line error naming the log."""
    kept = root / "failed-builds" / f"{build_key()}.log"
    kept.parent.mkdir(parents=True, exist_ok=True)
    if log.exists():
        os.replace(log, kept)
    tail_lines = _log_tail(kept) if kept.exists() else ""
    shutil.rmtree(stage, ignore_errors=True)
    what = f"llama.cpp build ({ub.label})" if ub else "llama.cpp build"
    return UserError(what, f"`{' '.join(map(str, e.cmd[:3]))} ...` exited {e.returncode}: {tail_lines[-400:]}",
                     f"read the build log {kept}; fix the tree (or install the missing tool) and run again")


def _log_tail(log: Path) -> str:
    """A failed build's last error in a line: the last line naming an error and the one after it, else the
    log's last three lines."""
    lines = [x.strip() for x in log.read_text(errors="replace").splitlines()[-60:] if x.strip()]
    errs = [i for i, x in enumerate(lines) if "error" in x.lower() and not x.startswith("-- ")]
    return " | ".join(lines[errs[0]:errs[0] + 2] if errs else lines[-3:])


def ccache_dir() -> Path:
    """The compiler cache of this machine's builds, keyed by this CPU's ISA (-march=native objects are only
    valid on it)."""
    return cache_root() / "ccache" / native_isa()


def compiler_cache(stage: Path) -> tuple[list[str], dict | None, str | None]:
    """ccache where it is installed (`make` installs it where apt-get can): the cmake arguments, the environment
    and ccache's version line for the manifest; nothing where it is not (EDGE_HARNESS_CCACHE=0 turns it off).
    The native, server and ISA-variant builds of one sdist compile libllama and common with the same commands:
    with ccache each of those objects is compiled once per machine, not once per build. Paths under the stage
    are rewritten relative to it (CCACHE_BASEDIR), so that builds in different stage folders share."""
    exe = shutil.which("ccache")
    if exe is None or os.environ.get("EDGE_HARNESS_CCACHE", "1") == "0":
        return [], None, None
    env = {**os.environ, "CCACHE_DIR": str(ccache_dir()), "CCACHE_BASEDIR": str(stage),
           "CCACHE_NOHASHDIR": "1", "CCACHE_MAXSIZE": "4G"}
    return ([f"-DCMAKE_C_COMPILER_LAUNCHER={exe}", f"-DCMAKE_CXX_COMPILER_LAUNCHER={exe}"], env,
            _first_line([exe, "--version"]))


def _logged(cmd: list[str], log: Path, env: dict | None = None) -> None:
    with open(log, "a") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        subprocess.run(cmd, check=True, stdout=f, stderr=subprocess.STDOUT, env=env)


def _copy_user_tree(ub: UserBuild, stage: Path) -> tuple[str, str, Path, dict]:
    """A copy of the user's tree (what was hashed is what is built): (commit label, full, source dir, record)."""
    check_user_build(ub, "build.source")
    tree = tree_sha256(ub.source)
    with user_build(None), variant(None):
        pinned = ub.source == source_dir()
    state = ({"git": f"the pinned sdist's vendored tree (llama.cpp {EXPECTED_COMMIT}, sdist sha256 {SDIST_SHA256})"}
             if pinned else git_state(ub.source))
    src = stage / "src"
    shutil.copytree(ub.source, src, symlinks=True, ignore=lambda d, names: [
        n for n in names if n in SKIP_IN_TREE or (n.startswith("build") and (Path(d) / n).is_dir())])
    if tree_sha256(src) != tree:
        raise UserError(str(ub.source), "build.source: the tree changed while it was copied", "run again")
    if "git_commit" in state:
        full = state["git_commit"] + ("-dirty" if state["git_dirty"] else "")
        commit = state["git_commit"][:7] + ("-dirty" if state["git_dirty"] else "")
    else:
        full, commit = f"tree:{tree}", f"tree-{tree[:10]}"
    return commit, full, src, {"user_source": str(ub.source), "tree_sha256": tree, **state,
                               "extra_flags": list(ub.flags)}


def engine_block(name: str, m: dict | None = None) -> dict:
    """The artifact's engine block for an engine running this build: version, commit, flags, compiler, keys."""
    m = m or load_manifest()
    src = m["source"]
    if "package" in src:
        version, origin = f"{src['package']}=={src['version']} (vendored)", {"sdist_sha256": src["sdist_sha256"]}
        if src.get("release"):  # a release a grid named, not the pinned build
            origin["release"] = src["version"]
    elif "prebuilt" in src:
        version = f"prebuilt: {src['version_output']}"
        origin = {"prebuilt": src["prebuilt"], "built_by_harness": False,
                  "binaries_sha256": {t: b["sha256"] for t, b in m["binaries"].items()}}
    else:
        version = f"user source {src['user_source']}"
        origin = {k: src[k] for k in ("user_source", "tree_sha256", "git_commit", "git_dirty", "git", "extra_flags")
                  if k in src}
    return {"name": name, "version": version, "build_commit": m["build_commit"],
            "build": {"flags": m["flags"], "compiler": m["compiler"], "build_key": m["build_key"],
                      "native_isa": m.get("native_isa", "unknown"), **origin,
                      **({"isa_variant": m["isa_variant"]} if m.get("isa_variant") else {})}}


def _read_cmake_cache(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in path.read_text(errors="replace").splitlines():
        if "=" in line and ":" in line and not line.startswith(("//", "#")):
            k, v = line.split("=", 1)
            out[k.split(":", 1)[0]] = v
    return out
