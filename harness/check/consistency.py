"""Consistency: figures of one artifact that contradict each other, though each is well-formed (settings
against the engine's read-back, samples against the workload and the run's timing, the cell against its
parameters, threads and CPUs against the affinity and the host)."""

from __future__ import annotations

import math
import re
from datetime import datetime
from functools import lru_cache
from typing import Any


from harness.engines import ENGINES, engine_class
from harness.engines.capabilities import IsaCap, Limits
from harness.metrics import DEFINITIONS_VERSION, REQUEST_METRICS
from harness.rules import cell_id, run_key


# Settings rows whose requested value is the workload's.
WORKLOAD_SETTINGS = ("prompt_len", "gen_len", "context_len", "batch", "warmups", "repetitions")
# The cell parameters a run's workload copies (batch defaults to 1).
CELL_WORKLOAD = ("prompt_len", "context_len", "gen_len", "batch")
# Seconds per unit of the time-valued metric units.
TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
# Units of quantities that cannot be negative besides times and rates (anything per second, tok/s): sizes, counts.
NONNEGATIVE_UNITS = {"s of audio", "ratio", "B", "bytes", "KiB", "MiB", "GiB", "TiB", "KB", "MB", "GB", "tok", "tokens", "count",
                     "requests", "steps"}
# A sample may exceed the run's wall clock (timing, UTC) by this much: samples are timed by monotonic clocks
# inside the span, the span by the wall clock around it.
RUN_SLACK_S, RUN_SLACK = 0.5, 0.01
# A fresh process, started and run to its exit (a metric whose definition says "process, start to exit"), takes at
# least this: fork, exec and exit of even /bin/sh are hundreds of microseconds on any machine these runs measure,
# so a sample of 1 ns is a lie, not a fast machine.
MIN_PROCESS_S = 50e-6
_PROCESS = re.compile(r"process, start to exit")
# timing.duration_s against end - start (one Span takes both: they differ by under a millisecond in the store).
DURATION_SLACK_S = 1.0
# Relative tolerance of a figure recomputed from the others by its shared definition (harness/metrics.py).
REL_TOL = 1e-6
_PER = re.compile(r"one sample per run|per request|per repetition")


PARTS: dict[str, tuple[str, ...]] = {}


def parts(dotted: str) -> tuple[str, ...]:
    parts = PARTS.get(dotted)
    if parts is None:
        parts = PARTS[dotted] = tuple(dotted.split("."))
    return parts


def consistency_problems(a: Any, where: str) -> list[str]:
    """Figures of one parsed artifact that contradict each other: what a plausible lie (an edited artifact whose
    id was recomputed) cannot keep consistent. Timing for every kind; CPUs for every engine artifact; for runs
    the cell, the settings against the read-back, and (ok runs) the samples against the workload and timing."""
    out = _timing_problems(a, where)
    if hasattr(a, "execution"):
        out += _affinity_problems(a, where)
    if hasattr(a, "engine") and isinstance(a.engine.build, dict):
        out += _build_problems(a.engine.build, where)
    if a.kind == "run":
        out += _cell_problems(a, where)
        out += _settings_problems(a, where)
        out += _isa_problems(a, where)
        if a.status == "ok":
            out += _sample_problems(a, where)
    return out


_SHA256 = re.compile(r"[0-9a-f]{64}")


def _build_problems(b: dict, where: str) -> list[str]:
    """The build that ran, as the engine recorded it: every content hash it names is a sha256, and a run of
    prebuilt binaries ran the binary whose hash the build lists (two arms of two builds differ by these)."""
    out = [f"{where}: engine.build.{k}: {_short(b[k])} is not a sha256" for k in ("binary_sha256", "tree_sha256",
           "sdist_sha256") if k in b and not (isinstance(b[k], str) and _SHA256.fullmatch(b[k]))]
    listed = b.get("binaries_sha256")
    if listed is not None:
        if not isinstance(listed, dict) or not all(isinstance(v, str) and _SHA256.fullmatch(v) for v in listed.values()):
            out.append(f"{where}: engine.build.binaries_sha256: must map each binary to its sha256")
        elif isinstance(b.get("binary"), str) and b["binary"] in listed and listed[b["binary"]] != b.get("binary_sha256"):
            out.append(f"{where}: engine.build.binary_sha256: {_short(b.get('binary_sha256'))}, but the build lists "
                       f"{b['binary']} as {listed[b['binary']]}: the run did not use the build it names")
    return out


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 80 else r[:77] + "..."


