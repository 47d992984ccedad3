"""Rules across artifacts: a fidelity artifact against the reference it was scored on, and a rate sweep's
runs against each other."""

from __future__ import annotations

import math
from typing import Any


def reference_mismatch(ref: Any, fid_ref: dict, prompt_set: dict, engine: dict | None) -> list[str]:
    """Why a reference artifact is not the one a fidelity artifact names (empty: it is)."""
    return _mismatch(ref_summary(ref), fid_ref, prompt_set, engine)


def ref_summary(ref: Any) -> dict:
    """What reference_mismatch compares of a reference artifact, as JSON."""
    return {"id": ref.id, "model_sha256": sorted(f.sha256 for f in ref.model.files),
            "prompt_set": [ref.prompt_set.sha256, ref.prompt_set.token_ids_sha256],
            "engine": [ref.engine.build_commit, ref.engine.build]}


def _mismatch(ref: dict, fid_ref: dict, prompt_set: dict, engine: dict | None) -> list[str]:
    out = []
    if ref["id"] != fid_ref.get("id"):
        out.append("id differs")
    if ref["model_sha256"] != sorted(fid_ref.get("model_sha256", [])):
        out.append("model hash differs")
    if ref["prompt_set"] != [prompt_set["sha256"], prompt_set["token_ids_sha256"]]:
        out.append("prompt set hash differs")
    if engine is not None and ref["engine"] != [engine["build_commit"], engine["build"]]:
        out.append("engine build differs")
    return out


def sweep_record(a: Any) -> dict[str, Any]:
    """What the check across files needs of a rate sweep's run (harness/sweep.py): its series and pass, and for a
    probe the request throughput it measured, for a point the rate it was sent at and where that came from."""
    from harness import sweep
    sw = a.workload.load["sweep"]
    out = {"id": a.id, "series": [a.grid.sha256, a.host.key, a.grid.pass_index], "arm": a.grid.arm,
           "point": sw.get("point"), "ok": a.status == "ok"}
    if sw.get("point") in (sweep.SYNC, sweep.MAX):
        out["req_s"] = sweep._req_s(a) if a.status == "ok" else None
    else:
        out |= {"sweep": sw, "rate": a.workload.load.get("rate")}
    return out


def sweep_problems(recs: list[tuple[str, dict]]) -> list[str]:
    """Each sweep point's rate is what its pass's probes give: the probes it names are among the checked
    artifacts, of its series and pass, measured what it says they did, are every ok probe of that pass, and the
    rate follows from them by the rule (a forged rate, or a point resolved from another pass, is caught)."""
    from harness import sweep
    probes = {r["id"]: r for _, r in recs if r.get("point") in (sweep.SYNC, sweep.MAX)}
    by_pass: dict[tuple, set] = {}
    for r in probes.values():
        if r["ok"]:
            by_pass.setdefault(tuple(r["series"]), set()).add(r["arm"])
    out = []
    for where, r in recs:
        km = sweep.between(r.get("point"))
        if km is None or "sweep" not in r:
            continue
        sw = r["sweep"]
        if "error" in sw:  # an unresolved point: failed, never sent
            if r["ok"]:
                out.append(f"{where}: workload.load.sweep: an ok run of a point that was not resolved ({sw['error']})")
            continue
        try:
            got = {arm: {p: (v["artifact"], float(v["request_throughput_req_s"])) for p, v in by.items()}
                   for arm, by in sw["from"].items()}
            lo, hi, rate = float(sw["sync_req_s"]), float(sw["max_req_s"]), float(sw["rate_req_s"])
        except (KeyError, TypeError, ValueError, AttributeError):
            out.append(f"{where}: workload.load.sweep: malformed (needs from, sync_req_s, max_req_s, rate_req_s)")
            continue
        why = []
        for arm, by in sorted(got.items()):
            for p in (sweep.SYNC, sweep.MAX):
                aid, v = by.get(p, (None, None))
                pr = probes.get(aid)
                if pr is None:
                    why.append(f"arm {arm}'s {p} probe {str(aid)[:12]}... is not among the checked artifacts")
                elif pr["series"] != r["series"] or pr["arm"] != arm or pr["point"] != p or not pr["ok"]:
                    why.append(f"arm {arm}'s {p} probe {aid[:12]}... is not an ok {p} run of arm {arm} in this pass")
                elif pr["req_s"] is None or not math.isclose(pr["req_s"], v, rel_tol=1e-9):
                    why.append(f"arm {arm}'s {p} probe measured {pr['req_s']}, not {v}")
        if not why:
            arms = by_pass.get(tuple(r["series"]), set())
            if set(got) != arms:
                why.append(f"names the probes of arms {sorted(got)}, its pass has ok probes of {sorted(arms)}")
            want_lo = min(v[sweep.SYNC][1] for v in got.values())
            want_hi = max(v[sweep.MAX][1] for v in got.values())
            want = want_lo + (want_hi - want_lo) * km[0] / (km[1] + 1)
            if not (math.isclose(lo, want_lo, rel_tol=1e-9) and math.isclose(hi, want_hi, rel_tol=1e-9)
                    and math.isclose(rate, want, rel_tol=1e-9)):
                why.append(f"rate {rate:g} req/s is not {want:g}, the rule's from its probes")
            elif not isinstance(r["rate"], (int, float)) or not math.isclose(float(r["rate"]), rate, rel_tol=1e-9):
                why.append(f"was sent at {r['rate']}, not the resolved {rate:g}")
        out += [f"{where}: workload.load.sweep: {w}" for w in why]
    return out


def reference_problems(fidelity_recs: list[tuple[str, dict]], references: dict[str, dict | None]) -> list[str]:
    """Each fidelity artifact's reference is among the checked ones, and is what the artifact says it is (from
    the records of _check_file: a summary is None where its artifact did not parse, which is reported above)."""
    out = []
    for where, fid in fidelity_recs:
        rid = fid["rid"]
        if rid not in references:
            out.append(f"{where}: reference.id: {str(rid)[:12]}... is not among the checked artifacts "
                       "(check the fidelity store and baselines together)")
            continue
        ref, parsed = references[rid], fid["parsed"]
        if ref is None or parsed is None:
            continue
        why = _mismatch(ref, parsed["reference"], parsed["prompt_set"], parsed["engine"])
        if why:
            out.append(f"{where}: reference: {', '.join(why)} from reference {rid[:12]}...")
    return out
