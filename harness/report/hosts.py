"""The machines (host keys) that measured a store: `harness hosts`, and the report's hosts table."""

from __future__ import annotations

import difflib
from collections import defaultdict
from pathlib import Path


from harness.analysis import by_key
from harness.errors import UserError
from harness.probe import describe
from harness.report.inputs import Collected, collect


def _class_caps(name: str) -> dict | None:
    """The caps of a hardware class as the hosts tables show them (None where its file is gone)."""
    from harness import hardware
    try:
        hc = hardware.get_class(name)
    except UserError:
        return None
    return {"isa_tier": hc.isa_tier, "cores": str(hc.cores), "memory": f"{hc.memory_gib:g} GiB"}


def hosts_rows(c: Collected) -> list[dict]:
    """One row per host that measured anything in the stores: key, CPU, ISA tier, cores, memory, artifact
    count by kind, first and last date."""
    every = [a for arts in c.runs.values() for a in arts] + [a for arts in c.fidelity.values() for a in arts] + \
        list(c.calibrations) + list(c.references)
    rows = []
    for key, arts in by_key(every).items():
        h = arts[0].host
        total = h.memory.get("total_bytes")
        kinds = defaultdict(int)
        for a in arts:
            kinds[a.kind] += 1
        row = {"isa_tier": h.cpu.get("isa_tier", "unknown"),
               "cores": f"{h.cpu.get('physical_cores')}/{h.cpu.get('logical_cores')}",
               "memory": f"{total / 2**30:.1f} GiB" if isinstance(total, int) else "unknown"}
        if h.emulation:  # an emulated class: its caps, on the machine that emulated it
            row = _class_caps(h.emulation) or row
        rows.append({"key": key, "cpu": h.cpu.get("model", "unknown"), **row,
                     "machine": h.get("machine_key") or key,
                     "identity": h.identity.status, "emulation": h.emulation or "none",
                     "artifacts": len(arts), "kinds": ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())),
                     "grids": sorted({a.grid.name for a in arts}),
                     "first": min(a.timing.start for a in arts)[:10], "last": max(a.timing.end for a in arts)[:10],
                     "describe": describe(h.model_dump())})
    return rows


def check_file(path: str, text: str) -> list[str]:
    try:
        current = Path(path).read_text()
    except OSError:
        current = ""
    if current == text:
        return []
    diff = list(difflib.unified_diff(current.splitlines(), text.splitlines(), f"{path} (on disk)", f"{path} (from store)",
                                     lineterm="", n=0))
    return diff[:40]


def hosts(store_dirs: list[str] | None = None) -> list[dict]:
    """`harness hosts`: the machines that measured the stores, with this machine marked."""
    from harness.provenance import current_host_key
    if store_dirs:
        for d in store_dirs:
            if not Path(d).is_dir():
                raise UserError(str(d), "--store: no such store directory", "pass the folder that holds <grid>/<id>.json")
    dirs = [str(d) for d in store_dirs] if store_dirs else [d for d in ("artifacts", "baselines") if Path(d).is_dir()]
    me = current_host_key()
    return [{**r, "this_machine": r["key"] == me} for r in hosts_rows(collect(dirs))]


def format_hosts(rows: list[dict]) -> str:
    if not rows:
        return "no artifacts in the store(s)"
    head = f"{'host key':<14} {'CPU':<18} {'ISA tier':<12} {'cores':<6} {'memory':>9} {'artifacts':>9}  first       last        note"
    lines = [head]
    for r in rows:
        note = "this machine" if r["this_machine"] else ""
        if r["emulation"] != "none":
            note = f"class {r['emulation']} emulated on {r['machine']}"
        if r["identity"].startswith("legacy"):
            note = ", ".join(x for x in (note, "legacy record (identity not recorded)") if x)
        lines.append(f"{r['key']:<14} {r['cpu'][:18]:<18} {r['isa_tier']:<12} {r['cores']:<6} {r['memory']:>9} "
                     f"{r['artifacts']:>9}  {r['first']}  {r['last']}  {note}")
    return "\n".join(lines)
