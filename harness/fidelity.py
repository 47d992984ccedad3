"""`harness fidelity GRID`: each build's greedy outputs against its own engine's bf16 reference.

A fidelity grid (`kind: fidelity`) names a model, a committed prompt set, the builds to check and
the thresholds they must meet. The prompts go through the model's own chat template once, with the
model's own tokenizer; every engine receives the same token ids. For each engine the reference
build (bf16 by default) generates greedily and is stored as a `reference` artifact under
baselines/quality/<grid>/ (reused while its model files, prompt set, engine build and decoding
settings are the same). Every build then generates greedily, and is scored teacher-forced on the
reference's tokens: exact match, first divergence, token agreement, top-1 agreement and a
top-k KL. A build below a threshold makes the command exit 1, naming the prompts that diverged.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import documents, lifecycle, models, provenance
from harness.artifact import Decoding, Execution, FidelityGridRef
from harness import grid
from harness.engines import get_engine
from harness.engines.capabilities import Fidelity, capability
from harness.grid.fidelity import THRESHOLDS, Build, FidelityGrid, default_references  # noqa: F401
from harness.errors import UserError
from harness.paths import read_utf8, sha256_file
from harness.check.references import reference_mismatch
from harness.store import Store, load_path

# The engines with a fidelity mode (Fidelity.reference_form set), and each one's default reference form.
DEFAULT_REFERENCES = default_references()
ENGINES = tuple(DEFAULT_REFERENCES)


def load_grid(path: str | Path) -> FidelityGrid:
    """A fidelity grid file, read and validated by the grid package's one loader."""
    return grid.load(path, kind="fidelity")


# ---- prompts ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PromptSet:
    ref: dict[str, Any]
    prompts: list[dict]  # id, category, text, ids


def load_prompts(g: FidelityGrid) -> PromptSet:
    """The prompt set, through the model's own chat template and tokenizer (the same ids for every engine)."""
    where = str(g.prompts_path)
    try:
        doc = json.loads(read_utf8(g.prompts_path, "save the prompt set as UTF-8"))
        prompts = doc["prompts"]
        assert isinstance(prompts, list) and prompts and all(isinstance(x["id"], str) and isinstance(x["text"], str)
                                                             for x in prompts)
    except (ValueError, KeyError, TypeError, AssertionError):
        raise UserError(where, "prompts: must be a JSON object with a list of {id, category, text}",
                        "see grids/prompts/fidelity-v1.json") from None
    # of a user's model, the forms this grid loads: its builds', its references' (or their full-precision
    # siblings, reference_form), and an HF form for the tokenizer
    wanted = [b.form for b in g.builds if b.form] + ["hf-fp32"]
    for r in g.references.values():
        wanted += [r] if models.can_have(g.model, r) else [_full_precision(r)]
    root = models.ensure(g.model, sorted({f for f in wanted if models.can_have(g.model, f)}))
    manifest = models.load_manifest(g.model)
    hf = next((f["path"] for f in manifest["forms"].values() if f["format"] == "safetensors"), None)
    if hf is None:
        raise UserError(g.path, f"model: {g.model} has no HF form with a tokenizer", "add an hf-* form to the model")
    tok_dir = root / hf
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    template = tok_dir / "chat_template.jinja"
    out = []
    for pr in prompts:
        enc = tok.apply_chat_template([{"role": "user", "content": pr["text"]}], add_generation_prompt=True,
                                      tokenize=True)
        ids = enc["input_ids"] if isinstance(enc, dict) or hasattr(enc, "keys") else enc
        out.append({"id": pr["id"], "category": pr.get("category", ""), "text": pr["text"], "ids": [int(i) for i in ids]})
    ids_sha = hashlib.sha256(json.dumps([p["ids"] for p in out]).encode()).hexdigest()
    ref = {"name": str(doc.get("name", g.prompts_path.stem)), "path": os.path.relpath(g.prompts_path),
           "sha256": sha256_file(g.prompts_path), "n_prompts": len(out),
           "chat_template_sha256": sha256_file(template) if template.exists() else "none (tokenizer_config template)",
           "tokenizer_sha256": sha256_file(tok_dir / "tokenizer.json"), "token_ids_sha256": ids_sha}
    return PromptSet(ref=ref, prompts=out)


# ---- engines ------------------------------------------------------------------------------------------

