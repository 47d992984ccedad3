"""One ONNX Runtime GenAI measurement in a fresh process: `python worker.py REQUEST.json RESULT.json`.

Run by harness/engines/onnxruntime/engine.py (under taskset, like every engine process); the only module here that
imports onnxruntime_genai. It loads the form's folder with og.Model on the CPU, its session's intra-op threads set
by a config overlay (inter-op 1), then per repetition (warm-ups first) appends the harness's prompt token ids (not
text) to a fresh og.Generator, which runs the prefill, and calls generate_next_token() once per output token
(greedy, min_length = max_length: end of sequence never stops it), stamping each token after it is sampled and
detokenized. It reads back what the library lets it: the threads that ran the model (from the kernel), its CPU
affinity, the output ids and counts, the shared libraries it loaded (/proc/self/maps: the harness checks they are
the ones it hashed), the versions and commits. Standard library, onnxruntime_genai, numpy and
harness/engines/workerlib.py only.

`python worker.py --fidelity CONFIG.json RESULT.json` answers a `harness fidelity` request (the request and result
format of harness/engines/llamacpp/native/edge-fidelity.cpp): per prompt, greedy ids from the very Generator loop a
measurement runs, and teacher-forced log-probabilities of the full vocabulary from one prefill of a fresh Generator
over prompt + continuation (its `logits` output: one row per position, the same model and session options).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

# started as a script: its folder (harness/engines/onnxruntime) must not stand in front of the real packages
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

from harness.engines.workerlib import (add_busy, log_softmax, main, running_threads, scored_prompts,  # noqa: E402
                                      thread_times_ns)


def loaded_libraries() -> list[str]:
    """The ONNX Runtime shared libraries mapped into this process (their real paths)."""
    out = set()
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            name = os.path.basename(path)
            if name.startswith(("libonnxruntime", "onnxruntime_genai.")) and ".so" in name:
                out.add(os.path.realpath(path))
    return sorted(out)


def load_model(model_path: str, threads: int):
    """og.Model of the form's folder on the CPU with `threads` intra-op threads: (model, overlay, load seconds)."""
    import onnxruntime_genai as og

    overlay = {"model": {"decoder": {"session_options": {"intra_op_num_threads": threads, "inter_op_num_threads": 1,
                                                         "provider_options": []}}}}
    og.disable_telemetry_events()  # no usage events from a benchmark (and no telemetry thread beside the model's)
    t = time.perf_counter()
    cfg = og.Config(model_path)
    cfg.clear_providers()  # the CPU execution provider only
    cfg.overlay(json.dumps(overlay))
    model = og.Model(cfg)
    return model, overlay, time.perf_counter() - t


def generator(model, length: int):
    """A greedy generator of exactly `length` tokens in all (prompt + output): end of sequence never stops it."""
    import onnxruntime_genai as og

    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=length, min_length=length, batch_size=1)
    return og.Generator(model, params)


def measure(req: dict) -> dict:
    import numpy as np
    import onnxruntime_genai as og

    threads, gen_len = int(req["threads"]), int(req["gen_len"])
    model, overlay, load_s = load_model(req["model_path"], threads)
    tokenizer = og.Tokenizer(model)
    samples, busy_ns, prompt_tokens, output_tokens, output_hashes, batch_sizes = [], {}, [], [], [], []
    for rep in req["repetitions"]:
        (ids,) = rep["prompts"]  # batch 1: one request per repetition
        stream = tokenizer.create_stream()
        before = thread_times_ns()
        t0 = time.perf_counter()
        g = generator(model, len(ids) + gen_len)
        g.append_tokens([ids])  # the prefill
        times, out = [], []
        for _ in range(gen_len):
            g.generate_next_token()
            tid = int(g.get_next_tokens()[0])
            stream.decode(tid)
            times.append(time.perf_counter() - t0)
            out.append(tid)
        after = thread_times_ns()
        batch_sizes.append(int(np.asarray(g.get_output("logits")).shape[0]))  # sequences the last step computed
        seq = [int(i) for i in g.get_sequence(0)]
        del g
        if not rep["warmup"]:
            add_busy(busy_ns, before, after)
        if seq[:len(ids)] != ids or seq[len(ids):] != out:
            return {"status": "failed", "error": f"the generator's sequence ({len(seq)} tokens) is not the prompt's "
                                                 f"{len(ids)} ids and the {len(out)} tokens stamped"}
        prompt_tokens.append(len(seq) - len(out))
        output_tokens.append(len(out))
        samples.append({"warmup": bool(rep["warmup"]), "requests": [{"token_times_s": times}]})
        output_hashes.append(hashlib.sha256(json.dumps(out).encode()).hexdigest())
    running = running_threads(busy_ns)
    return {"status": "ok", "samples": samples, "load_s": load_s,
            "effective": {"threads": len(running), "thread_cpu_s": [round(ns / 1e9, 6) for ns in running],
                          "cpu_affinity": sorted(os.sched_getaffinity(0)), **common(og, overlay),
                          "prompt_tokens": prompt_tokens, "output_tokens": output_tokens,
                          "output_ids_sha256": output_hashes, "batch_sizes": batch_sizes}}


