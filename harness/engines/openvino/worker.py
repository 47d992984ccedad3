"""One OpenVINO GenAI measurement in a fresh process: `python worker.py REQUEST.json RESULT.json`.

Run by harness/engines/openvino (under taskset, like every engine process); the only module here that imports
openvino. It loads the GGUF file with openvino_genai.LLMPipeline on the CPU, then per repetition (warm-ups
first) submits one request of the harness's prompt token ids (not text), decodes greedily with end-of-sequence
ignored for exactly gen_len tokens, and stamps each output token in a streamer. It reads back what the library
lets it: the build string, the threads that ran the model (from the kernel: LLMPipeline does not expose its
compiled model's INFERENCE_NUM_THREADS), its own CPU affinity, the prompt and output token counts, the load
time and the library's own per-token times. Standard library and openvino only: no harness import.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import traceback

# started as a script: its folder (harness/engines/openvino) must not stand in front of the real packages
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

# a thread counts as running the model when it used at least this share of the busiest thread's CPU time
BUSY_SHARE = 0.10


def thread_cpu_ns() -> dict[int, int]:
    """CPU time (ns, /proc/self/task/*/schedstat) of each thread of this process."""
    out = {}
    for t in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{t}/schedstat") as f:
                out[int(t)] = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return out


def one_line(text: str) -> str:
    """OpenVINO's exception text in one line, without its 'Exception from <source file>' lines."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    said = [ln for ln in lines if not ln.startswith("Exception from")]
    return " ".join(said or lines)[:500]


def main(req_path: str, out_path: str) -> int:
    req = json.loads(open(req_path).read())
    res: dict = {"status": "failed"}
    try:
        res = measure(req)
        code = 0 if res["status"] == "ok" else 1
    except Exception as e:  # reported in the result file: the harness stores it as a failed run
        traceback.print_exc()
        res = {"status": "failed", "error": f"{type(e).__name__}: {one_line(str(e))}"}
        code = 1
    tmp = out_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(res, f)
    os.replace(tmp, out_path)
    return code


def measure(req: dict) -> dict:
    import numpy as np
    import openvino as ov
    import openvino_genai as ov_genai

    threads, gen_len = int(req["threads"]), int(req["gen_len"])
    sched = ov_genai.SchedulerConfig()
    sched.enable_prefix_caching = False  # every repetition prefills its whole prompt (as vLLM's, prefix caching off)
    sched.max_num_batched_tokens = 1 << 32  # the whole prompt in one step (the library's latency default)
    props = {"INFERENCE_NUM_THREADS": threads, "ATTENTION_BACKEND": req["attention_backend"]}
    t = time.perf_counter()
    pipe = ov_genai.LLMPipeline(req["model_path"], "CPU", scheduler_config=sched, **props)
    load_s = time.perf_counter() - t
    tokenizer = pipe.get_tokenizer()
    config = ov_genai.GenerationConfig(max_new_tokens=gen_len, min_new_tokens=gen_len, ignore_eos=True,
                                       do_sample=False)

    class Stamps(ov_genai.StreamerBase):
        """A timestamp per output token, after it is sampled (by the library) and detokenized (here)."""

        def __init__(self) -> None:
            super().__init__()
            self.t0 = 0.0
            self.times: list[float] = []
            self.ids: list[int] = []

        def write(self, token) -> ov_genai.StreamingStatus:
            ids = list(token) if isinstance(token, (list, tuple)) else [int(token)]
            for tid in ids:
                tokenizer.decode([tid])
                self.times.append(time.perf_counter() - self.t0)
                self.ids.append(int(tid))
            return ov_genai.StreamingStatus.RUNNING

        def end(self) -> None:
            pass

    samples, library, busy_ns = [], [], {}
    prompt_tokens, output_tokens, batch_sizes, output_hashes = [], [], [], []
    for rep in req["repetitions"]:
        (ids,) = rep["prompts"]  # batch 1: one request per repetition
        x = np.array([ids], dtype=np.int64)
        inputs = ov_genai.TokenizedInputs(ov.Tensor(x), ov.Tensor(np.ones_like(x)))
        streamer = Stamps()
        before = thread_cpu_ns()
        streamer.t0 = time.perf_counter()
        result = pipe.generate(inputs, config, streamer)
        after = thread_cpu_ns()
        if not rep["warmup"]:
            for tid, ns in after.items():
                busy_ns[tid] = busy_ns.get(tid, 0) + ns - before.get(tid, 0)
        out_ids = [int(i) for i in result.tokens[0]]
        if len(streamer.times) != gen_len or streamer.ids != out_ids:
            return {"status": "failed", "error": f"the streamer stamped {len(streamer.times)} tokens, the request "
                                                 f"returned {len(out_ids)}, gen_len is {gen_len}"}
        pm = result.perf_metrics
        raw = pm.raw_metrics
        ttft_us = float(raw.m_times_to_first_token[0])
        steps_us = [float(d) for d in raw.m_durations]  # each later token's time after the one before, in us
        library.append({"ttft_s": ttft_us / 1e6, "last_token_s": (ttft_us + sum(steps_us)) / 1e6})
        prompt_tokens.append(int(pm.get_num_input_tokens()))
        output_tokens.append(len(out_ids))
        batch_sizes.append(max(int(b) for b in raw.m_batch_sizes) if len(raw.m_batch_sizes) else None)
        samples.append({"warmup": bool(rep["warmup"]), "requests": [{"token_times_s": streamer.times}]})
        output_hashes.append(hashlib.sha256(json.dumps(out_ids).encode()).hexdigest())
    top = max(busy_ns.values(), default=0)
    running = sorted((ns for ns in busy_ns.values() if top and ns >= BUSY_SHARE * top), reverse=True)
    core = ov.Core()  # the CPU plugin's defaults (not the pipeline's compiled model, which GenAI does not expose)
    defaults = {}
    for key in ("INFERENCE_PRECISION_HINT", "KEY_CACHE_PRECISION", "VALUE_CACHE_PRECISION", "NUM_STREAMS",
                "PERFORMANCE_HINT", "ENABLE_CPU_PINNING", "ENABLE_HYPER_THREADING", "EXECUTION_MODE_HINT"):
        try:
            defaults[key] = str(core.get_property("CPU", key))
        except Exception as e:  # a property this build does not have
            defaults[key] = f"unreadable: {type(e).__name__}"
    return {"status": "ok", "samples": samples, "load_s": load_s,
            "effective": {
                "threads": len(running),
                "thread_cpu_s": [round(ns / 1e9, 6) for ns in running],
                "cpu_affinity": sorted(os.sched_getaffinity(0)),
                "inference_num_threads": threads,
                "attention_backend": req["attention_backend"],
                "scheduler_config": " ".join(sched.to_string().split()),
                "prompt_tokens": prompt_tokens,
                "output_tokens": output_tokens,
                "output_ids_sha256": output_hashes,
                "batch_sizes": batch_sizes,
                "library_load_s": float(pm.get_load_time()) / 1e3,
                "library_times": library,
                "openvino_build": ov.get_version(),
                "openvino_genai_build": ov_genai.get_version(),
                "openvino_dir": os.path.dirname(os.path.abspath(ov.__file__)),
                "openvino_genai_dir": os.path.dirname(os.path.abspath(ov_genai.__file__)),
                "cpu_plugin_defaults": defaults,
                "cpu_device": str(core.get_property("CPU", "FULL_DEVICE_NAME")),
            }}


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print("usage: worker.py REQUEST.json RESULT.json", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2]))