def instant(ts: str) -> datetime:
    return datetime.fromisoformat(ts[:-1] + "+00:00" if ts.endswith("Z") else ts)


def _timing_problems(a: Any, where: str) -> list[str]:
    t = a.timing
    out, at = [], {}
    for name in ("start", "end"):
        try:
            at[name] = instant(getattr(t, name))
        except (ValueError, TypeError):
            out.append(f"{where}: timing.{name}: {getattr(t, name)!r} is not an ISO 8601 timestamp")
    if out:
        return out
    try:
        span = (at["end"] - at["start"]).total_seconds()
    except TypeError:
        return [f"{where}: timing: start {t.start!r} and end {t.end!r} mix times with and without a time zone"]
    if span < 0:
        return [f"{where}: timing.end: {t.end} is before timing.start {t.start}"]
    if abs(t.duration_s - span) > DURATION_SLACK_S + RUN_SLACK * span:
        return [f"{where}: timing.duration_s: {t.duration_s:.6g} s, but end - start is {span:.6g} s"]
    return []


def _affinity_problems(a: Any, where: str) -> list[str]:
    """The harness pins one engine thread per CPU (runner: cpus = the arm's, or the first `threads`), on CPUs
    this host has online."""
    ex, out = a.execution, []
    aff = ex.cpu_affinity
    if aff and ex.threads > len(aff):
        out.append(f"{where}: execution.threads: {ex.threads} threads on {len(aff)} CPU(s) {aff}: runs pin one "
                   "thread per CPU")
    if len(set(aff)) != len(aff):
        out.append(f"{where}: execution.cpu_affinity: {aff} lists a CPU twice")
    cpu = a.host.cpu
    online, n = cpu.get("online_cpus"), cpu.get("logical_cores")
    if isinstance(online, list) and online:
        have, what = set(online), f"host.cpu.online_cpus ({len(online)} CPUs)"
    elif isinstance(n, int) and not isinstance(n, bool) and n > 0:
        have, what = set(range(n)), f"host.cpu.logical_cores ({n})"
    else:
        return out
    read = ((ex.settings or {}).get("cpus") or {}).get("effective")
    for field, cpus in (("execution.cpu_affinity", aff), ("execution.settings.cpus.effective", read)):
        if isinstance(cpus, list):
            beyond = [c for c in cpus if c not in have]
            if beyond:
                out.append(f"{where}: {field}: CPU(s) {beyond} are not on this host ({what})")
    return out


def _cell_problems(a: Any, where: str) -> list[str]:
    g, w, out = a.grid, a.workload, []
    params = g.cell_params
    try:
        want = cell_id(params)
    except Exception:  # unsortable keys cannot come from a grid file
        want = None
    if g.cell != want:
        out.append(f"{where}: grid.cell: {g.cell!r} is not the id of grid.cell_params ({want!r})")
    elif g.run_key != run_key(g.cell, g.arm, g.pass_index):
        out.append(f"{where}: grid.run_key: {g.run_key} is not the key of cell {g.cell!r}, arm {g.arm!r}, pass "
                   f"{g.pass_index} ({run_key(g.cell, g.arm, g.pass_index)})")
    speech = w.speech is not None
    if speech and (not isinstance(w.speech.get("text_set"), str) or w.speech["text_set"] != params.get("text")):
        out.append(f"{where}: workload.speech.text_set: {w.speech.get('text_set')!r}, but the cell's text is "
                   f"{params.get('text')!r}")
    for k in CELL_WORKLOAD:
        if k != "batch" and (speech or getattr(w, k) is None):  # a speech request is a text: no token lengths
            if speech and (getattr(w, k) is not None or k in params):
                out.append(f"{where}: workload.{k}: {getattr(w, k)!r} in a speech run (a text has no token length)")
            elif not speech:
                out.append(f"{where}: workload.{k}: missing (only a speech run has no token lengths)")
        elif k not in params and k != "batch":
            out.append(f"{where}: grid.cell_params.{k}: missing (workload.{k} is {getattr(w, k)})")
        elif getattr(w, k) != params.get(k, 1):
            out.append(f"{where}: workload.{k}: {getattr(w, k)}, but the cell's {k} is {params.get(k, 1)!r}")
    return out


