// edge-bench: llama.cpp served the way a request is served, for the harness's request contract: B
// concurrent requests submitted together, one shared context, continuous batching of their decode steps,
// and a timestamp per output token (sampled and detokenized), so that TTFT, inter-token latency and
// decode rate are computed from timestamps exactly as for the other engines (harness/metrics.py).
// Built by `harness build` against the pinned llama.cpp libraries.
//
// Usage: edge-bench -m MODEL.gguf -t THREADS -i REQUEST.json -o RESULT.json
//
// REQUEST: {"n_ctx_per_seq": C,                          // context of each request (prompt + gen_len must fit)
//           "batch": B,                                  // concurrent requests (sequences) per repetition
//           "gen_len": G,                                // output tokens per request (greedy, ignore_eos)
//           "repetitions": [{"warmup": true|false,
//                            "prompts": [[ids], ...]}],  // B prompts, already tokenized, run in order
//           "options": {"n_batch": N, "n_ubatch": U,     // optional; default both max(512, the most prompt
//                                                        //   tokens of any repetition); llama.cpp caps n_batch
//                                                        //   at B * C, and the prefill must fit in one n_batch
//                       "flash_attn": "on"|"off"|"auto", // default: llama.cpp's (auto)
//                       "type_k": "f16", "type_v": "f16",// KV cache types, ggml names (f32, f16, bf16, q8_0, ...)
//                       "poll": 0..100,                  // attach a ggml threadpool with this polling level
//                                                        //   (only ggml's own threads poll; an OpenMP build's
//                                                        //   threads, "OPENMP = 1" in system_info, do not)
//                       "attribution": true}}            // time each step's parts (below)
// RESULT:  {"status": "ok",
//           "samples": [{"warmup": bool,
//                        "requests": [{"token_times_s": [G seconds since submission],
//                                      "token_ids": [G ids], "text_bytes": bytes of their detokenized text}],
//                        "max_concurrent": most sequences in one llama_decode,
//                        "prefill_batch_tokens": prompt tokens in the prefill llama_decode,
//                        "steps": [{"prepare", "forward", "sample", "detokenize", "output", "rest", "step",
//                                   "engine_forward", "emitted", "first_tokens", "end_s"}]}],  // with attribution:
//                                                        //   per llama_decode, seconds: filling the batch,
//                                                        //   llama_decode, llama_sampler_sample, token_to_piece,
//                                                        //   storing id and stamp, the step less those; "step"
//                                                        //   from filling the batch to the last stamp;
//                                                        //   engine_forward: llama.cpp's own eval timer
//                                                        //   (llama_perf_context t_eval_ms + t_p_eval_ms) delta
//           "effective": {"n_ctx", "n_ctx_per_seq", "n_seq_max", "n_batch", "n_ubatch", "n_threads",
//                         "n_threads_batch", "type_k", "type_v", "flash_attn", "poll", "kv_unified",
//                         "cpu_affinity", "omp_num_threads_env", "n_vocab", "model_desc", "model_n_params",
//                         "model_size"},               // flash_attn, type_k, type_v, poll: as set (on|off|auto)
//           "system_info": llama_print_system_info(), "load_s": seconds to load the model and create the context}
//
// One context holds all B sequences (n_seq_max = B, n_ctx = B * C, kv_unified off: each sequence has its
// own C; llama.cpp pads the per-sequence context up to a multiple of 256, reported in "effective"). Each
// repetition clears the KV cache, submits all B prompts in one llama_decode (logits only on each prompt's
// last token), then decodes one token of every sequence per llama_decode until each has G tokens. Each
// token is sampled by its sequence's greedy sampler chain and detokenized (llama_token_to_piece, special
// tokens not rendered, as a server with skip_special_tokens) before it is stamped. End of generation
// tokens do not stop a sequence (as vLLM's ignore_eos). Exit status: 2 for a bad request, 1 for a
// runtime failure, each with one line of its own on stderr (after whatever errors llama.cpp logs).
#include "ggml-cpu.h"
#include "llama.h"
#include <nlohmann/json.hpp>

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

