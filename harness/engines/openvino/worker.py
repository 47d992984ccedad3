"""One OpenVINO GenAI measurement in a fresh process: `python worker.py REQUEST.json RESULT.json`.

Run by harness/engines/openvino (under taskset, like every engine process); the only module here that imports
openvino. It loads the GGUF file with openvino_genai.LLMPipeline on the CPU, then per repetition (warm-ups
first) submits one request of the harness's prompt token ids (not text), decodes greedily with end-of-sequence
ignored for exactly gen_len tokens, and stamps each output token in a streamer. It reads back what the library
lets it: the build string, the threads that ran the model (from the kernel: LLMPipeline does not expose its
compiled model's INFERENCE_NUM_THREADS), its own CPU affinity, the prompt and output token counts, the load
time and the library's own per-token times. Standard library, openvino and harness/engines/workerlib.py (the
workers' shared helpers, standard library) only.

`python worker.py --fidelity CONFIG.json RESULT.json` answers a `harness fidelity` request instead (the request and
result format of harness/engines/llamacpp/native/edge-fidelity.cpp): per prompt, greedy ids from the same
LLMPipeline and GenerationConfig as a measurement, and teacher-forced log-probabilities of the full vocabulary from
one forward pass of the model GenAI converted from the GGUF file (saved by the pipeline itself,
`enable_save_ov_model`, into the run's own folder, then compiled on the CPU with the same thread count). The
pipeline cannot give them: LLMPipeline returns one summed log-probability per sequence (GenerationConfig.logprobs
is capped at 1), never a position's distribution, and no logits for given tokens.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

# started as a script: its folder (harness/engines/openvino) must not stand in front of the real packages
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

from harness.engines.workerlib import (add_busy, log_softmax, running_threads, scored_prompts,  # noqa: E402
                                      sha256_of, thread_times_ns, write_result)


def one_line(text: str) -> str:
    """OpenVINO's exception text in one line, without its 'Exception from <source file>' lines."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    said = [ln for ln in lines if not ln.startswith("Exception from")]
    return " ".join(said or lines)[:500]


def main(req_path: str, out_path: str, mode: str = "measure") -> int:
    req = json.loads(open(req_path).read())
    return write_result(out_path, lambda: fidelity(req) if mode == "fidelity" else measure(req), one_line)


def load_pipeline(model_path: str, threads: int, attention_backend: str, **extra):
    """LLMPipeline on the CPU as every measurement loads it: (pipeline, scheduler config, load seconds)."""
    import openvino_genai as ov_genai

    sched = ov_genai.SchedulerConfig()
    sched.enable_prefix_caching = False  # every repetition prefills its whole prompt (as vLLM's, prefix caching off)
    sched.max_num_batched_tokens = 1 << 32  # the whole prompt in one step (the library's latency default)
    props = {"INFERENCE_NUM_THREADS": threads, "ATTENTION_BACKEND": attention_backend, **extra}
    t = time.perf_counter()
    pipe = ov_genai.LLMPipeline(model_path, "CPU", scheduler_config=sched, **props)
    return pipe, sched, time.perf_counter() - t


def greedy_config(gen_len: int):
    """Greedy decoding of exactly gen_len tokens, end of sequence ignored."""
    import openvino_genai as ov_genai

    return ov_genai.GenerationConfig(max_new_tokens=gen_len, min_new_tokens=gen_len, ignore_eos=True, do_sample=False)


def tokenized(ids: list[int]):
    """One request of prompt token ids (not text)."""
    import numpy as np
    import openvino as ov
    import openvino_genai as ov_genai

    x = np.array([ids], dtype=np.int64)
    return ov_genai.TokenizedInputs(ov.Tensor(x), ov.Tensor(np.ones_like(x)))


