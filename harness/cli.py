"""The `harness` command line: a thin layer, each verb calls one library function.

Exit codes: 0 success, 1 a finding, 2 usage or input error (one line on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from harness import __version__
from harness.errors import UserError


def cmd_probe(args: argparse.Namespace) -> int:
    if args.bandwidth:
        from harness import ceiling
        path = ceiling.measure(args.max_threads, args.repetitions, args.store, hw_class=args.hw_class)
        print(f"wrote {path}")
        return 0
    from harness.ceiling import describe_machine
    from harness.probe import probe
    host = probe()
    print(json.dumps({**host, "hardware": describe_machine(host)}, indent=2, sort_keys=True))
    return 0


def cmd_adapt(args: argparse.Namespace) -> int:
    from pathlib import Path

    from harness import engines, hardware
    from harness.provenance import current_host_key
    prof = hardware.current_profile(args.hw_class)
    rows = engines.adapt(args.model, prof, args.context_len, args.gen_len, Path(args.store) if args.store else None,
                          current_host_key())
    if args.json:
        print(json.dumps({"profile": prof, "settings": rows}, indent=2, default=str))
        return 0
    print(f"# {args.model} on {prof.get('class') or hardware.class_name_of(prof)} ({prof['source']}), "
          f"context {args.context_len}, gen {args.gen_len}")
    for engine, settings in rows.items():
        print(f"\n## {engine}\n")
        print("| setting | value | rule | evidence |\n| --- | --- | --- | --- |")
        for r in settings:
            print(f"| {r['setting']} | {r['value']} | {r['rule']} | {r['evidence']} |")
    return 0


def cmd_models_prepare(args: argparse.Namespace) -> int:
    from harness import models
    names = args.names or models.default_models()  # synthetic models only when named: they are large
    for name in names:
        m = models.prepare(name, rebuild=args.rebuild)
        print(f"{name}: {len(m['files'])} files in {models.model_dir(name)}")
    return 0


def cmd_models_add(args: argparse.Namespace) -> int:
    """Register your model by path (harness/usermodels.py): checked now, prepared when a grid first runs it."""
    from harness import models, usermodels
    kind, path = ("gguf", args.gguf) if args.gguf else ("hf", args.hf)
    um = usermodels.from_mapping(str(Path.cwd() / "harness models add"), "model",
                                 {"name": args.name, kind: str(Path(path).expanduser().resolve()),
                                  **({"sha256": args.sha256} if args.sha256 else {})})
    reg = usermodels.load_registry()
    if args.name in models.MODELS and args.name not in models.USER:
        raise UserError(f"harness models add {args.name}", "is the name of a zoo model", "give your model another name")
    reg[args.name] = um
    usermodels.save_registry(reg)
    print(f"{args.name}: {kind} {um.path} registered in {usermodels.registry_path()} "
          f"(sha256 {usermodels.source_sha256(um)[:16]}...); `harness models prepare {args.name}` derives its forms")
    return 0


def cmd_models_path(args: argparse.Namespace) -> int:
    """Where a prepared model (or one form of it) is: for scripts, e.g. to give one form's file to another tool."""
    from harness import models
    print(models.form_path(args.name, args.form) if args.form else models.model_dir(args.name))
    return 0


