"""Speech metrics, one definition each, from one stream's chunk arrival stamps and each chunk's audio duration
(docs/speech.md, "The playback model").

A stream of n chunks: chunk i arrives a_i seconds after the request (the text handed to the engine) and holds
d_i seconds of audio (its samples / the sample rate read back). A player plays the chunks back to back, in order.
Before chunk i it has played D_i = d_0 + ... + d_{i-1}.
"""

from __future__ import annotations

import math
from typing import Any

PER = "; per request"  # one sample per stream (a request speaks one text; a repetition sends one request)
SPEECH_METRICS: dict[str, tuple[str, bool, str]] = {
    "ttfa_s": ("s", False, "time to first audio: the request to the first chunk's arrival (a_0)" + PER),
    "rtf": ("ratio", False, "real-time factor: the request to the last chunk's arrival / the audio's duration "
                            "(a_{n-1} / sum d_i; below 1 is faster than real time)" + PER),
    "rtf_streamed": ("ratio", False, "real-time factor after the first chunk: (a_{n-1} - a_0) / (sum d_i - d_0); "
                                     "streams of two chunks or more" + PER),
    "audio_s": ("s of audio", True, "the audio's duration, sum d_i (samples / the sample rate the engine reported)" + PER),
    "playback_start_s": ("s", False, "the earliest playback start after the request at which the stream plays "
                                     "without an underrun: max_i (a_i - D_i)" + PER),
    "stall_count": ("count", False, "underruns when playback starts at the first chunk's arrival: chunks that arrive "
                                    "after the player has played all before them" + PER),
    "stall_s": ("s", False, "the silence those underruns add when playback starts at the first chunk's arrival "
                            "(the sum of each late chunk's wait)" + PER),
    "ready_s": ("s", False, "the engine process's launch (interpreter start and imports included) to the voice "
                            "loaded and ready (its session made, its phonemizer initialized); not vLLM's startup_s, "
                            "which times its engine's construction alone; one sample per run"),
}
for _q in ("p50", "p90", "p99", "max"):
    SPEECH_METRICS[f"chunk_gap_{_q}_s"] = (
        "s", False, f"the {_q} of the gaps between consecutive chunk arrivals (a_i - a_(i-1)) within a stream "
                    "(linear interpolation between order statistics); streams of two chunks or more" + PER)
_REP = "; per repetition"
# A served run (workload.load): each repetition sends many requests at once; its figures are over them.
SERVED_METRICS: dict[str, tuple[str, bool, str]] = {
    "served_ttfa_p50_s": ("s", False, "the median over the repetition's requests of the time from a request's send to "
                                      "its first audio chunk's last byte" + _REP),
    "served_ttfa_p90_s": ("s", False, "the p90 over the repetition's requests of the time from a request's send to its "
                                      "first audio chunk's last byte" + _REP),
    "served_rtf_p50": ("ratio", False, "the median over the repetition's requests of (the last chunk's arrival after "
                                       "the send) / the audio's duration" + _REP),
    "stall_free_share": ("share", True, "requests whose stream plays without an underrun when playback starts at its "
                                        "first chunk (the playback model's stall_count 0), of the requests sent" + _REP),
    "stall_free_streams_s": ("req/s", True, "stall-free streams / (the last response's end - the first send): the "
                                            "goodput of speech" + _REP),
    "served_audio_s_per_s": ("s of audio/s", True, "seconds of audio delivered by the requests that completed / (the "
                                                   "last response's end - the first send)" + _REP),
}
MULTI_CHUNK = ("rtf_streamed", "chunk_gap_p50_s", "chunk_gap_p90_s", "chunk_gap_p99_s", "chunk_gap_max_s")


