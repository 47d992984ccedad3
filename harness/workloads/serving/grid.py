"""A server grid's load (workload.load: a closed loop of concurrency, an open loop at a rate, or a rate sweep)
and its latency bounds (workload.slo); docs/serving.md. A load needs server engines and they need a load."""

from __future__ import annotations

import math
from typing import Any

from harness.engines import engine_class, get_engine
from harness.engines.capabilities import Serves, capability, has
from harness.grid.spec import GridSpec, err, integer, short

# workload.load and workload.slo; concurrency and rate are cell parameters (fixed in the load, or axes), the rest of
# the load is the grid's (load(spec), kept in GridSpec.kinds under the kind's name)
LOAD_FIELDS = {"concurrency", "rate", "arrival", "burstiness", "requests", "seed", "errors_allowed", "points",
               "shared_prefix", "conversations", "turns", "user_len", "think_s", "trace", "block_len", "time_scale",
               "dataset"}
CONVERSATION_FIELDS = ("turns", "user_len", "think_s")  # with conversations only
LOAD_AXES = ("concurrency", "rate")
SLO_FIELDS = ("ttft_s", "tpot_s", "e2e_s")  # bounds in seconds; `share` (a sweep's capacity rule) is apart
MAX_LOAD_REQUESTS = 100_000
MAX_RATE = 10_000.0