def cpu_plugin_defaults(core) -> dict[str, str]:
    """The CPU plugin's default settings that shape a run, as this build reports them."""
    defaults = {}
    for key in ("INFERENCE_PRECISION_HINT", "KEY_CACHE_PRECISION", "VALUE_CACHE_PRECISION", "NUM_STREAMS",
                "PERFORMANCE_HINT", "ENABLE_CPU_PINNING", "ENABLE_HYPER_THREADING", "EXECUTION_MODE_HINT"):
        try:
            defaults[key] = str(core.get_property("CPU", key))
        except Exception as e:  # a property this build does not have
            defaults[key] = f"unreadable: {type(e).__name__}"
    return defaults


def measure(req: dict) -> dict:
    import openvino as ov
    import openvino_genai as ov_genai

    threads, gen_len = int(req["threads"]), int(req["gen_len"])
    pipe, sched, load_s = load_pipeline(req["model_path"], threads, req["attention_backend"])
    tokenizer = pipe.get_tokenizer()
    config = greedy_config(gen_len)

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
        inputs = tokenized(ids)
        streamer = Stamps()
        before = thread_times_ns()
        streamer.t0 = time.perf_counter()
        result = pipe.generate(inputs, config, streamer)
        after = thread_times_ns()
        if not rep["warmup"]:
            add_busy(busy_ns, before, after)
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
    running = running_threads(busy_ns)
    core = ov.Core()  # the CPU plugin's defaults (not the pipeline's compiled model, which GenAI does not expose)
    defaults = cpu_plugin_defaults(core)
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


# ---- fidelity ---------------------------------------------------------------------------------------------------
FORCED_SOURCE = ("one forward pass over prompt + forced tokens of the model OpenVINO GenAI converted from the GGUF file "
                 "(LLMPipeline's own conversion, saved by it with enable_save_ov_model into the run's folder), compiled "
                 "on the CPU plugin with the same INFERENCE_NUM_THREADS (stateful model, SDPA attention, the plugin's "
                 "default precisions); the logits of every position, log-softmax over the full vocabulary in float64")
GREEDY_SOURCE = ("ids: LLMPipeline.generate on the prompt ids with the measurement's GenerationConfig (greedy, "
                 "ignore_eos, exactly n_predict tokens) and scheduler config (paged attention); logprobs and top: the "
                 "teacher-forced pass over those ids (LLMPipeline gives one summed log-probability per sequence, kept "
                 "as library_scores, and no distribution)")


def linked_model(cfg: dict) -> tuple[str, str]:
    """GenAI saves the model it converted next to the file it loaded: the file is linked into a folder of this run's
    own (new: no model of another run is read), so the saved model is this run's and nothing is written beside the
    zoo's files. (the folder, the link)"""
    ir_dir = cfg["ir_dir"]
    os.makedirs(ir_dir)
    link = os.path.join(ir_dir, os.path.basename(cfg["model_path"]))
    os.symlink(os.path.abspath(cfg["model_path"]), link)
    return ir_dir, link


def compiled_property(compiled, key: str) -> str:
    try:
        return str(compiled.get_property(key))
    except Exception as e:  # a property this build does not have
        return f"unreadable: {type(e).__name__}"


