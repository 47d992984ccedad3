"""One ExecuTorch measurement in a fresh process: `python worker.py REQUEST.json RESULT.json`, run by the
ExecuTorch environment's python (harness/engines/executorch/forms.py), never the project's.

Run by harness/engines/executorch/engine.py (under taskset, like every engine process); the only module here that
imports executorch. It sets the runtime's thread pool to the requested size, loads the form's `model.pte` with
executorch.runtime and its `forward` method (the method ExecuTorch's LLM runner calls: tokens [1, T] and the
start position [1] in, the last position's logits [1, vocab] out, the KV cache held in the program), then per
repetition (warm-ups first) runs the prefill as one forward call over the harness's prompt token ids (not text:
the LLM runner takes text and tokenizes it itself, so it is not used) and one forward call per further token,
greedy (argmax of the logits; end of sequence never stops it), stamping each token after its argmax. It reads back
what the runtime lets it: the thread pool's size and the threads that ran the model (from the kernel), its CPU
affinity, the program's metadata (its context length), the output ids and counts, the shared libraries it loaded
(/proc/self/maps: the harness checks they are the ones it hashed) and the version. Standard library, executorch,
torch, numpy and harness/engines/workerlib.py (loaded by its path: the harness's package is not importable here).

`python worker.py --fidelity CONFIG.json RESULT.json` answers a `harness fidelity` request (the format of
harness/engines/llamacpp/native/edge-fidelity.cpp): per prompt, greedy ids from the very loop a measurement runs,
and teacher-forced log-probabilities of the full vocabulary from the same calls: one prefill over the prompt, then
one forward call per forced token (the program returns the last position's logits only).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
import time

if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)
_spec = importlib.util.spec_from_file_location(
    "workerlib", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "workerlib.py"))
workerlib = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(workerlib)


def loaded_libraries() -> list[str]:
    """The ExecuTorch shared libraries mapped into this process (their real paths)."""
    out = set()
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            path = parts[-1] if len(parts) >= 6 else ""
            if "/executorch/" in path and ".so" in os.path.basename(path):
                out.add(os.path.realpath(path))
    return sorted(out)


class Program:
    """The form's program with the thread pool set: forward calls of one sequence at a time."""

    def __init__(self, path: str, threads: int) -> None:
        importlib.import_module("executorch.extension.llm.custom_ops.custom_ops")  # registers llama::sdpa_with_kv_cache
        import torch
        from executorch.extension.pybindings import portable_lib
        from executorch.runtime import Runtime

        self.torch = torch
        portable_lib._unsafe_reset_threadpool(threads)
        self.pool_threads = int(portable_lib._threadpool_get_thread_count())
        t = time.perf_counter()
        prog = Runtime.get().load_program(path)
        self.methods = sorted(prog.method_names)
        self.metadata = {m: prog.load_method(m).execute([])[0] for m in self.methods
                         if m.startswith(("get_", "use_", "enable_"))}
        self.forward = prog.load_method("forward")
        self.load_s = time.perf_counter() - t
        self.shapes: list[list[int]] = []

    def logits(self, ids: list[int], pos: int):
        """The logits after feeding ids at positions pos.. (float32 numpy row)."""
        torch = self.torch
        (out,) = self.forward.execute([torch.tensor([ids], dtype=torch.long), torch.tensor([pos], dtype=torch.long)])
        if len(self.shapes) < 3:
            self.shapes.append(list(out.shape))
        return out.reshape(-1, out.shape[-1])[-1].float().numpy()

    def greedy(self, ids: list[int], n: int, stamp=None) -> list[int]:
        """n greedy tokens after ids: the prefill, then one call per token; stamp() after each token's argmax."""
        out = []
        row = self.logits(ids, 0)
        for i in range(n):
            out.append(int(row.argmax()))
            if stamp:
                stamp()
            if i + 1 < n:
                row = self.logits([out[-1]], len(ids) + i)
        return out

    def common(self) -> dict:
        import executorch
        from importlib import metadata
        return {"pool_threads": self.pool_threads, "program_metadata": self.metadata, "methods": self.methods,
                "executorch_version": metadata.version("executorch"),
                "executorch_dir": list(executorch.__path__)[0],
                "libraries": loaded_libraries()}


def measure(req: dict) -> dict:
    threads, gen_len = int(req["threads"]), int(req["gen_len"])
    prog = Program(req["model_path"], threads)
    samples, busy_ns, prompt_tokens, output_tokens, output_hashes = [], {}, [], [], []
    for rep in req["repetitions"]:
        (ids,) = rep["prompts"]  # batch 1: one request per repetition
        times: list[float] = []
        before = workerlib.thread_times_ns()
        t0 = time.perf_counter()
        out = prog.greedy(ids, gen_len, lambda: times.append(time.perf_counter() - t0))
        after = workerlib.thread_times_ns()
        if not rep["warmup"]:
            workerlib.add_busy(busy_ns, before, after)
        prompt_tokens.append(len(ids))
        output_tokens.append(len(out))
        samples.append({"warmup": bool(rep["warmup"]), "requests": [{"token_times_s": times}]})
        output_hashes.append(hashlib.sha256(json.dumps(out).encode()).hexdigest())
    running = workerlib.running_threads(busy_ns)
    return {"status": "ok", "samples": samples, "load_s": prog.load_s,
            "effective": {"threads": len(running), "thread_cpu_s": [round(ns / 1e9, 6) for ns in running],
                          "cpu_affinity": sorted(os.sched_getaffinity(0)), **prog.common(),
                          "prompt_tokens": prompt_tokens, "output_tokens": output_tokens,
                          "output_ids_sha256": output_hashes, "logits_shapes": prog.shapes}}


FORCED_SOURCE = ("the measurement's calls: one forward over the prompt, then one forward per forced token (the "
                 "program's last-position logits); log-softmax over the full vocabulary in float64")
GREEDY_SOURCE = ("ids: the measurement's loop (prefill of the prompt ids, then one forward per token, argmax, "
                 "exactly n_predict tokens); logprobs and top: the teacher-forced pass over those ids")


def fidelity(cfg: dict) -> dict:
    import numpy as np

    req = json.loads(open(cfg["request_path"]).read())
    n, k, threads = int(req["n_predict"]), int(req["top_k"]), int(cfg["threads"])
    prog = Program(cfg["model_path"], threads)

    def forced_logprobs(ids: list[int], cont: list[int]):
        rows = [prog.logits(ids, 0)] + [prog.logits([t], len(ids) + j) for j, t in enumerate(cont[:-1])]
        return workerlib.log_softmax(np.stack(rows))

    n_vocab = int(prog.metadata.get("get_vocab_size") or 0)
    before = workerlib.thread_times_ns()
    prompts, error = workerlib.scored_prompts(req, lambda ids: prog.greedy(ids, n), forced_logprobs, n_vocab)
    busy_ns: dict[int, int] = {}
    workerlib.add_busy(busy_ns, before, workerlib.thread_times_ns())
    if error:
        return {"status": "failed", "error": error}
    return {"status": "ok", "prompts": prompts, "n_vocab": n_vocab, "n_predict": n, "top_k": k, "threads": threads,
            "effective": {"threads": len(workerlib.running_threads(busy_ns)),
                          "cpu_affinity": sorted(os.sched_getaffinity(0)), **prog.common(),
                          "n_ctx": prog.metadata.get("get_max_context_len"), "greedy_source": GREEDY_SOURCE,
                          "forced_source": FORCED_SOURCE, "logits_shapes": prog.shapes, "load_s": prog.load_s}}


if __name__ == "__main__":
    sys.exit(workerlib.main(measure, fidelity))
