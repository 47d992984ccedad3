"""A server engine's fidelity mode: greedy generation and teacher-forced scoring on token ids, over HTTP.

The serving worker (worker.py) starts the server as for a run and, given a fidelity request (the format of
harness/engines/llamacpp/native/edge-fidelity.cpp), answers it through the server's own API, one request at a
time, in the same result format, so `harness fidelity` scores a server build as it scores every engine:

- `vllm-server`: `POST /v1/completions`. Greedy: the prompt's ids, `max_tokens` = `min_tokens` = n (EOS is
  banned until n, as in the vllm engine's fidelity mode), temperature 0, `logprobs: top_k`, `return_token_ids` (the output's ids). Forced: the prompt followed by the continuation,
  `max_tokens: 1`, `prompt_logprobs: top_k`: the distribution vLLM computed at every position of the
  continuation under the teacher-forced context (its top-k, and the forced token's own).
- `llama-server`: `POST /completion`, one request per position (`n_predict: 1`, `n_probs: top_k`: the softmax
  of the raw logits), the first from a whole prefill and each next one decoded on the previous request's cache
  (`cache_prompt`). Greedy: the argmax at each step, EOS included and ties to the lowest id, as edge-fidelity
  computes it (llama-server's own sampler bans EOS under `ignore_eos`); forced: the same on the continuation.

A server reports the top-k of a distribution, not the whole vocabulary: a candidate outside what it reported
gets its smallest reported log-probability (`floor`: an upper bound of that candidate's probability), as
harness/fidelity.py's kl_topk reads it.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any


def post(url: str, body: dict, timeout: float) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 (127.0.0.1, a server this worker started)
        return json.loads(r.read())


def _dist(pairs: list[tuple[int, float]], k: int, candidates: list[int] | None) -> dict[str, Any]:
    """One position's reported distribution: its argmax, top-k, the candidates' log-probabilities, the floor."""
    pairs = sorted(pairs, key=lambda t: (-t[1], t[0]))
    lp = dict(pairs)
    return {"argmax": pairs[0][0], "top": [[i, v] for i, v in pairs[:k]], "floor": min(lp.values()),
            "candidates": None if candidates is None else [lp.get(c) for c in candidates]}


def _forced(dists: list[dict], ids: list[int]) -> dict[str, Any]:
    return {"argmax": [d["argmax"] for d in dists], "top": [d["top"] for d in dists],
            "floor": [d["floor"] for d in dists],
            "logprobs": [dict((i, v) for i, v in d["top"]).get(t, d["floor"]) for d, t in zip(dists, ids)],
            "candidates": [d["candidates"] or [] for d in dists]}


def _token_id(key: str) -> int:
    return int(key.split(":", 1)[1]) if key.startswith("token_id:") else int(key)


class Vllm:
    def __init__(self, base: str, model: str, timeout: float) -> None:
        self.url, self.model, self.timeout = f"{base}/v1/completions", model, timeout

    def greedy(self, ids: list[int], n: int, k: int) -> dict[str, Any]:
        r = post(self.url, {"model": self.model, "prompt": ids, "max_tokens": n, "min_tokens": n, "temperature": 0.0,
                            "ignore_eos": True, "logprobs": k, "return_token_ids": True,
                            "return_tokens_as_token_ids": True}, self.timeout)
        c = r["choices"][0]
        return {"ids": list(c["token_ids"]), "logprobs": list(c["logprobs"]["token_logprobs"])}

    def forced(self, ids: list[int], cont: list[int], k: int, candidates: list[list[int]] | None) -> dict[str, Any]:
        r = post(self.url, {"model": self.model, "prompt": ids + cont, "max_tokens": 1, "temperature": 0.0,
                            "prompt_logprobs": k, "return_tokens_as_token_ids": True}, self.timeout)
        plp = r["choices"][0]["prompt_logprobs"][len(ids):]
        dists = [_dist([(_token_id(t), float(v["logprob"])) for t, v in pos.items()], k,
                       candidates[j] if candidates else None) for j, pos in enumerate(plp)]
        return _forced(dists, cont)


class LlamaServer:
    """Greedy as edge-fidelity computes it (the in-process llama.cpp engine's fidelity mode): at every step the
    argmax of the logits, EOS included (llama-server's own sampler bans EOS under ignore_eos), ties to the
    lowest id; one position a request, so the greedy pass is also its own teacher-forced pass."""

    def __init__(self, base: str, model: str, timeout: float) -> None:
        self.url, self.timeout = f"{base}/completion", timeout
        self.last: tuple[list[int], list[int], list[dict]] | None = None

    def _at(self, seq: list[int], k: int, cache: bool, candidates: list[int] | None) -> dict[str, Any]:
        """The distribution after `seq`: the first position of a pass from a whole prefill, each next one decoded
        on the previous request's cache (`cache_prompt`), one token at a time."""
        r = post(self.url, {"prompt": seq, "n_predict": 1, "temperature": 0.0, "top_k": 1, "n_probs": k,
                            "ignore_eos": True, "cache_prompt": cache, "seed": 0}, self.timeout)
        top = r["completion_probabilities"][0]["top_logprobs"]
        return _dist([(int(t["id"]), float(t["logprob"])) for t in top], k, candidates)

    def greedy(self, ids: list[int], n: int, k: int) -> dict[str, Any]:
        out: list[int] = []
        dists = []
        for j in range(n):
            d = self._at(ids + out, k, j > 0, None)
            dists.append(d)
            out.append(d["argmax"])
        self.last = (ids, out, dists)
        return {"ids": out, "logprobs": [d["top"][0][1] for d in dists]}

    def forced(self, ids: list[int], cont: list[int], k: int, candidates: list[list[int]] | None) -> dict[str, Any]:
        if candidates is None and self.last is not None and self.last[:2] == (ids, cont):
            return _forced(self.last[2], cont)  # its own greedy tokens: the same requests, already answered
        return _forced([self._at(ids + cont[:j], k, j > 0, candidates[j] if candidates else None)
                        for j in range(len(cont))], cont)


DIALECTS = {"vllm-server": Vllm, "llama-server": LlamaServer}


def answer(dialect: str, base: str, model: str, request: dict, timeout: float) -> dict[str, Any]:
    """The fidelity result for a request (edge-fidelity.cpp's format), each prompt greedy then forced."""
    api = DIALECTS[dialect](base, model, timeout)
    n, k = int(request["n_predict"]), int(request["top_k"])
    out = []
    for p in request["prompts"]:
        g = api.greedy(list(p["ids"]), n, k)
        if len(g["ids"]) != n:
            raise RuntimeError(f"the server returned {len(g['ids'])} tokens, {n} were asked (EOS not ignored?)")
        entry: dict[str, Any] = {"greedy": {"ids": g["ids"], "logprobs": g["logprobs"]}}
        cont = g["ids"] if p.get("self_forced") else p.get("forced")
        if cont is not None:
            entry["forced"] = api.forced(list(p["ids"]), list(cont), k, p.get("candidates"))
        out.append(entry)
    return {"prompts": out}


def effective(dialect: str, info: dict, log_matches: dict, affinity: list[int] | None) -> dict[str, Any]:
    """What the server said it ran with (its log lines and info routes), for the fidelity artifact."""
    import re
    out: dict[str, Any] = {"cpus": affinity}
    for pattern, line in (log_matches or {}).items():
        if line is None:
            continue
        if m := re.search(r"n_threads = (\d+)", line):
            out["threads"] = int(m.group(1))
        if m := re.search(r"core ids=\[([\d, ]*)\]", line):
            out["threads"] = len([x for x in m.group(1).split(",") if x.strip()])
            out["bound_cores"] = [int(x) for x in m.group(1).split(",") if x.strip()]
        if m := re.search(r"\bdtype=torch\.(\w+)", line):
            out["dtype"] = m.group(1)
    props = (info or {}).get("/props")
    if isinstance(props, dict):
        out["n_ctx_per_slot"] = (props.get("default_generation_settings") or {}).get("n_ctx")
        out["total_slots"] = props.get("total_slots")
    return out
