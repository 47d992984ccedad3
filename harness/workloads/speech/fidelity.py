"""Audio fidelity (`harness fidelity` on a grid whose model is a voice; docs/speech.md, "Fidelity"): each build
speaks every committed text and is compared with its own engine's full-precision reference (voice-fp32), spoken in
the same call: the log-spectral distance along the best alignment of the two (so a form that speaks a little faster
or slower is not punished for it) and the duration ratio, gated by the grid's thresholds. A build that garbles
speech fails, and the report then gives its speed no verdict, as for every engine.

With a word error rate threshold (max_mean_wer, max_wer_excess) each text's audio, the build's and the reference's,
also makes an ASR round trip (asr.py: Whisper tiny.en from a wheel, greedy): its transcript's word error rate
against the text, recorded per text and gated absolutely or as the excess over the reference's.

The reference is not stored: it is synthesized again in every call (deterministic, noise scales 0), and each text's
reference audio sha256 is recorded, so a speed run's `audio_sha256` of the same engine and form can be matched
with it.
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.grid.spec import err, short
from harness.workloads.speech import texts

REFERENCE_FORM = "voice-fp32"
THRESHOLDS = {  # name -> (summary figure, direction)
    "max_mean_lsd_db": ("mean_lsd_db", "<="),
    "max_lsd_db": ("max_lsd_db", "<="),
    "min_duration_ratio": ("min_duration_ratio", ">="),
    "max_duration_ratio": ("max_duration_ratio", "<="),
    "max_mean_wer": ("mean_wer", "<="),  # the ASR round trip (asr.py): asked by either of these two
    "max_wer_excess": ("wer_excess", "<="),
}
WER_THRESHOLDS = ("max_mean_wer", "max_wer_excess")
TOP_FIELDS = {"kind", "name", "description", "model", "texts", "threads", "timeout_s", "thresholds", "builds"}
BUILD_FIELDS = {"name", "engine", "form"}
N_FFT, HOP, FLOOR_DB = 1024, 256, 80.0


@dataclass(frozen=True)
class SpeechBuild:
    name: str
    engine: str
    form: str


@dataclass(frozen=True)
class SpeechFidelityGrid:
    path: str
    sha256: str
    name: str
    description: str
    model: str
    sets: tuple[str, ...]
    threads: int
    timeout_s: float
    thresholds: dict[str, float]
    builds: tuple[SpeechBuild, ...]


def from_dict(doc: dict, sp: str, sha: str) -> SpeechFidelityGrid:
    """A speech fidelity grid's document, validated (each refusal one line naming the field)."""
    from harness import voices
    from harness.engines import ENGINES, engine_class
    from harness.engines.capabilities import Speaks
    from harness.grid.yamlfile import entries, grid_name, only_fields
    from harness.grid.spec import integer
    only_fields(sp, "", doc, TOP_FIELDS)
    name = grid_name(sp, doc.get("name"))
    for req in ("texts", "threads", "thresholds", "builds"):
        if req not in doc:
            raise err(sp, req, "is required", "see docs/speech.md, Fidelity")
    sets = doc["texts"]
    if not isinstance(sets, list) or not sets or any(s not in texts.TEXTS for s in sets) or len(set(sets)) != len(sets):
        raise err(sp, "texts", f"must list committed text sets, each once, got {short(sets)}",
                  f"from {', '.join(texts.names())}")
    m = doc.get("model")
    if voices.known(m) and REFERENCE_FORM not in voices.VOICES[m].forms:
        raise err(sp, "model", f"voice {m} ships no {REFERENCE_FORM} form: its builds have no full-precision "
                  "reference to be held against", "audio fidelity needs a voice with voice-fp32 (docs/speech.md)")
    from harness.workloads.speech import asr
    wer = [k for k in WER_THRESHOLDS if k in (doc["thresholds"] if isinstance(doc["thresholds"], dict) else {})]
    if wer and voices.known(m) and voices.VOICES[m].language != asr.LANGUAGE:
        raise err(sp, f"thresholds.{wer[0]}", f"the ASR round trip's recogniser (Whisper tiny.en) hears "
                  f"{asr.LANGUAGE} only; voice {m} speaks {voices.VOICES[m].language}", "drop the word error rate "
                  "thresholds for this voice")
    for s in sets:
        if voices.known(m) and texts.LANGUAGE[s] != voices.VOICES[m].language:
            raise err(sp, "texts", f"voice {m} speaks {voices.VOICES[m].language}; the text set {s} is "
                      f"{texts.LANGUAGE[s]}", "use text sets of the voice's language")
    th = doc["thresholds"]
    if not isinstance(th, dict) or not th:
        raise err(sp, "thresholds", f"must be a mapping of bounds, got {short(th)}", f"known: {', '.join(THRESHOLDS)}")
    for k, v in th.items():
        if k not in THRESHOLDS:
            raise err(sp, f"thresholds.{k}", "unknown threshold", f"known: {', '.join(THRESHOLDS)}")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 1e6:
            raise err(sp, f"thresholds.{k}", f"must be a positive number, got {short(v)}")
    timeout = doc.get("timeout_s", 600)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 7 * 86400:
        raise err(sp, "timeout_s", f"must be a positive number of seconds (a week at most), got {short(timeout)}")
    builds = []
    for f, b in entries(sp, "builds", doc["builds"], BUILD_FIELDS, "each build: {name, engine, form}"):
        for req in ("name", "engine"):
            if not isinstance(b.get(req), str) or not b[req]:
                raise err(sp, f"{f}.{req}", "is required (a string)")
        if b["engine"] not in ENGINES or not issubclass(engine_class(b["engine"]), Speaks):
            speakers = [e for e in ENGINES if issubclass(engine_class(e), Speaks)]
            raise err(sp, f"{f}.engine", f"{short(b['engine'])} is not a speech engine", f"one of {', '.join(speakers)}")
        form = b.get("form") or REFERENCE_FORM
        voices.check_form(f"{sp}: {f}.form", form)
        builds.append(SpeechBuild(b["name"], b["engine"], form))
    if len({b.name for b in builds}) != len(builds):
        raise err(sp, "builds", "build names must be unique")
    return SpeechFidelityGrid(path=sp, sha256=sha, name=name, description=str(doc.get("description") or ""),
                              model=doc["model"], sets=tuple(sets), threads=integer(sp, "threads", doc["threads"]),
                              timeout_s=float(timeout), thresholds={k: float(v) for k, v in th.items()},
                              builds=tuple(builds))


