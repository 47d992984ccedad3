"""Synthetic models (#16): reproducible builds (the same sha256s twice, on the smallest shape, through the
builder the real sizes use), finite logits, provenance that says synthetic, and fidelity refusing them.
The 360M and 1.7B shapes are built only when named (`harness models prepare NAME`), never in `make test`."""

import pytest

from harness import fidelity, models
from harness.errors import UserError

SMALL = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, head_dim=64)


def test_two_builds_give_the_same_files(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    forms = ("hf-fp32", "hf-bf16", "gguf-f32", "gguf-q8_0")
    ia = models.build_synthetic(a, "test-synthetic", SMALL, forms)
    ib = models.build_synthetic(b, "test-synthetic", SMALL, forms)
    fa, fb = models._file_table(a), models._file_table(b)
    assert fa == fb and len(fa) >= 8
    assert ia["source"]["synthetic"] is True and all(ia["source"]["finite_logits"].values())
    assert set(ia["forms"]) == set(forms) and ia == ib


def test_synthetic_shapes_are_the_real_ones_and_not_prepared_by_default():
    s = models.SYNTHETIC_SHAPES
    assert s["smollm2-360m-synthetic"]["hidden_size"] == 960 and s["smollm2-360m-synthetic"]["num_hidden_layers"] == 32
    assert s["smollm2-1.7b-synthetic"]["intermediate_size"] == 8192
    assert not any(models.is_synthetic(n) for n in models.default_models())


def test_fidelity_refuses_a_synthetic_model(tmp_path):
    g = tmp_path / "fid.yaml"
    g.write_text("kind: fidelity\nname: fid\nmodel: smollm2-360m-synthetic\nprompts: x.json\ngen_len: 8\n"
                 "threads: 2\nthresholds: {}\nbuilds: []\n")
    with pytest.raises(UserError, match="synthetic weights: speed only"):
        fidelity.load_grid(str(g))


def test_synthetic_rows_keep_their_verdict_marked():
    from types import SimpleNamespace

    from harness import analysis
    a = SimpleNamespace(model=SimpleNamespace(files=[1], source={"synthetic": True}))
    assert analysis.gate(a, {}) == "synthetic weights"
    from harness.stats import Comparison
    c = Comparison(n_pairs=8, ratio=0.5, ci_low=0.4, ci_high=0.6, level=0.95, achieved=0.96, p_value=0.01,
                   p_adjusted=0.01, m_family=1, detectable=None, warnings=())
    row = analysis.Row(cell="c", cell_params={}, cell_short="c", arm="x", metric="decode_tok_s", unit="tok/s",
                       higher_is_better=True, threads=2, values=[1.0, 2.0], n_samples=2, failed=0, duplicates=0,
                       comparison=c, role="family",
                       fidelity="synthetic weights")
    assert row.verdict == "worse (synthetic weights)"