def _lookup(d: dict, dotted: str) -> Any:
    v: Any = d
    for part in parts(dotted):
        v = v.get(part, KeyError) if isinstance(v, dict) else KeyError
        if v is KeyError:
            break
    return v


def _isa_problems(a: Any, where: str) -> list[str]:
    """The ISA features the engine's read-back says its build used, each one the host block's CPU has: a run and a
    host block of two machines (another machine's identity, its key recomputed) contradict each other here."""
    cls = engine_class(a.engine.name) if a.engine.name in ENGINES else None
    if cls is None or not issubclass(cls, IsaCap) or a.status != "ok":
        return []
    isa = a.host.cpu.get("isa")
    if not isinstance(isa, dict):
        return []
    return [f"{where}: host.cpu.isa.{feat}: false, but the engine's read-back says its build used it "
            f"(execution.effective): the run and the host block are not of one machine"
            for feat in cls.isa_in_use(a.execution.effective or {}) if isa.get(feat) is False]


def _settings_problems(a: Any, where: str) -> list[str]:
    """Each settings row agrees with what else the artifact says: its request with execution and the workload,
    its effective value with the engine's raw read-back in execution.effective."""
    ex, out = a.execution, []
    rows = ex.settings or {}
    # the engine's own read-back keys (its Limits); an engine not registered here: the defaults
    cls = engine_class(a.engine.name) if a.engine.name in ENGINES else None
    read_back = cls.read_back_keys if cls is not None and issubclass(cls, Limits) else Limits.read_back_keys
    for name, want, field in (("threads", ex.threads, "execution.threads"),
                              ("cpus", ex.cpu_affinity, "execution.cpu_affinity"),
                              *((k, getattr(a.workload, k), f"workload.{k}") for k in WORKLOAD_SETTINGS)):
        row = rows.get(name)
        if isinstance(row, dict) and "requested" in row and row["requested"] != want:
            out.append(f"{where}: execution.settings.{name}.requested: {row['requested']!r}, but {field} is {want!r}")
    for name, row in rows.items():
        if not isinstance(row, dict) or row.get("effective") is None:
            continue
        keys = read_back.get(name) or ((name[8:],) if name.startswith("options.") else ())
        for key in keys:
            v = _lookup(ex.effective, key)
            if v is not KeyError and v != row["effective"]:
                out.append(f"{where}: execution.settings.{name}.effective: {row['effective']!r}, but the engine's "
                           f"read-back execution.effective.{key} is {v!r}")
    return out


@lru_cache(maxsize=1024)
def _per(definition: str) -> str | None:
    """What one sample of a metric is, as its definition says (the last phrase that says it): request,
    repetition, run; None where the definition does not say."""
    found = _PER.findall(definition)
    return None if not found else {"one sample per run": "run", "per request": "request",
                                   "per repetition": "repetition"}[found[-1]]


def _nonnegative(unit: str) -> bool:
    return unit in TIME_UNITS or unit in NONNEGATIVE_UNITS or unit.endswith("/s")


