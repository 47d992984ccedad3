"""The project's own native tools (edge-bench, edge-fidelity: harness/engines/llamacpp/native), compiled against
the llama.cpp build in effect (native, an ISA variant or a user's build) and cached by its key."""

from __future__ import annotations

import contextvars
import json
import os
import shutil
import subprocess
import tempfile
import time
from functools import lru_cache
from pathlib import Path

from harness.errors import UserError
from harness.paths import sha256_file
from harness.engines.llamacpp.build import build_dir, build_key, load_manifest, manifest_path, tool_march


NATIVE_DIR = Path(__file__).resolve().parent / "native"
# Link order matters for static archives: each one after the ones that use it.
TOOL_LIBS = ("libllama.a", "libggml.a", "libggml-cpu.a", "libggml-base.a")


def tool(name: str) -> Path:
    """A project tool (harness/engines/llamacpp/native/NAME.cpp) linked against the pinned build's static libraries.

    Cached beside the build, keyed by the tool's source sha256: editing the tool recompiles only it.
    Verified (or compiled) once per process.
    """
    return _tool(name, str(build_dir()), sha256_file(NATIVE_DIR / f"{name}.cpp"), tool_march())


def tools(names: tuple[str, ...]) -> list[Path]:
    """tool() of each name, compiled side by side (each compile is one single-threaded compiler process), each in
    this context (the build in use)."""
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=max(1, min(len(names), os.cpu_count() or 1))) as pool:
        futures = [pool.submit(contextvars.copy_context().run, tool, n) for n in names]
        return [f.result() for f in futures]


@lru_cache(maxsize=None)
def _tool(name: str, _build_dir: str, digest: str, march: tuple[str, ...]) -> Path:
    src = NATIVE_DIR / f"{name}.cpp"
    manifest = load_manifest()
    if manifest.get("built_by_harness") is False:
        raise UserError(f"build.bin {manifest['source']['prebuilt']}", f"{name} links against a build's static "
                        "libraries, and prebuilt binaries come without them", "use engine llama-bench with build.bin, "
                        "or build: {source: DIR} to have the harness build the tree")
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
