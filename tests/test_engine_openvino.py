"""The OpenVINO GenAI engine (harness/engines/openvino): refused forms at plan, no openvino import in the
harness, and one real run beside llama.cpp on the same GGUF file."""

import json
import subprocess
import sys

import pytest

from harness import check, runner
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
    s = runner.run(str(g), store_root=tmp_path / "store")
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