def _sample_problems(a: Any, where: str) -> list[str]:
    """An ok run's samples: finite, of a possible sign, as many as the workload ran (the definition says per
    what), none longer than the run, and (shared definitions) each rate what its times make."""
    w, dur, out = a.workload, a.timing.duration_s, []
    reps, batch, warm = w.repetitions, w.batch, w.warmups
    limit = dur * (1 + RUN_SLACK) + RUN_SLACK_S
    shared = a.execution.effective.get("metric_definitions") == DEFINITIONS_VERSION
    counted: dict[str, str] = {}  # the metrics with finite samples, as many as their definition makes
    for name, m in a.metrics.items():
        xs, ws = m.samples, m.warmup_samples
        total = sum(xs) + sum(ws)  # finite: no NaN or infinity among them (the common case, tested fast)
        finite = math.isfinite(total)
        if not finite or (xs and min(xs) < 0) or (ws and min(ws) < 0):
            finite = _value_problems(out, f"{where}: metrics.{name}", m)  # element by element (or the sum overflowed)
        per = _per(m.definition)
        n, nw = len(xs), len(ws)
        if per is None:
            if n not in (1, reps, reps * batch):
                out.append(f"{where}: metrics.{name}.samples: {n} samples, but workload.repetitions is {reps} (batch "
                           f"{batch}): one per repetition ({reps}), per request ({reps * batch}) or per run (1)")
            if nw not in (0, warm, warm * batch):
                out.append(f"{where}: metrics.{name}.warmup_samples: {nw} samples, but workload.warmups is {warm} "
                           f"(batch {batch})")
        else:
            want, want_w = (1, 0) if per == "run" else (reps, warm) if per == "repetition" else (reps * batch,
                                                                                             warm * batch)
            exact = shared and name in REQUEST_METRICS and m.definition == REQUEST_METRICS[name][2]
            if n != want:
                how = {"run": "one per run", "repetition": f"one per repetition: workload.repetitions {reps}",
                       "request": f"one per request: workload.repetitions {reps} x batch {batch}"}[per]
                out.append(f"{where}: metrics.{name}.samples: {n} samples, but its definition makes {want} ({how})")
            if nw != want_w and (nw or exact or per == "run"):  # an engine may not report its warm-ups; shared ones do
                how = {"run": "none for a per-run figure", "repetition": f"workload.warmups {warm}",
                       "request": f"workload.warmups {warm} x batch {batch}"}[per]
                out.append(f"{where}: metrics.{name}.warmup_samples: {nw} samples, but its definition makes {want_w} "
                           f"({how})")
            elif n == want and finite:
                counted[name] = per
        scale = TIME_UNITS.get(m.unit)
        if scale is None or not finite or not xs:
            continue
        if _PROCESS.search(m.definition) and min(xs + ws) * scale < MIN_PROCESS_S:
            out.append(f"{where}: metrics.{name}.samples: {min(xs + ws) * scale:.3g} s for a fresh process, start "
                       f"to exit; no process starts and ends in under {MIN_PROCESS_S * 1e6:.0f} µs")
        # repetitions run one after another, the requests of one together: what they take adds up within the run
        if counted.get(name) == "request" and batch > 1:
            both = ws + xs
            total = sum(max(both[i:i + batch]) for i in range(0, len(both), batch))
        elif counted.get(name) not in ("repetition", "request"):
            total = max(max(xs), max(ws) if ws else 0.0)
        if total * scale <= limit:
            continue
        longest = max(max(xs), max(ws) if ws else 0.0) * scale
        if longest > limit:
            out.append(f"{where}: metrics.{name}.samples: {longest:.6g} s, longer than the whole run "
                       f"(timing.duration_s {dur:.6g} s)")
        else:
            out.append(f"{where}: metrics.{name}.samples: its repetitions take {total * scale:.6g} s together, longer "
                       f"than the whole run (timing.duration_s {dur:.6g} s)")
    if shared:
        out += _request_figure_problems(a, where, counted)
    return out


def _value_problems(out: list[str], f: str, m: Any) -> bool:
    """Appends a line for each list of a metric with a sample that is not finite, or negative where its unit
    cannot be; whether its samples are all finite."""
    finite = True
    for field, xs in (("samples", m.samples), ("warmup_samples", m.warmup_samples)):
        bad = [(i, x) for i, x in enumerate(xs) if not math.isfinite(x)]
        if bad:
            finite = False
            out.append(f"{f}.{field}[{bad[0][0]}]: {bad[0][1]} is not a finite number"
                       + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""))
            continue
        neg = [(i, x) for i, x in enumerate(xs) if x < 0] if _nonnegative(m.unit) else []
        if neg:
            what = "time" if m.unit in TIME_UNITS else "rate" if m.unit.endswith("/s") else "size or count"
            out.append(f"{f}.{field}[{neg[0][0]}]: {neg[0][1]!r} {m.unit} is negative, which a {what} cannot be"
                       + (f" (and {len(neg) - 1} more)" if len(neg) > 1 else ""))
    return finite


