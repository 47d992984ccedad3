"""The ExecuTorch engine (harness/engines/executorch): refusals at plan, no executorch import in the harness, its
forms exported by the pinned ExecuTorch into the zoo (in its own environment), one real run on tiny-llama and its
fidelity mode end to end (the fp32 build scored on its own reference exactly, the 8da4w build not)."""

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
model: tiny-llama
arms:
  - {{name: et, engine: executorch, form: {form}}}
workload: {{prompt_len: 16, context_len: {ctx}, gen_len: 8}}
threads: 2
passes: 1
repetitions: 2
warmups: 1
timeout_s: 300
"""


def test_plan_refuses_a_form_it_cannot_load_and_a_context_beyond_the_program(write_grid, cli):
    rc, out, err = cli("plan", write_grid(GRID.format(name="etgguf", form="gguf-f32", ctx=64)))
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "arms[et].form" in err and "'gguf-f32'" in err and "pte-fp32, pte-8da4w, pte-8da4w-head" in err
    rc, _, err = cli("plan", write_grid(GRID.format(name="etctx", form="pte-fp32", ctx=2048)))
    assert rc == 2 and "workload.context_len: 2048" in err and "1024" in err and len(err.strip().splitlines()) == 1
    rc, _, err = cli("plan", write_grid(GRID.format(name="etshort", form="pte-fp32", ctx=20)))
    assert rc == 2 and "do not fit" in err
    rc, _, err = cli("plan", write_grid(GRID.format(name="etok", form="pte-8da4w", ctx=64)))
    assert rc == 0, err


def test_importing_the_engine_does_not_import_executorch():
    code = ("import sys; from harness.engines import get_engine; e = get_engine('executorch'); "
            "import harness.models; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('executorch', 'torchao', 'torch')]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


FIDELITY_GRID = """
kind: fidelity
name: etfid
model: tiny-llama
prompts: prompts.json
gen_len: 8
top_k: 5
threads: 2
timeout_s: 300
references: {executorch: pte-fp32}
thresholds: {min_top1_agreement: 1.0, max_mean_kl: 0.0}
builds:
  - {name: et-fp32, engine: executorch, form: pte-fp32}
  - {name: et-8da4w, engine: executorch, form: pte-8da4w}