def common(og, overlay: dict) -> dict:
    """What both modes read back of the library."""
    return {"intra_op_num_threads": overlay["model"]["decoder"]["session_options"]["intra_op_num_threads"],
            "session_overlay": overlay, "telemetry": "disabled (og.disable_telemetry_events())",
            "onnxruntime_genai_version": og.__version__,
            "onnxruntime_genai_commit": getattr(og, "__commit__", "unknown"),
            "onnxruntime_genai_dir": os.path.dirname(os.path.abspath(og.__file__)),
            "libraries": loaded_libraries()}


# ---- fidelity ---------------------------------------------------------------------------------------------------
FORCED_SOURCE = ("one prefill of a fresh og.Generator over prompt + forced tokens (the model's `logits` output, one "
                 "row per position, from the same og.Model and session options); log-softmax over the full vocabulary "
                 "in float64")
GREEDY_SOURCE = ("ids: the measurement's loop (append_tokens of the prompt ids, then generate_next_token per token, "
                 "greedy, exactly n_predict tokens); logprobs and top: the teacher-forced pass over those ids")


def fidelity(cfg: dict) -> dict:
    """Greedy ids and teacher-forced scoring for `harness fidelity` (see the module docstring)."""
    import numpy as np
    import onnxruntime_genai as og

    req = json.loads(open(cfg["request_path"]).read())
    n, k, threads = int(req["n_predict"]), int(req["top_k"]), int(cfg["threads"])
    model, overlay, load_s = load_model(cfg["model_path"], threads)
    shapes = []

    def forced_logprobs(ids: list[int], cont: list[int]):
        """[len(cont), n_vocab]: the log-probabilities before each token of cont, given the prompt and cont before it."""
        seq = ids + cont[:-1]  # the last token is only predicted, never fed
        g = generator(model, len(seq) + 1)
        g.append_tokens([seq])
        logits = np.asarray(g.get_output("logits"))
        del g
        shapes.append(list(logits.shape))
        if logits.ndim != 3 or logits.shape[1] != len(seq):
            raise RuntimeError(f"the model's logits output has shape {list(logits.shape)}, not one row per position "
                               f"of the {len(seq)} tokens fed")
        return log_softmax(logits[0, len(ids) - 1:])

    def greedy(ids: list[int]) -> list[int]:
        g = generator(model, len(ids) + n)
        g.append_tokens([ids])
        for _ in range(n):
            g.generate_next_token()
        return [int(i) for i in g.get_sequence(0)][len(ids):]

    probe = forced_logprobs(req["prompts"][0]["ids"], [0]) if req["prompts"] else None
    n_vocab = int(probe.shape[1]) if probe is not None else 0
    before = thread_times_ns()
    prompts, error = scored_prompts(req, greedy, forced_logprobs, n_vocab)
    busy_ns: dict[int, int] = {}
    add_busy(busy_ns, before, thread_times_ns())
    if error:
        return {"status": "failed", "error": error}
    return {"status": "ok", "prompts": prompts, "n_vocab": n_vocab, "n_predict": n, "top_k": k, "threads": threads,
            "effective": {"threads": len(running_threads(busy_ns)), "cpu_affinity": sorted(os.sched_getaffinity(0)), **common(og, overlay),
                          "n_ctx": "not passed: each generator's KV cache is sized to its own max_length",
                          "greedy_source": GREEDY_SOURCE, "forced_source": FORCED_SOURCE,
                          "logits_shapes": shapes[:3], "load_s": load_s}}


if __name__ == "__main__":
    sys.exit(main(measure, fidelity))
