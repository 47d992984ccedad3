"""Step attribution's arithmetic (harness/metrics.py attribution, harness/steps.py): on hand-made step records."""

from harness import metrics, steps


def _step(end, forward, sample=0.001, emitted=1, first=0, rest=0.0005):
    wall = forward + sample + rest
    return {"forward": forward, "sample": sample, "rest": rest, "step": wall, "emitted": emitted,
            "first_tokens": first, "end_s": end}


def test_only_decode_steps_of_measured_repetitions_count():
    # prefill step (first tokens) at 0.1 s, then 3 decode steps every 12 ms, each 11.5 ms of parts
    rec = [_step(0.1, 0.05, first=1)] + [_step(0.1 + 0.012 * k, 0.010) for k in (1, 2, 3)]
    warm = {"warmup": True, "steps": [_step(0.1, 1.0, first=1), _step(9.0, 5.0)], "requests": []}
    block = metrics.attribution([warm, {"warmup": False, "steps": rec, "requests": []}], "test")
    assert block["steps"] == 3
    assert abs(block["itl_mean_ms"] - 12.0) < 1e-9
    assert abs(block["parts"]["forward"]["mean_ms"] - 10.0) < 1e-9
    assert abs(block["accounted"] - 11.5 / 12.0) < 1e-9
    assert abs(block["model_share"] - 10.0 / 12.0) < 1e-9
    assert block["engine_forward_mean_ms"] is None
    assert set(block["part_definitions"]) == {"forward", "sample", "rest"}


def test_time_inside_the_forward_is_reported_not_added():
    """A clock kept inside the forward (the decode-gemv kernel's) is averaged like a part but never added to
    the parts' sum: it is already in the forward."""
    rec = [_step(0.1, 0.05, first=1)] + [{**_step(0.1 + 0.012 * k, 0.010), "linear_kernel": 0.006} for k in (1, 2, 3)]
    block = metrics.attribution([{"warmup": False, "steps": rec, "requests": []}], "test")
    assert abs(block["inside_forward"]["linear_kernel"]["mean_ms"] - 6.0) < 1e-9
    assert abs(block["accounted"] - 11.5 / 12.0) < 1e-9 and "linear_kernel" not in block["parts"]
    assert set(block["inside_forward_definitions"]) == {"linear_kernel"}
    assert "inside_forward" not in metrics.attribution([{"warmup": False, "steps": rec[:1] + [_step(0.2, 0.01)],
                                                         "requests": []}], "test")


def test_meaning_splits_the_forward_at_the_kernel():
    row = {"arm": "vllm", "cell_short": "threads=2", "model_share": 0.9, "itl_ms": 50.0, "forward_bw_share": "55%",
           "forward_bw_share_value": 0.55, "within": True, "accounted_text": "99.0%", "kernel_ms": 30.0,
           "kernel_bw_share_value": 0.75, "parts": {"forward": 45.0, "prepare": 1.0}}
    (line,) = steps._meaning([row])
    assert line.endswith("; inside the forward, the linear layers' kernel takes 30.0 ms (the weights at 75% of the "
                         "read bandwidth) and everything else in it (attention, norms, rotary, activations and the "
                         "calls between them) 15.0 ms")


def test_no_steps_no_block():
    assert metrics.attribution([{"warmup": False, "requests": []}], "x") is None
    only_prefill = [{"warmup": False, "steps": [_step(0.1, 0.05, first=1)], "requests": []}]
    assert metrics.attribution(only_prefill, "x") is None


def test_meaning_names_the_largest_part_outside_the_forward_and_a_shortfall():
    row = {"arm": "vllm", "cell_short": "threads=2", "model_share": 0.6, "itl_ms": 30.0,
           "forward_bw_share": "40%", "forward_bw_share_value": 0.4, "within": False, "accounted_text": "80.0%",
           "parts": {"forward": 18.0, "schedule": 0.5, "prepare": 3.0, "rest": 2.0}}
    (line,) = steps._meaning([row])
    assert line == ("vllm (threads=2): the forward takes 60% of the 30.0 ms between tokens, streaming the weights "
                    "at 40% of the measured read bandwidth; the largest other part is prepare (3.00 ms); the parts "
                    "account for only 80.0% of it")


def test_meaning_says_what_a_share_above_the_ceiling_means():
    """A forward streaming faster than the host's stored ceiling is said to be so, not left as a bare >100%."""
    row = {"arm": "llama.cpp-f32", "cell_short": "threads=1", "model_share": 0.99, "itl_ms": 41.0,
           "forward_bw_share": "105%", "forward_bw_share_value": 1.05, "within": True, "accounted_text": "99.9%",
           "parts": {"forward": 40.8, "sample": 0.2}}
    lines = steps._meaning([row, {**row, "forward_bw_share_value": 0.9, "arm": "other"}])
    assert len(lines) == 3 and lines[2].startswith("llama.cpp-f32: a share above 100%")
    assert len(steps._meaning([{**row, "forward_bw_share_value": 0.9}])) == 1
