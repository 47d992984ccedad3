"""A parsed grid against what runs it: its engines' rules for every cell an arm runs in, the machine's CPUs,
an emulated hardware class's rules and memory, and the forms a user's model can have. Refused at load (so at
`harness plan`), before anything runs."""

from __future__ import annotations

from harness.engines import get_engine
from harness.engines.capabilities import IsaCap, Sizing, capability
from harness.errors import UserError
import harness.grid.cells as grid_cells
from harness.grid.spec import Arm, Cell, GridSpec, cpu_list, err, hardware_of, model_of


def user_forms(spec: GridSpec) -> None:
    """Each form an arm loads of a user's model is one the model can have (models.user_forms): a GGUF whose
    architecture transformers cannot dequantize has no hf-* form, so an engine that loads hf-* cannot run it."""
    from harness import models
    from harness.engines import ENGINES, engine_class
    for name, forms in grid_cells.model_forms(spec).items():
        um = models.USER.get(name)
        if um is None or um.kind == "synthetic" or not forms:
            continue
        have = models.user_forms(um)
        for form in forms:
            if form in have:
                continue
            arms = [a.name for a in spec.arms if (a.form or engine_class(a.engine).default_form) == form] or ["?"]
            can = [e for e in ENGINES if any(f.startswith(engine_class(e).form_prefix) for f in have)
                   and engine_class(e).needs_model]
            raise err(spec.path, f"arms[{arms[0]}].form", f"model {name} ({um.kind} {um.path}) has no form {form}: "
                      f"its forms are {', '.join(have)}", f"load one of those (engines that can run it: "
                      f"{', '.join(can) or 'none'})")


# what _validate_hardware reads of a cell: cells alike in these are checked once
_HARDWARE_KEYS = ("hardware", "threads", "model", "batch", "context_len", "form")


def engines(spec: GridSpec, avail: list[int] | None = None) -> None:
    """Each arm's options, and the workload of every cell it runs in, as its engine can honour them, and as
    the machine can run them (native threads within `avail`, when given; an emulated class's own rules):
    refused here (at load, so at `harness plan`), before anything runs."""
    from harness.engines import engine_class
    cells = grid_cells.expand(spec)
    runs_in = [(c, {a.name for a in grid_cells.arms_for(spec, c)}) for c in cells]
    checked: set[tuple] = set()
    for a in spec.arms:
        mine = [c for c, names in runs_in if a.name in names]
        values = {k: (f"axes.{k}" if k in spec.axes else f"workload.{k}", {c.params[k] for c in mine})
                  for k in ("batch", "context_len", "prompt_len", "gen_len", "form") if mine and k in mine[0].params}
        engine_class(a.engine)().validate(spec.path, a, values, spec.warmups)
        _validate_threads(spec, a, mine, avail)
        for c in mine:
            key = (a.name, *(c.params.get(k) for k in _HARDWARE_KEYS))
            if key not in checked:
                checked.add(key)
                _validate_hardware(spec, a, c)


def _validate_threads(spec: GridSpec, arm: Arm, cells: list[Cell], avail: list[int] | None) -> None:
    """A native run's threads within the arm's own cpus (one thread per CPU: `harness check` refuses a run whose
    threads exceed its affinity) and, given `avail`, within the CPUs this process may run on (emulated runs:
    emulate.plan's rule, the class's cores, which this machine must have)."""
    native = [c for c in cells if hardware_of(arm, c.params) is None]
    if not native:
        return
    threads = max(int(arm.options.get("threads") or c.params.get("threads") or 1) for c in native)
    src = f"arms[{arm.name}].threads" if "threads" in arm.options else \
        "axes.threads" if "threads" in spec.axes else "threads"
    if arm.cpus and threads > len(arm.cpus):
        raise err(spec.path, src, f"{threads} threads asked of arm {arm.name!r}, but its cpus are "
                  f"{cpu_list(arm.cpus)} ({len(arm.cpus)} CPU(s))", f"list at least {threads} cpus, or use fewer threads")
    if avail is not None and threads > len(avail):
        raise err(spec.path, src, f"{threads} threads asked of arm {arm.name!r}, but this process may run on "
                  f"{len(avail)} CPU(s) ({cpu_list(avail)}, os.sched_getaffinity)",
                  f"use at most {len(avail)} threads, or plan and run the grid on a machine with more CPUs")


def _validate_hardware(spec: GridSpec, arm: Arm, cell: Cell) -> None:
    """A run under a hardware class: this machine can emulate it at the run's threads, and (for model engines)
    the class's memory admits the cell's sequences (the admission rule, with its numbers)."""
    name = hardware_of(arm, cell.params)
    eng = get_engine(arm.engine)
    auto = capability(eng, Sizing).sizes_by_admission(arm.options)
    where = f"{spec.path}: arms[{arm.name}] cell {cell.id}"
    form = cell.params.get("form") or arm.form or eng.default_form
    isa = capability(eng, IsaCap)
    if isa.isa_bound(form):  # a form whose kernels only some ISA tiers have: refused here on a tier without them
        from harness import hardware
        why = isa.isa_refusal(form, arm.options, hardware.current_profile(name) if name else hardware.current_profile())
        if why:
            raise UserError(where, why, "run this arm on a host (or hardware class) whose ISA tier has the kernel, or "
                                        "drop it (docs/quantization.md)")
    if name is None and not auto:
        return
    from harness import emulate, hardware
    threads = int(arm.options.get("threads") or cell.params.get("threads") or 1)
    prof = hardware.current_profile(name) if name else hardware.current_profile()
    if name:
        emulate.plan(name, threads, arm.cpus, where)
    model = model_of(spec, cell.params)
    if model == "none" or "context_len" not in cell.params:  # no tokens (speech): no KV cache to admit
        return
    batch, ctxlen = int(cell.params.get("batch", 1)), int(cell.params["context_len"])
    adm = capability(eng, Sizing).admission(model, prof, cell.params.get("form") or arm.form, arm.options, ctxlen)
    if adm is None:  # the engine has no memory rule
        return
    if adm["max_num_seqs"] < batch:
        raise UserError(where, f"does not fit {prof['source']}: {adm['max_num_seqs']} sequence(s) of context "
                               f"{ctxlen} admitted, batch {batch} asked (available {adm['available_bytes']} B - weights "
                               f"{adm['weights_bytes']} B - overhead {adm['overhead_bytes']} B, "
                               f"{adm['kv_bytes_per_sequence']} B of KV per sequence)",
                        "lower the batch or context_len, or choose a class with more memory")