def cmd_models_list(args: argparse.Namespace) -> int:
    from harness import models, usermodels
    for name in usermodels.load_registry():
        models.known(name)  # registered ones are listed beside the zoo, marked
    names = args.names or None
    if args.verify:
        problems = [p for n in (names or sorted(models.MODELS)) if (models.model_dir(n) / "manifest.json").exists()
                    for p in models.verify(n, full=True)]
        for p in problems:
            print(p)
        if problems:
            return 1
    rows = models.listing(names)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(models.format_listing(rows))
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    from harness.engines import ENGINES, get_engine
    if args.environments:
        from harness import envs
        print(json.dumps(envs.ensure_all(), indent=2))
        return 0
    if args.grid:  # each arm's own build (a source tree, a release of a history), as `harness run` makes them first
        from harness import execute, grid
        spec = grid.load(args.grid)
        execute.prepare_arms(spec)
        print(json.dumps({"grid": spec.name, "prepared": [a.name for a in spec.arms]}, indent=2))
        return 0
    out = {}
    for name in args.engines or ENGINES:  # each engine provisions what it runs (cached; a variant where asked)
        m = get_engine(name).provision(args.isa, rebuild=args.rebuild)
        if m is not None:
            out[name] = {k: m[k] for k in ("build_commit", "build_key", "compiler", "flags", "version") if k in m}
    print(json.dumps(out, indent=2))
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from harness import grid, schedule
    spec = grid.load(args.grid)
    runs = schedule.schedule(spec)
    if args.json:
        print(json.dumps(schedule.plan_rows(runs), indent=1))
    else:
        print(schedule.format_plan(spec, runs))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    if args.executor == "ray":
        from harness import fleet
        s = fleet.run_on_fleet(args.grid, store_root=args.store, address=args.address, insecure=args.insecure,
                      new_series=args.new_series)
        return 0 if s.failed == 0 else 1
    if args.address or args.insecure:
        raise UserError("--address/--insecure", "only apply to --executor ray", "add --executor ray, or drop them")
    from harness import execute
    s = execute.run_grid(args.grid, store_root=args.store, new_series=args.new_series)
    return 0 if s.failed == 0 else 1


def cmd_fleet_start(args: argparse.Namespace) -> int:
    from harness import fleet
    if bool(args.head) == bool(args.join):
        raise UserError("harness fleet start", "give exactly one of --head and --join HEAD:PORT",
                        "--head on the first machine, --join HEAD_IP:PORT on the others")
    return fleet.start_node(args.bind, bool(args.head), args.join, args.port, args.object_store_mb,
                            args.allow_all_interfaces)


def cmd_fleet_status(args: argparse.Namespace) -> int:
    from harness import fleet
    for line in fleet.status(args.address, args.insecure):
        print(line)
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from harness import check
    n, problems = check.check(args.paths, verify_models=not args.no_model_hashes,
                              allow_unknown_commit=args.allow_unknown_commit)
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} problem(s) in {n} artifact(s)", file=sys.stderr)
        return 1
    print(f"{n} artifact(s) OK")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from pathlib import Path
    from harness import report
    pages, sections, ctx = report.build_all(args.store)
    for line in ctx["left_out"]:
        print(f"left out (harness check refuses it): {line}", file=sys.stderr)
    if args.verdict:
        lines = report.verdict_lines(sections, args.verdict)
        if not lines:
            raise UserError(args.verdict, "--verdict: no series of this grid in the store",
                            f"run it first (harness run grids/{args.verdict}.yaml), or name a grid `harness hosts` lists")
        print("\n".join(lines))
        return _gate(args, report.worse_rows(sections, args.verdict, args.min_effect) if args.fail_on else [],
                     lambda r: f"host {r['host']}: {r['arm']} {r['metric']} at {r['cell']}: {r['ratio']}")
    if args.fail_on:
        raise UserError("--fail-on", "gates the verdicts of one grid", "add --verdict GRID")
    if args.html:
        from harness import html
        written = html.write(args.html, pages, sections)
        print(f"wrote {len(written)} HTML page(s) to {args.html} (open {Path(args.html) / 'index.html'}; no server needed)")
        return 0
    docs = [(path, report.readme_text(path, ctx)) for path in (args.readme or [])]
    out = Path(args.out)
    if out.is_dir() or not out.parent.is_dir():
        raise UserError(args.out, "--out: a directory, or in a folder that does not exist",
                        "give the index's file name in an existing folder (the grids' pages go beside it)")
    if args.check:
        stale = report.check_pages(args.out, pages)
        stale += [(p, diff) for p, diff in ((p, report.check_file(p, t)) for p, t in docs) if diff]
        for path, diff in stale:
            fix = f"harness report --readme {path}" if path in dict(docs) else f"harness report --out {args.out}"
            print(f"{path}: stale: differs from what the store regenerates; run `{fix}`")
            print("\n".join(diff))
        if not stale:
            print(f"{args.out} and {len(pages) - 1} grid page(s){' and ' + ', '.join(p for p, _ in docs) if docs else ''}"
                  ": up to date")
        return 1 if stale else 0
    written, removed = report.write_pages(args.out, pages)
    drawn, kept = report.write_plots(sections, out.parent)
    print(f"wrote {args.out} and {len(written) - 1} grid page(s) beside it"
          f"{f', removed {len(removed)} of grids no longer in the store' if removed else ''}; plots: {len(drawn)} drawn, "
          f"{len(kept)} unchanged (data hashes in {out.parent / report.PLOT_HASHES})")
    from harness.untrusted import write_file
    for path, t in docs:
        write_file(Path(path), t.encode(), f"harness report --readme {path}")
        print(f"wrote the generated block(s) of {path}")
    return 0


