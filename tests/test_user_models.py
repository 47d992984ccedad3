"""Your model by path (harness/usermodels.py): a small HF model built here (random weights, a real
architecture) given to a grid by path, its GGUF forms derived with the pinned tools, both real engines run on
it; the registry of `harness models add`; and every bad input refused in one line, exit 2, nothing run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness import models, usermodels
from harness.store import Store, load_path

SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=1,
             num_key_value_heads=1, head_dim=64, max_position_embeddings=512, tie_word_embeddings=True)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    """A Llama of random weights (seeded: the same bytes each time, so its prepared forms are cached by
    content across runs) with SmolLM2's tokenizer."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    tok = AutoTokenizer.from_pretrained(str(models.ensure("smollm2-135m") / "hf-fp32"))
    torch.manual_seed(7)
    m = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), bos_token_id=tok.bos_token_id,
                                     eos_token_id=tok.eos_token_id, dtype=torch.float32, **SHAPE))
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0.0, 0.02)
    d = tmp_path_factory.mktemp("mine") / "my-llama"
    m.save_pretrained(d, safe_serialization=True)
    tok.save_pretrained(d)
    return d


GRID = """
name: own
model: {model}
arms:
  - {{name: llama.cpp, engine: llama.cpp, form: gguf-q8_0}}
  - {{name: vllm, engine: vllm, form: hf-fp32}}
workload: {{prompt_len: 8, context_len: 256, gen_len: 4}}
threads: 1
passes: 1
repetitions: 1
warmups: 0
"""


def _grid(tmp_path: Path, model: str) -> Path:
    g = tmp_path / "own.yaml"
    g.write_text(GRID.format(model=model))
    return g


@pytest.mark.engines
def test_your_hf_model_by_path_runs_on_both_engines_and_is_recorded(hf_dir, tmp_path):
    from harness import execute
    from harness.check import check
    shutil.copytree(hf_dir, tmp_path / "m")
    g = _grid(tmp_path, "{name: my-llama, hf: m}")  # relative to the grid file
    s = execute.run_grid(str(g), store_root=tmp_path / "st")
    assert (s.done, s.failed) == (2, 0)
    arts = {a.grid.arm: a for a in (load_path(p) for p in Store(tmp_path / "st").iter_paths("own"))}
    for a in arts.values():
        assert a.model.name == "my-llama" and a.model.source["user_source"] == str(tmp_path / "m")
        assert a.model.source["sha256"] == usermodels.source_sha256(usermodels.UserModel("x", "hf", tmp_path / "m"))
    assert arts["llama.cpp"].model.dtype == "q8_0" and arts["llama.cpp"].model.files[0].path.endswith("q8_0.gguf")
    manifest = models.load_manifest("my-llama")  # the forms the arms load, and gguf-f32 that q8_0 is made from
    assert {"hf-fp32", "gguf-f32", "gguf-q8_0"} <= set(manifest["forms"])
    assert models.user_forms(models.USER["my-llama"]) == ["hf-fp32", "gguf-f32", "gguf-bf16", "gguf-q8_0", "gguf-q4_0"]
    assert manifest["architecture"] == ["LlamaForCausalLM"] and manifest["config"]["hidden_size"] == 64
    n, problems = check([tmp_path / "st"])  # model hashes verified against this machine's prepared copy
    assert n == 2 and [p for p in problems if ": harness.dirty:" not in p] == []


def test_a_gguf_by_path_is_read_from_its_own_metadata(tmp_path):
    src = models.form_path("tiny-llama", "gguf-f32")
    info = usermodels.gguf_info(src, "x")
    assert info["architecture"] == "llama" and info["file_type"] == "f32"
    assert info["shape"]["hidden_size"] == 128 and info["shape"]["num_hidden_layers"] == 2
    assert info["parameters"] > 0


def test_models_add_registers_beside_the_zoo_and_a_grid_names_it(tmp_path, cli, monkeypatch):
    monkeypatch.setattr(usermodels, "registry_path", lambda: tmp_path / "user-models.json")
    monkeypatch.setattr(models, "MODELS", dict(models.MODELS))
    monkeypatch.setattr(models, "USER", {})
    src = models.form_path("tiny-llama", "gguf-f32")
    rc, out, _ = cli("models", "add", "my-tiny", "--gguf", src)
    assert rc == 0 and "registered" in out
    assert json.loads((tmp_path / "user-models.json").read_text())["my-tiny"]["kind"] == "gguf"
    rc, out, err = cli("plan", _grid(tmp_path, "my-tiny"))
    assert rc == 0, err
    rc, out, _ = cli("models", "add", "tiny-llama", "--gguf", src)
    assert rc == 2 and "zoo model" in out + _


