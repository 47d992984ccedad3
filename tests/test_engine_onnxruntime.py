"""The ONNX Runtime GenAI engine (harness/engines/onnxruntime): refusals at plan, no onnxruntime import in the
harness, its forms made by the pinned builder into the zoo, one real run on tiny-llama and its fidelity mode end to
end (a build scored on its own reference, and the head-trap form against it)."""

import json
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
  - {{name: ort, engine: onnxruntime-genai, form: {form}}}
workload: {{prompt_len: 16, context_len: 64, gen_len: 8}}
threads: 2
passes: 1
repetitions: 2
warmups: 1
timeout_s: 300
"""


def test_plan_refuses_a_form_it_cannot_load_and_a_request_longer_than_the_context(write_grid, cli):
    rc, out, err = cli("plan", write_grid(GRID.format(name="ortgguf", form="gguf-f32")))
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "arms[ort].form" in err and "'gguf-f32'" in err and "onnx-fp32, onnx-int4, onnx-int4-head" in err
    rc, _, err = cli("plan", write_grid(GRID.format(name="ortctx", form="onnx-fp32").replace("context_len: 64",
                                                                                            "context_len: 20")))
    assert rc == 2 and "do not fit" in err and len(err.strip().splitlines()) == 1
    rc, _, err = cli("plan", write_grid(GRID.format(name="ortok", form="onnx-int4")))
    assert rc == 0, err


def test_importing_the_engine_does_not_import_onnxruntime():
    code = ("import sys; from harness.engines import get_engine; e = get_engine('onnxruntime-genai'); "
            "import harness.models; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('onnxruntime', 'onnxruntime_genai', 'onnx', 'torch')]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_missing_or_other_version_is_one_line_naming_the_extra(monkeypatch):
    from importlib import metadata

    from harness.engines.onnxruntime import forms
    from harness.engines.onnxruntime.engine import OnnxRuntimeGenAi
    from harness.errors import UserError

    def gone(dist):
        raise metadata.PackageNotFoundError(dist)

    monkeypatch.setattr(forms.metadata, "version", gone)
    with pytest.raises(UserError) as e:
        OnnxRuntimeGenAi().check("tiny-llama", "onnx-int4")
    assert "\n" not in str(e.value) and ".[onnxruntime]" in str(e.value)
    monkeypatch.setattr(forms.metadata, "version", lambda d: "0.1.0")
    with pytest.raises(UserError) as e:
        OnnxRuntimeGenAi().check("tiny-llama", "onnx-int4")
    assert "0.1.0 is installed" in str(e.value) and forms.PIN in str(e.value)


FIDELITY_GRID = """
kind: fidelity
name: ortfid
model: tiny-llama
prompts: prompts.json
gen_len: 8
top_k: 5
threads: 2
timeout_s: 300
references: {onnxruntime-genai: onnx-fp32}
thresholds: {min_top1_agreement: 1.0, max_mean_kl: 0.0}
builds:
  - {name: ort-fp32, engine: onnxruntime-genai, form: onnx-fp32}
  - {name: ort-int4-head, engine: onnxruntime-genai, form: onnx-int4-head}
