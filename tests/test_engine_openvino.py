"""The OpenVINO GenAI engine (harness/engines/openvino): refused forms at plan, no openvino import in the
harness, one real run beside llama.cpp on the same GGUF file, and its fidelity mode end to end."""

import hashlib
import json
import os
import subprocess
import sys

import pytest

from harness import check, execute
from harness.check import check_doc
from harness.store import Store

GRID = """
name: {name}
model: smollm2-135m
arms:
  - {{name: llama.cpp, engine: llama.cpp, form: gguf-q8_0}}
  - {{name: openvino, engine: openvino, form: {form}}}
workload: {{prompt_len: 16, context_len: 256, gen_len: 8}}
threads: 1
passes: 1
repetitions: 1
warmups: 0
timeout_s: 120
"""


def test_plan_refuses_a_form_openvino_cannot_load(write_grid, cli):
    g = write_grid(GRID.format(name="ovf32", form="gguf-f32"))
    rc, out, err = cli("plan", g)
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "arms[openvino].form" in lines[0] and "'gguf-f32'" in lines[0]
    assert "gguf-q8_0, gguf-q4_0, gguf-q4_1" in lines[0]


def test_plan_refuses_a_request_longer_than_the_context(write_grid, cli):
    text = GRID.format(name="ovctx", form="gguf-q8_0").replace("context_len: 256", "context_len: 20")
    g = write_grid(text.replace("  - {name: llama.cpp, engine: llama.cpp, form: gguf-q8_0}\n", ""))
    rc, _, err = cli("plan", g)
    assert rc == 2 and "do not fit" in err and len(err.strip().splitlines()) == 1


def test_plan_accepts_the_forms_openvino_loads(write_grid, cli):
    for form in ("gguf-q8_0", "gguf-q4_0", "gguf-q4_1"):
        rc, out, err = cli("plan", write_grid(GRID.format(name="ovok", form=form)))
        assert rc == 0, err