def parse_rate(path: str, fld: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not 0 < v <= MAX_RATE:
        raise err(path, fld, f"must be a number of requests per second in (0, {MAX_RATE:g}], got {short(v)}")
    return v


def parse_load(path: str, raw: Any, axes: dict[str, list]) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """workload.load: (the grid's load fields, the cell parameters it fixes: concurrency and rate off the axes)."""
    on_axes = [k for k in LOAD_AXES if k in axes]
    if raw is None:
        if on_axes:
            raise err(path, f"axes.{on_axes[0]}", "a load axis needs workload.load",
                      "add workload.load: {requests: N} (docs/serving.md)")
        return None, {}
    if not isinstance(raw, dict):
        raise err(path, "workload.load", f"must be a mapping, got {short(raw)}",
                  "e.g. {concurrency: 2, requests: 16} or {rate: 4, arrival: poisson, requests: 32}")
    for k in raw:
        if k not in LOAD_FIELDS:
            raise err(path, f"workload.load.{k}", "unknown field", f"allowed: {', '.join(sorted(LOAD_FIELDS))}")
    out: dict[str, Any] = {}
    if "trace" in raw:
        return parse_trace(path, raw, axes)
    for k in ("block_len", "time_scale"):
        if k in raw:
            raise err(path, f"workload.load.{k}", "applies to a trace", "add trace: FILE, or drop it")
    if "dataset" in raw:
        out = parse_dataset(path, raw)
    if "conversations" in raw:
        out = parse_conversations(path, raw, axes)
    elif "requests" not in raw:
        raise err(path, "workload.load.requests", "is required", "set how many measured requests a repetition sends")
    else:
        for k in CONVERSATION_FIELDS:
            if k in raw:
                raise err(path, f"workload.load.{k}", "applies to conversations", "add conversations: N, or drop it")
        out["requests"] = integer(path, "workload.load.requests", raw["requests"])
    if out["requests"] > MAX_LOAD_REQUESTS:
        raise err(path, "workload.load.requests", f"{out['requests']:,} is more than {MAX_LOAD_REQUESTS:,}")
    cells: dict[str, Any] = {}
    if "concurrency" in raw:
        cells["concurrency"] = integer(path, "workload.load.concurrency", raw["concurrency"])
    if raw.get("rate") == "sweep":
        from harness import sweep
        clash = (["workload.load.concurrency"] if "concurrency" in raw else []) + [f"axes.{k}" for k in on_axes]
        if clash:
            raise err(path, clash[0], "cannot be set beside rate: sweep (its points are one request at a time, "
                      "every request at once, and rates between)", "drop it, or list rates as axes.rate instead")
        n = raw.get("points", sweep.DEFAULT_POINTS)
        if isinstance(n, bool) or not isinstance(n, int) or not sweep.MIN_POINTS <= n <= sweep.MAX_POINTS:
            raise err(path, "workload.load.points", f"must be an integer in [{sweep.MIN_POINTS}, {sweep.MAX_POINTS}], "
                      f"got {short(n)}", "the sweep's points: sync, max and the rates between them")
        out["points"] = n
        on_axes = ["rate"]
    elif "points" in raw:
        raise err(path, "workload.load.points", "applies to rate: sweep", "set rate: sweep, or drop points")
    elif "rate" in raw:
        cells["rate"] = parse_rate(path, "workload.load.rate", raw["rate"])
    for k in on_axes:
        if k in cells:
            raise err(path, f"workload.load.{k}", "is also an axis", f"set {k} in one place")
    if not cells and not on_axes:
        raise err(path, "workload.load", "names neither concurrency nor rate",
                  "add concurrency: N (a closed loop) or rate: R (requests/s, an open loop)")
    arrival = raw.get("arrival", "poisson")
    from harness.serving import ARRIVALS
    if arrival not in ARRIVALS:
        raise err(path, "workload.load.arrival", f"unknown arrival {short(arrival)}", f"allowed: {', '.join(ARRIVALS)}")
    b = raw.get("burstiness", 1.0)
    if isinstance(b, bool) or not isinstance(b, (int, float)) or not math.isfinite(b) or not 0 < b <= 100:
        raise err(path, "workload.load.burstiness", f"must be a number in (0, 100], got {short(b)}")
    if b != 1.0 and arrival != "gamma":
        raise err(path, "workload.load.burstiness", f"applies to arrival: gamma, not {arrival}", "set arrival: gamma")
    if "rate" not in cells and "rate" not in on_axes and ("arrival" in raw or "seed" in raw):
        raise err(path, "workload.load.arrival" if "arrival" in raw else "workload.load.seed",
                  "applies to a rate (an open loop)", "add rate: R, or drop it")
    seed = raw.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise err(path, "workload.load.seed", f"must be an integer, got {short(seed)}")
    e = raw.get("errors_allowed", 0.0)
    if isinstance(e, bool) or not isinstance(e, (int, float)) or not 0 <= e < 1:
        raise err(path, "workload.load.errors_allowed", f"must be a share in [0, 1), got {short(e)}")
    out |= {"arrival": arrival, "burstiness": float(b), "seed": seed, "errors_allowed": float(e)}
    if "shared_prefix" in raw:  # checked against each cell's prompt_len in validate_load
        out["shared_prefix"] = integer(path, "workload.load.shared_prefix", raw["shared_prefix"], hi=1 << 20)
    return out, cells


def _user_file(path: str, fld: str, f: Any, example: str) -> tuple[str, Any]:
    """A load field naming the user's file: (as written, its path resolved against the grid file's folder)."""
    from pathlib import Path
    if not isinstance(f, str) or not f.strip():
        raise err(path, f"workload.load.{fld}", f"must be a file's path, got {short(f)}", f"{fld}: {example}")
    return f, (Path(path).parent / f).resolve()


def parse_trace(path: str, raw: dict, axes: dict[str, list]) -> tuple[dict[str, Any], dict[str, Any]]:
    """trace: FILE (Mooncake JSONL or BurstGPT CSV, relative to the grid file), block_len (default 512, Mooncake's), time_scale (default 1:
    each timestamp x it), requests (default: all its lines; the first N), concurrency (optional: at most that
    many in flight). Read here: its sha256 recorded, a malformed line refused before anything runs."""
    from harness.workloads.serving.traces import read as read_trace
    clash = [f"workload.load.{k}" for k in ("rate", "arrival", "seed", "points", "burstiness", "conversations",
                                            "shared_prefix")
             if k in raw] + [f"axes.{k}" for k in LOAD_AXES if k in axes]
    if clash:
        raise err(path, clash[0], "a trace sends its own requests on its own schedule", "drop it")
    f, full = _user_file(path, "trace", raw["trace"], "traces/mine.jsonl")
    reqs, sha = read_trace(full)
    n = integer(path, "workload.load.requests", raw.get("requests", len(reqs)), hi=len(reqs))
    block = integer(path, "workload.load.block_len", raw.get("block_len", 512), hi=1 << 16)
    scale = raw.get("time_scale", 1.0)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or not 0 < scale <= 1e3:
        raise err(path, "workload.load.time_scale", f"must be a number in (0, 1000], got {short(scale)}",
                  "0.5: the trace twice as fast")
    e = raw.get("errors_allowed", 0.0)
    if isinstance(e, bool) or not isinstance(e, (int, float)) or not 0 <= e < 1:
        raise err(path, "workload.load.errors_allowed", f"must be a share in [0, 1), got {short(e)}")
    cells = {"concurrency": integer(path, "workload.load.concurrency", raw["concurrency"])} if "concurrency" in raw else {}
    longest = max(reqs[:n], key=lambda r: r.input_len + r.output_len)
    return {"requests": n, "trace": f, "trace_path": str(full), "trace_sha256": sha, "block_len": block,
            "time_scale": float(scale), "errors_allowed": float(e), "arrival": "trace",
            "longest": {"line": longest.line, "input_len": max(r.input_len for r in reqs[:n]),
                        "output_len": max(r.output_len for r in reqs[:n])}}, cells


def parse_dataset(path: str, raw: dict) -> dict[str, Any]:
    """dataset: FILE (ShareGPT-style JSON or JSONL, relative to the grid file), read and checked here; its
    records' prompts are tokenized at run time with the model's tokenizer (harness/workloads/serving/datasets.py)."""
    from harness.workloads.serving.datasets import read as read_dataset
    clash = [f"workload.load.{k}" for k in ("conversations", "shared_prefix") if k in raw]
    if clash:
        raise err(path, clash[0], "a dataset's requests are its records' prompts", "drop it")
    f, full = _user_file(path, "dataset", raw["dataset"], "data/chats.json")
    recs, sha = read_dataset(full)
    return {"dataset": f, "dataset_path": str(full), "dataset_sha256": sha, "dataset_records": len(recs)}


def parse_conversations(path: str, raw: dict, axes: dict[str, list]) -> dict[str, Any]:
    """conversations: N, turns: T (2 or more), user_len: U (each later turn's new tokens), think_s: S (after a
    reply, before the next turn): a closed loop of `concurrency` users, requests = N x T."""
    if "requests" in raw:
        raise err(path, "workload.load.requests", "is conversations x turns in a conversation load",
                  "drop requests (conversations: N, turns: T)")
    clash = [f"workload.load.{k}" for k in ("rate", "arrival", "points") if k in raw] + \
        [f"axes.{k}" for k in ("rate",) if k in axes]
    if clash:
        raise err(path, clash[0], "a conversation load is a closed loop of users (concurrency)",
                  "drop it, and set concurrency: the users talking at once")
    for k in ("turns", "user_len"):
        if k not in raw:
            raise err(path, f"workload.load.{k}", "is required with conversations",
                      "turns: 4 (each conversation's requests), user_len: 32 (each later turn's new tokens)")
    n = integer(path, "workload.load.conversations", raw["conversations"])
    turns = integer(path, "workload.load.turns", raw["turns"], lo=2, hi=1000)
    user = integer(path, "workload.load.user_len", raw["user_len"], hi=1 << 20)
    think = raw.get("think_s", 0.0)
    if isinstance(think, bool) or not isinstance(think, (int, float)) or not math.isfinite(think) or \
            not 0 <= think <= 3600:
        raise err(path, "workload.load.think_s", f"must be seconds in [0, 3600], got {short(think)}")
    if n * turns > MAX_LOAD_REQUESTS:
        raise err(path, "workload.load.conversations", f"{n:,} x {turns} turns are more than {MAX_LOAD_REQUESTS:,} "
                  "requests")
    return {"requests": n * turns, "turns": turns, "user_len": user, "think_s": float(think)}


def parse_slo(path: str, raw: Any, load: dict | None) -> dict[str, float] | None:
    if raw is None:
        return None
    if load is None:
        raise err(path, "workload.slo", "applies to a load", "add workload.load (docs/serving.md)")
    if not isinstance(raw, dict) or not raw:
        raise err(path, "workload.slo", f"must be a mapping of bounds, got {short(raw)}",
                  f"e.g. {{ttft_s: 1.0, tpot_s: 0.1}} (fields: {', '.join(SLO_FIELDS)})")
    for k, v in raw.items():
        if k == "share":
            if "points" not in load:
                raise err(path, "workload.slo.share", "applies to a rate sweep (the share of a run's requests "
                          "within every bound for the run to meet the slo)", "set workload.load.rate: sweep, or drop it")
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
                raise err(path, "workload.slo.share", f"must be a share in (0, 1], got {short(v)}")
            continue
        if k not in SLO_FIELDS:
            raise err(path, f"workload.slo.{k}", "unknown field", f"allowed: {', '.join(SLO_FIELDS)}, share")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise err(path, f"workload.slo.{k}", f"must be a positive number of seconds, got {short(v)}")
    if not any(k in SLO_FIELDS for k in raw):
        raise err(path, "workload.slo", "gives a share and no bound", f"add a bound ({', '.join(SLO_FIELDS)})")
    return {k: float(v) for k, v in raw.items()}


KIND = "serving"  # the kind's name: its fields' key in GridSpec.kinds


def load(spec: GridSpec) -> dict[str, Any] | None:
    """The grid's load, less what cells carry (concurrency, rate); None: no load."""
    return (spec.kinds.get(KIND) or {}).get("load")


def slo(spec: GridSpec) -> dict[str, float] | None:
    """The latency bounds of goodput (and a sweep's capacity share); None: none."""
    return (spec.kinds.get(KIND) or {}).get("slo")


def errors_allowed(spec: GridSpec) -> float:
    """The share of a run's requests that may fail (error, timeout) before the run does."""
    return float((load(spec) or {}).get("errors_allowed", 0.0))


def load_of(spec: GridSpec, params: dict, resolved: dict | None = None) -> Any:
    """The load of a cell (harness/serving.py Load). A rate sweep's point (harness/sweep.py) takes its rate
    from `resolved` (sweep.resolve, at the run's start); its probes are closed loops of 1 and of every request."""
    from harness import sweep
    from harness.serving import Load
    d = load(spec) or {}
    conc, rate, point = params.get("concurrency"), params.get("rate"), None
    if sweep.is_point(rate):
        point = {"point": rate}
        if rate in (sweep.SYNC, sweep.MAX):
            conc = 1 if rate == sweep.SYNC else d["requests"]
            rate = None
        else:
            point = resolved or {"point": rate, "error": "not resolved: the run was not started by the grid's "
                                 "execution loop, which resolves a sweep's rates (harness/sweep.py)"}
            rate = point.get("rate_req_s")
    if "trace" in d:
        return Load(requests=d["requests"], concurrency=conc, arrival="trace", trace=d["trace"],
                    trace_sha256=d["trace_sha256"], trace_path=d["trace_path"], block_len=d["block_len"],
                    time_scale=d["time_scale"])
    return Load(requests=d["requests"], concurrency=conc, rate=rate, arrival=d.get("arrival", "poisson"),
                burstiness=d.get("burstiness", 1.0), seed=d.get("seed", 0), sweep=point, dataset=d.get("dataset"),
                dataset_sha256=d.get("dataset_sha256"), dataset_path=d.get("dataset_path"),
                shared_prefix=d.get("shared_prefix", 0), turns=d.get("turns", 1), user_len=d.get("user_len", 0),
                think_s=d.get("think_s", 0.0))


def validate_load(spec: GridSpec) -> None:
    """A load needs server engines and server engines need a load; a server is sent requests, not batches."""
    grid_load = load(spec)
    if grid_load is not None and "points" in grid_load and spec.order != "interleaved":
        raise err(spec.path, "order", f"a rate sweep runs interleaved (each pass measures its probes before the rates "
                  f"derived from them), not {spec.order}", "drop order, or set order: interleaved")
    serves = {a.name: has(engine_class(a.engine), Serves) for a in spec.arms}
    if grid_load is not None:
        other = [n for n, s in serves.items() if not s]
        if other:
            raise err(spec.path, f"arms[{other[0]}].engine", f"{spec.arm(other[0]).engine} runs no load "
                      "(workload.load is for server engines)", "use llama-server or openai, or drop workload.load")
        for a in spec.arms:  # what each server engine's client can send (its own rule)
            capability(get_engine(a.engine), Serves).refuse_load(spec.path, a, grid_load)
        conc = spec.axes.get("concurrency") or [spec.fixed.get("concurrency", 1)]
        if "turns" in grid_load:
            _fits_conversations(spec, grid_load, conc)
        elif "trace" in grid_load:
            _fits_trace(spec, grid_load)
        elif max(conc) > grid_load["requests"]:
            raise err(spec.path, "workload.load.requests", f"{grid_load['requests']} requests cannot keep "
                      f"{max(conc)} in flight", f"send at least {max(conc)} requests a repetition")
        shared = grid_load.get("shared_prefix")
        lens = spec.axes.get("prompt_len") or [spec.fixed.get("prompt_len")]
        if shared is not None and any(isinstance(p, int) and shared >= p for p in lens):
            raise err(spec.path, "workload.load.shared_prefix", f"{shared} tokens leave no tokens of a request's own "
                      f"in a prompt of {min(p for p in lens if isinstance(p, int))}",
                      "set shared_prefix below every prompt_len (a prompt is the shared prefix, then its own tokens)")
        if "batch" in spec.axes or spec.fixed.get("batch", 1) != 1:
            raise err(spec.path, "workload.batch", "a server engine takes a load, not a batch",
                      "drop batch; set workload.load.concurrency")
    else:
        srv = [n for n, s in serves.items() if s and capability(get_engine(spec.arm(n).engine), Serves).load_required]
        if srv:
            raise err(spec.path, "workload.load", f"is required: arm {srv[0]!r} runs a server engine",
                      "add workload.load: {concurrency: N, requests: M} (docs/serving.md)")


def _fits_conversations(spec: GridSpec, load: dict[str, Any], conc: list) -> None:
    """A conversation's last turn (its prompt, every reply and user turn before it, and its reply) fits each
    cell's context; as many conversations as users at once."""
    n = load["requests"] // load["turns"]
    if max(conc) > n:
        raise err(spec.path, "workload.load.conversations", f"{n} conversations cannot keep {max(conc)} users busy",
                  f"have at least {max(conc)} conversations")
    for cell in _cells(spec):
        p, g, c = (cell.get(k) for k in ("prompt_len", "gen_len", "context_len"))
        if not all(isinstance(x, int) for x in (p, g, c)):
            continue
        need = p + (load["turns"] - 1) * (g + load["user_len"]) + g
        if need > c:
            raise err(spec.path, "workload.load.turns", f"a conversation's last turn needs {need} tokens of context "
                      f"(prompt_len {p} + {load['turns'] - 1} x (gen_len {g} + user_len {load['user_len']}) + gen_len), "
                      f"more than context_len {c}", "raise context_len, or fewer or shorter turns")


def _fits_trace(spec: GridSpec, load: dict[str, Any]) -> None:
    """A trace's longest input and output within each cell's prompt_len and gen_len (its caps: the requests take
    the trace's own lengths)."""
    most = load["longest"]
    for cell in _cells(spec):
        for k, mine in (("prompt_len", "input_len"), ("gen_len", "output_len")):
            if isinstance(cell.get(k), int) and most[mine] > cell[k]:
                raise err(spec.path, f"workload.{k}", f"{cell[k]} is below the trace's longest {mine.replace('_len', '')} "
                          f"({most[mine]} tokens; {load['trace']})", f"with a trace, {k} is each request's cap: set it "
                          f"to {most[mine]} or more, or cut the trace (requests: N)")


def _cells(spec: GridSpec) -> list[dict[str, Any]]:
    from harness.grid.cells import expand
    return [c.params for c in expand(spec)]


def parse(path: str, workload: dict[str, Any], axes: dict[str, list]) -> tuple[dict[str, Any], dict[str, Any]]:
    """workload.load and workload.slo, taken out of `workload`: (GridSpec's load and slo, the cell parameters the
    load fixes). A rate sweep's points become the rate axis (harness/sweep.py)."""
    load, cells = parse_load(path, workload.pop("load", None), axes)
    if load is not None and "points" in load:
        from harness import sweep
        axes["rate"] = sweep.points(load["points"])
    slo = parse_slo(path, workload.pop("slo", None), load)
    for k in LOAD_AXES:
        if k in workload:
            raise err(path, f"workload.{k}", "is a field of workload.load", f"write workload.load.{k}")
    return {"load": load, "slo": slo}, cells


def axis_value(path: str, fld: str, axis: str, v: Any, rule: bool) -> bool:
    """A value of the rate axis: a number of requests per second; in an include/exclude/primary rule also a
    point of a rate sweep (sync, max, sweep-KofM, as `harness plan` names cells). False: not this kind's to judge."""
    if axis != "rate":
        return False
    if not rule:
        parse_rate(path, fld, v)
        return True
    if not isinstance(v, str):
        return False  # a number in a rule is held to the numeric axes' rule
    from harness import sweep
    if not sweep.is_point(v):
        raise err(path, fld, f"{short(v)} is no point of a rate sweep",
                  "sync, max or sweep-KofM (the cells of `harness plan`), or a number")
    return True