"""
PROMPTS = {"name": "ort-two", "prompts": [
    {"id": "fact", "category": "factual", "text": "What is the capital of Australia?"},
    {"id": "code", "category": "code", "text": "Write a Python function that reverses a string."}]}


@pytest.mark.engines
def test_onnxruntime_forms_a_real_run_and_fidelity(tmp_path):
    """The zoo makes the ONNX forms with the pinned builder (hashed in its manifest, with their recipe); a real run
    of onnx-int4 on tiny-llama with its settings read back and its provenance complete; through harness fidelity,
    the fp32 build scored on its own reference exactly (top-1 1, KL 0: the forced pass aligned with the greedy
    tokens) and the head-trap form not (on tiny-llama's random weights its logits are near uniform, so its drift
    is tiny: the trap's real effect is in the published four-bit-fidelity series); the greedy ids are those of the speed worker on the same ids."""
    import hashlib
    import os

    from harness import fidelity, models
    from harness.engines.onnxruntime import forms
    from harness.engines.onnxruntime.engine import WORKER

    models.ensure("tiny-llama", ["onnx-fp32", "onnx-int4", "onnx-int4-head"])
    m = models.load_manifest("tiny-llama")
    for f in ("onnx-fp32", "onnx-int4", "onnx-int4-head"):
        assert m["forms"][f]["format"] == "onnx" and m["forms"][f]["recipe"] == forms.recipe(f)
        assert {"model.onnx", "genai_config.json"} <= {p.rsplit("/", 1)[-1] for p in models.form_files("tiny-llama", f)}
        assert models.weight_files("tiny-llama", f)  # the graph and its data, by the onnx weight rule
    # what the builder made, read from each graph: the head and embedding float32 but for the head trap
    graph = {f: m["forms"][f]["graph"] for f in ("onnx-fp32", "onnx-int4", "onnx-int4-head")}
    assert "MatMulNBits" not in graph["onnx-fp32"]["matrix_ops"] and graph["onnx-int4"]["matrix_ops"]["MatMulNBits"] > 0
    assert graph["onnx-int4"]["lm_head"] == ["MatMul"] and graph["onnx-int4"]["embed_tokens"] == ["Gather"]
    assert "MatMulNBits" in graph["onnx-int4-head"]["lm_head"]
    # int4 weights are smaller; the head trap's head and embedding too
    size = {f: sum(i["size"] for i in models.weight_files("tiny-llama", f).values()) for f in m["forms"]
            if f.startswith("onnx-")}
    assert size["onnx-int4-head"] < size["onnx-int4"] < size["onnx-fp32"]

    g = tmp_path / "ortreal.yaml"
    g.write_text(GRID.format(name="ortreal", form="onnx-int4"))
    s = execute.run_grid(str(g), store_root=tmp_path / "store")
    docs = [json.loads(p.read_text()) for p in Store(tmp_path / "store").iter_paths("ortreal")]
    assert s.failed == 0 and len(docs) == 1, [a.get("error") for a in docs]
    (a,) = docs
    eff, st = a["execution"]["effective"], a["execution"]["settings"]
    assert eff["output_tokens"] == [8, 8, 8] and eff["prompt_tokens"] == [16, 16, 16]
    assert eff["form_recipe"] == forms.recipe("onnx-int4") and eff["onnxruntime_genai_version"] == forms.PIN
    assert st["threads"] == {**st["threads"], "requested": 2, "effective": 2, "rule": "enforced"}
    assert st["cpus"]["effective"] == st["cpus"]["requested"] and st["warmups"]["effective"] == 1
    assert all(lib["matches_record"] for lib in a["engine"]["build"]["libraries"].values())
    assert a["model"]["form"] == "onnx-int4" and {f["path"].rsplit("/", 1)[-1] for f in a["model"]["files"]} >= {
        "model.onnx", "model.onnx.data"}
    assert len(a["metrics"]["itl_p50_s"]["samples"]) == 2 and min(a["metrics"]["decode_tok_s"]["samples"]) > 0
    assert [p for p in check_doc(a, f"{a['id']}.json") if ": harness.dirty:" not in p] == []

    (tmp_path / "prompts.json").write_text(json.dumps(PROMPTS))
    (tmp_path / "ortfid.yaml").write_text(FIDELITY_GRID)
    r = fidelity.run_fidelity(str(tmp_path / "ortfid.yaml"), str(tmp_path / "fid"), str(tmp_path / "refs"))
    assert r.errors == [], r.errors
    ref = json.loads(next(Store(tmp_path / "refs").iter_paths("ortfid")).read_text())
    fids = {d["grid"]["build"]: d for d in (json.loads(p.read_text()) for p in Store(tmp_path / "fid").iter_paths("ortfid"))}
    assert ref["engine"]["name"] == "onnxruntime-genai" and ref["model"]["form"] == "onnx-fp32"
    same, trap = fids["ort-fp32"], fids["ort-int4-head"]
    assert same["verdict"] == "pass" and same["summary"]["top1_agreement"] == 1.0 and same["summary"]["mean_kl"] == 0.0
    assert trap["verdict"] == "fail" and trap["summary"]["mean_kl"] > 0
    for o in ref["outputs"]:
        assert len(o["ids"]) == 8 and len(o["top"]) == 8 and o["forced_argmax_agreement"] >= 0.75
    assert same["execution"]["effective"]["threads"] == 2
    n, problems = check.check([str(tmp_path / "fid"), str(tmp_path / "refs")])
    assert n == 3 and [p for p in problems if ": harness.dirty:" not in p] == []

    prompts = fidelity.load_prompts(fidelity.load_grid(tmp_path / "ortfid.yaml")).prompts
    req = {"model_path": str(models.form_path("tiny-llama", "onnx-fp32")), "threads": 2, "gen_len": 8,
           "repetitions": [{"warmup": False, "prompts": [p["ids"]]} for p in prompts]}
    (tmp_path / "speed-request.json").write_text(json.dumps(req))
    subprocess.run([sys.executable, str(WORKER), str(tmp_path / "speed-request.json"),
                    str(tmp_path / "speed-result.json")], check=True, env={**os.environ, "PYTHONNOUSERSITE": "1"})
    speed = json.loads((tmp_path / "speed-result.json").read_text())
    assert speed["effective"]["output_ids_sha256"] == [hashlib.sha256(json.dumps(o["ids"]).encode()).hexdigest()
                                                        for o in ref["outputs"]]


def test_the_builder_stamps_no_checkout_commit_into_the_graph(tmp_path):
    """The builder writes `git rev-parse HEAD`, run in a folder five levels above its own file, into the graph's
    producer_version: with the venv inside this checkout that was the harness's commit, so a form's bytes changed
    with every commit that built it. Built with no repository in reach, the stamp is the wheel's own."""
    from importlib import metadata

    import onnx

    from harness import models
    from harness.engines.onnxruntime import forms
    from harness.paths import PROJECT_ROOT
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=PROJECT_ROOT, capture_output=True, text=True).stdout.strip()
    if not head:
        pytest.skip("the project is not a git checkout here: no commit to leak")
    models.ensure("tiny-llama")
    forms.build(models.form_path("tiny-llama", "hf-fp32"), tmp_path / "o", "onnx-fp32")
    stamp = onnx.load(str(tmp_path / "o" / "model.onnx"), load_external_data=False).producer_version
    assert stamp.split("+")[0] == metadata.version("onnxruntime-genai") and head[:7] not in stamp, stamp


def test_check_leaves_a_derived_forms_bytes_to_the_build_that_made_them():
    # a derived form is made on each machine (harness/models.py derived_forms): another build's bytes are not this
    # machine's to vouch for; the zoo's own forms (from the wheel) are compared as before
    files = (("onnx-int4/model.onnx", "a" * 64), ("hf-w4a16/model.safetensors", "b" * 64), ("gguf-f32/m.gguf", "c" * 64),
             ("/abs/build.gguf", "d" * 64))
    assert check.comparable(files) == (("gguf-f32/m.gguf", "c" * 64), ("/abs/build.gguf", "d" * 64))
