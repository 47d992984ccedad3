"""A grid arm's own llama.cpp (options.build): a source tree the harness builds, or prebuilt binaries.

The refusals (one line, exit 2, nothing run) and the tree's identity are checked here without compiling; a
folder of prebuilt binaries runs llama-bench for real; a tree that does not build fails with its log's path
and last lines. A full build of a source tree takes minutes: it is the published series
grids/llamacpp-builds.yaml, not a test."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from harness.engines.llamacpp import build as llamacpp_build
from harness.store import Store, load_path

GRID = """
name: ub
model: tiny-llama
arms:
  - {{name: pinned, engine: llama-bench, form: gguf-f32}}
  - {{name: mine, engine: {engine}, form: gguf-f32, options: {{build: {build}}}}}
workload: {{prompt_len: 8, context_len: 64, gen_len: 4}}
threads: 1
passes: 1
repetitions: 1
warmups: 0
"""


def _grid(tmp_path: Path, build: str, engine: str = "llama-bench") -> Path:
    g = tmp_path / "ub.yaml"
    g.write_text(GRID.format(build=build, engine=engine))
    return g


def _fake_tree(root: Path, cmake: str = "project(x)\n") -> Path:
    (root / "ggml").mkdir(parents=True)
    (root / "CMakeLists.txt").write_text(cmake)
    (root / "src.c").write_text("int main(void) { return 0; }\n")
    return root


@pytest.mark.parametrize("build, says", [
    ("{source: a, bin: b}", "exactly one of source"),
    ("{}", "exactly one of source"),
    ("{bin: b, flags: [-DX=1]}", "flags apply to a source build only"),
    ("{source: tree, flags: [X=1]}", "cmake -DNAME=VALUE"),
    ("{source: nowhere}", "is not a directory"),
    ("{source: notatree}", "is not a llama.cpp source tree"),
    ("{bin: notatree}", "has no executable llama-bench"),
])
def test_a_bad_build_is_one_line_naming_the_field_exit_2(tmp_path, cli, build, says):
    _fake_tree(tmp_path / "tree")
    (tmp_path / "notatree").mkdir()
    rc, _, err = cli("plan", _grid(tmp_path, build))
    assert rc == 2 and says in err and len(err.strip().splitlines()) == 1, err
    assert "ub.yaml" in err and "build" in err


def test_the_llamacpp_engine_refuses_prebuilt_binaries_at_plan(tmp_path, cli):
    (tmp_path / "bin").mkdir()
    exe = tmp_path / "bin" / "llama-bench"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    rc, _, err = cli("plan", _grid(tmp_path, "{bin: bin}", engine="llama.cpp"))
    assert rc == 2 and "static libraries" in err and "use engine llama-bench" in err


def test_a_trees_identity_is_its_content_and_its_git_state(tmp_path):
    tree = _fake_tree(tmp_path / "tree")
    h0 = llamacpp_build.tree_sha256(tree)
    (tree / "build").mkdir()
    (tree / "build" / "junk.o").write_text("x")  # build folders and .git are not the tree
    assert llamacpp_build.tree_sha256(tree) == h0
    (tree / "src.c").write_text("int main(void) { return 1; }\n")
    h1 = llamacpp_build.tree_sha256(tree)
    assert h1 != h0
    assert llamacpp_build.git_state(tree) == {"git": "not a git repository"}
    (tree / ".git").write_text("gitdir: ../../.git/modules/vendor/llama.cpp\n")  # a submodule's link, as the sdist's
    assert llamacpp_build.git_state(tree) == {"git": "not a git repository (its .git links to a folder that is not here)"}
    (tree / ".git").unlink()
    git = ["git", "-C", str(tree), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    state = llamacpp_build.git_state(tree)
    assert len(state["git_commit"]) == 40 and state["git_dirty"] is False
    (tree / "src.c").write_text("int main(void) { return 2; }\n")
    assert llamacpp_build.git_state(tree)["git_dirty"] is True
    ub = llamacpp_build.UserBuild(source=tree)
    with llamacpp_build.user_build(ub):
        k1 = llamacpp_build.build_key()
    with llamacpp_build.user_build(llamacpp_build.UserBuild(source=tree, flags=("-DGGML_AVX2=OFF",))):
        k2 = llamacpp_build.build_key()
    assert k1 != k2 and k1 != llamacpp_build.build_key()  # flags and tree are the build's key; the pinned one apart


def test_a_tree_that_does_not_build_says_where_its_log_is(tmp_path):
    from harness.errors import UserError
    tree = _fake_tree(tmp_path / "tree", 'cmake_minimum_required(VERSION 3.14)\nproject(x)\n'
                                         'message(FATAL_ERROR "broken on purpose")\n')
    with llamacpp_build.user_build(llamacpp_build.UserBuild(source=tree)), pytest.raises(UserError) as e:
        llamacpp_build.build()
    msg = str(e.value)
    assert "broken on purpose" in msg and "failed-builds" in msg and "\n" not in msg
    log = Path(msg.split("read the build log ")[1].split(";")[0])
    assert log.is_file() and "broken on purpose" in log.read_text()
    log.unlink()


@pytest.mark.engines
def test_prebuilt_binaries_run_and_say_they_were_not_built_here(tmp_path):
    from harness import execute
    from harness.check import check
    pinned = llamacpp_build.load_manifest()
    bindir = Path(pinned["binaries"]["llama-bench"]["path"]).parent
    g = _grid(tmp_path, f"{{bin: {bindir}}}")
    s = execute.run_grid(str(g), store_root=tmp_path / "st")
    assert (s.done, s.failed) == (2, 0)
    arts = {a.grid.arm: a for a in (load_path(p) for p in Store(tmp_path / "st").iter_paths("ub"))}
    mine, base = arts["mine"].engine, arts["pinned"].engine
    assert mine.build["built_by_harness"] is False and mine.build["prebuilt"] == str(bindir)
    assert mine.build["binaries_sha256"]["llama-bench"] == pinned["binaries"]["llama-bench"]["sha256"]
    assert mine.build_commit == base.build_commit == pinned["build_commit"]  # read from --version
    assert "sdist_sha256" in base.build and "sdist_sha256" not in mine.build
    assert json.loads(json.dumps(arts["mine"].execution.requested))["build"] == {"bin": str(bindir)}
    n, problems = check([tmp_path / "st"], verify_models=False)
    assert n == 2 and [p for p in problems if ": harness.dirty:" not in p] == []


VLLM_GRID = """
name: uv
model: tiny-llama
arms:
  - {{name: mine, engine: vllm, form: hf-fp32, {patches}options: {{python: {python}}}}}
