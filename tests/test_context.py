"""The context view (harness/context.py): KV bytes per token, when it applies, what the bytes predict and
the generated sentences, on hand-made artifacts and rows."""

from types import SimpleNamespace as NS

from harness import context, models


def _art(prompt_len, effective, model="smollm2-135m", status="ok", engine="llama.cpp"):
    return NS(status=status, workload=NS(prompt_len=prompt_len, gen_len=64), model=NS(name=model),
              execution=NS(effective=effective), engine=NS(name=engine))


def test_kv_bytes_per_token_from_either_engine():
    # SmolLM2-135M: 2 x 30 layers x 3 KV heads x 64 = 11,520 values a token
    assert models.kv_elements_per_token("smollm2-135m") == 11520
    assert context.kv_bytes_per_token(_art(128, {"kv_bytes_per_token": 46080})) == (46080.0, "engine")
    b, src = context.kv_bytes_per_token(_art(128, {"type_k": "f16", "type_v": "f16"}))
    assert b == 23040 and src == "f16/f16 x model geometry"
    assert context.kv_bytes_per_token(_art(128, {"type_k": "q8_0", "type_v": "f16"}))[0] == 5760 * (34 / 32 + 2)
    assert context.kv_bytes_per_token(_art(128, {}, model="unknown"))[0] is None
    # the KV types are llama.cpp's (its Sizing): an engine that reads back none has no such figure
    assert context.kv_bytes_per_token(_art(128, {"type_k": "f16", "type_v": "f16"}, engine="vllm"))[0] is None
    # 1.7B shape: 2 x 24 x 32 x 64
    assert models.kv_elements_per_token("smollm2-1.7b-synthetic") == 98304


def test_applies_only_to_a_span_of_prompt_lengths():
    assert context.applies([_art(128, {}), _art(4096, {})])
    assert not context.applies([_art(128, {}), _art(512, {})])  # a speed grid's prompt axis
    assert not context.applies([_art(128, {}), _art(128, {})])
    assert not context.applies([_art(128, {}), _art(4096, {}, status="failed")])


def _row(arm, plen, dec, w=500e6, kv_tok=40e3, pre=1000.0, ratio=None):
    kv = kv_tok * (plen + 31.5)
    return {"arm": arm, "model": "m", "size": "135M", "parameters": 135_000_000, "prompt_len": plen,
            "weight_bytes": w, "kv_read": kv, "kv_share_value": kv / (w + kv), "kv_share": f"{100 * kv / (w + kv):.0f}%",
            "decode_value": dec, "decode": context._g(dec), "prefill_value": pre, "prefill": context._g(pre),
            "ratio_value": ratio}


def test_relative_decode_against_what_the_bytes_predict():
    w, kv_tok = 500e6, 40e3
    t0, t1 = w + kv_tok * 159.5, w + kv_tok * 4127.5
    predicted = t0 / t1
    bound = [_row("a", 128, 20.0), _row("a", 4096, 20.0 * predicted, pre=500.0)]  # time in proportion to bytes
    slower = [_row("b", 128, 20.0), _row("b", 4096, 20.0 * predicted * 0.8, ratio=0.5)]
    rows = bound + slower
    context._relative(rows)
    assert abs(bound[1]["predicted_value"] - predicted) < 1e-12 and abs(bound[1]["relative_value"] - predicted) < 1e-12
    assert bound[0]["relative_value"] == 1.0 and bound[0]["predicted_value"] == 1.0
    text = context._meaning(rows, "a")
    assert text[0].startswith(f"a at 135M: decode at prompt 4096 runs at {predicted:.2f}x its rate at prompt 128")
    assert "the KV reads account for it" in text[0] and "Prefill: 1000 -> 500 tok/s (0.50x)" in text[0]
    assert "more than the KV reads explain" in text[1]
    assert text[2] == "b / a decode at 135M: 0.50x at prompt 4096 (paired ratios, intervals in the table)."