# ---- the comparison ----------------------------------------------------------------------------------

def log_spectra(x: Any) -> Any:
    """Frames of N_FFT samples every HOP (Hann window) as power in dB, floored FLOOR_DB below the loudest bin (silence
    does not dominate the distance); one row per frame."""
    import numpy as np
    x = np.asarray(x, dtype=np.float64)
    if len(x) < N_FFT:
        x = np.pad(x, (0, N_FFT - len(x)))
    n = 1 + (len(x) - N_FFT) // HOP
    frames = np.lib.stride_tricks.as_strided(x, (n, N_FFT), (x.strides[0] * HOP, x.strides[0])) * np.hanning(N_FFT)
    p = np.abs(np.fft.rfft(frames, axis=1)) ** 2
    db = 10 * np.log10(np.maximum(p, 1e-20))
    return np.maximum(db, db.max() - FLOOR_DB)


def lsd_dtw(ref: Any, build: Any) -> float:
    """The log-spectral distance (dB) of build from ref along their best alignment: frame distance
    d(i, j) = sqrt(mean over bins of (R_i - B_j)^2), dynamic time warping with the symmetric step pattern (a
    diagonal step counts d twice, a vertical or horizontal one once), the total divided by N + M frames."""
    import numpy as np
    a, b = log_spectra(ref), log_spectra(build)
    k = a.shape[1]
    sq = (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2 * a @ b.T
    d = np.sqrt(np.maximum(sq, 0.0) / k)
    n, m = d.shape
    prev = np.full(m, np.inf)
    for i in range(n):
        c = d[i]
        # D[i, j] = min(D[i-1, j-1] + 2 c_j, D[i-1, j] + c_j, D[i, j-1] + c_j), D[0, 0] = 2 c_0: what enters row i
        # from row i-1, then the horizontal steps by a prefix minimum: D[i, j] = S_j + min_(k<=j) (enter_k - S_k)
        if i == 0:
            enter = np.full(m, np.inf)
            enter[0] = 2 * c[0]
        else:
            diag = np.empty(m)
            diag[0] = np.inf
            diag[1:] = prev[:-1] + 2 * c[1:]
            enter = np.minimum(diag, prev + c)
        s = np.cumsum(c)
        prev = s + np.minimum.accumulate(enter - s)
    return float(prev[-1] / (n + m))


def compare(ref: list, build: list) -> list[dict[str, Any]]:
    """Per text: the distance and the duration ratio of the build's audio to the reference's (and, where both were
    transcribed, their transcripts and word error rates)."""
    import numpy as np
    rows = []
    for r, b in zip(ref, build):
        same = len(r["audio"]) == len(b["audio"]) and bool(np.array_equal(r["audio"], b["audio"]))
        rows.append({"id": r["id"], "samples": len(b["audio"]), "reference_samples": len(r["audio"]),
                     "duration_ratio": len(b["audio"]) / len(r["audio"]), "identical": same,
                     "lsd_db": 0.0 if same else lsd_dtw(r["audio"], b["audio"]), "audio_sha256": b["audio_sha256"],
                     **({"transcript": b["transcript"], "wer": b["wer"], "reference_transcript": r["transcript"],
                         "reference_wer": r["wer"]} if "wer" in b and "wer" in r else {})})
    return rows


def summarize(rows: list[dict]) -> dict[str, Any]:
    ls = [r["lsd_db"] for r in rows]
    dr = [r["duration_ratio"] for r in rows]
    out = {"texts": len(rows), "identical_share": sum(r["identical"] for r in rows) / len(rows),
           "mean_lsd_db": sum(ls) / len(ls), "max_lsd_db": max(ls), "min_duration_ratio": min(dr),
           "max_duration_ratio": max(dr)}
    if rows and all("wer" in r for r in rows):
        w, rw = [r["wer"] for r in rows], [r["reference_wer"] for r in rows]
        out |= {"mean_wer": sum(w) / len(w), "max_wer": max(w), "reference_mean_wer": sum(rw) / len(rw),
                "wer_excess": sum(w) / len(w) - sum(rw) / len(rw)}
    return out


def transcribe_all(res: dict, spoken: list[tuple[str, str]], transcribe: Any) -> None:
    """Each item of a spoken build (speak_all's result) given its transcript and word error rate, in place."""
    from harness.workloads.speech import asr
    if res.get("status") != "ok":
        return
    rate = int(res["effective"]["sample_rate"])
    for it, (_, text) in zip(res["items"], spoken):
        it["transcript"] = transcribe(it["audio"], rate)
        it["wer"] = asr.word_error_rate(text, it["transcript"])


def gate(summary: dict, thresholds: dict[str, float]) -> list[str]:
    out = []
    for k, bound in sorted(thresholds.items()):
        fig, op = THRESHOLDS[k]
        v = summary[fig]
        if (op == "<=" and v > bound) or (op == ">=" and v < bound):
            out.append(f"{fig} {v:.4g} {'>' if op == '<=' else '<'} {bound:g} ({k})")
    return out


# ---- the run ----------------------------------------------------------------------------------------

@dataclass
class Result:
    """What `harness fidelity` reports (as harness.fidelity.FidelityRun): the files written, the builds that failed,
    the builds that errored."""
    written: list
    failed_builds: list
    errors: list


def _spoken(g: SpeechFidelityGrid) -> list[tuple[str, str]]:
    return [(f"{s}[{i}]", t) for s in g.sets for i, t in enumerate(texts.TEXTS[s])]


def run(g: SpeechFidelityGrid, store_root: str = "artifacts", out: Any = None) -> Result:
    """Every build against its engine's reference: one audio-fidelity artifact per build, written to the store."""
    import os

    from harness import lifecycle, provenance
    from harness.engines import get_engine
    from harness.store import Store
    out = out or sys.stderr
    store = Store(Path(store_root))
    workroot = lifecycle.new_root("fidelity")
    spoken = _spoken(g)
    cpus = sorted(os.sched_getaffinity(0))[:g.threads]  # as a run's default CPUs (runner.default_cpus)
    harness = provenance.harness_info()
    print(f"[fidelity] {g.name}: {len(g.builds)} builds x {len(spoken)} texts ({', '.join(g.sets)}), each against "
          f"its engine's {REFERENCE_FORM}", file=out)
    result = Result([], [], [])
    refs: dict[str, Any] = {}
    transcribe, asr_info = None, None
    if any(k in g.thresholds for k in WER_THRESHOLDS):  # the ASR round trip, its recogniser loaded once
        from harness.workloads.speech import asr
        transcribe, asr_info = asr.recogniser(g.threads)
    for b in g.builds:
        eng = get_engine(b.engine)
        if b.engine not in refs:
            print(f"[fidelity] {b.engine} {REFERENCE_FORM}: the reference", file=out, flush=True)
            refs[b.engine] = eng.speak_all(g.model, REFERENCE_FORM, spoken, g.threads, cpus,
                                           Path(tempfile.mkdtemp(prefix="ref-", dir=workroot)), g.timeout_s)
            if transcribe is not None:
                transcribe_all(refs[b.engine], spoken, transcribe)
        span = provenance.Span()
        res = eng.speak_all(g.model, b.form, spoken, g.threads, cpus, Path(tempfile.mkdtemp(prefix="build-",
                                                                                            dir=workroot)), g.timeout_s)
        host, timing = span.finish()
        if transcribe is not None:
            transcribe_all(res, spoken, transcribe)
        a = _artifact(g, b, spoken, refs[b.engine], res, cpus, harness, host, timing, eng, asr_info)
        result.written.append(store.write(a))
        s = a.summary
        if a.status != "ok":
            result.errors.append(f"{b.name}: {a.error}")
            line = f"{b.name}: ERROR {a.error}"
        else:
            line = (f"{b.name}: {a.verdict}: mean LSD {s['mean_lsd_db']:.2f} dB (max {s['max_lsd_db']:.2f}), duration "
                    f"ratio {s['min_duration_ratio']:.3f}-{s['max_duration_ratio']:.3f}, identical "
                    f"{s['identical_share']:.2f}" + (f", WER {s['mean_wer']:.3f} (reference {s['reference_mean_wer']:.3f})"
                                                     if "mean_wer" in s else ""))
            if a.verdict == "fail":
                result.failed_builds.append(b.name)
                line += "\n    " + "\n    ".join(a.failures)
        print(f"[fidelity] {line}", file=out, flush=True)
    return result


def _artifact(g: SpeechFidelityGrid, b: SpeechBuild, spoken: list, ref: dict, res: dict, cpus: list[int],
              harness: dict, host: dict, timing: dict, eng: Any, asr_info: dict | None = None) -> Any:
    """One build's audio-fidelity artifact: compared and gated where both it and its reference spoke."""
    from harness import documents, voices
    from harness.artifact import FidelityGridRef
    mblock, _ = voices.model_block(g.model, b.form)
    rblock, _ = voices.model_block(g.model, REFERENCE_FORM)
    reference = {"engine": b.engine, "form": REFERENCE_FORM, "model_sha256": sorted(f["sha256"] for f in rblock["files"]),
                 "status": ref["status"], "audio_sha256": [x["audio_sha256"] for x in ref.get("items", [])],
                 **({"asr": asr_info} if asr_info else {})}
    bad = next((x for x in (ref, res) if x["status"] != "ok"), None)
    if bad is not None:
        outcome = dict(status=bad["status"], error=bad["error"], stderr_tail=bad.get("stderr") or None, items=[],
                       summary={}, verdict="error", failures=[bad["error"]])
    else:
        rows = compare(ref["items"], res["items"])
        summary = summarize(rows)
        fails = gate(summary, g.thresholds)
        outcome = dict(status="ok", error=None, stderr_tail=None, items=rows, summary=summary,
                       verdict="fail" if fails else "pass", failures=fails)
    return documents.audio_fidelity(
        grid=FidelityGridRef(path=g.path, sha256=g.sha256, name=g.name, build=b.name), model=mblock,
        engine=res.get("engine") or eng.engine_info(), harness=harness, host=host, timing=timing,
        execution=documents.execution(
            threads=g.threads, cpus=cpus, numa_policy="default (no numa option)", env=res.get("env", {}),
            requested={"form": b.form, "threads": g.threads, "noise_scale": 0.0, "noise_w_scale": 0.0},
            effective=res.get("effective", {}), compile_cache={"key": "n/a", "state": "n/a (no compile cache)"},
            eager=None, command=res.get("command", [])),
        texts={"sets": {s: texts.set_sha256(s) for s in g.sets}, "ids": [i for i, _ in spoken]},
        reference=reference, thresholds=g.thresholds, **outcome)
