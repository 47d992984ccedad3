"""Plots for the report (matplotlib, PNG next to results.md): thread sweeps and A/B ratio charts.

Each plot is drawn from the same section data the markdown is rendered from; which plots a
section gets is decided once, by report.plot_names.
"""

from __future__ import annotations

from pathlib import Path

from harness.analysis import load_of, load_points

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PNG_META = {"Software": None}  # no version stamp: the same store draws the same picture


def save(fig, out_dir: Path, name: str) -> str:
    """Lay out, write without a version stamp, close; the file's name."""
    fig.tight_layout()
    fig.savefig(out_dir / name, dpi=100, metadata=PNG_META)
    plt.close(fig)
    return name


# a comparison's colour by its verdict (the report's words: better, worse, no difference detected, the rest)
VERDICT_COLORS = {"better": "tab:green", "worse": "tab:red", "no difference detected": "tab:grey"}


def verdict_color(verdict: str) -> str:
    """Its verdict's colour: undetermined and a failed fidelity gate are orange."""
    return VERDICT_COLORS.get(verdict.split(":")[0].split(" (")[0], "tab:orange")


def ratio_label(metric: str, row: dict, sep: str) -> str:
    """A comparison's label: the metric with the direction of better (higher or lower), the arm, the cell."""
    where = f" | {row['cell_short']}" if row["cell_short"] else ""
    return f"{metric} ({'higher' if row['hib'] else 'lower'} is better){sep}{row['arm']}{where}"


def ratio_chart(section: dict, out_dir: Path) -> str:
    """Per metric and non-baseline arm: the paired ratio to the baseline with its interval (a forest plot),
    coloured by verdict, each label saying which way is better; the figure as tall as its rows need."""
    items = []
    for t in section["tables"]:
        for r in t["rows"]:
            if "ci" in r:
                items.append((ratio_label(t["metric"], r, "\n"), r["ratio_value"], r["ci"], verdict_color(r["verdict"])))
    fig, ax = plt.subplots(figsize=(7, 0.5 * len(items) + 1.2))
    ys = list(range(len(items)))
    for y, (_, med, (lo, hi), color) in zip(ys, items):
        ax.errorbar([med], [y], xerr=[[med - lo], [hi - med]], fmt="o", color=color, capsize=4)
    ax.axvline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set_yticks(ys, [label for label, *_ in items], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(f"ratio to baseline arm '{section['baseline']}' (paired, interval at the family's level)\n"
                  "green better, red worse, grey no difference, orange undetermined or fidelity failed", fontsize=7)
    ax.set_title(f"{section['name']} (host {section['host_key']})", fontsize=9)
    return save(fig, out_dir, f"{section['slug']}-ratios.png")


def thread_sweep(section: dict, out_dir: Path) -> str:
    """Where cells differ by threads: median per arm with a band of its 95% bootstrap CI over passes."""
    tables = [t for t in section["tables"] if t["unit"] == "tok/s"]
    fig, axes = plt.subplots(1, len(tables), figsize=(4.2 * len(tables), 3.4), squeeze=False)
    for ax, t in zip(axes[0], tables):
        arms = sorted({r["arm"] for r in t["rows"]})
        for arm in arms:
            rows = sorted((r for r in t["rows"] if r["arm"] == arm), key=lambda r: r["threads"])
            xs = [r["threads"] for r in rows]
            ax.plot(xs, [r["median_value"] for r in rows], marker="o", label=arm)
            ax.fill_between(xs, [r["median_ci"][0] for r in rows], [r["median_ci"][1] for r in rows], alpha=0.25)
        ax.set_xlabel("threads")
        ax.set_ylabel(f"{t['metric']} ({t['unit']})")
        ax.set_xticks(sorted({r["threads"] for r in t["rows"]}))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{section['name']} (host {section['host_key']}): median over passes, "
                 "band = 95% bootstrap CI of the median", fontsize=9)
    return save(fig, out_dir, f"{section['slug']}-threads.png")


def load_curve(section: dict, out_dir: Path) -> str:
    """Per latency metric: each arm's median latency against its median output throughput, one point per load
    (labelled with its concurrency or rate), joined in the order of the load."""
    pts = load_points(section)
    fig, axes = plt.subplots(1, len(pts), figsize=(4.2 * len(pts), 3.4), squeeze=False)
    kind = next((load_of(r["cell"])[0] for t in section["tables"] for r in t["rows"] if load_of(r["cell"])), "load")
    for ax, (metric, by_arm) in zip(axes[0], pts.items()):
        for arm, rows in sorted(by_arm.items()):
            ax.plot([x for _, x, _, _ in rows], [y for _, _, y, _ in rows], marker="o", label=arm)
            for _, x, y, label in rows:
                ax.annotate(label, (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
        ax.set_xlabel("serve_output_tok_s (median over passes)")
        ax.set_ylabel(f"{metric} (median over passes)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{section['name']} (host {section['host_key']}): latency against throughput, points labelled "
                 f"by {kind}", fontsize=9)
    return save(fig, out_dir, f"{section['slug']}-load.png")


def history_chart(section: dict, out_dir: Path) -> str:
    """A history: per metric and cell a panel, each version's median with its 95% interval, oldest first; a step
    found between two versions shaded (green better, red worse) and labelled with its ratio."""
    tables = section["history"]["tables"][:12]
    fig, axes = plt.subplots(len(tables), 1, figsize=(7, 2.2 * len(tables) + 0.6), squeeze=False)
    for ax, t in zip(axes[:, 0], tables):
        xs = list(range(len(t["rows"])))
        for x, r in zip(xs, t["rows"]):
            lo, hi = r["ci_values"] or (r["median_value"], r["median_value"])
            ax.errorbar([x], [r["median_value"]], yerr=[[r["median_value"] - lo], [hi - r["median_value"]]], fmt="o",
                        color="tab:blue", capsize=3)
            if r["found"]:
                color = verdict_color(r["verdict"])
                ax.axvspan(x - 1, x, color=color, alpha=0.15)
                ax.annotate(f"x{r['step_value']:.3f}", (x - 0.5, r["median_value"]), fontsize=7, ha="center", color=color)
        ax.plot(xs, [r["median_value"] for r in t["rows"]], color="tab:blue", linewidth=0.8)
        ax.set_xticks(xs, [r["version"] for r in t["rows"]], fontsize=7, rotation=20)
        ax.set_ylabel(f"{t['unit']} ({t['better']} is better)", fontsize=7)
        ax.set_title(f"{t['metric']}{' at ' + t['cell'] if t['cell'] else ''}", fontsize=8)
    fig.suptitle(f"{section['name']} (host {section['host_key']}): history, steps found shaded", fontsize=9)
    return save(fig, out_dir, f"{section['slug']}-history.png")