"""
PROMPTS = {"name": "et-two", "prompts": [
    {"id": "fact", "category": "factual", "text": "What is the capital of Australia?"},
    {"id": "code", "category": "code", "text": "Write a Python function that reverses a string."}]}


@pytest.mark.engines
def test_executorch_forms_a_real_run_and_fidelity(tmp_path):
    """The zoo exports the forms with the pinned ExecuTorch (hashed in its manifest, with their recipe and which
    Linear layers the quantizer took: all but the head); a real run of pte-8da4w on tiny-llama with its settings read
    back and its provenance complete; through harness fidelity the fp32 build reproduces its own reference exactly
    and the 8da4w build does not; the greedy ids are those of the speed worker on the same ids."""
    from harness import fidelity, models
    from harness.engines.executorch import engine, forms

    models.ensure("tiny-llama", ["pte-fp32", "pte-8da4w"])
    m = models.load_manifest("tiny-llama")
    for f in ("pte-fp32", "pte-8da4w"):
        assert m["forms"][f]["format"] == "pte" and m["forms"][f]["recipe"] == forms.recipe(f)
        assert list(models.weight_files("tiny-llama", f)) == [f"{f}/model.pte"]
        assert m["forms"][f]["program"]["metadata"]["get_max_context_len"] == forms.MAX_CONTEXT
    q = m["forms"]["pte-8da4w"]["program"]
    assert q["linears_float"] == ["output"] and q["linears_quantized"] == 7 * 2  # 7 per layer, 2 layers, not the head
    size = {f: models.weight_files("tiny-llama", f)[f"{f}/model.pte"]["size"] for f in ("pte-fp32", "pte-8da4w")}
    assert size["pte-8da4w"] < size["pte-fp32"]

    g = tmp_path / "etreal.yaml"
    g.write_text(GRID.format(name="etreal", form="pte-8da4w", ctx=64))
    s = execute.run_grid(str(g), store_root=tmp_path / "store")
    docs = [json.loads(p.read_text()) for p in Store(tmp_path / "store").iter_paths("etreal")]
    assert s.failed == 0 and len(docs) == 1, [a.get("error") for a in docs]
    (a,) = docs
    eff, st = a["execution"]["effective"], a["execution"]["settings"]
    assert eff["output_tokens"] == [8, 8, 8] and eff["prompt_tokens"] == [16, 16, 16] and eff["pool_threads"] == 2
    assert eff["form_recipe"] == forms.recipe("pte-8da4w") and eff["executorch_version"] == forms.PIN
    assert st["threads"] == {**st["threads"], "requested": 2, "effective": 2, "rule": "enforced"}
    assert st["cpus"]["effective"] == st["cpus"]["requested"] and st["warmups"]["effective"] == 1
    libs = a["engine"]["build"]["libraries"]
    assert all(lib["matches_record"] for lib in libs.values()) and "libexecutorch_backend_xnnpack.so" in libs
    assert a["model"]["form"] == "pte-8da4w" and "pte-8da4w/model.pte" in {f["path"] for f in a["model"]["files"]}
    assert len(a["metrics"]["itl_p50_s"]["samples"]) == 2 and min(a["metrics"]["decode_tok_s"]["samples"]) > 0
    assert [p for p in check_doc(a, f"{a['id']}.json") if ": harness.dirty:" not in p] == []

    (tmp_path / "prompts.json").write_text(json.dumps(PROMPTS))
    (tmp_path / "etfid.yaml").write_text(FIDELITY_GRID)
    r = fidelity.run_fidelity(str(tmp_path / "etfid.yaml"), str(tmp_path / "fid"), str(tmp_path / "refs"))
    assert r.errors == [], r.errors
    ref = json.loads(next(Store(tmp_path / "refs").iter_paths("etfid")).read_text())
    fids = {d["grid"]["build"]: d for d in (json.loads(p.read_text()) for p in Store(tmp_path / "fid").iter_paths("etfid"))}
    assert ref["engine"]["name"] == "executorch" and ref["model"]["form"] == "pte-fp32"
    same, q4 = fids["et-fp32"], fids["et-8da4w"]
    assert same["verdict"] == "pass" and same["summary"]["top1_agreement"] == 1.0 and same["summary"]["mean_kl"] == 0.0
    assert q4["verdict"] == "fail" and q4["summary"]["mean_kl"] > 0
    for o in ref["outputs"]:
        assert len(o["ids"]) == 8 and len(o["top"]) == 8 and o["forced_argmax_agreement"] == 1.0
    n, problems = check.check([str(tmp_path / "fid"), str(tmp_path / "refs")])
    assert n == 3 and [p for p in problems if ": harness.dirty:" not in p] == []

    prompts = fidelity.load_prompts(fidelity.load_grid(tmp_path / "etfid.yaml")).prompts
    req = {"model_path": str(models.form_path("tiny-llama", "pte-fp32") / "model.pte"), "threads": 2, "gen_len": 8,
           "repetitions": [{"warmup": False, "prompts": [p["ids"]]} for p in prompts]}
    (tmp_path / "speed-request.json").write_text(json.dumps(req))
    subprocess.run([str(forms.env_python()[0]), str(engine.WORKER), str(tmp_path / "speed-request.json"),
                    str(tmp_path / "speed-result.json")], check=True,
                   env={**os.environ, "PYTHONNOUSERSITE": "1", "PYTHONPATH": ""})
    speed = json.loads((tmp_path / "speed-result.json").read_text())
    assert speed["effective"]["output_ids_sha256"] == [hashlib.sha256(json.dumps(o["ids"]).encode()).hexdigest()
                                                        for o in ref["outputs"]]


def test_a_foreign_library_in_the_worker_is_refused(monkeypatch):
    """The worker's mapped ExecuTorch libraries must be the hashed files: another copy is named."""
    from harness.engines.executorch import engine
    monkeypatch.setattr(engine, "libraries", lambda: {"libexecutorch.so": {"path": "/env/executorch/lib/libexecutorch.so"}})
    assert engine._foreign_libraries({"libraries": ["/env/executorch/lib/libexecutorch.so"]}) is None
    assert "/other/executorch/lib/libexecutorch.so" in engine._foreign_libraries(
        {"libraries": ["/env/executorch/lib/libexecutorch.so", "/other/executorch/lib/libexecutorch.so"]})
    assert "no ExecuTorch library" in engine._foreign_libraries({"libraries": []})
