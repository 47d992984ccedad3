"""The report's view of an audio-fidelity grid on one host (harness/workloads/speech/fidelity.py): the newest result
of each build, its distance from its engine's reference and its verdict (template: sections.md.j2
audio_fidelity_section)."""

from __future__ import annotations

import hashlib
from typing import Any


def audio_fidelity_section(name: str, all_arts: list, describe: Any, span: Any) -> dict[str, Any]:
    from harness.analysis import newest_series
    arts = newest_series(all_arts)
    latest = max(arts, key=lambda a: a.timing.end)
    by_build: dict[str, Any] = {}
    for a in sorted(arts, key=lambda a: a.timing.end):
        by_build[a.grid.build] = a
    rows = []
    for build, a in sorted(by_build.items(), key=lambda kv: (kv[1].engine.name, kv[0])):
        s = a.summary

        def f(key: str, digits: str = ".2f") -> str:
            v = s.get(key)
            return "-" if v is None else format(v, digits)
        rows.append({"build": build, "engine": a.engine.name, "form": a.model.form,
                     "verdict": a.verdict if a.status == "ok" else f"error: {a.error}",
                     "lsd": f("mean_lsd_db"), "lsd_max": f("max_lsd_db"),
                     "duration": "-" if not s else f"{s['min_duration_ratio']:.3f}-{s['max_duration_ratio']:.3f}",
                     "identical": f("identical_share"), "reference": f"{a.reference['engine']} {a.reference['form']}",
                     "wer": "-" if "mean_wer" not in s else f"{s['mean_wer']:.3f} ({s['reference_mean_wer']:.3f})",
                     "thresholds": ", ".join(f"{k} {v:g}" for k, v in sorted(a.thresholds.items())),
                     "id": a.id[:12]})
    fingerprint = hashlib.sha256("\n".join(sorted(a.id for a in all_arts)).encode()).hexdigest()[:16]
    return {"audio": True, "asr": any(r["wer"] != "-" for r in rows), "name": name, "grid_path": latest.grid.path, "grid_sha": latest.grid.sha256[:12],
            "model": latest.model.name, "texts": latest.texts, "rows": rows, "n_artifacts": len(arts),
            "n_older": len(all_arts) - len(arts), "fingerprint": fingerprint, "threads": latest.execution.threads,
            "host": describe(latest.host.model_dump()), "host_key": latest.host.key,
            "dirty": any(a.harness.dirty for a in arts), "harness_commits": sorted({a.harness.commit[:12] for a in arts}),
            "span": span(list(by_build.values()))}