def _model_block(g: FidelityGrid, form: str | None, path: str | None = None) -> tuple[dict, Path]:
    """The model block of a build (a zoo form, or a GGUF file given by path) and the path to run."""
    if path:
        fp = Path(path)
        if not fp.is_file():
            raise UserError(g.path, f"builds.path: no such GGUF file {fp}", "give an existing file")
        return ({"name": g.model, "form": f"file:{fp.name}", "source": {"file": str(fp)}, "format": "gguf",
                 "dtype": "as stored", "parameters": models.load_manifest(g.model)["parameters"],
                 "files": [{"path": str(fp), "size": fp.stat().st_size, "sha256": sha256_file(fp)}]}, fp)
    assert form is not None
    try:
        return models.loaded_block(g.model, form), models.form_path(g.model, form)
    except UserError as e:
        raise UserError(g.path, f"form {form!r}: {e.problem}", e.fix) from None


def engine_block(engine: str, options: dict | None = None) -> dict:
    return capability(get_engine(engine), Fidelity).fidelity_block(options)


def generate(g: FidelityGrid, engine: str, model_path: Path, dtype: str | None, request: dict, workdir: Path,
             options: dict | None = None) -> dict:
    """Run one build over the prompts in a fresh process, through the engine's fidelity command (the same
    request and result format for every engine: harness/engines/llamacpp/native/edge-fidelity.cpp documents it)."""
    from harness.engines.base import run_worker, tail
    req_path, out_path = workdir / "request.json", workdir / "result.json"
    req_path.write_text(json.dumps(request))
    cpus = list(range(g.threads))
    fid = capability(get_engine(engine), Fidelity)
    cmd, env_rec = fid.fidelity_command(model_path, g.threads, cpus, dtype, req_path, out_path, workdir, options)
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"} | env_rec
    w = run_worker(cmd, env, g.timeout_s, out_path, engine)
    res: dict[str, Any] = {"argv": cmd, "env": env_rec, "cpus": cpus}
    if w.result is None:
        return res | {"status": w.status, "error": w.error, "stderr": tail(w.stderr)}
    return res | {"status": "ok", "result": w.result}


# ---- comparison ---------------------------------------------------------------------------------------

def kl_topk(ref_top: list, cand_lp: list, floor: float | None) -> tuple[float, int]:
    """KL(ref || build) over the reference's top-k tokens plus one bucket for the rest of the vocabulary.

    Coarsening both distributions the same way can only lower a KL divergence, so this is a lower
    bound of the full-vocabulary KL. A candidate the build did not report (outside its returned
    log-probabilities) gets the build's smallest reported one, an upper bound of its probability.
    """
    missing = 0
    p, q = [], []
    for (_, lp_ref), lp_b in zip(ref_top, cand_lp):
        if lp_b is None:
            missing += 1
            lp_b = floor if floor is not None else -50.0
        p.append(math.exp(lp_ref))
        q.append(math.exp(lp_b))
    kl = sum(pi * (math.log(pi) - math.log(max(qi, 1e-300))) for pi, qi in zip(p, q) if pi > 0)
    p_rest, q_rest = 1.0 - sum(p), max(1.0 - sum(q), 1e-12)
    if p_rest > 1e-12:
        kl += p_rest * math.log(p_rest / q_rest)
    return max(kl, 0.0), missing


def compare(ref_outputs: list[dict], build_prompts: list[dict]) -> list[dict]:
    rows = []
    for ref, b in zip(ref_outputs, build_prompts):
        r_ids, b_ids = ref["ids"], b["greedy"]["ids"]
        agree = [x == y for x, y in zip(r_ids, b_ids)]
        first = next((i for i, a in enumerate(agree) if not a), None)
        row = {"id": ref["id"], "category": ref["category"], "ids": b_ids, "exact_match": first is None,
               "first_divergence": first, "token_agreement": sum(agree) / len(r_ids), "top1_agreement": None,
               "mean_kl": None, "kl_outside_topk": 0}
        fz = b.get("forced")
        if fz:
            # both argmaxes under the same (reference) context and the same teacher-forced computation
            ref_argmax = [pos[0][0] for pos in ref["top"]]
            row["top1_agreement"] = sum(a == t for a, t in zip(fz["argmax"], ref_argmax)) / len(r_ids)
            floors = fz.get("floor") or [None] * len(r_ids)
            kls = [kl_topk(top, cl, fl) for top, cl, fl in zip(ref["top"], fz["candidates"], floors)]
            row["mean_kl"] = statistics.fmean(k for k, _ in kls)
            row["kl_outside_topk"] = sum(m for _, m in kls)
        rows.append(row)
    return rows