def _request_figure_problems(a: Any, where: str, counted: dict[str, str]) -> list[str]:
    """Under the shared definitions (harness/metrics.py) every request's figures come from its token timestamps:
    ttft_s <= e2e_s, prefill_tok_s = prompt_len / ttft_s, decode_tok_s = (gen_len - 1) / (e2e_s - ttft_s), the
    gaps' percentiles in order and within e2e_s - ttft_s, output_tok_s = batch x gen_len / the repetition's
    longest e2e_s. The first request that contradicts them is named, per metric."""
    m, w = a.metrics, a.workload
    shared = {k for k in counted if k in REQUEST_METRICS and m[k].definition == REQUEST_METRICS[k][2]}
    if not {"ttft_s", "e2e_s"} <= shared:
        return []
    out = []
    p, g, b = w.prompt_len, w.gen_len, w.batch
    for field in ("samples", "warmup_samples"):
        tt, e2 = getattr(m["ttft_s"], field), getattr(m["e2e_s"], field)
        here = f"{where}: metrics.{{}}.{field}[{{}}]: "
        for i, (t, e) in enumerate(zip(tt, e2)):
            if t > e:
                out.append(here.format("ttft_s", i) + f"{t:.6g} s, after the request's last token (e2e_s {e:.6g} s)")
                break
        if "prefill_tok_s" in shared:
            for i, (x, t) in enumerate(zip(getattr(m["prefill_tok_s"], field), tt)):
                if t <= 0 or abs(x - p / t) > REL_TOL * p / t:
                    out.append(here.format("prefill_tok_s", i) + f"{x:.6g} tok/s, but prompt_len {p} / ttft_s "
                               f"{t:.6g} s is {p / t if t > 0 else math.inf:.6g}")
                    break
        if "decode_tok_s" in shared:
            for i, (x, t, e) in enumerate(zip(getattr(m["decode_tok_s"], field), tt, e2)):
                if e <= t or abs(x - (g - 1) / (e - t)) > REL_TOL * (g - 1) / (e - t):
                    out.append(here.format("decode_tok_s", i) + f"{x:.6g} tok/s, but (gen_len {g} - 1) / (e2e_s - "
                               f"ttft_s = {e - t:.6g} s) is {(g - 1) / (e - t) if e > t else math.inf:.6g}")
                    break
        prev = None
        for q in ("itl_p50_s", "itl_p90_s", "itl_p99_s", "itl_max_s"):
            if q not in shared:
                prev = None
                continue
            xs = getattr(m[q], field)
            for i, (x, t, e) in enumerate(zip(xs, tt, e2)):
                if x > (e - t) * (1 + REL_TOL) + 1e-9:
                    out.append(here.format(q, i) + f"{x:.6g} s, but the request decoded for {e - t:.6g} s in all "
                               "(e2e_s - ttft_s)")
                    break
            if prev is not None:
                for i, (x, y) in enumerate(zip(xs, prev[1])):
                    if x < y * (1 - REL_TOL):
                        out.append(here.format(q, i) + f"{x:.6g} s, below {prev[0]} {y:.6g} s of the same request")
                        break
            prev = (q, xs)
        if "output_tok_s" in shared and len(tt) == len(getattr(m["output_tok_s"], field)) * b:
            for r, x in enumerate(getattr(m["output_tok_s"], field)):
                last = max(e2[r * b:(r + 1) * b])
                if last <= 0 or abs(x - b * g / last) > REL_TOL * b * g / last:
                    out.append(here.format("output_tok_s", r) + f"{x:.6g} tok/s, but batch {b} x gen_len {g} / the "
                               f"repetition's longest e2e_s {last:.6g} s is "
                               f"{b * g / last if last > 0 else math.inf:.6g}")
                    break
    return out
