// edge-fidelity: greedy generation and teacher-forced scoring on token ids, with llama.cpp's own
// kernels, for `harness fidelity`. Built by `harness build` against the pinned llama.cpp libraries.
//
// Usage: edge-fidelity -m MODEL.gguf -t THREADS -i REQUEST.json -o RESULT.json
//
// REQUEST: {"n_predict": N, "top_k": K, "n_ctx": C,
//           "prompts": [{"ids": [...],                     // the prompt, already tokenized (BOS included if wanted)
//                        "forced": [...],                  // optional: a continuation to score teacher-forced
//                        "self_forced": true,              // optional: score its own greedy output instead
//                        "candidates": [[...], ...]}]}     // optional: per forced position, ids whose logprob to report
// RESULT:  {"prompts": [{"greedy": {"ids": [...], "logprobs": [...], "top": [[[id, logprob], ...], ...]},
//                        "forced": {"argmax": [...], "logprobs": [...], "candidates": [[...], ...],
//                                   "top": [[[id, logprob], ...], ...]}}], ...}
//
// Greedy is argmax of the logits at every step (ties: the lowest id), for exactly N tokens (end of
// generation tokens do not stop it, as vLLM's ignore_eos). Log-probabilities are the log-softmax of
// the full vocabulary in double precision. The KV cache is cleared between prompts.
#include "llama.h"
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

using json = nlohmann::json;

static void quiet_log(enum ggml_log_level level, const char * text, void *) {
    if (level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

static std::vector<double> log_softmax(const float * logits, int n) {
    double mx = -INFINITY;
    for (int i = 0; i < n; i++) mx = std::max(mx, (double) logits[i]);
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += std::exp((double) logits[i] - mx);
    const double lse = mx + std::log(sum);
    std::vector<double> out(n);
    for (int i = 0; i < n; i++) out[i] = (double) logits[i] - lse;
    return out;
}

static int argmax(const std::vector<double> & lp) {
    int best = 0;
    for (int i = 1; i < (int) lp.size(); i++) if (lp[i] > lp[best]) best = i;
    return best;
}

static json top_k(const std::vector<double> & lp, int k) {
    std::vector<int> idx(lp.size());
    for (size_t i = 0; i < idx.size(); i++) idx[i] = (int) i;
    k = std::min<int>(k, (int) idx.size());
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int a, int b) {
        return lp[a] > lp[b] || (lp[a] == lp[b] && a < b);
    });
    json out = json::array();
    for (int i = 0; i < k; i++) out.push_back({idx[i], lp[idx[i]]});
    return out;
}