def summarize(rows: list[dict], gen_len: int) -> dict:
    firsts = [r["first_divergence"] if r["first_divergence"] is not None else gen_len for r in rows]
    top1 = [r["top1_agreement"] for r in rows if r["top1_agreement"] is not None]
    kls = [r["mean_kl"] for r in rows if r["mean_kl"] is not None]
    return {"n_prompts": len(rows), "exact_match_rate": sum(r["exact_match"] for r in rows) / len(rows),
            "median_first_divergence": float(statistics.median(firsts)),
            "min_first_divergence": min(firsts),
            "token_agreement": statistics.fmean(r["token_agreement"] for r in rows),
            "top1_agreement": statistics.fmean(top1) if top1 else None,
            "mean_kl": statistics.fmean(kls) if kls else None}


def gate(summary: dict, thresholds: dict[str, float], rows: list[dict]) -> list[str]:
    fails = []
    for name, limit in sorted(thresholds.items()):
        metric, op = THRESHOLDS[name]
        v = summary.get(metric)
        if v is None:
            fails.append(f"{metric}: not measured (threshold {name} {limit})")
        elif (op == ">=" and v < limit) or (op == "<=" and v > limit):
            fails.append(f"{metric} {v:.4g} {'<' if op == '>=' else '>'} {name} {limit:g}")
    if fails:
        div = [f"{r['id']}@{r['first_divergence']}" for r in rows if r["first_divergence"] is not None]
        fails.append("diverged (prompt@first token): " + (", ".join(div) if div else "none"))
    return fails


# ---- references ---------------------------------------------------------------------------------------

def _execution(res: dict, g: FidelityGrid, engine: str, requested: dict, effective: dict) -> Execution:
    extra = capability(get_engine(engine), Fidelity).fidelity_execution()
    return documents.execution(threads=g.threads, cpus=res["cpus"], numa_policy="default (no numa option)",
                               env={**provenance.relevant_env(), **res["env"]}, requested=requested,
                               effective=effective, compile_cache=extra["compile_cache"], eager=extra["eager"],
                               command=res["argv"])


@dataclass
class FidelityRun:
    written: list[Path]
    failed_builds: list[str]
    errors: list[str]


def _find_reference(refs: Store, g: FidelityGrid, engine: str, form: str, eng: dict, model_files: list,
                    prompts: PromptSet, out) -> Any | None:
    """This host's newest matching reference: another machine's greedy outputs are never this machine's
    reference (numerics differ by ISA)."""
    from harness.provenance import current_host_key
    host = current_host_key()
    for p in reversed(list(refs.iter_paths(g.name))):
        a = load_path(p)
        if a.kind != "reference" or a.engine.name != engine or a.model.form != form or a.host.key != host:
            continue
        why = reference_mismatch(a, {"id": a.id, "model_sha256": [f["sha256"] for f in model_files]}, prompts.ref, eng)
        if a.decoding.gen_len != g.gen_len or a.decoding.top_k != g.top_k:
            why.append("decoding settings differ")
        if not why:
            return a
        print(f"[fidelity] reference {p}: not reused ({', '.join(why)})", file=out)
    return None


def _new_reference(g: FidelityGrid, engine: str, form: str, mblock: dict, mpath: Path, eng: dict, prompts: PromptSet,
                   n_ctx: int, workroot: Path, harness: dict, options: dict | None = None) -> Any:
    """Generate a reference artifact: greedy outputs of the reference build, and the distributions of the
    teacher-forced pass over its own greedy tokens (the same computation a build is scored with, so that a
    build identical to the reference scores top-1 1 and KL 0)."""
    wd = Path(tempfile.mkdtemp(prefix="ref-", dir=workroot))
    request = {"n_predict": g.gen_len, "top_k": g.top_k, "n_ctx": n_ctx,
               "prompts": [{"ids": p["ids"], "self_forced": True} for p in prompts.prompts]}
    span = provenance.Span()
    dtype = capability(get_engine(engine), Fidelity).fidelity_dtype(form, {})
    res = generate(g, engine, mpath, dtype, request, wd, options or None)
    if res["status"] != "ok":
        raise UserError(f"reference {engine} {form}", f"{res['error']}", "fix the engine (see the message) and rerun; "
                        "no fidelity can be measured without its reference")
    outs = [{"id": p["id"], "category": p["category"], "prompt_tokens": len(p["ids"]), "ids": r["greedy"]["ids"],
             "logprobs": r["greedy"]["logprobs"], "top": r["forced"]["top"],
             "forced_argmax_agreement": sum(a == t for a, t in zip(r["forced"]["argmax"], r["greedy"]["ids"]))
             / len(r["greedy"]["ids"])}
            for p, r in zip(prompts.prompts, res["result"]["prompts"])]
    eng = capability(get_engine(engine), Fidelity).fidelity_result_block(eng, res["result"])
    host, timing = span.finish()
    return documents.reference(
        grid=FidelityGridRef(path=g.path, sha256=g.sha256, name=g.name, build=f"reference-{engine}"), model=mblock,
        engine=eng, harness=harness, host=host, timing=timing,
        execution=_execution(res, g, engine, {"form": form, "dtype": dtype, "threads": g.threads},
                             res["result"].get("effective", {"threads": g.threads})),
        prompt_set=prompts.ref, decoding=_decoding(g), outputs=outs)


