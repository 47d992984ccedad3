"""A server run's requests where the load brings its own (docs/serving.md): a trace's (its prompts from its blocks,
its output lengths, its send times) or a dataset's (its records' prompts tokenized, their replies' lengths). Either
file is checked against the sha256 the grid read at plan: changed since, the run fails."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from harness import metrics, serving
from harness.errors import UserError


def of_load(ctx: Any, load: serving.Load, tok_dir: str | None, vocab_source: str) -> dict[str, Any] | str | None:
    """{prompts, gen_lens[, schedule][, dataset]} of a trace or dataset load; None: neither; a str: why the run
    fails."""
    try:
        if load.trace is not None:
            return _trace(load, vocab_source)
        if load.dataset is not None:
            return _dataset(ctx, load, tok_dir)
    except UserError as e:
        return str(e)
    return None


def _changed(what: str, sha: str, planned: str | None) -> None:
    if sha != planned:
        raise UserError(what, f"changed since the grid was read (sha256 {sha[:12]}, was {str(planned)[:12]})",
                        "plan the grid again")


def _trace(load: serving.Load, vocab_source: str) -> dict[str, Any]:
    """A trace's first `requests` requests: prompts, output lengths and send times."""
    from harness.workloads.serving import traces
    reqs, sha = traces.read(load.trace_path or "")
    _changed(str(load.trace), sha, load.trace_sha256)
    cut = reqs[:load.requests]
    vocab, special = metrics.vocabulary(vocab_source)
    return {"prompts": traces.prompts(cut, load.block_len, vocab, set(special)),
            "gen_lens": [r.output_len for r in cut], "schedule": [r.t_s * load.time_scale for r in cut]}


def _dataset(ctx: Any, load: serving.Load, tok_dir: str | None) -> dict[str, Any]:
    """A dataset's first `requests` usable records: prompts (the model's tokenizer) and output lengths."""
    from harness.workloads.serving import datasets
    recs, sha = datasets.read(load.dataset_path or "")
    _changed(str(load.dataset), sha, load.dataset_sha256)
    if tok_dir is None:
        raise UserError(f"model {ctx.model}", "has no tokenizer here to read a dataset's text with",
                        "use a model with an hf-* form, or give the arm a tokenizer")
    g = int(ctx.params["gen_len"])
    prompts, outs, used = datasets.requests(recs, serving.tokenizer_of(tok_dir), load.requests,
                                            int(ctx.params["prompt_len"]), g, g)
    tok_sha = hashlib.sha256((Path(tok_dir) / "tokenizer.json").read_bytes()).hexdigest()
    return {"prompts": prompts, "gen_lens": outs,
            "dataset": {**used, "tokenizer_sha256": tok_sha, "prompt_tokens": [len(p) for p in prompts]}}