@pytest.mark.parametrize("model, says", [
    ("{name: m, gguf: nowhere.gguf}", "No such file"),
    ("{name: m, gguf: notgguf.gguf}", "is not a GGUF file"),
    ("{name: m, gguf: cut.gguf}", "truncated"),
    ("{name: m, hf: empty}", "has no config.json"),
    ("{name: m, hf: noweights}", "has no *.safetensors"),
    ("{name: m, gguf: ok.gguf, hf: empty}", "exactly one of gguf"),
    ("{name: Bad Name, gguf: ok.gguf}", "is not a model name"),
    ("{name: m, gguf: ok.gguf, sha256: abc}", "is not 64 hex digits"),
    ("{name: m, gguf: ok.gguf, sha256: " + "a" * 64 + "}", "the pin is aaaa"),
    ("{name: m, gguf: ok.gguf, size: 3}", "unknown key 'size'"),
    ("{name: tiny-llama, gguf: ok.gguf}", "is the name of a zoo model"),
])
def test_a_bad_model_by_path_is_one_line_exit_2(tmp_path, cli, model, says):
    src = models.form_path("tiny-llama", "gguf-f32")
    shutil.copyfile(src, tmp_path / "ok.gguf")
    (tmp_path / "notgguf.gguf").write_bytes(b"PK\x03\x04 not a gguf")
    (tmp_path / "cut.gguf").write_bytes(src.read_bytes()[: src.stat().st_size // 2])
    (tmp_path / "empty").mkdir()
    (tmp_path / "noweights").mkdir()
    (tmp_path / "noweights" / "config.json").write_text("{}")
    rc, _, err = cli("plan", _grid(tmp_path, model))
    assert rc == 2 and says in err and len(err.strip().splitlines()) == 1, err
    assert "own.yaml" in err or "model" in err


def test_a_synthetic_shape_from_a_config_is_planned_and_marked_synthetic(tmp_path, cli):
    cfg = {"architectures": ["LlamaForCausalLM"], **{k: v for k, v in SHAPE.items() if k in usermodels.SHAPE_KEYS}}
    (tmp_path / "shape.json").write_text(json.dumps(cfg))
    rc, _, err = cli("plan", _grid(tmp_path, "{name: my-shape, synthetic: {config: shape.json}}"))
    assert rc == 0, err
    assert models.is_synthetic("my-shape") and models.known("my-shape")
    committed = Path(__file__).resolve().parent.parent / "grids" / "shapes" / "llama-3.2-1b.json"
    shape = usermodels.synthetic_shape(usermodels.UserModel("l1b", "synthetic", committed), "x")
    assert shape == {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64}


@pytest.mark.parametrize("cfg, says", [
    ({"architectures": ["GPT2LMHeadModel"], "hidden_size": 64}, "architecture GPT2LMHeadModel"),
    ({"architectures": ["LlamaForCausalLM"], "hidden_size": 64}, "intermediate_size missing"),
    ({"architectures": ["LlamaForCausalLM"], "hidden_size": 65536, "intermediate_size": 262144,
      "num_hidden_layers": 512, "num_attention_heads": 512, "num_key_value_heads": 512}, "GiB in fp32 to build"),
])
def test_a_bad_synthetic_config_is_one_line_exit_2(tmp_path, cli, cfg, says):
    (tmp_path / "shape.json").write_text(json.dumps(cfg))
    rc, _, err = cli("plan", _grid(tmp_path, "{name: my-shape, synthetic: {config: shape.json}}"))
    assert rc == 2 and says in err and len(err.strip().splitlines()) == 1, err


AXIS_GRID = """
name: own-axis
arms: [{{name: llama.cpp, engine: llama.cpp, form: gguf-f32}}]
axes:
  model: {models}
workload: {{prompt_len: 8, context_len: 256, gen_len: 4}}
threads: 1
passes: 1
"""


def test_a_model_axis_takes_models_by_path_and_names_them_in_its_cells(tmp_path, cli):
    from harness import grid
    shutil.copyfile(models.form_path("tiny-llama", "gguf-f32"), tmp_path / "t.gguf")
    cfg = {"architectures": ["LlamaForCausalLM"], **{k: v for k, v in SHAPE.items() if k in usermodels.SHAPE_KEYS}}
    (tmp_path / "shape.json").write_text(json.dumps(cfg))
    g = tmp_path / "axis.yaml"
    g.write_text(AXIS_GRID.format(models="[{name: ax-gguf, gguf: t.gguf}, {name: ax-shape, synthetic: {config: "
                                  "shape.json}}, tiny-llama]"))
    cells = {c.params["model"] for c in grid.expand(grid.load(g))}
    assert cells == {"ax-gguf", "ax-shape", "tiny-llama"}
    assert models.USER["ax-gguf"].path == tmp_path / "t.gguf" and models.is_synthetic("ax-shape")
    g.write_text(AXIS_GRID.format(models="[{name: ax-gguf, gguf: t.gguf}, {name: ax-gguf, gguf: t.gguf}]"))
    rc, _, err = cli("plan", g)
    assert rc == 2 and "axes.model" in err and "names a model twice" in err, err
    g.write_text(AXIS_GRID.format(models="[{name: ax-gone, gguf: gone.gguf}]"))
    rc, _, err = cli("plan", g)
    assert rc == 2 and "axes.model[0]" in err and len(err.strip().splitlines()) == 1, err


def test_models_path_names_a_prepared_form(cli):
    rc, out, _ = cli("models", "path", "tiny-llama", "gguf-f32")
    assert rc == 0 and Path(out.strip()) == models.form_path("tiny-llama", "gguf-f32") and Path(out.strip()).is_file()
    rc, _, err = cli("models", "path", "tiny-llama", "gguf-nope")
    assert rc == 2 and "unknown form" in err


FIDELITY_GRID = """
kind: fidelity
name: own-fidelity
model: {{name: my-llama, hf: m}}
prompts: {prompts}
gen_len: 4
threads: 1
thresholds: {{min_top1_agreement: 0.5}}
builds:
{builds}
"""


def _fidelity_grid(tmp_path: Path, builds: str) -> Path:
    g = tmp_path / "fid.yaml"
    prompts = Path(__file__).resolve().parent.parent / "grids" / "prompts" / "fidelity-v1.json"
    g.write_text(FIDELITY_GRID.format(prompts=prompts, builds=builds))
    return g


@pytest.mark.engines
def test_fidelity_of_your_model_is_scored_against_its_own_full_precision_form(hf_dir, tmp_path):
    """A model given by path in a fidelity grid: a real llama.cpp q8_0 build scored against the model's own bf16
    GGUF (the default reference); vLLM's default reference (hf-bf16) falls back to the folder as given (fp32),
    and a reference form the model lacks, named by the grid, is refused with the forms it has."""
    from harness import fidelity
    from harness.errors import UserError
    shutil.copytree(hf_dir, tmp_path / "m")
    g = _fidelity_grid(tmp_path, "  - {name: q8, engine: llama.cpp, form: gguf-q8_0}")
    r = fidelity.run_fidelity(str(g), store_root=str(tmp_path / "st"), references_root=str(tmp_path / "refs"))
    assert r.errors == []
    arts = [load_path(p) for p in r.written]
    ref, build = [a for a in arts if a.kind == "reference"], [a for a in arts if a.kind == "fidelity"]
    assert len(ref) == 1 and ref[0].model.form == "gguf-bf16" and ref[0].model.name == "my-llama"
    assert ref[0].model.source["user_source"] == str(tmp_path / "m")
    assert len(build) == 1 and build[0].status == "ok" and build[0].reference["form"] == "gguf-bf16"
    assert build[0].summary["top1_agreement"] > 0.5 and build[0].verdict in ("pass", "fail")
    vg = fidelity.load_grid(_fidelity_grid(tmp_path, "  - {name: v, engine: vllm, form: hf-fp32}"))
    assert fidelity.reference_form(vg, "vllm") == "hf-fp32"
    named = _fidelity_grid(tmp_path, "  - {name: v, engine: vllm, form: hf-fp32}").read_text() + \
        "references: {vllm: hf-bf16}\n"
    (tmp_path / "named.yaml").write_text(named)
    with pytest.raises(UserError, match="references.vllm: model my-llama has no hf-bf16 form"):
        fidelity.reference_form(fidelity.load_grid(tmp_path / "named.yaml"), "vllm")


def test_forms_are_made_as_grids_ask_for_them_and_a_prepared_copy_is_extended(tmp_path, monkeypatch):
    """A user's f32 GGUF, prepared for the one form a grid loads (the file as given), is extended when another
    grid asks for q8_0 (quantized from the f32 source: nothing else is made; the prepared file is linked, not
    rewritten), then for an HF form (dequantized); a form the model cannot have is refused with its forms."""
    shutil.copyfile(models.form_path("tiny-llama", "gguf-f32"), tmp_path / "t.gguf")
    monkeypatch.setattr(models, "models_root", lambda: tmp_path / "models")  # a cache of its own: built here
    monkeypatch.setattr(models, "MODELS", dict(models.MODELS))
    monkeypatch.setattr(models, "USER", {})
    models.register(usermodels.UserModel("forms-tiny", "gguf", tmp_path / "t.gguf"))
    assert models.user_forms(models.USER["forms-tiny"])[0] == "gguf-f32"
    root = models.ensure("forms-tiny", ["gguf-f32"])
    m = models.load_manifest("forms-tiny")
    assert set(m["forms"]) == {"gguf-f32"} and not (root / "hf-fp32").exists()
    inode = (root / "gguf" / "model-f32.gguf").stat().st_ino
    models.ensure("forms-tiny", ["gguf-q8_0"])
    m = models.load_manifest("forms-tiny")
    assert set(m["forms"]) == {"gguf-f32", "gguf-q8_0"} and not (root / "hf-fp32").exists()
    assert (root / "gguf" / "model-f32.gguf").stat().st_ino == inode
    assert models.verify("forms-tiny", full=True) == []
    models.ensure("forms-tiny", ["hf-bf16"])  # an HF form: dequantized by transformers, then
    assert set(models.load_manifest("forms-tiny")["forms"]) == {"gguf-f32", "gguf-q8_0", "hf-fp32", "hf-bf16"}
    with pytest.raises(Exception, match="has no form 'gguf-q5_k'"):
        models.ensure("forms-tiny", ["gguf-q5_k"])


def test_an_engine_that_cannot_load_your_models_architecture_is_refused_at_plan(tmp_path, cli, monkeypatch):
    """A GGUF whose architecture transformers cannot dequantize (here: llama, declared so) has no hf-* form: a
    vLLM arm on it is refused at plan, naming the forms it has and the engines that can run it."""
    monkeypatch.setattr(usermodels, "GGUF_TO_HF", ())
    shutil.copyfile(models.form_path("tiny-llama", "gguf-f32"), tmp_path / "t.gguf")
    g = _grid(tmp_path, "{name: arch-tiny, gguf: t.gguf}")
    g.write_text(g.read_text().replace("form: gguf-q8_0", "form: gguf-f32"))
    rc, _, err = cli("plan", g)
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "arms[vllm].form: model arch-tiny" in err
    assert "has no form hf-fp32: its forms are gguf-f32, gguf-q8_0, gguf-q4_0" in err
    assert "engines that can run it: " in err and "llama.cpp" in err and "vllm" not in err.split("can run it")[1]


def test_check_accepts_runs_of_models_this_machine_does_not_know(tmp_path, monkeypatch):
    """The published own-model series ran a GGUF given by path and a synthetic shape: on a machine (or in a
    process) that has registered neither, check has nothing local to compare their files with, and passes."""
    from harness.check import check
    monkeypatch.setattr(usermodels, "registry_path", lambda: tmp_path / "user-models.json")
    monkeypatch.setattr(models, "USER", {})
    monkeypatch.setattr(models, "MODELS", {k: v for k, v in models.MODELS.items()
                                           if k not in ("my-smollm2-q4_1", "llama-3.2-1b-shape")})
    store = Path(__file__).resolve().parent.parent / "artifacts" / "own-model"
    assert not models.known("my-smollm2-q4_1") and not models.known("llama-3.2-1b-shape")
    n, problems = check([str(store)])
    assert n >= 54 and problems == []


def test_a_gguf_transformers_cannot_dequantize_is_requantized_by_llama_quantize(tmp_path, monkeypatch):
    """Without HF forms (its architecture, here declared so), q8_0 and q4_0 are made from the quantized file itself
    (llama-quantize --allow-requantize), and say so."""
    shutil.copyfile(models.form_path("smollm2-135m", "gguf-q4_1"), tmp_path / "s.gguf")
    monkeypatch.setattr(usermodels, "GGUF_TO_HF", ())
    monkeypatch.setattr(models, "models_root", lambda: tmp_path / "models")
    monkeypatch.setattr(models, "MODELS", dict(models.MODELS))
    monkeypatch.setattr(models, "USER", {})
    models.register(usermodels.UserModel("requant", "gguf", tmp_path / "s.gguf"))
    assert models.user_forms(models.USER["requant"]) == ["gguf-q4_1", "gguf-q8_0", "gguf-q4_0"]
    models.ensure("requant", ["gguf-q8_0"])
    m = models.load_manifest("requant")
    assert set(m["forms"]) == {"gguf-q4_1", "gguf-q8_0"} and "requantized" in m["forms"]["gguf-q8_0"]["from"]
    assert usermodels.gguf_info(models.form_path("requant", "gguf-q8_0"), "x")["file_type"] == "q8_0"


def test_a_damaged_safetensors_header_is_one_user_error(tmp_path):
    from harness.errors import UserError
    (tmp_path / "model.safetensors").write_bytes((12).to_bytes(8, "little") + b'{"w": {"x":1')
    with pytest.raises(UserError, match="model.safetensors: not a readable safetensors file"):
        models._safetensors_parameters(tmp_path)
