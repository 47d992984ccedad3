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
    s = execute.run(str(g), store_root=tmp_path / "st")
    assert (s.done, s.failed) == (2, 0)
    arts = {a.grid.arm: a for a in (load_path(p) for p in Store(tmp_path / "st").iter_paths("own"))}
    for a in arts.values():
        assert a.model.name == "my-llama" and a.model.source["user_source"] == str(tmp_path / "m")
        assert a.model.source["sha256"] == usermodels.source_sha256(usermodels.UserModel("x", "hf", tmp_path / "m"))
    assert arts["llama.cpp"].model.dtype == "q8_0" and arts["llama.cpp"].model.files[0].path.endswith("q8_0.gguf")
    manifest = models.load_manifest("my-llama")
    assert set(manifest["forms"]) == {"hf-fp32", "gguf-f32", "gguf-bf16", "gguf-q8_0", "gguf-q4_0"}
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