workload: {{prompt_len: 8, context_len: 64, gen_len: 4}}
threads: 1
passes: 1
repetitions: 1
warmups: 0
"""


@pytest.mark.parametrize("python, patches, says", [
    ("nowhere/python", "", "is not an executable"),
    ("/usr/bin/python3", "patches: none, ", "has no vllm"),
])
def test_a_vllm_python_without_vllm_is_refused_at_plan(tmp_path, cli, python, patches, says):
    g = tmp_path / "uv.yaml"
    g.write_text(VLLM_GRID.format(python=python, patches=patches))
    rc, _, err = cli("plan", g)
    assert rc == 2 and says in err and "arms[mine].options.python" in err and len(err.strip().splitlines()) == 1


def test_another_vllm_environment_reports_itself(tmp_path):
    """Another interpreter's environment (here this venv's python3, a path other than sys.executable): its vllm,
    torch and runtime plugin are read from it, not from this process."""
    import sys
    from harness.engines import get_engine
    other = str(Path(sys.executable).with_name("python3"))
    assert other != sys.executable
    eng = get_engine("vllm")
    mine, theirs = eng.engine_info(), eng.engine_info(other)
    assert theirs["version"] == mine["version"] and theirs["build"]["interpreter"] == other
    assert theirs["build"]["wheel_record_sha256"] == mine["build"]["wheel_record_sha256"]
    assert theirs["build"]["torch_record_sha256"] == mine["build"]["torch_record_sha256"]
    assert theirs["build"]["runtime_plugin"] is True and other in theirs["build_commit"]


def test_models_are_keyed_and_made_by_the_pinned_build_whatever_build_runs_them(tmp_path):
    """A run under a user build looks its model up under the pinned build's key (the zoo is made by it)."""
    from harness import models
    outside, pinned = models.model_dir("tiny-llama"), llamacpp_build.build_key()
    with llamacpp_build.user_build(llamacpp_build.UserBuild(source=_fake_tree(tmp_path / "tree"))):
        assert llamacpp_build.build_key() != pinned and models.model_dir("tiny-llama") == outside


def test_check_refuses_a_build_record_that_contradicts_itself():
    """Two arms of two builds differ by their build's hashes: check refuses a hash that is not one, and a run of
    prebuilt binaries whose binary is not the one its build lists (an edited artifact, its id recomputed)."""
    import copy
    from harness import artifact, check
    root = Path(__file__).resolve().parents[1] / "artifacts" / "llamacpp-builds"
    doc = next(d for d in (json.loads(p.read_text()) for p in sorted(root.glob("*.json")))
               if d["kind"] == "run" and d["status"] == "ok" and "tree_sha256" in d["engine"]["build"])

    def lie(edit):
        d = copy.deepcopy(doc)
        edit(d["engine"]["build"])
        d["id"] = artifact.compute_id(d)
        return [p for p in check.check_doc(d, "x.json", verify_models=False) if "engine.build" in p]
    assert lie(lambda b: None) == []
    assert lie(lambda b: b.update(tree_sha256="abc")) == ["x.json: engine.build.tree_sha256: 'abc' is not a sha256"]
    ran = doc["engine"]["build"]["binary"]
    listed = {"llama-bench": "0" * 64, ran: doc["engine"]["build"]["binary_sha256"]}
    assert lie(lambda b: b.update(binaries_sha256=listed)) == []
    said = lie(lambda b: b.update(binaries_sha256={**listed, ran: "1" * 64}))
    assert len(said) == 1 and "the run did not use the build it names" in said[0]