def percentile(xs: list[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between order statistics (numpy's default)."""
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def stream_figures(arrivals: list[float], durations: list[float]) -> dict[str, float]:
    """One stream's figures (the metrics above but ready_s); the multi-chunk ones only where n >= 2."""
    if not arrivals or len(arrivals) != len(durations):
        raise ValueError(f"a stream needs one duration per chunk ({len(arrivals)} arrivals, {len(durations)} "
                         "durations)")
    if any(b < a for a, b in zip(arrivals, arrivals[1:])) or arrivals[0] < 0 or min(durations) < 0:
        raise ValueError("chunk arrivals must be non-negative and in order, durations non-negative")
    total = sum(durations)
    if total <= 0:
        raise ValueError("the stream holds no audio")
    played = 0.0  # D_i
    start = 0.0
    for a, d in zip(arrivals, durations):
        start = max(start, a - played)
        played += d
    clock, stalls, silent = arrivals[0], 0, 0.0  # playback from the first chunk's arrival
    for a, d in zip(arrivals, durations):
        if a > clock:
            stalls += 1
            silent += a - clock
            clock = a
        clock += d
    out = {"ttfa_s": arrivals[0], "rtf": arrivals[-1] / total, "audio_s": total, "playback_start_s": start,
           "stall_count": float(stalls), "stall_s": silent}
    if len(arrivals) >= 2:
        gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
        rest = total - durations[0]
        if rest > 0:
            out["rtf_streamed"] = (arrivals[-1] - arrivals[0]) / rest
        for q, v in (("p50", 50), ("p90", 90), ("p99", 99), ("max", 100)):
            out[f"chunk_gap_{q}_s"] = percentile(gaps, v)
    return out


def served_metrics(repetitions: list[dict[str, Any]], startup_s: float | None) -> dict[str, dict]:
    """A served run's metrics: per repetition, its requests' records ({send_s, end_s, arrivals_s, samples,
    sample_rate, error}) through the playback model; ready_s once (None: a server the harness did not start)."""
    reps = []
    for rep in repetitions:
        recs = rep["requests"]
        ok = [(r, stream_figures(r["arrivals_s"], [s / r["sample_rate"] for s in r["samples"]]))
              for r in recs if not r["error"]]
        span = max(r["end_s"] for r in recs) - min(r["send_s"] for r in recs)
        free = sum(1 for _, f in ok if f["stall_count"] == 0)
        figs = {"stall_free_share": free / len(recs), "stall_free_streams_s": free / span,
                "served_audio_s_per_s": sum(f["audio_s"] for _, f in ok) / span}
        if ok:
            figs |= {"served_ttfa_p50_s": percentile([f["ttfa_s"] for _, f in ok], 50),
                     "served_ttfa_p90_s": percentile([f["ttfa_s"] for _, f in ok], 90),
                     "served_rtf_p50": percentile([f["rtf"] for _, f in ok], 50)}
        reps.append(figs)
    out = {} if startup_s is None else {
        "ready_s": {"unit": "s", "higher_is_better": False, "definition": SPEECH_METRICS["ready_s"][2],
                    "samples": [startup_s], "warmup_samples": []}}
    for name, (unit, hib, definition) in SERVED_METRICS.items():
        if reps and all(name in f for f in reps):
            out[name] = {"unit": unit, "higher_is_better": hib, "definition": definition,
                         "samples": [f[name] for f in reps], "warmup_samples": []}
    return out


def metrics(streams: list[dict[str, Any]], startup_s: float | None) -> dict[str, dict]:
    """The run's metrics block from its streams ({warmup, arrivals_s, durations_s}, warm-ups flagged): a metric is
    reported where every stream of the run defines it; ready_s where a start-up was timed (None: not)."""
    figs = [(s["warmup"], stream_figures(s["arrivals_s"], s["durations_s"])) for s in streams]
    out = {}
    for name, (unit, hib, definition) in SPEECH_METRICS.items():
        if name == "ready_s":
            if startup_s is None:
                continue
            out[name] = {"unit": unit, "higher_is_better": hib, "definition": definition, "samples": [startup_s],
                         "warmup_samples": []}
            continue
        if not figs or not all(name in f for _, f in figs):
            continue
        out[name] = {"unit": unit, "higher_is_better": hib, "definition": definition,
                     "samples": [f[name] for w, f in figs if not w], "warmup_samples": [f[name] for w, f in figs if w]}
    return out