def _gate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fail-on", choices=["worse"], default=None, help="exit 1 when a comparison's verdict is worse "
                   "(a CI gate; docs/harness.md)")
    p.add_argument("--min-effect", type=_share, default=0.0, metavar="SHARE", help="with --fail-on: only when worse "
                   "by at least this share with the interval's confidence (e.g. 0.03: 3%%)")


def _share(v: str) -> float:
    try:
        x = float(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{v!r} is not a number (a share: 0.03 is 3%)") from None
    if not 0 <= x < 1:
        raise argparse.ArgumentTypeError(f"{v} is not a share in [0, 1)")
    return x


def cmd_bisect(args: argparse.Namespace) -> int:
    from harness import bisect
    return bisect.command(args)


def cmd_changes(args: argparse.Namespace) -> int:
    from harness import bisect
    return bisect.changes_command(args)


def cmd_hosts(args: argparse.Namespace) -> int:
    from harness import report
    rows = report.hosts(args.store)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(report.format_hosts(rows))
    return 0


def cmd_fidelity(args: argparse.Namespace) -> int:
    from harness import fidelity
    r = fidelity.run_fidelity(args.grid, store_root=args.store, references_root=args.references)
    if r.failed_builds or r.errors:
        print(f"fidelity: {len(r.failed_builds)} build(s) below threshold ({', '.join(r.failed_builds) or 'none'}), "
              f"{len(r.errors)} error(s)", file=sys.stderr)
        return 1
    print(f"fidelity: all builds pass; {len(r.written)} artifact(s) written")
    return 0


def cmd_index(args: argparse.Namespace) -> int:
    from harness import index
    from pathlib import Path
    root = Path(args.store)
    if not root.is_dir():
        raise UserError(str(root), "not a store directory", "pass the folder that holds <grid>/<id>.json")
    stale = index.is_stale(root)
    if stale or args.force:
        index.build(root)
    df = index.load(root)
    print(f"{index.index_path(root)}: {df['id'].nunique()} artifacts, {len(df)} rows"
          f"{' (rebuilt)' if stale or args.force else ' (up to date)'}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from harness import export
    if args.format == "parquet" and args.out in (None, "-"):
        raise UserError("--out", "parquet is binary", "give --out FILE.parquet")
    runs = export.select(args.store, args.grid, args.host, args.engine, args.arm, err=sys.stderr,
                         all_series=args.all_series)
    export.write(args.out, export.render(args.format, runs, one_arm=len({a.grid.arm for a in runs}) == 1 and
                                         bool(args.arm)), sys.stdout)
    if args.out not in (None, "-"):
        print(f"wrote {args.out}: {args.format}, {len(runs)} run(s)", file=sys.stderr)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from harness import compare, export
    sides = [compare.resolve(spec, export.collect(stores or args.store, sys.stderr).runs)
             for spec, stores in ((args.a, args.store_a), (args.b, args.store_b))]
    rows = compare.compare(*sides, metrics=args.metric)
    print(compare.to_json(*sides, rows) if args.json else compare.markdown(*sides, rows), end="")
    return _gate(args, compare.gate(rows, args.min_effect) if args.fail_on else [],
                 lambda r: f"{r['metric']} {r['arm'] or ''} at {r['cell']}: B/A {r['ratio']:.3f} "
                           f"[{r['ci_low']:.3f}, {r['ci_high']:.3f}]")


def _gate(args: argparse.Namespace, failing: list, say) -> int:
    """`--fail-on worse`: exit 1, naming each, when a comparison is worse by at least --min-effect; else 0."""
    for r in failing:
        print(f"fail-on worse: {say(r)}", file=sys.stderr)
    if failing:
        print(f"{len(failing)} comparison(s) worse by at least {args.min_effect:.1%} (--fail-on worse): exit 1",
              file=sys.stderr)
    return 1 if failing else 0


def cmd_schema(args: argparse.Namespace) -> int:
    from harness.artifact import json_schema
    print(json.dumps(json_schema(), indent=1, sort_keys=True))
    return 0


def cmd_trace_synth(args: argparse.Namespace) -> int:
    from harness.workloads.serving import traces
    return traces.synth_command(args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="harness", description="Reproducible LLM inference benchmarks with provenance.")
    p.add_argument("--version", action="version", version=f"edge-harness {__version__}")
    sub = p.add_subparsers(dest="verb", required=True)
    _machine_verbs(sub)
    _run_verbs(sub)
    _store_verbs(sub)
    _report_verbs(sub)
    return p


def _machine_verbs(sub: Any) -> None:
    """probe, adapt, models: this machine, the settings it should use and its model zoo."""
    sp = sub.add_parser("probe", help="host profile as JSON on stdout")
    sp.add_argument("--bandwidth", action="store_true",
                    help="measure memory read bandwidth and matmul FLOP/s at 1..N threads; store a calibration artifact")
    sp.add_argument("--max-threads", type=int, default=None, help="N (default: the CPUs this process may use)")
    sp.add_argument("--repetitions", type=int, default=5)
    sp.add_argument("--store", default="baselines", help="where the calibration artifact goes (<store>/calibration/)")
    sp.add_argument("--class", dest="hw_class", default=None,
                    help="with --bandwidth: calibrate a hardware class emulated on this machine (grids/hardware/)")
    sp.set_defaults(func=cmd_probe)

    sa = sub.add_parser("adapt", help="the settings each engine should use on this machine or a hardware class")
    sa.add_argument("--model", required=True, help="a prepared model (harness models list)")
    sa.add_argument("--class", dest="hw_class", default=None,
                    help="a hardware class (grids/hardware/NAME.yaml); default: EDGE_HARNESS_HW_PROFILE, else this machine")
    sa.add_argument("--context-len", type=int, default=1024)
    sa.add_argument("--gen-len", type=int, default=128)
    sa.add_argument("--store", default=None, help="where measured costs are read (default: artifacts/)")
    sa.add_argument("--json", action="store_true")
    sa.set_defaults(func=cmd_adapt)

    sm = sub.add_parser("models", help="build and list the model zoo")
    msub = sm.add_subparsers(dest="models_verb", required=True)
    mp = msub.add_parser("prepare", help="build (or verify) the model zoo in the cache")
    mp.add_argument("names", nargs="*", help="models (default: all)")
    mp.add_argument("--rebuild", action="store_true", help="rebuild a model whose cached files are corrupted")
    mp.set_defaults(func=cmd_models_prepare)
    ma = msub.add_parser("add", help="register your own model by path (a GGUF file or a Hugging Face folder)")
    ma.add_argument("name")
    src = ma.add_mutually_exclusive_group(required=True)
    src.add_argument("--gguf", help="a GGUF file")
    src.add_argument("--hf", help="a Hugging Face model folder (config.json and *.safetensors)")
    ma.add_argument("--sha256", help="pin the weights (the GGUF's sha256): another file is refused")
    ma.set_defaults(func=cmd_models_add)
    mw = msub.add_parser("path", help="the folder of a prepared model, or the file (folder) of one of its forms")
    mw.add_argument("name")
    mw.add_argument("form", nargs="?")
    mw.set_defaults(func=cmd_models_path)
    ml = msub.add_parser("list", help="every file of the zoo and of your registered models, with size and sha256")
    ml.add_argument("names", nargs="*")
    ml.add_argument("--json", action="store_true")
    ml.add_argument("--verify", action="store_true", help="re-hash every file; exit 1 on a mismatch")
    ml.set_defaults(func=cmd_models_list)


def _run_verbs(sub: Any) -> None:
    """build, plan, run, fleet, fidelity: provisioning the engines and running grids."""
    sb = sub.add_parser("build", help="provision every engine (or those named): the pinned llama.cpp build and its "
                        "tools (cached outside the checkout), vLLM's runtime plugin checked")
    sb.add_argument("--engine", dest="engines", action="append", default=None, help="only this engine (repeatable)")
    sb.add_argument("--rebuild", action="store_true")
    sb.add_argument("--environments", action="store_true", help="only make the environments of their own (ExecuTorch's, "
                    "the quantizer's: pins that clash with vLLM's), cached outside the checkout")
    sb.add_argument("--isa", default=None, help="build the variant capped at this x86 ISA tier (baseline, avx2, avx512, "
                    "avx512-bf16) for hardware emulation; the runner builds it on first use otherwise")
    sb.add_argument("--grid", default=None, help="only the builds this grid's arms name (their own source trees, "
                    "the releases of a history), made as `harness run` makes them before measuring")
    sb.set_defaults(func=cmd_build)

    spl = sub.add_parser("plan", help="expansion and exact run order; no engine started")
    spl.add_argument("grid")
    spl.add_argument("--json", action="store_true", help="one object per run: cell, arm, pass, position")
    spl.set_defaults(func=cmd_plan)

    str_ = sub.add_parser("trace", help="timed traces a load replays (docs/serving.md, \"Traces\")")
    tsub = str_.add_subparsers(dest="trace_cmd", required=True)
    tsy = tsub.add_parser("synth", help="write a seeded synthetic trace (Mooncake's JSONL form, or BurstGPT's CSV)")
    tsy.add_argument("out")
    tsy.add_argument("--format", choices=["mooncake", "burstgpt"], default="mooncake",
                     help="mooncake: JSONL with shared blocks' hash ids; burstgpt: CSV, no shared blocks")
    tsy.add_argument("--requests", type=int, default=64)
    tsy.add_argument("--rate", type=float, default=2.0, help="requests/s, Poisson arrivals")
    tsy.add_argument("--seed", type=int, default=0)
    tsy.add_argument("--input-len", default="64:256", help="MIN:MAX tokens, uniform")
    tsy.add_argument("--output-len", default="16:64", help="MIN:MAX tokens, uniform")
    tsy.add_argument("--block-len", type=int, default=512, help="tokens a hash id stands for (the load's block_len)")
    tsy.add_argument("--prefixes", type=int, default=4, help="shared prefixes, one opening each request")
    tsy.add_argument("--prefix-blocks", type=int, default=1, help="blocks of a shared prefix")
    tsy.set_defaults(func=cmd_trace_synth)

    srun = sub.add_parser("run", help="execute a grid; resumable")
    srun.add_argument("grid")
    srun.add_argument("--store", default="artifacts")
    srun.add_argument("--new-series", action="store_true", help="start a new series when the grid file changed")
    srun.add_argument("--executor", choices=("local", "ray"), default="local",
                      help="local: this machine; ray: the machines of a Ray cluster (docs/fleet.md)")
    srun.add_argument("--address", help="the Ray cluster's head, HOST:PORT (default: RAY_ADDRESS, else the local one)")
    srun.add_argument("--insecure", action="store_true", help="send runs to a cluster without token authentication")
    srun.set_defaults(func=cmd_run)

    sfl = sub.add_parser("fleet", help="start a fleet node; show the fleet's machines (docs/fleet.md)")
    flsub = sfl.add_subparsers(dest="fleet_cmd", required=True)
    fst = flsub.add_parser("start", help="ray start with token authentication, bound to the address named")
    fst.add_argument("--bind", required=True, help="this machine's address on the fleet's network (never all interfaces)")
    fst.add_argument("--head", action="store_true", help="start the head node (generates the token if there is none)")
    fst.add_argument("--join", metavar="HEAD:PORT", help="join the cluster whose head is at HEAD:PORT")
    fst.add_argument("--port", type=int, default=6379, help="the head's port (default 6379)")
    fst.add_argument("--object-store-mb", type=int, default=256,
                     help="Ray's shared-memory object store, kept small: only artifacts travel (default 256)")
    fst.add_argument("--allow-all-interfaces", action="store_true",
                     help="keep the node running though Ray listens on every interface (firewall its ports first)")
    fst.set_defaults(func=cmd_fleet_start)
    fss = flsub.add_parser("status", help="the cluster's machines: nodes grouped by host key, with their class")
    fss.add_argument("--address", help="the head, HOST:PORT (default: RAY_ADDRESS, else the local one)")
    fss.add_argument("--insecure", action="store_true")
    fss.set_defaults(func=cmd_fleet_status)

    sf = sub.add_parser("fidelity", help="greedy fidelity of each build against its bf16 reference (a voice's grid: its audio against its fp32; docs/speech.md); exit 1 below threshold")
    sf.add_argument("grid")
    sf.add_argument("--store", default="artifacts", help="where fidelity artifacts go (<store>/<grid>/)")
    sf.add_argument("--references", default="baselines/quality", help="where reference artifacts go (<dir>/<grid>/)")
    sf.set_defaults(func=cmd_fidelity)


def _store_verbs(sub: Any) -> None:
    """check, index, export, compare, schema: what a store holds, checked, indexed and read out."""
    sc = sub.add_parser("check", help="validate artifacts: schema, provenance, id")
    sc.add_argument("paths", nargs="+")
    sc.add_argument("--no-model-hashes", action="store_true", help="skip comparing model sha256 with local files")
    sc.add_argument("--allow-unknown-commit", action="store_true",
                    help="accept artifacts written outside a git checkout (harness commit unknown)")
    sc.set_defaults(func=cmd_check)

    si = sub.add_parser("index", help="build the parquet index of a store (rebuilt when stale)")
    si.add_argument("--store", default="artifacts")
    si.add_argument("--force", action="store_true")
    si.set_defaults(func=cmd_index)

    se = sub.add_parser("export", help="the runs of a store as csv, jsonl, parquet, llama-bench JSON/SQL or pyperf "
                        "JSON (docs/harness.md)")
    from harness.export import FORMATS
    se.add_argument("--format", required=True, choices=FORMATS)
    se.add_argument("--store", action="append", default=None, help="store directory (repeatable; default: "
                    "artifacts and baselines)")
    for flag, what in (("grid", "grid name"), ("host", "host key"), ("engine", "engine name"), ("arm", "arm name")):
        se.add_argument(f"--{flag}", action="append", default=None, metavar=flag.upper(),
                        help=f"only runs of this {what} (repeatable)")
    se.add_argument("--all-series", action="store_true", help="every series of each grid on each host (default: "
                    "the newest, the report's); the series column tells them apart")
    se.add_argument("--out", default=None, help="file to write (replaced whole); default: stdout")
    se.set_defaults(func=cmd_export)

    sb = sub.add_parser("bisect", help="the first commit of a git tree (or release of a list) at which a grid's "
                        "figure steps (docs/methodology.md)")
    sb.add_argument("grid", help="a grid of one arm whose options name {tree} (or {version} with --versions)")
    sb.add_argument("--tree", help="the git tree")
    sb.add_argument("--good", help="a commit before the change")
    sb.add_argument("--bad", help="a commit after it")
    sb.add_argument("--versions", help="releases instead of commits, oldest first: V1,V2,...,Vn (V1 good, Vn bad)")
    sb.add_argument("--until-step", action="store_true", help="each probe's passes sequential: it stops at the first "
                    "planned look where a half steps (passes: {until: step, max: --passes})")
    sb.add_argument("--metric", required=True, help="the figure to follow (e.g. wall_s, decode_tok_s)")
    sb.add_argument("--passes", type=int, default=10, help="passes of each probe (default 10: a family of two "
                    "steps needs 8)")
    sb.add_argument("--store", default="artifacts", help="where each probe's artifacts go (<store>/<grid>-bisect-K/)")
    sb.add_argument("--alpha", type=_share, default=0.05, help="each probe's family level (default 0.05; a smaller "
                    "one needs more passes: 2/2^n <= alpha/2)")
    sb.set_defaults(func=cmd_bisect)
    sch = sub.add_parser("changes", help="what differs between the llama.cpp trees two llama-cpp-python releases "
                         "vendor (a step's two releases; docs/methodology.md)")
    sch.add_argument("old", help="the earlier release, e.g. 0.3.16")
    sch.add_argument("new", help="the later release, e.g. 0.3.17")
    sch.set_defaults(func=cmd_changes)

    scm = sub.add_parser("compare", help="B against A: two series (hosts, grid versions, stores, or two arms), "
                         "ratios with intervals (docs/harness.md)")
    scm.add_argument("a", metavar="A", help="GRID[@HOST][#SHA256-PREFIX][/ARM]")
    scm.add_argument("b", metavar="B", help="the same form")
    scm.add_argument("--store", action="append", default=None, help="store of both sides (repeatable; default: "
                     "artifacts and baselines)")
    scm.add_argument("--store-a", action="append", default=None, help="A's store(s), instead of --store")
    scm.add_argument("--store-b", action="append", default=None, help="B's store(s), instead of --store")
    scm.add_argument("--metric", action="append", default=None, help="only this metric (repeatable)")
    _gate_arguments(scm)
    scm.add_argument("--json", action="store_true")
    scm.set_defaults(func=cmd_compare)

    ss = sub.add_parser("schema", help="the artifact JSON Schema (as in docs/formats.md)")
    ss.set_defaults(func=cmd_schema)


def _report_verbs(sub: Any) -> None:
    """report, hosts: the pages rendered from the stores and the machines that measured them."""
    sr = sub.add_parser("report", help="render results.md from the stored results")
    sr.add_argument("--store", action="append", default=None)
    sr.add_argument("--out", default="reports/results.md")
    sr.add_argument("--check", action="store_true", help="exit 1 when the file on disk differs")
    sr.add_argument("--readme", action="append", default=None, metavar="FILE",
                    help="also render the generated blocks of FILE (README's published results, the docs' evidence; "
                         "between their markers) from the store; repeatable")
    sr.add_argument("--html", metavar="DIR", help="write the same pages as static HTML into DIR (interactive plots, "
                    "sortable tables; no network at view time) and nothing else")
    _gate_arguments(sr)
    sr.add_argument("--verdict", metavar="GRID", help="print the verdicts of GRID's newest series on each host "
                    "(its comparisons given verdicts, fidelity gates included) and write nothing")

    sh = sub.add_parser("hosts", help="the machines (host keys) that measured a store")
    sh.add_argument("--store", action="append", default=None, help="store directory (repeatable; default: "
                    "artifacts and baselines)")
    sh.add_argument("--json", action="store_true")
    sh.set_defaults(func=cmd_hosts)
    sr.set_defaults(func=cmd_report)


def _terminate(signum, frame):  # SIGTERM stops a grid the way Ctrl-C does
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    import signal
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _terminate)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `harness plan ... | head`
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:  # a file the OS refused that no reader or writer turned into its own line (untrusted.py)
        what = e.filename or getattr(args, "command", "harness")
        print(f"error: {what}: {e.strerror or type(e).__name__} (fix: check the path, its permissions and the space "
              "left)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