def test_a_vllm_fidelity_build_may_run_another_environment(tmp_path):
    """A fidelity build's `python:` (another environment's interpreter): checked at load, resolved against the
    grid file, and the build's engine block is that environment's own."""
    import sys
    from harness import fidelity
    from harness.errors import UserError
    from harness.engines import get_engine
    prompts = Path(__file__).resolve().parents[1] / "grids" / "prompts" / "fidelity-v1.json"
    other = str(Path(sys.executable).with_name("python3"))
    body = (f"kind: fidelity\nname: f\nmodel: tiny-llama\nprompts: {prompts}\ngen_len: 4\nthreads: 1\n"
            "thresholds: {min_top1_agreement: 0.5}\nbuilds:\n  - {name: v, engine: vllm, form: hf-fp32, "
            "options: {python: PY}}\n")
    g = tmp_path / "f.yaml"
    g.write_text(body.replace("PY", other))
    b = fidelity.load_grid(g).builds[0]
    assert b.options["python"] == other
    block = get_engine("vllm").fidelity_block(b.options)
    assert block["build"]["interpreter"] == other
    cmd, env = get_engine("vllm").fidelity_command(Path("m"), 1, [0], "float32", _req(tmp_path), tmp_path / "o",
                                                   tmp_path, b.options)
    assert cmd[0] == other and env["PYTHONPATH"].split(":")[0] == str(Path(__file__).resolve().parents[1])
    g.write_text(body.replace("PY", "/usr/bin/python3"))
    with pytest.raises(UserError, match=r"builds\[0\].options.python: .* has no vllm"):
        fidelity.load_grid(g)


def _req(tmp_path: Path) -> Path:
    p = tmp_path / "req.json"
    p.write_text("{}")
    return p


def test_a_llamacpp_fidelity_build_may_name_its_own_build(tmp_path):
    """A fidelity build's `build:` (as a speed arm's): its source resolved against the grid file and checked at
    load; prebuilt binaries refused (the fidelity tool links against a build's libraries)."""
    from harness import fidelity
    from harness.errors import UserError
    prompts = Path(__file__).resolve().parents[1] / "grids" / "prompts" / "fidelity-v1.json"
    tree = _fake_tree(tmp_path / "tree")
    body = (f"kind: fidelity\nname: f\nmodel: tiny-llama\nprompts: {prompts}\ngen_len: 4\nthreads: 1\n"
            "thresholds: {min_top1_agreement: 0.5}\nbuilds:\n  - {name: mine, engine: llama.cpp, form: gguf-f32, "
            "options: {build: BUILD}}\n")
    g = tmp_path / "f.yaml"
    g.write_text(body.replace("BUILD", "{source: tree, flags: [-DGGML_LLAMAFILE=OFF]}"))
    b = fidelity.load_grid(g).builds[0]
    assert b.options["build"] == {"source": str(tree), "flags": ["-DGGML_LLAMAFILE=OFF"]}
    from harness.engines import get_engine  # its reference is made by that same build (check: same engine build)
    assert get_engine("llama.cpp").reference_options(b.options) == {"build": b.options["build"]}
    assert get_engine("llama.cpp").reference_options({}) == {}
    for build, says in (("{bin: tree}", "builds[0].options.build.bin: the fidelity tool links"),
                        ("{source: nowhere}", "build.source"), ("{source: tree, flags: [X]}", "-DNAME=VALUE")):
        g.write_text(body.replace("BUILD", build))
        with pytest.raises(UserError, match=re.escape(says)):
            fidelity.load_grid(g)


def test_the_native_build_leaves_ggml_amx_out_on_an_amx_cpu_only():
    """With ggml's AMX buffer type, this pin's quantized GGUFs die with SIGSEGV on an AMX CPU (issue 20824)."""
    amx = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n"
    off = llamacpp_build.amx_off(amx)
    assert off and all("-mno-amx-int8" in f and "-mno-amx-tile" in f for f in off)
    assert {f.split("=", 1)[0] for f in off} == {"-DCMAKE_C_FLAGS", "-DCMAKE_CXX_FLAGS"}
    assert llamacpp_build.amx_off("flags\t\t: fpu avx2 avx512f avx512_bf16\n") == ()
    assert llamacpp_build.amx_off("") == ()
    here = llamacpp_build.amx_off()
    assert set(here) <= set(llamacpp_build.cmake_flags())
    with llamacpp_build.server():
        assert set(here) <= set(llamacpp_build.cmake_flags())
    for tier in llamacpp_build.ISA_VARIANTS:  # the variants' libllama/common compile as the native build's do
        with llamacpp_build.variant(tier):
            assert set(here) <= set(llamacpp_build.cmake_flags())