def _decoding(g: FidelityGrid) -> Decoding:
    return Decoding(gen_len=g.gen_len, temperature=0.0, top_k=g.top_k, seed=g.seed)


def _full_precision(form: str) -> str:
    """A bf16 form's full-precision sibling: hf-bf16 -> hf-fp32, gguf-bf16 -> gguf-f32."""
    return form.replace("bf16", "fp32" if form.startswith("hf-") else "f32")


def reference_form(g: FidelityGrid, engine: str) -> str:
    """The form an engine's reference is generated from: the grid's, else the engine's default (bf16) where the
    model has it, else its full-precision sibling (a user's fp32 HF folder has no bf16 form). A form the model
    lacks is refused, with the forms it has."""
    forms = models.load_manifest(g.model)["forms"]
    form = g.references[engine]
    if form in forms:
        return form
    if engine not in g.named_references:
        full = _full_precision(form)
        if full in forms:
            return full
    raise UserError(g.path, f"references.{engine}: model {g.model} has no {form} form",
                    f"its forms: {', '.join(sorted(forms))}; name one in references: {{{engine}: FORM}}")


def _references(g: FidelityGrid, ref_opts: dict, eng_blocks: dict, refs: Store, prompts: PromptSet, n_ctx: int,
                workroot: Path, harness: dict, run_: FidelityRun, out: Any) -> dict[tuple[str, str], Any]:
    """The reference of each (engine, reference options): one stored under `refs` for these model files, prompt set,
    engine build and decoding settings, reused; else generated and stored (its path in run_.written)."""
    references: dict[tuple[str, str], Any] = {}
    for (e, k), opts in sorted(ref_opts.items()):
        form = reference_form(g, e)
        label = f"{e} {form}" + (f" ({', '.join(f'{n}: {v}' for n, v in sorted(opts.items()))})" if opts else "")
        eng = engine_block(e, opts) if opts else eng_blocks[e]
        mblock, mpath = _model_block(g, form)
        ref = _find_reference(refs, g, e, form, eng, mblock["files"], prompts, out)
        if ref is None:
            print(f"[fidelity] reference {label}: generating", file=out, flush=True)
            ref = _new_reference(g, e, form, mblock, mpath, eng, prompts, n_ctx, workroot, harness, opts)
            path = refs.write(ref)
            run_.written.append(path)
            print(f"[fidelity] reference {label}: {path}", file=out)
        else:
            print(f"[fidelity] reference {label}: reusing {ref.id[:12]}", file=out)
        references[(e, k)] = ref
    return references


def run_fidelity(grid_path: str, store_root: str = "artifacts", references_root: str = "baselines/quality",
        out=None) -> FidelityRun:
    g = load_grid(grid_path)
    if not isinstance(g, FidelityGrid):  # a voice's grid: audio fidelity (harness/workloads/speech/fidelity.py)
        from harness.workloads.speech import fidelity as speech
        return speech.run(g, store_root, out)  # type: ignore[return-value]
    return _run_greedy(g, store_root, references_root, out or sys.stderr)


