"""The sets of `benchmarks/estimator_accuracy.py` (issue #23): the second
held-out set shares no model with the design set or the first held-out
set, the third none with any of them, the fourth none with any of the
four before it, and a case whose setting could
not be applied is left out of its set's figures. Pure Python: nothing is
built or trained."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
# The benchmark adds its folder to sys.path when imported: put it back, so
# that the benchmarks' module names shadow nothing in the rest of the suite.
_PATH = list(sys.path)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import estimator_accuracy as bench  # noqa: E402
from _estimator_table import summarize  # noqa: E402

sys.path[:] = _PATH


def test_second_heldout_set_is_new_and_large_enough():
    second = set(bench.HELDOUT2)
    assert not second & set(bench.MODELS), second & set(bench.MODELS)
    assert not second & set(bench.HELDOUT), second & set(bench.HELDOUT)
    cases = [c for name in second for c in bench.cases(name, quick=False)]
    assert len(second) >= 6 and len(cases) >= 18, (len(second), len(cases))
    variants = {variant for variant, _ in cases}
    assert {"base", "sgd_momentum"} <= variants, variants
    for name in second:  # two batch sizes each, at least
        batches = {batch for _, batch in bench.cases(name, quick=False)}
        assert len(batches) >= 2, (name, batches)
        assert bench.set_of(name) == "heldout2"
    assert bench.set_of("mlp") == "design"
    assert bench.set_of("bigru") == "heldout"


def test_third_heldout_set_is_new_and_covers_the_settings():
    third = set(bench.HELDOUT3)
    for earlier in (bench.MODELS, bench.HELDOUT, bench.HELDOUT2):
        assert not third & set(earlier), third & set(earlier)
    cases = [(n, *c) for n in third for c in bench.cases(n, quick=False)]
    assert len(third) >= 7 and len(cases) >= 24, (len(third), len(cases))
    optimizers = {
        type(bench.optimizer_of(variant)).__name__ for _, variant, _ in cases
    }
    assert {"Adam", "AdamW", "SGD"} <= optimizers, optimizers
    for setting in ("accumulation=4", "checkpointing=auto"):
        families = {n for n, variant, _ in cases if variant == setting}
        assert len(families) >= 2, (setting, families)
    assert any(variant == "mixed_bfloat16" for _, variant, _ in cases)
    for name in third:
        batches = {batch for _, batch in bench.cases(name, quick=False)}
        assert len(batches) >= 2, (name, batches)
        assert bench.set_of(name) == "heldout3"


def test_fourth_heldout_set_is_new_and_covers_the_settings():
    fourth = set(bench.HELDOUT4)
    for earlier in (
        bench.MODELS,
        bench.HELDOUT,
        bench.HELDOUT2,
        bench.HELDOUT3,
    ):
        assert not fourth & set(earlier), fourth & set(earlier)
    cases = [(n, *c) for n in fourth for c in bench.cases(n, quick=False)]
    assert len(fourth) >= 7 and len(cases) >= 24, (len(fourth), len(cases))
    optimizers = {
        type(bench.optimizer_of(variant)).__name__ for _, variant, _ in cases
    }
    assert {"Adam", "AdamW", "SGD"} <= optimizers, optimizers
    for setting in ("accumulation=4", "checkpointing=auto"):
        families = {n for n, variant, _ in cases if variant == setting}
        assert len(families) >= 2, (setting, families)
    assert any(variant == "mixed_bfloat16" for _, variant, _ in cases)
    for name in fourth:
        batches = {batch for _, batch in bench.cases(name, quick=False)}
        assert len(batches) >= 2, (name, batches)
        assert bench.set_of(name) == "heldout4"
    assert "heldout4" in bench.MEASURE_ONLY


def test_summary_leaves_out_a_case_that_did_not_apply():
    def row(measured, estimate, error=""):
        return {
            "model": "m",
            "variant": "checkpointing=auto" if error else "base",
            "batch": 8,
            "measured": measured,
            "estimate": estimate,
            "error": error,
        }

    rows = [row(100, 104), row(100, 94), row(100, 50, "raised")]
    text = summarize(rows)
    assert text.startswith("2 cases, median |error| 5.0%, worst 6.0%"), text
    assert "signed mean -1.0%" in text and "(1 over, 1 under)" in text, text
    assert "left out" in text and "m checkpointing=auto B=8 (raised)" in text
