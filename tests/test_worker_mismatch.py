"""The request and token-count checks every worker engine (OpenVINO, ONNX Runtime GenAI, ExecuTorch) shares:
a worker that read back another count than was asked makes the run fail, named in the engine's own words."""
import pytest

from harness.engines import get_engine

ENGINES = {"openvino": "the library counted", "onnxruntime-genai": "the generator held",
           "executorch": "the program was fed"}


def _eff(prompt=(16, 16), output=(8, 8)) -> dict:
    return {"prompt_tokens": list(prompt), "output_tokens": list(output)}


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_counts_checked_before_the_build(name, monkeypatch):
    eng = get_engine(name)
    assert eng.prompt_counted == ENGINES[name]
    seen = []
    monkeypatch.setattr(eng, "build_mismatch", lambda info, eff, threads: seen.append(threads) or "build")
    assert eng.mismatch({}, _eff(), 16, 8, 1, 2, 2) == "the worker ran 1 requests, 2 were asked"
    assert eng.mismatch({}, _eff(prompt=(16, 15)), 16, 8, 2, 2, 2) == \
        f"{ENGINES[name]} [16, 15] prompt tokens, prompt_len is 16"
    assert eng.mismatch({}, _eff(output=(8, 7)), 16, 8, 2, 2, 2) == \
        "the requests returned [8, 7] tokens, gen_len is 8"
    assert seen == []  # a count mismatch is reported before the build is looked at
    assert eng.mismatch({}, _eff(), 16, 8, 2, 2, 3) == "build"
    assert seen == [3]
