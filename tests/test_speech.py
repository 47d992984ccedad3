"""Speech (harness/workloads/speech, harness/engines/piper): the playback model against a hand-computed stream,
grid refusals in one line, a voice file that is not the pinned one refused, and real Piper runs of the real voice
(the short texts, two requests) whose per-chunk records, metrics and provenance `harness check` accepts."""

import json
import shutil

import pytest

from harness import check, execute, voices
from harness.errors import UserError
from harness.store import Store
from harness.workloads.speech import playback, texts

GRID = """
name: {name}
model: joe-us-medium
arms:
  - {{name: fp32, engine: piper, form: voice-fp32}}
workload: {{text: {text}}}
threads: 1
passes: 1
repetitions: 2
warmups: 0
timeout_s: 300
"""


def test_the_playback_model_on_a_hand_computed_stream():
    # chunks arrive at 0.5, 1.0 and 4.0 s holding 1, 2 and 1 s of audio; played before each: 0, 1, 3 s
    f = playback.stream_figures([0.5, 1.0, 4.0], [1.0, 2.0, 1.0])
    assert f["ttfa_s"] == 0.5
    assert f["audio_s"] == 4.0 and f["rtf"] == 1.0  # the last chunk at 4.0 s, 4 s of audio
    assert f["playback_start_s"] == 1.0  # max(0.5 - 0, 1.0 - 1, 4.0 - 3)
    # from 0.5 s: chunk 0 plays to 1.5, chunk 1 (here at 1.0) to 3.5, chunk 2 arrives at 4.0: one stall of 0.5 s
    assert f["stall_count"] == 1.0 and f["stall_s"] == pytest.approx(0.5)
    assert f["rtf_streamed"] == pytest.approx(3.5 / 3.0)
    # gaps 0.5 and 3.0: p50 1.75, p90 0.5 + 0.9 * 2.5, max 3.0
    assert f["chunk_gap_p50_s"] == pytest.approx(1.75) and f["chunk_gap_p90_s"] == pytest.approx(2.75)
    assert f["chunk_gap_max_s"] == 3.0
    # started at playback_start_s instead, the same stream plays through: no stall
    late = playback.stream_figures([x - 0.5 for x in [0.5, 1.0, 4.0]], [1.0, 2.0, 1.0])
    assert late["playback_start_s"] == 0.5 and late["stall_count"] == 1.0


def test_a_stream_ahead_of_playback_never_stalls_and_one_chunk_has_no_gaps():
    f = playback.stream_figures([0.2, 0.4, 0.6], [1.0, 1.0, 1.0])
    assert f["stall_count"] == 0.0 and f["stall_s"] == 0.0 and f["playback_start_s"] == 0.2
    one = playback.stream_figures([0.3], [2.0])
    assert not set(playback.MULTI_CHUNK) & set(one) and one["rtf"] == pytest.approx(0.15)
    m = playback.metrics([{"warmup": True, "arrivals_s": [0.3], "durations_s": [2.0]},
                          {"warmup": False, "arrivals_s": [0.2], "durations_s": [1.0]}], 1.5)
    assert m["ttfa_s"]["samples"] == [0.2] and m["ttfa_s"]["warmup_samples"] == [0.3]
    assert m["startup_s"]["samples"] == [1.5] and "chunk_gap_p50_s" not in m
    for bad in (([], []), ([0.5, 0.2], [1.0, 1.0]), ([0.1], [0.0]), ([0.1], [1.0, 1.0])):
        with pytest.raises(ValueError):
            playback.stream_figures(*bad)


def test_texts_are_chosen_alike_for_every_arm_of_a_pass():
    a = texts.chosen("long", 0, "text=long", 3, 5)
    assert a == texts.chosen("long", 0, "text=long", 3, 5) and len(a) == 5
    assert all(0 <= i < len(texts.TEXTS["long"]) for i in a)
    assert texts.set_sha256("short") != texts.set_sha256("long")


