"""Prompts from the user's dataset file (docs/serving.md, "Datasets"): a ShareGPT-style JSON list, or JSONL, of
records {"conversations": [{"from": "human", "value": TEXT}, {"from": "gpt", "value": TEXT}, ...]} (or, plainly,
{"prompt": TEXT, "output": TEXT}). Each record's first human turn is a request's prompt, tokenized with the
model's own tokenizer (sent as ids, no special tokens added); its output is forced to the first reply's length in
the same tokens (as vLLM's bench does with ShareGPT), or to the load's gen_len where the record has no reply.
Records are taken in the file's order: one without a prompt, or whose prompt or reply is longer than the cell's
prompt_len or gen_len (the caps), is skipped and counted. The file is untrusted: read at plan (a malformed file
or record is one error naming the file and the record), its sha256 recorded; a file changed between plan and run
fails the run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.errors import UserError

MAX_BYTES = 256 << 20
MAX_RECORDS = 1_000_000
MAX_TEXT = 1 << 20  # characters of one turn
FIX = ('a JSON list (or JSONL) of {"conversations": [{"from": "human", "value": TEXT}, {"from": "gpt", "value": '
       'TEXT}]} or {"prompt": TEXT, "output": TEXT} (docs/serving.md, "Datasets")')


def _turns(where: str, rec: Any) -> tuple[str, str | None]:
    """A record's prompt and reply (None: no reply); refused where it has neither form."""
    if not isinstance(rec, dict):
        raise UserError(where, "not a JSON object", FIX)
    if "conversations" in rec:
        conv = rec["conversations"]
        if not isinstance(conv, list):
            raise UserError(where, "conversations: must be a list of turns", FIX)
        prompt = reply = None
        for i, t in enumerate(conv):
            if not isinstance(t, dict) or not isinstance(t.get("value"), str) or not isinstance(t.get("from"), str):
                raise UserError(where, f"conversations[{i}]: must be {{\"from\": ..., \"value\": TEXT}}", FIX)
            if len(t["value"]) > MAX_TEXT:
                raise UserError(where, f"conversations[{i}].value: more than {MAX_TEXT:,} characters", FIX)
            if prompt is None and t["from"] in ("human", "user"):
                prompt = t["value"]
            elif prompt is not None and reply is None and t["from"] in ("gpt", "assistant"):
                reply = t["value"]
        return prompt or "", reply
    if "prompt" in rec:
        p, o = rec["prompt"], rec.get("output")
        if not isinstance(p, str) or (o is not None and not isinstance(o, str)):
            raise UserError(where, "prompt and output: must be text", FIX)
        if len(p) > MAX_TEXT or len(o or "") > MAX_TEXT:
            raise UserError(where, f"prompt or output: more than {MAX_TEXT:,} characters", FIX)
        return p, o
    raise UserError(where, "neither conversations nor prompt", FIX)


def read(path: str | Path) -> tuple[list[tuple[str, str | None]], str]:
    """The records' (prompt, reply) in file order, and the file's sha256; one line where it is malformed."""
    from harness.untrusted import read_text
    p = Path(path)
    text, sha = read_text(p, str(p), FIX, MAX_BYTES)
    if text.lstrip().startswith("["):
        try:
            recs = json.loads(text)
        except (ValueError, RecursionError) as e:
            raise UserError(str(p), f"not JSON ({str(e)[:60]})", FIX) from None
        where = [f"{p}: record {i}" for i in range(len(recs))]
    else:
        recs, where = [], []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    recs.append(json.loads(line))
                except (ValueError, RecursionError) as e:
                    raise UserError(f"{p}:{n}", f"not JSON ({str(e)[:60]})", FIX) from None
                where.append(f"{p}:{n}")
    if len(recs) > MAX_RECORDS:
        raise UserError(str(p), f"more than {MAX_RECORDS:,} records", "cut the dataset")
    out = [_turns(w, r) for w, r in zip(where, recs)]
    if not any(prompt for prompt, _ in out):
        raise UserError(str(p), "no record has a prompt", FIX)
    return out, sha


def requests(records: list[tuple[str, str | None]], tokenize: Any, n: int, prompt_cap: int, gen_cap: int,
             gen_len: int) -> tuple[list[list[int]], list[int], dict[str, Any]]:
    """The first n usable records as (prompt ids, output lengths), and what was skipped; fewer than n usable:
    UserError."""
    prompts, outs, skipped = [], [], {"no_prompt": 0, "prompt_too_long": 0, "reply_too_long": 0}
    for prompt, reply in records:
        if len(prompts) == n:
            break
        if not prompt:
            skipped["no_prompt"] += 1
            continue
        ids = tokenize(prompt)
        out = len(tokenize(reply)) if reply else gen_len
        if not ids or len(ids) > prompt_cap:
            skipped["prompt_too_long"] += 1
            continue
        if not 1 <= out <= gen_cap:
            skipped["reply_too_long"] += 1
            continue
        prompts.append(ids)
        outs.append(out)
    if len(prompts) < n:
        raise UserError("workload.load.dataset", f"{len(prompts)} usable records of {n} asked (skipped: "
                        f"{', '.join(f'{k} {v}' for k, v in skipped.items() if v)})",
                        "raise prompt_len or gen_len (the caps), or ask fewer requests")
    return prompts, outs, {"skipped": skipped, "used": n}
