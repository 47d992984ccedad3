"""llama.cpp's K-quant form (harness/models.py KQuants): made on demand from hf-fp32 by the pinned build's own
tools, the tensor types it holds read back from the file and recorded (a row width that is not a multiple of 256
takes llama-quantize's fallback type: tiny-llama's width 128 sends all but its ffn_down matrices there), and a
real llama.cpp run
on it."""

import json

import pytest

from harness import execute, models, usermodels
from harness.check import check_doc
from harness.store import Store

GRID = """
name: kq
model: tiny-llama
arms:
  - {name: q4k, engine: llama.cpp, form: gguf-q4_k_m}
workload: {prompt_len: 16, context_len: 256, gen_len: 8}
threads: 2
passes: 1
repetitions: 1
warmups: 0
timeout_s: 300
"""


@pytest.mark.engines
def test_q4_k_m_form_records_the_types_it_holds_and_llamacpp_runs_it(tmp_path):
    models.ensure("tiny-llama", ["gguf-q4_k_m"])
    m = models.load_manifest("tiny-llama")
    f = m["forms"]["gguf-q4_k_m"]
    assert f["format"] == "gguf" and f["dtype"] == "q4_k_m" and f["recipe"] == models.KQuants.recipe("gguf-q4_k_m")
    files = models.form_files("tiny-llama", "gguf-q4_k_m")
    assert list(files) == ["gguf-q4_k_m/model-q4_k_m.gguf"]  # the intermediate f32 file is not left behind
    path = models.form_path("tiny-llama", "gguf-q4_k_m")
    info = usermodels.gguf_info(path, "x")
    assert f["tensor_types"] == info["tensor_types"] and info["file_type"] == "q4_k_m"
    # rows 128 wide cannot hold 256-wide K-quant blocks: those take the fallbacks (q5_0, q8_0); only the two
    # ffn_down matrices (rows 256 wide) take K-quant types (q4_K, and q6_K where Q4_K_M gives ffn_down more bits)
    t = f["tensor_types"]
    assert t.get("q4_k", 0) + t.get("q6_k", 0) == 2 and t["q5_0"] > 0, t
    assert f["tensor_types"]["f32"] == 2 * 2 + 1  # the norms stay float32

    g = tmp_path / "kq.yaml"
    g.write_text(GRID)
    s = execute.run_grid(str(g), store_root=tmp_path / "store")
    docs = [json.loads(p.read_text()) for p in Store(tmp_path / "store").iter_paths("kq")]
    assert s.failed == 0 and len(docs) == 1, [a.get("error") for a in docs]
    (a,) = docs
    assert a["model"]["form"] == "gguf-q4_k_m" and a["model"]["dtype"] == "q4_k_m"
    assert [x["sha256"] for x in a["model"]["files"]] == [files["gguf-q4_k_m/model-q4_k_m.gguf"]["sha256"]]
    assert a["status"] == "ok" and len(a["metrics"]["decode_tok_s"]["samples"]) == 1
    assert [p for p in check_doc(a, f"{a['id']}.json") if ": harness.dirty:" not in p] == []