static bool decode(llama_context * ctx, llama_batch & batch, const std::vector<llama_token> & toks, int pos0,
                   int first_logit) {
    batch.n_tokens = (int) toks.size();
    for (size_t i = 0; i < toks.size(); i++) {
        batch.token[i] = toks[i];
        batch.pos[i] = pos0 + (int) i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = (int) i >= first_logit;
    }
    return llama_decode(ctx, batch) == 0;
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
        else { fprintf(stderr, "edge-fidelity: unknown argument %s\n", a.c_str()); return 2; }
    }
    if (model_path.empty() || in_path.empty() || out_path.empty()) {
        fprintf(stderr, "usage: edge-fidelity -m MODEL.gguf -t THREADS -i REQUEST.json -o RESULT.json\n");
        return 2;
    }
    json req;
    try {
        std::ifstream f(in_path);
        req = json::parse(f);
    } catch (const std::exception & e) {
        fprintf(stderr, "edge-fidelity: %s: %s\n", in_path.c_str(), e.what());
        return 2;
    }
    const int n_predict = req.at("n_predict").get<int>();
    const int k = req.value("top_k", 20);
    const int n_ctx = req.value("n_ctx", 2048);

    llama_log_set(quiet_log, nullptr);
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    llama_model * model = llama_model_load_from_file(model_path.c_str(), mp);
    if (!model) { fprintf(stderr, "edge-fidelity: %s: cannot load model\n", model_path.c_str()); return 1; }
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_batch = n_ctx;
    cp.n_ubatch = n_ctx;
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "edge-fidelity: cannot create a context of %d tokens\n", n_ctx); return 1; }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    llama_batch batch = llama_batch_init(n_ctx, 0, 1);

    json out = {{"n_vocab", n_vocab}, {"n_predict", n_predict}, {"top_k", k}, {"threads", threads},
                {"prompts", json::array()}};
    for (const auto & p : req.at("prompts")) {
        std::vector<llama_token> ids = p.at("ids").get<std::vector<llama_token>>();
        if (ids.empty() || (int) ids.size() + n_predict > n_ctx) {
            fprintf(stderr, "edge-fidelity: prompt of %zu tokens + %d does not fit n_ctx %d\n", ids.size(), n_predict, n_ctx);
            return 2;
        }
        json res;
        // greedy
        llama_memory_clear(llama_get_memory(ctx), true);
        if (!decode(ctx, batch, ids, 0, (int) ids.size() - 1)) { fprintf(stderr, "edge-fidelity: decode failed\n"); return 1; }
        json g_ids = json::array(), g_lp = json::array(), g_top = json::array();
        int pos = (int) ids.size();
        for (int s = 0; s < n_predict; s++) {
            std::vector<double> lp = log_softmax(llama_get_logits_ith(ctx, -1), n_vocab);
            int t = argmax(lp);
            g_ids.push_back(t);
            g_lp.push_back(lp[t]);
            g_top.push_back(top_k(lp, k));
            if (s + 1 < n_predict) {
                if (!decode(ctx, batch, {t}, pos++, 0)) { fprintf(stderr, "edge-fidelity: decode failed\n"); return 1; }
            }
        }
        res["greedy"] = {{"ids", g_ids}, {"logprobs", g_lp}, {"top", g_top}};
        // teacher-forced: the distribution before each forced token, under the forced context
        if (p.contains("forced") || p.value("self_forced", false)) {
            std::vector<llama_token> forced = p.contains("forced") ? p.at("forced").get<std::vector<llama_token>>()
                                                                   : g_ids.get<std::vector<llama_token>>();
            json cands = p.value("candidates", json::array());
            std::vector<llama_token> seq = ids;
            seq.insert(seq.end(), forced.begin(), forced.end());
            seq.pop_back();  // the last forced token is only predicted, never fed
            if ((int) seq.size() > n_ctx) { fprintf(stderr, "edge-fidelity: forced sequence exceeds n_ctx\n"); return 2; }
            llama_memory_clear(llama_get_memory(ctx), true);
            const int first = (int) ids.size() - 1;
            if (!decode(ctx, batch, seq, 0, first)) { fprintf(stderr, "edge-fidelity: decode failed\n"); return 1; }
            json f_arg = json::array(), f_lp = json::array(), f_c = json::array(), f_top = json::array();
            for (size_t j = 0; j < forced.size(); j++) {
                std::vector<double> lp = log_softmax(llama_get_logits_ith(ctx, first + (int) j), n_vocab);
                f_arg.push_back(argmax(lp));
                f_lp.push_back(lp[forced[j]]);
                f_top.push_back(top_k(lp, k));
                json c = json::array();
                if (j < cands.size()) {
                    for (const auto & id : cands[j]) {
                        const int v = id.get<int>();
                        if (v < 0 || v >= n_vocab) { fprintf(stderr, "edge-fidelity: candidate id %d out of range\n", v); return 2; }
                        c.push_back(lp[v]);
                    }
                }
                f_c.push_back(c);
            }
            res["forced"] = {{"argmax", f_arg}, {"logprobs", f_lp}, {"candidates", f_c}, {"top", f_top}};
        }
        out["prompts"].push_back(res);
    }
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    std::ofstream of(out_path);
    of << out.dump() << "\n";
    return of.good() ? 0 : 1;
}