def test_importing_the_engine_does_not_import_openvino():
    code = ("import sys; from harness.engines import get_engine; e = get_engine('openvino'); "
            "assert e.name == 'openvino'; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('openvino', 'openvino_genai', 'torch', 'vllm')]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_missing_package_is_one_line_naming_the_extra(monkeypatch):
    from importlib import metadata

    from harness.engines import openvino
    from harness.errors import UserError

    def gone(dist):
        raise metadata.PackageNotFoundError(dist)

    monkeypatch.setattr(openvino.metadata, "version", gone)
    with pytest.raises(UserError) as e:
        openvino.OpenVino().check("smollm2-135m", "gguf-q8_0")
    assert "\n" not in str(e.value) and ".[openvino]" in str(e.value) and "openvino-genai" in str(e.value)


@pytest.mark.engines
def test_openvino_beside_llamacpp_on_the_same_gguf(tmp_path):
    g = tmp_path / "ovreal.yaml"
    g.write_text(GRID.format(name="ovreal", form="gguf-q8_0"))
    s = execute.run_grid(str(g), store_root=tmp_path / "store")
    docs = [json.loads(p.read_text()) for p in Store(tmp_path / "store").iter_paths("ovreal")]
    arts = {a["grid"]["arm"]: a for a in docs}
    assert s.failed == 0, [a.get("error") for a in docs]
    assert set(arts) == {"llama.cpp", "openvino"} and all(a["status"] == "ok" for a in docs)
    ov, cpp = arts["openvino"], arts["llama.cpp"]
    # the very same file, by sha256, for both engines
    assert [f["sha256"] for f in ov["model"]["files"]] == [f["sha256"] for f in cpp["model"]["files"]]
    assert ov["workload"]["prompt_token_hash"] == cpp["workload"]["prompt_token_hash"]
    eff = ov["execution"]["effective"]
    assert eff["output_tokens"] == [8] and eff["prompt_tokens"] == [16]
    assert eff["openvino_build"] == ov["engine"]["build"]["openvino_build"]
    assert all(lib["matches_record"] for lib in ov["engine"]["build"]["libraries"].values())
    st = ov["execution"]["settings"]
    assert st["threads"] == {**st["threads"], "requested": 1, "effective": 1, "rule": "enforced"}
    assert st["cpus"]["effective"] == st["cpus"]["requested"] and st["batch"]["effective"] == 1
    assert st["context_len"]["rule"].startswith("observe only")
    assert len(ov["metrics"]["itl_p50_s"]["samples"]) == 1
    for m in ("ttft_s", "decode_tok_s", "e2e_s"):
        assert ov["metrics"][m]["definition"] == cpp["metrics"][m]["definition"]
    problems = [p for a in docs for p in check_doc(a, f"{a['id']}.json") if ": harness.dirty:" not in p]
    assert problems == []
    n, problems = check.check([str(tmp_path / "store")])  # what `harness check STORE` prints
    assert n == 2 and [p for p in problems if ": harness.dirty:" not in p] == []


def test_a_form_on_an_axis_that_openvino_cannot_load_is_refused_at_plan(write_grid, cli):
    g = write_grid("""
        name: ov-axis
        model: smollm2-135m
        arms:
          - {name: openvino, engine: openvino}
        axes: {form: [gguf-q8_0, gguf-f32]}
        workload: {prompt_len: 16, context_len: 256, gen_len: 8}
        threads: 1
        passes: 1
    """)
    rc, out, err = cli("plan", g)
    assert rc == 2 and "axes.form" in err and "gguf-f32" in err and len(err.strip().splitlines()) == 1


def test_openvino_has_a_fidelity_mode_with_a_q8_0_reference(tmp_path):
    from harness import fidelity
    from harness.engines import get_engine
    from harness.errors import UserError

    e = get_engine("openvino")
    assert fidelity.DEFAULT_REFERENCES["openvino"] == "gguf-q8_0" and e.accepts_file
    g = fidelity.load_grid("grids/openvino-fidelity.yaml")
    assert g.references["openvino"] == "gguf-q8_0" and g.references["llama.cpp"] == "gguf-bf16"
    assert {b.engine for b in g.builds} == {"openvino", "llama.cpp"}
    assert all(b.startswith("openvino-") and a == "llama.cpp" for b, a in g.cross_engine)
    with pytest.raises(UserError) as err:  # a form the library refuses: refused before its build runs
        e.fidelity_dtype("gguf-bf16", {})
    assert "gguf-q8_0, gguf-q4_0, gguf-q4_1" in str(err.value)
    cmd, env = e.fidelity_command(tmp_path / "m.gguf", 2, [0, 1], None, tmp_path / "request.json",
                                  tmp_path / "result.json", tmp_path)
    assert cmd[:3] == ["taskset", "-c", "0,1"] and "--fidelity" in cmd and env["PYTHONNOUSERSITE"] == "1"
    cfg = json.loads((tmp_path / "fidelity-config.json").read_text())
    assert cfg["threads"] == 2 and cfg["request_path"] == str(tmp_path / "request.json")


FIDELITY_GRID = """
kind: fidelity
name: ovfid
model: smollm2-135m
prompts: prompts.json
gen_len: 8
top_k: 5
threads: 2
timeout_s: 300
references: {openvino: gguf-q8_0}
thresholds: {min_top1_agreement: 1.0, max_mean_kl: 0.0}
builds:
  - {name: openvino-q8_0, engine: openvino, form: gguf-q8_0}
"""
PROMPTS = {"name": "ov-two", "prompts": [
    {"id": "fact", "category": "factual", "text": "What is the capital of Australia?"},
    {"id": "code", "category": "code", "text": "Write a Python function that reverses a string."}]}


@pytest.mark.engines
def test_openvino_fidelity_greedy_is_the_speed_path_and_forced_scores_itself_exactly(tmp_path):
    """Through harness fidelity: OpenVINO's reference (q8_0) and a q8_0 build scored teacher-forced on the
    reference's tokens in another process (top-1 1, KL 0, candidates from the reference's top-k), the forced pass
    aligned with the greedy tokens, and the greedy ids those of the speed worker on the same prompt ids."""
    from harness import fidelity, models
    from harness.engines.openvino import ATTENTION_BACKEND, WORKER

    (tmp_path / "prompts.json").write_text(json.dumps(PROMPTS))
    (tmp_path / "ovfid.yaml").write_text(FIDELITY_GRID)
    r = fidelity.run_fidelity(str(tmp_path / "ovfid.yaml"), str(tmp_path / "store"), str(tmp_path / "refs"))
    assert r.errors == [] and r.failed_builds == [], r.errors
    ref = json.loads(next(Store(tmp_path / "refs").iter_paths("ovfid")).read_text())
    fid = json.loads(next(Store(tmp_path / "store").iter_paths("ovfid")).read_text())
    assert ref["engine"]["name"] == "openvino" and ref["model"]["form"] == "gguf-q8_0"
    assert fid["verdict"] == "pass" and fid["summary"]["top1_agreement"] == 1.0 and fid["summary"]["mean_kl"] == 0.0
    assert fid["summary"]["exact_match_rate"] == 1.0 and all(p["kl_outside_topk"] == 0 for p in fid["prompts"])
    for o in ref["outputs"]:
        assert len(o["ids"]) == 8 and len(o["top"]) == 8 and all(len(t) == 5 for t in o["top"])
        # the forced pass is aligned with the greedy tokens: one position off would agree nowhere
        assert o["forced_argmax_agreement"] >= 0.75
        assert all(lp <= 0 for lp in o["logprobs"]) and all(t[0][1] >= t[-1][1] for t in o["top"])
    eff = fid["execution"]["effective"]
    assert eff["threads"] == 2 and eff["forced_model"]["xml_sha256"] and "forward pass" in eff["forced_source"]
    # the library's own summed log-probability of each greedy sequence is near the forced pass's
    assert all(abs(a - b) < 1.0 for a, b in zip(eff["library_scores"], eff["forced_scores"]))
    n, problems = check.check([str(tmp_path / "store"), str(tmp_path / "refs")])
    assert n == 2 and [p for p in problems if ": harness.dirty:" not in p] == []

    # the speed worker (what `harness run` measures) on the same prompt ids generates the same tokens
    prompts = fidelity.load_prompts(fidelity.load_grid(tmp_path / "ovfid.yaml")).prompts
    req = {"model_path": str(models.form_path("smollm2-135m", "gguf-q8_0")), "threads": 2, "gen_len": 8,
           "attention_backend": ATTENTION_BACKEND,
           "repetitions": [{"warmup": False, "prompts": [p["ids"]]} for p in prompts]}
    (tmp_path / "speed-request.json").write_text(json.dumps(req))
    subprocess.run([sys.executable, str(WORKER), str(tmp_path / "speed-request.json"),
                    str(tmp_path / "speed-result.json")], check=True, env={**os.environ, "PYTHONNOUSERSITE": "1"})
    speed = json.loads((tmp_path / "speed-result.json").read_text())
    assert speed["effective"]["output_ids_sha256"] == [hashlib.sha256(json.dumps(o["ids"]).encode()).hexdigest()
                                                        for o in ref["outputs"]]
