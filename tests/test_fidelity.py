"""Fidelity: grid validation, the comparison arithmetic, and the real engines catching a broken build."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness import fidelity, models
from harness.engines.llamacpp import build as llamacpp_build
from harness.errors import UserError
from harness.paths import PROJECT_ROOT

PROMPTS = PROJECT_ROOT / "grids" / "prompts" / "fidelity-v1.json"


def _grid(tmp_path: Path, body: str, name: str = "fid.yaml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(body).replace("PROMPTS", str(PROMPTS)))
    return p


BASE = """
kind: fidelity
name: fid
model: tiny-llama
prompts: PROMPTS
gen_len: 8
threads: 2
thresholds: {min_top1_agreement: 0.9}
builds:
  - {name: a, engine: llama.cpp, form: gguf-f32}
"""


def test_committed_prompt_set_has_twelve_prompts_of_every_category():
    doc = json.loads(PROMPTS.read_text())
    assert len(doc["prompts"]) == 12 and len({p["id"] for p in doc["prompts"]}) == 12
    cats = {p["category"] for p in doc["prompts"]}
    assert {"instruction", "factual", "arithmetic", "code", "long-context", "other-language"} <= cats


def test_published_fidelity_grid_loads():
    g = fidelity.load_grid(PROJECT_ROOT / "grids" / "fidelity.yaml")
    forms = {(b.engine, b.form) for b in g.builds}
    assert {("llama.cpp", f"gguf-{q}") for q in ("f32", "bf16", "q8_0", "q4_0", "q4_1")} <= forms
    assert {("vllm", "hf-fp32"), ("vllm", "hf-bf16")} <= forms
    assert g.references == {"llama.cpp": "gguf-bf16", "vllm": "hf-bf16"}


@pytest.mark.parametrize("edit, field", [
    (("gen_len: 8", "gen_len: 0"), "gen_len"),
    (("thresholds: {min_top1_agreement: 0.9}", "thresholds: {min_top_one: 0.9}"), "thresholds.min_top_one"),
    (("thresholds: {min_top1_agreement: 0.9}\n", ""), "thresholds"),
    (("engine: llama.cpp, form: gguf-f32", "engine: llama.cpp, form: hf-fp32"), "builds[0].form"),
    (("engine: llama.cpp, form: gguf-f32", "engine: vllm, path: x.gguf"), "builds[0].path"),
    (("prompts: PROMPTS", "prompts: nope.json"), "prompts"),
    (("kind: fidelity\n", "kind: fidelity\nwarmups: 1\n"), "warmups"),
])
def test_bad_fidelity_grid_names_the_field(tmp_path, edit, field):
    p = _grid(tmp_path, BASE.replace(*edit))
    with pytest.raises(UserError) as e:
        fidelity.load_grid(p)
    assert str(p) in str(e.value) and field in str(e.value)


def test_harness_run_refuses_a_fidelity_grid(tmp_path, cli):
    p = _grid(tmp_path, BASE)
    rc, _, err = cli("run", p, "--store", tmp_path / "s")
    assert rc == 2 and "harness fidelity" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "s").exists()


def test_kl_is_zero_for_identical_and_positive_for_shifted_distributions():
    top = [[1, math.log(0.6)], [2, math.log(0.3)]]
    assert fidelity.kl_topk(top, [math.log(0.6), math.log(0.3)], None) == (0.0, 0)
    kl, missing = fidelity.kl_topk(top, [math.log(0.3), math.log(0.6)], None)
    assert kl > 0.1 and missing == 0
    # a candidate outside the build's returned log-probs is bounded by the smallest one returned, and counted
    kl2, missing2 = fidelity.kl_topk(top, [math.log(0.6), None], math.log(0.01))
    assert missing2 == 1 and kl2 > 0


def test_compare_and_gate():
    ref = [{"id": "p", "category": "c", "ids": [1, 2, 3, 4], "top": [[[t, 0.0]] for t in (1, 2, 3, 4)]}]
    # top-1 compares argmaxes (the reference's teacher-forced argmax is top[0])
    build = [{"greedy": {"ids": [1, 2, 9, 9]},
              "forced": {"argmax": [1, 2, 3, 0], "candidates": [[0.0], [0.0], [0.0], [-3.0]]}}]
    rows = fidelity.compare(ref, build)
    r = rows[0]
    assert r["first_divergence"] == 2 and r["token_agreement"] == 0.5 and not r["exact_match"]
    assert r["top1_agreement"] == 0.75 and r["mean_kl"] > 0
    s = fidelity.summarize(rows, 4)
    assert s["median_first_divergence"] == 2
    fails = fidelity.gate(s, {"min_top1_agreement": 0.9, "max_mean_kl": 10.0}, rows)
    assert any("top1_agreement 0.75 < min_top1_agreement 0.9" in f for f in fails)
    assert any("p@2" in f for f in fails)
    assert fidelity.gate(s, {"min_top1_agreement": 0.5}, rows) == []


def _zero_output_head(src: Path, dst: Path) -> str:
    """A copy of a GGUF whose output projection is all zeros (the tied embedding, when there is no output.weight)."""
    shutil.copyfile(src, dst)
    code = textwrap.dedent(f"""
        import sys
        from gguf import GGUFReader
        r = GGUFReader({str(dst)!r}, "r+")
        names = [t.name for t in r.tensors]
        name = "output.weight" if "output.weight" in names else "token_embd.weight"
        t = next(t for t in r.tensors if t.name == name)
        t.data[...] = 0
        r.data.flush()
        print(name)
    """)
    env = {"PYTHONPATH": str(llamacpp_build.source_dir() / "gguf-py"), "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return r.stdout.strip()


def test_a_vllm_build_may_compile_in_its_own_cache(tmp_path):
    """options.eager: false compiles the build (from scratch, under its own directory); a reference stays eager."""
    from harness.engines import get_engine
    eng = get_engine("vllm")
    assert "eager" in eng.fidelity_options
    req = tmp_path / "request.json"
    req.write_text("{}")
    _, env = eng.fidelity_command(tmp_path, 2, [0, 1], "float32", req, tmp_path / "out.json", tmp_path,
                                  {"eager": False, "patches": ["all", "decode-gemv"]})
    assert json.loads((tmp_path / "worker-config.json").read_text())["eager"] is False
    assert env["VLLM_CACHE_ROOT"].startswith(str(tmp_path)) and env["EDGE_HARNESS_PATCHES"] == "all,decode-gemv"
    # what vLLM learns of a model class is shared with every other run, its compile cache is not
    from harness.paths import cache_root
    info = Path(env["VLLM_CACHE_ROOT"]) / "modelinfos"
    assert info.is_symlink() and info.resolve() == (cache_root() / "vllm-modelinfos").resolve()
    _, env = eng.fidelity_command(tmp_path, 2, [0, 1], "float32", req, tmp_path / "out.json", tmp_path, None)
    assert json.loads((tmp_path / "worker-config.json").read_text())["eager"] is True
    assert "VLLM_CACHE_ROOT" not in env


@pytest.mark.engines
def test_real_engines_pass_a_sound_build_and_catch_a_zeroed_output_head(tmp_path, cli):
    """Two vLLM starts (each tens of seconds on 2 cores): its reference and the decode-patched build, which is
    the vLLM build that passes; the cross-engine score runs the other way (llama.cpp's f32 build on vLLM's
    reference), so it costs a llama.cpp start instead of a third vLLM one."""
    good = models.form_path("tiny-llama", "gguf-f32")
    broken = tmp_path / "broken.gguf"
    zeroed = _zero_output_head(good, broken)
    assert zeroed in ("output.weight", "token_embd.weight")
    g = _grid(tmp_path, f"""
        kind: fidelity
        name: fid
        model: tiny-llama
        prompts: PROMPTS
        gen_len: 8
        top_k: 5
        threads: 2
        references: {{llama.cpp: gguf-f32, vllm: hf-fp32}}
        thresholds: {{min_top1_agreement: 0.9, max_mean_kl: 0.05}}
        builds:
          - {{name: f32, engine: llama.cpp, form: gguf-f32}}
          - {{name: broken, engine: llama.cpp, path: {broken}}}
          - {{name: vllm-fp32-decode, engine: vllm, form: hf-fp32,
              options: {{patches: [all, decode-gemv, cpu-norm-kernels]}}, thresholds: {{min_exact_match_rate: 1.0}}}}
        cross_engine:
          - {{build: f32, against: vllm}}
    """)
    store, refs = tmp_path / "store", tmp_path / "refs"
    rc, out, err = cli("fidelity", g, "--store", store, "--references", refs)
    assert rc == 1, err
    assert "broken: fail" in err and "diverged (prompt@first token)" in err
    arts = {(d["grid"]["build"], d["cross_engine"]): d
            for d in (json.loads(p.read_text()) for p in (store / "fid").glob("*.json"))}
    assert arts[("f32", False)]["verdict"] == "pass" and arts[("f32", False)]["summary"]["exact_match_rate"] == 1.0
    cross = arts[("f32", True)]
    assert cross["verdict"] == "not gated" and cross["reference"]["engine"] == "vllm" and cross["summary"]
    assert cross["reference"]["id"] == arts[("vllm-fp32-decode", False)]["reference"]["id"]
    # the decode patches leave the greedy output token-identical to the same build's reference
    d = arts[("vllm-fp32-decode", False)]
    assert d["verdict"] == "pass" and d["summary"]["exact_match_rate"] == 1.0, d["summary"]
    from runtime.gemv import unavailable
    expected = {"cpu-norm-kernels"} | ({"decode-gemv"} if unavailable() is None else set())  # AVX2 CPUs only
    assert {p["name"] for p in d["engine"]["patches"] if p["applied"]} >= expected
    b = arts[("broken", False)]
    assert b["verdict"] == "fail" and b["summary"]["top1_agreement"] < 0.5
    assert b["model"]["files"][0]["sha256"] != arts[("f32", False)]["model"]["files"][0]["sha256"]
    # every artifact passes check with its references (a dirty working tree aside, as in development);
    # without them, the fidelity artifacts do not
    _, out, _ = cli("check", store, refs)
    assert [x for x in out.splitlines() if ": harness.dirty:" not in x and "artifact(s) OK" not in x] == [], out
    _, out, _ = cli("check", store)
    assert "reference.id: " in out
    # a second run reuses the stored reference instead of generating a new one
    n_refs = len(list((refs / "fid").glob("*.json")))
    g2 = tmp_path / "fid2.yaml"
    g2.write_text(g.read_text().split("builds:")[0] + "builds:\n  - {name: f32, engine: llama.cpp, form: gguf-f32}\n")
    rc, _, err = cli("fidelity", g2, "--store", store, "--references", refs)
    assert rc == 0, err
    assert "reference llama.cpp gguf-f32: reusing" in err and len(list((refs / "fid").glob("*.json"))) == n_refs