def _run_greedy(g: FidelityGrid, store_root: str, references_root: str, out: Any) -> FidelityRun:
    """Every build of a language model's fidelity grid against its engine's reference (generated once, stored)."""
    prompts = load_prompts(g)
    store, refs = Store(Path(store_root)), Store(Path(references_root))
    workroot = lifecycle.new_root("fidelity")
    n_ctx = max(len(p["ids"]) for p in prompts.prompts) + g.gen_len + 8
    harness = provenance.harness_info()
    print(f"[fidelity] {g.name}: {len(g.builds)} builds x {len(prompts.prompts)} prompts x {g.gen_len} tokens, "
          f"prompt set {prompts.ref['sha256'][:12]}", file=out)
    run_ = FidelityRun([], [], [])
    engines = sorted({b.engine for b in g.builds} | {a for _, a in g.cross_engine})
    # one reference per build of each engine: the default one, and each other build (its own tree or
    # environment: Fidelity.reference_options) against its own bf16
    def ref_key(b: Build) -> tuple[str, str]:
        opts = capability(get_engine(b.engine), Fidelity).reference_options(b.options)
        return b.engine, json.dumps(opts, sort_keys=True)
    ref_opts = {ref_key(b): json.loads(ref_key(b)[1]) for b in g.builds}
    ref_opts.update({(a, "{}"): {} for _, a in g.cross_engine})
    eng_blocks = {e: engine_block(e) for e in engines}
    references = _references(g, ref_opts, eng_blocks, refs, prompts, n_ctx, workroot, harness, run_, out)

    jobs = [(b, b.engine, False) for b in g.builds] + [(next(b for b in g.builds if b.name == n), a, True)
                                                       for n, a in g.cross_engine]
    for b, against, cross in jobs:
        ref = references[(against, "{}") if cross else ref_key(b)]
        mblock, mpath = _model_block(g, b.form, b.path)
        dtype = capability(get_engine(b.engine), Fidelity).fidelity_dtype(b.form, b.options)
        request = {"n_predict": g.gen_len, "top_k": g.top_k, "n_ctx": n_ctx,
                   "prompts": [{"ids": p["ids"], "forced": o.ids, "candidates": [[t[0] for t in pos] for pos in o.top]}
                               for p, o in zip(prompts.prompts, ref.outputs)]}
        label = f"{b.name}{' vs ' + against + ' reference' if cross else ''}"
        print(f"[fidelity] {label}: generating", file=out, flush=True)
        wd = Path(tempfile.mkdtemp(prefix="build-", dir=workroot))
        span = provenance.Span()
        res = generate(g, b.engine, mpath, dtype, request, wd, b.options)
        eng = engine_block(b.engine, b.options) if b.options else {**eng_blocks[b.engine]}  # a build's own engine
        ref_block = {"id": ref.id, "engine": ref.engine.name, "form": ref.model.form,
                     "model_sha256": sorted(f.sha256 for f in ref.model.files),
                     "engine_build": {"build_commit": ref.engine.build_commit, "build": ref.engine.build},
                     "prompt_set_sha256": ref.prompt_set.sha256}
        common = dict(grid=FidelityGridRef(path=g.path, sha256=g.sha256, name=g.name, build=b.name), model=mblock,
                      harness=harness, prompt_set=prompts.ref, decoding=_decoding(g), reference=ref_block,
                      cross_engine=cross, thresholds={} if cross else b.thresholds)
        if res["status"] != "ok":
            outcome = dict(status=res["status"], error=res["error"], stderr_tail=res.get("stderr"), engine=eng,
                           prompts=[], summary={}, verdict="error", failures=[res["error"]])
            effective: dict = {}
        else:
            result = res["result"]
            eng = capability(get_engine(b.engine), Fidelity).fidelity_result_block(eng, result)
            rows = compare([o.model_dump() for o in ref.outputs], result["prompts"])
            summary = summarize(rows, g.gen_len)
            fails = [] if cross else gate(summary, b.thresholds, rows)
            verdict = "not gated" if cross else ("fail" if fails else "pass")
            outcome = dict(status="ok", error=None, stderr_tail=None, engine=eng, prompts=rows, summary=summary,
                           verdict=verdict, failures=fails)
            effective = result.get("effective", {"threads": g.threads})
        host, timing = span.finish()
        a = documents.fidelity(**common, **outcome, host=host, timing=timing, execution=_execution(
            res, g, b.engine, {"form": mblock["form"], "dtype": dtype, "threads": g.threads, "gen_len": g.gen_len,
                               "top_k": g.top_k}, effective))
        path = store.write(a)
        run_.written.append(path)
        s = a.summary
        if a.status != "ok":
            run_.errors.append(f"{label}: {a.error}")
            line = f"{label}: ERROR {a.error}"
        else:
            line = (f"{label}: {a.verdict}: exact {s['exact_match_rate']:.2f}, first divergence median "
                    f"{s['median_first_divergence']:g}, token agreement {s['token_agreement']:.3f}, top-1 "
                    f"{s['top1_agreement']:.3f}, KL {s['mean_kl']:.4f}")
            if a.verdict == "fail":
                run_.failed_builds.append(b.name)
                line += "\n    " + "\n    ".join(a.failures)
        print(f"[fidelity] {line}", file=out, flush=True)
    return run_
