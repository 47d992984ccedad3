"""The model-scale view (harness/scale.py): its footprint fit and its generated sentences, on hand-made rows."""

from harness import scale


def test_footprint_fit_is_least_squares_and_needs_two_sizes():
    assert scale.fit_footprint([(100, 5), (100, 7)]) is None
    a, b = scale.fit_footprint([(1, 3), (2, 5), (3, 7)])
    assert (round(a, 9), round(b, 9)) == (1.0, 2.0)


def _row(arm, model, params, share, ratio=None, rss=None):
    return {"arm": arm, "model": model, "parameters": params, "size": scale._size(params), "form": "f",
            "bw_share_value": share, "ratio_value": ratio, "rss_value": rss}


def test_meaning_says_where_an_arm_reaches_the_baselines_share():
    rows = [_row("base", "s", 135_000_000, 0.9), _row("base", "m", 360_000_000, 0.9), _row("base", "l", 1_700_000_000, 0.8),
            _row("v", "s", 135_000_000, 0.4, 0.4), _row("v", "m", 360_000_000, 0.6, 0.6),
            _row("v", "l", 1_700_000_000, 0.85, 1.05)]
    text = scale._meaning(rows, "base")
    assert text[0] == "v decodes at 0.40x base at 135M, 0.60x base at 360M, 1.05x base at 1.70B (paired ratios, intervals in the table)."
    assert "reaches base's at 1.70B" in text[1]
    rows[-1]["bw_share_value"] = 0.5
    assert "stays below base's at every size measured" in scale._meaning(rows, "base")[1]


def test_largest_model_that_fits_is_extrapolated_from_the_fit():
    gib = 2**30
    rows = [_row("v", "s", 100_000_000, 0.4, rss=1 * gib + 4 * 100_000_000),
            _row("v", "l", 1_000_000_000, 0.4, rss=1 * gib + 4 * 1_000_000_000)]
    (fit,) = scale._fits(rows, 9 * gib)
    assert fit["bytes_per_param"] == "4.00" and fit["fixed_gib"] == "1.00"
    assert abs(fit["largest_value"] - 8 * gib / 4) < 1