def fidelity(cfg: dict) -> dict:
    """Greedy ids and teacher-forced scoring for `harness fidelity` (see the module docstring)."""
    import numpy as np
    import openvino as ov
    import openvino_genai as ov_genai

    req = json.loads(open(cfg["request_path"]).read())
    n, k, threads = int(req["n_predict"]), int(req["top_k"]), int(cfg["threads"])
    ir_dir, link = linked_model(cfg)
    pipe, sched, load_s = load_pipeline(link, threads, cfg["attention_backend"], enable_save_ov_model=True)
    xml, weights = os.path.join(ir_dir, "openvino_model.xml"), os.path.join(ir_dir, "openvino_model.bin")
    if not (os.path.isfile(xml) and os.path.isfile(weights)):
        return {"status": "failed", "error": f"LLMPipeline saved no converted model in {ir_dir} (enable_save_ov_model): "
                                             "no logits to score with"}
    core = ov.Core()
    t = time.perf_counter()
    compiled = core.compile_model(core.read_model(xml), "CPU", {"INFERENCE_NUM_THREADS": threads})
    compile_s = time.perf_counter() - t
    names = sorted(i.get_any_name() for i in compiled.inputs)
    if names != ["attention_mask", "beam_idx", "input_ids", "position_ids"]:
        return {"status": "failed", "error": f"the converted model takes inputs {names}, not the stateful LLM's "
                                             "input_ids, attention_mask, position_ids, beam_idx"}
    logits_port = compiled.output("logits")
    infer = compiled.create_infer_request()
    n_vocab = int(logits_port.get_partial_shape()[-1].get_length())

    def forced_logprobs(ids: list[int], cont: list[int]):
        """[len(cont), n_vocab]: the log-probabilities before each token of cont, given the prompt and cont before it."""
        seq = ids + cont[:-1]  # the last token is only predicted, never fed
        infer.reset_state()
        out = infer.infer({"input_ids": np.array([seq], dtype=np.int64),
                           "attention_mask": np.ones((1, len(seq)), dtype=np.int64),
                           "position_ids": np.arange(len(seq), dtype=np.int64)[None],
                           "beam_idx": np.zeros(1, dtype=np.int32)})
        return log_softmax(out[logits_port][0, len(ids) - 1:])

    config = greedy_config(n)
    config.logprobs = 1  # the library's summed log-probability of each greedy sequence (its decode path), recorded
    library_scores = []

    def greedy(ids: list[int]) -> list[int]:
        result = pipe.generate(tokenized(ids), config)
        library_scores.append(float(result.scores[0]))
        return [int(i) for i in result.tokens[0]]

    prompts, error = scored_prompts(req, greedy, forced_logprobs, n_vocab)
    if error:
        return {"status": "failed", "error": error}
    forced_scores = [float(sum(p["greedy"]["logprobs"])) for p in prompts]

    return {"status": "ok", "prompts": prompts, "n_vocab": n_vocab, "n_predict": n, "top_k": k, "threads": threads,
            "effective": {
                "threads": int(compiled.get_property("INFERENCE_NUM_THREADS")),
                "inference_num_threads": threads,
                "cpu_affinity": sorted(os.sched_getaffinity(0)),
                "attention_backend": cfg["attention_backend"],
                "scheduler_config": " ".join(sched.to_string().split()),
                "n_ctx": "not passed: OpenVINO GenAI sizes its paged KV cache itself; the forced pass is one request",
                "greedy_source": GREEDY_SOURCE,
                "forced_source": FORCED_SOURCE,
                "forced_model": {"xml_sha256": sha256_of(xml), "bin_sha256": sha256_of(weights),
                                 **{key.lower(): compiled_property(compiled, key) for key in (
                                     "INFERENCE_PRECISION_HINT", "KEY_CACHE_PRECISION", "VALUE_CACHE_PRECISION",
                                     "NUM_STREAMS", "EXECUTION_MODE_HINT")}},
                # per prompt: the greedy tokens' summed log-probability by the library's decode path, and by the
                # forced pass: their difference is the numerics of the two paths (paged attention and its u8 KV
                # cache vs one forward)
                "library_scores": library_scores,
                "forced_scores": forced_scores,
                "load_s": load_s,
                "compile_s": compile_s,
                "openvino_build": ov.get_version(),
                "openvino_genai_build": ov_genai.get_version(),
                "openvino_dir": os.path.dirname(os.path.abspath(ov.__file__)),
            }}


if __name__ == "__main__":
    args = sys.argv[1:]
    mode = "fidelity" if args[:1] == ["--fidelity"] else "measure"
    args = args[1:] if mode == "fidelity" else args
    if len(args) != 2:
        print("usage: worker.py REQUEST.json RESULT.json | worker.py --fidelity CONFIG.json RESULT.json", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(args[0], args[1], mode))