@pytest.mark.parametrize("edit,field", [
    (lambda g: g.replace("text: short", "text: whisper"), "workload.text"),
    (lambda g: g.replace("{text: short}", "{text: short, prompt_len: 8}"), "workload.prompt_len"),
    (lambda g: g.replace("{text: short}", "{text: short, chunking: frames}"), "workload.chunking"),
    (lambda g: g.replace("{text: short}", "{prompt_len: 8, context_len: 16, gen_len: 4}"), "workload.text"),
    (lambda g: g.replace("engine: piper, form: voice-fp32", "engine: command, options: {cmd: 'true'}"),
     "arms[fp32].engine"),
    (lambda g: g.replace("form: voice-fp32", "form: voice-fp8"), "voice-fp8"),
    (lambda g: g.replace("model: joe-us-medium", "model: tiny-llama"), "not a language model"),
])
def test_a_speech_grid_it_cannot_run_is_one_line(write_grid, cli, edit, field):
    rc, out, err = cli("plan", write_grid(edit(GRID.format(name="sp", text="short"))))
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert field in err


def test_a_voice_file_that_is_not_the_pinned_one_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(voices, "voice_dir", lambda name: tmp_path / name)
    d = voices.ensure("joe-us-medium", "voice-fp32")
    with open(d / voices.ONNX_NAME, "r+b") as f:
        f.seek(1000)
        f.write(b"\0\0\0\0")
    with pytest.raises(UserError) as e:
        voices.ensure("joe-us-medium", "voice-fp32")
    assert "corrupted" in str(e.value) and str(d) in str(e.value)
    shutil.rmtree(d)
    assert voices.ensure("joe-us-medium", "voice-fp32") == d  # prepared again from the installed wheel


@pytest.mark.parametrize("engine", ["piper", "sherpa-onnx"])
def test_real_runs_record_every_chunk_and_check_accepts_them(tmp_path, write_grid, engine):
    g = write_grid(GRID.format(name="spreal", text="long").replace("repetitions: 2", "repetitions: 2\nwarmups: 1")
                   .replace("warmups: 0\n", "").replace("engine: piper", f"engine: {engine}"))
    execute.run_grid(str(g), store_root=tmp_path / "store")
    (path,) = Store(tmp_path / "store").iter_paths("spreal")
    doc = json.loads(path.read_text())
    assert doc["status"] == "ok", doc.get("error")
    eff, m = doc["execution"]["effective"], doc["metrics"]
    assert doc["workload"]["speech"] == {"text_set": "long", "texts_sha256": texts.set_sha256("long"),
                                         "n_texts": len(texts.TEXTS["long"]), "chunking": "sentence"}
    assert doc["workload"]["prompt_len"] is None and doc["model"]["files"][0]["sha256"] == voices.VOICES[
        "joe-us-medium"].onnx_sha256
    # every stream of a long text: a chunk per sentence, each chunk's samples at the voice's rate
    assert len(eff["chunk_samples"]) == 3 and all(len(c) >= 4 for c in eff["chunk_samples"])
    assert eff["sample_rate"] == 22050 and eff["threads"] == 1
    assert eff["intra_op_num_threads" if engine == "piper" else "num_threads"] == 1
    if engine == "sherpa-onnx":  # the same voice file, with sherpa-onnx's metadata added: both recorded
        assert eff["derived"]["from_sha256"] == voices.VOICES["joe-us-medium"].onnx_sha256
    audio = [sum(c) / eff["sample_rate"] for c in eff["chunk_samples"]]
    assert m["audio_s"]["warmup_samples"] + m["audio_s"]["samples"] == pytest.approx(audio, abs=1e-6)
    for k in ("ttfa_s", "rtf", "playback_start_s", "chunk_gap_p50_s", "stall_count"):
        assert len(m[k]["samples"]) == 2 and len(m[k]["warmup_samples"]) == 1, k
    assert all(p >= t for p, t in zip(m["playback_start_s"]["samples"], m["ttfa_s"]["samples"]))
    assert m["startup_s"]["samples"][0] > 0
    # deterministic synthesis: the same text twice gives the same audio
    seen: dict = {}
    for t, h in zip(eff["texts"], eff["audio_sha256"]):
        assert seen.setdefault(t, h) == h
    _, problems = check.check([str(tmp_path / "store")], allow_unknown_commit=True)
    assert not [p for p in problems if "harness.dirty" not in p], problems