using json = nlohmann::json;
using clk = std::chrono::steady_clock;

static void quiet_log(enum ggml_log_level level, const char * text, void *) {
    if (level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

static double seconds_since(clk::time_point t0) {
    return std::chrono::duration<double>(clk::now() - t0).count();
}

// A KV cache type by its ggml name ("f16", "q8_0", ...); false if no ggml type has that name.
static bool ggml_type_by_name(const std::string & name, ggml_type & out) {
    for (int t = 0; t < GGML_TYPE_COUNT; t++) {
        const char * n = ggml_type_name((ggml_type) t);
        if (n && name == n) { out = (ggml_type) t; return true; }
    }
    return false;
}

// The CPUs this process may run on.
static json cpu_affinity() {
    json cpus = json::array();
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
        for (int c = 0; c < CPU_SETSIZE; c++) if (CPU_ISSET(c, &set)) cpus.push_back(c);
    }
    return cpus;
}

// The text of one token, as a server detokenizes its output; returns its length in bytes.
static int detokenize(const llama_vocab * vocab, llama_token t, std::vector<char> & buf) {
    int n = llama_token_to_piece(vocab, t, buf.data(), (int32_t) buf.size(), 0, false);
    if (n < 0) {
        buf.resize((size_t) -n);
        n = llama_token_to_piece(vocab, t, buf.data(), (int32_t) buf.size(), 0, false);
    }
    return std::max(n, 0);
}

static void batch_add(llama_batch & batch, llama_token t, llama_pos pos, llama_seq_id seq, bool logits) {
    const int i = batch.n_tokens++;
    batch.token[i] = t;
    batch.pos[i] = pos;
    batch.n_seq_id[i] = 1;
    batch.seq_id[i][0] = seq;
    batch.logits[i] = logits;
}

int main(int argc, char ** argv) {
    std::string model_path, in_path, out_path;
    int threads = 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        std::string a = argv[i];
        if (a == "-m") model_path = argv[i + 1];
        else if (a == "-t") threads = std::atoi(argv[i + 1]);
        else if (a == "-i") in_path = argv[i + 1];
        else if (a == "-o") out_path = argv[i + 1];
        else { fprintf(stderr, "edge-bench: unknown argument %s\n", a.c_str()); return 2; }
    }
    if (model_path.empty() || in_path.empty() || out_path.empty() || threads < 1) {
        fprintf(stderr, "usage: edge-bench -m MODEL.gguf -t THREADS -i REQUEST.json -o RESULT.json\n");
        return 2;
    }

    // ---- the request: validated before the model is loaded ----
    int n_ctx_seq = 0, n_seq = 0, gen_len = 0;
    struct Rep { bool warmup; std::vector<std::vector<llama_token>> prompts; int n_tokens; };
    std::vector<Rep> reps;
    json opts;
    try {
        std::ifstream f(in_path);
        if (!f) throw std::runtime_error("cannot open");
        json req = json::parse(f);
        n_ctx_seq = req.at("n_ctx_per_seq").get<int>();
        n_seq = req.at("batch").get<int>();
        gen_len = req.at("gen_len").get<int>();
        opts = req.value("options", json::object());
        for (const auto & r : req.at("repetitions")) {
            Rep rep{r.value("warmup", false), r.at("prompts").get<std::vector<std::vector<llama_token>>>(), 0};
            for (const auto & p : rep.prompts) rep.n_tokens += (int) p.size();
            reps.push_back(std::move(rep));
        }
    } catch (const std::exception & e) {
        fprintf(stderr, "edge-bench: %s: %s\n", in_path.c_str(), e.what());
        return 2;
    }
    if (n_seq < 1 || gen_len < 1 || n_ctx_seq < 1 || reps.empty()) {
        fprintf(stderr, "edge-bench: batch, gen_len and n_ctx_per_seq must be >= 1 and repetitions non-empty\n");
        return 2;
    }
    int max_prompt_tokens = 0;
    for (size_t r = 0; r < reps.size(); r++) {
        if ((int) reps[r].prompts.size() != n_seq) {
            fprintf(stderr, "edge-bench: repetition %zu has %zu prompts, batch is %d\n", r, reps[r].prompts.size(), n_seq);
            return 2;
        }
        for (const auto & p : reps[r].prompts) {
            if (p.empty() || (int) p.size() + gen_len > n_ctx_seq) {
                fprintf(stderr, "edge-bench: repetition %zu: prompt of %zu tokens + gen_len %d does not fit n_ctx_per_seq %d\n",
                        r, p.size(), gen_len, n_ctx_seq);
                return 2;
            }
        }
        max_prompt_tokens = std::max(max_prompt_tokens, reps[r].n_tokens);
    }

    // ---- context parameters, with the request's options ----
    llama_context_params cp = llama_context_default_params();
    cp.n_seq_max = (uint32_t) n_seq;
    cp.n_ctx = (uint32_t) n_ctx_seq * (uint32_t) n_seq;
    cp.kv_unified = false;  // each sequence gets its own n_ctx_per_seq
    cp.n_batch = (uint32_t) std::max(max_prompt_tokens, 512);
    cp.n_ubatch = cp.n_batch;
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    int poll = -1;  // -1: no explicit threadpool (ggml's own)
    bool attribution = false;
    try {
        for (auto it = opts.begin(); it != opts.end(); ++it) {
            const std::string & k = it.key();
            if (k == "n_batch" || k == "n_ubatch") {
                const int v = it->get<int>();
                if (v < 1) throw std::runtime_error(k + " must be >= 1");
                (k == "n_batch" ? cp.n_batch : cp.n_ubatch) = (uint32_t) v;
            }
            else if (k == "flash_attn") {
                const std::string v = it->get<std::string>();
                if (v == "on") cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
                else if (v == "off") cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
                else if (v == "auto") cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_AUTO;
                else throw std::runtime_error("flash_attn must be on, off or auto, not " + v);
            } else if (k == "type_k" || k == "type_v") {
                const std::string v = it->get<std::string>();
                if (!ggml_type_by_name(v, k == "type_k" ? cp.type_k : cp.type_v))
                    throw std::runtime_error(k + ": no ggml type named " + v);
            } else if (k == "attribution") {
                attribution = it->get<bool>();
            } else if (k == "poll") {
                poll = it->get<int>();
                if (poll < 0 || poll > 100) throw std::runtime_error("poll must be in 0..100");
            } else throw std::runtime_error("unknown option " + k);
        }
    } catch (const std::exception & e) {
        fprintf(stderr, "edge-bench: %s: options: %s\n", in_path.c_str(), e.what());
        return 2;
    }
    if (!opts.contains("n_ubatch") && opts.contains("n_batch")) cp.n_ubatch = cp.n_batch;

    // ---- model and context ----
    llama_log_set(quiet_log, nullptr);
    llama_backend_init();
    const auto t_load = clk::now();
    llama_model_params mp = llama_model_default_params();
    llama_model * model = llama_model_load_from_file(model_path.c_str(), mp);
    if (!model) { fprintf(stderr, "edge-bench: %s: cannot load model\n", model_path.c_str()); return 1; }
    cp.no_perf = !attribution;  // llama.cpp's own eval timer, read per step beside ours
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "edge-bench: cannot create a context of %u tokens for %d sequences\n", cp.n_ctx, n_seq);
        return 1;
    }
    ggml_threadpool * tp = nullptr;
    if (poll >= 0) {
        ggml_threadpool_params tpp = ggml_threadpool_params_default(threads);
        tpp.poll = (uint32_t) poll;
        tp = ggml_threadpool_new(&tpp);
        if (!tp) { fprintf(stderr, "edge-bench: cannot create a threadpool of %d threads\n", threads); return 1; }
        llama_attach_threadpool(ctx, tp, tp);
    }
    const double load_s = seconds_since(t_load);

    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    for (size_t r = 0; r < reps.size(); r++) {
        for (const auto & p : reps[r].prompts) {
            for (llama_token t : p) {
                if (t < 0 || t >= n_vocab) {
                    fprintf(stderr, "edge-bench: repetition %zu: token id %d out of range (n_vocab %d)\n", r, t, n_vocab);
                    return 2;
                }
            }
        }
    }
    const int n_batch = (int) llama_n_batch(ctx);
    if (max_prompt_tokens > n_batch || n_seq > n_batch) {
        fprintf(stderr, "edge-bench: a prefill of %d tokens (or %d sequences) exceeds the context's n_batch %d\n",
                max_prompt_tokens, n_seq, n_batch);
        return 2;
    }

    char desc[256];
    llama_model_desc(model, desc, sizeof(desc));
    const char * omp = getenv("OMP_NUM_THREADS");
    json effective = {
        {"n_ctx", llama_n_ctx(ctx)}, {"n_ctx_per_seq", llama_n_ctx_seq(ctx)}, {"n_seq_max", llama_n_seq_max(ctx)},
        {"n_batch", llama_n_batch(ctx)}, {"n_ubatch", llama_n_ubatch(ctx)},
        {"n_threads", llama_n_threads(ctx)}, {"n_threads_batch", llama_n_threads_batch(ctx)},
        // as set: the API has no getter for the cache types, nor for what "auto" flash attention chose
        {"type_k", ggml_type_name(cp.type_k)}, {"type_v", ggml_type_name(cp.type_v)},
        {"flash_attn", cp.flash_attn_type == LLAMA_FLASH_ATTN_TYPE_ENABLED    ? "on"
                     : cp.flash_attn_type == LLAMA_FLASH_ATTN_TYPE_DISABLED ? "off" : "auto"},
        {"poll", poll >= 0 ? json(poll) : json(nullptr)}, {"kv_unified", cp.kv_unified}, {"attribution", attribution},
        {"cpu_affinity", cpu_affinity()}, {"omp_num_threads_env", omp ? json(omp) : json(nullptr)},
        {"n_vocab", n_vocab}, {"model_desc", desc}, {"model_n_params", llama_model_n_params(model)},
        {"model_size", llama_model_size(model)}};

    // one greedy sampler chain per sequence, reset at each repetition
    std::vector<llama_sampler *> samplers(n_seq);
    for (auto & s : samplers) {
        s = llama_sampler_chain_init(llama_sampler_chain_default_params());
        llama_sampler_chain_add(s, llama_sampler_init_greedy());
    }
    llama_batch batch = llama_batch_init(std::max(max_prompt_tokens, n_seq), 0, 1);
    std::vector<char> piece(64);

    // ---- the repetitions ----
    json samples = json::array();
    int rc = 0;
    for (size_t r = 0; r < reps.size() && rc == 0; r++) {
        const Rep & rep = reps[r];
        llama_memory_clear(llama_get_memory(ctx), true);
        for (auto s : samplers) llama_sampler_reset(s);
        std::vector<std::vector<double>> times(n_seq);
        std::vector<std::vector<llama_token>> ids(n_seq);
        std::vector<long> text_bytes(n_seq, 0);
        std::vector<int> idx(n_seq);  // where each sequence's logits are in the last batch
        int max_concurrent = 0;
        json steps = json::array();
        double t_sample = 0, t_detok = 0, t_output = 0;  // this step's, with attribution

        // take the token each sequence's logits give, detokenize it, stamp it
        auto emit = [&](int j, clk::time_point t0) {
            const auto a = clk::now();
            const llama_token t = llama_sampler_sample(samplers[j], ctx, idx[j]);  // also accepts it
            const auto b = clk::now();
            text_bytes[j] += detokenize(vocab, t, piece);
            const auto c = clk::now();
            times[j].push_back(std::chrono::duration<double>(c - t0).count());
            ids[j].push_back(t);
            if (attribution) {
                t_sample += std::chrono::duration<double>(b - a).count();
                t_detok += std::chrono::duration<double>(c - b).count();
                t_output += seconds_since(c);
            }
        };
        auto engine_eval_s = [&]() {
            const llama_perf_context_data d = llama_perf_context(ctx);
            return (d.t_eval_ms + d.t_p_eval_ms) / 1e3;
        };
        // one record per llama_decode: the parts timed above, the rest of the step, llama.cpp's own timer
        auto record = [&](clk::time_point s0, clk::time_point f0, clk::time_point f1, double eval0, int emitted,
                          int first, clk::time_point t0) {
            if (!attribution) return;
            const double step = seconds_since(s0), prepare = std::chrono::duration<double>(f0 - s0).count(),
                         forward = std::chrono::duration<double>(f1 - f0).count();
            steps.push_back({{"prepare", prepare}, {"forward", forward}, {"sample", t_sample}, {"detokenize", t_detok},
                             {"output", t_output}, {"rest", step - prepare - forward - t_sample - t_detok - t_output},
                             {"step", step}, {"engine_forward", engine_eval_s() - eval0}, {"emitted", emitted},
                             {"first_tokens", first}, {"end_s", seconds_since(t0)}});
            t_sample = t_detok = t_output = 0;
        };

        // all B requests are submitted together: one prefill of every prompt
        const auto t0 = clk::now();
        batch.n_tokens = 0;
        for (int j = 0; j < n_seq; j++) {
            const auto & p = rep.prompts[j];
            for (size_t i = 0; i < p.size(); i++) batch_add(batch, p[i], (llama_pos) i, j, i + 1 == p.size());
            idx[j] = batch.n_tokens - 1;
        }
        double eval0 = attribution ? engine_eval_s() : 0;
        auto f0 = clk::now();
        if (llama_decode(ctx, batch) != 0) { fprintf(stderr, "edge-bench: prefill decode failed\n"); rc = 1; break; }
        auto f1 = clk::now();
        max_concurrent = std::max(max_concurrent, n_seq);
        for (int j = 0; j < n_seq; j++) emit(j, t0);
        record(t0, f0, f1, eval0, n_seq, n_seq, t0);

        // decode steps: every unfinished sequence's last token, one batch per step
        while (rc == 0) {
            eval0 = attribution ? engine_eval_s() : 0;  // llama.cpp's timer before the step (nothing runs between)
            const auto s0 = clk::now();
            batch.n_tokens = 0;
            for (int j = 0; j < n_seq; j++) {
                if ((int) ids[j].size() >= gen_len) { idx[j] = -1; continue; }
                idx[j] = batch.n_tokens;
                batch_add(batch, ids[j].back(), (llama_pos) (rep.prompts[j].size() + ids[j].size() - 1), j, true);
            }
            if (batch.n_tokens == 0) break;
            max_concurrent = std::max(max_concurrent, (int) batch.n_tokens);
            const int emitted = batch.n_tokens;
            f0 = clk::now();
            if (llama_decode(ctx, batch) != 0) { fprintf(stderr, "edge-bench: decode failed\n"); rc = 1; break; }
            f1 = clk::now();
            for (int j = 0; j < n_seq; j++) if (idx[j] >= 0) emit(j, t0);
            record(s0, f0, f1, eval0, emitted, 0, t0);
        }

        json requests = json::array();
        for (int j = 0; j < n_seq; j++)
            requests.push_back({{"token_times_s", times[j]}, {"token_ids", ids[j]}, {"text_bytes", text_bytes[j]}});
        json sample = {{"warmup", rep.warmup}, {"requests", requests}, {"max_concurrent", max_concurrent},
                       {"prefill_batch_tokens", rep.n_tokens}};
        if (attribution) sample["steps"] = steps;
        samples.push_back(sample);
    }

    const std::string system_info = llama_print_system_info();
    llama_batch_free(batch);
    for (auto s : samplers) llama_sampler_free(s);
    llama_free(ctx);
    if (tp) ggml_threadpool_free(tp);
    llama_model_free(model);
    if (rc != 0) return rc;

    json out = {{"status", "ok"}, {"samples", samples}, {"effective", effective}, {"system_info", system_info},
                {"load_s", load_s}};
    std::ofstream of(out_path);
    of << out.dump() << "\n";
    if (!of.good()) { fprintf(stderr, "edge-bench: %s: cannot write the result\n", out_path.c_str()); return 1; }
    return 0;
}
