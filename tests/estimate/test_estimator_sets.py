"""The sets of `benchmarks/estimator_accuracy.py` (issue #23): the second
held-out set shares no model with the design set or the first held-out
set, the third none with any of them, the fourth none with any of the
four before it, the fifth none with any of the five before it, the
sixth none with any of the six before it, the seventh none with any of
the seven before it, the eighth none with any of the eight before it,
the ninth none with any of the nine before it, the tenth none with any
of the ten before it, the eleventh none with any of the eleven before
it, the twelfth none with any of the twelve before it, the thirteenth
none with any of the thirteen before it, the fourteenth none with any
of the fourteen before it, the fifteenth none with any of the fifteen
before it, the sixteenth none with any of the sixteen before it, the
seventeenth none with any of the seventeen before it, the eighteenth
none with any of the eighteen before it, the nineteenth none with any
of the nineteen before it, the twentieth none with any of the twenty
before it, and a case whose setting could not be applied is left out
of its set's figures. Pure
Python: nothing is built or trained."""

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
# The benchmark adds its folder to sys.path when imported: put it back, so
# that the benchmarks' module names shadow nothing in the rest of the suite.
_PATH = list(sys.path)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import estimator_accuracy as bench  # noqa: E402
from _estimator_table import distribution  # noqa: E402
from _estimator_table import summarize  # noqa: E402
from estimator_spread import unreachable  # noqa: E402

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


def _check_new_set(new, earlier, name):
    """`new` (a set's models) shares no family with `earlier`, has >= 7
    families and >= 24 cases over Adam, AdamW and SGD, accumulation and
    checkpointing on >= 2 families each, a mixed_bfloat16 case and >= 2
    batch sizes per family, and `set_of` names it `name`."""
    new = set(new)
    for models in earlier:
        assert not new & set(models), new & set(models)
    cases = [(n, *c) for n in new for c in bench.cases(n, quick=False)]
    assert len(new) >= 7 and len(cases) >= 24, (len(new), len(cases))
    optimizers = {
        type(bench.optimizer_of(variant)).__name__ for _, variant, _ in cases
    }
    assert {"Adam", "AdamW", "SGD"} <= optimizers, optimizers
    for setting in ("accumulation=4", "checkpointing=auto"):
        families = {n for n, variant, _ in cases if variant == setting}
        assert len(families) >= 2, (setting, families)
    assert any(variant == "mixed_bfloat16" for _, variant, _ in cases)
    for model in new:
        batches = {batch for _, batch in bench.cases(model, quick=False)}
        assert len(batches) >= 2, (model, batches)
        assert bench.set_of(model) == name


@pytest.mark.parametrize(
    "which",
    [
        "heldout3",
        "heldout4",
        "heldout5",
        "heldout6",
        "heldout7",
        "heldout8",
        "heldout9",
        "heldout10",
        "heldout11",
        "heldout12",
        "heldout13",
        "heldout14",
        "heldout15",
        "heldout16",
        "heldout17",
        "heldout18",
        "heldout19",
        "heldout20",
    ],
)
def test_a_later_heldout_set_is_new_and_covers_the_settings(which):
    # Each is new against the design set and every set made before it,
    # is measured without an estimate until its one re-estimate, and
    # follows them in ALL.
    names = list(bench.HELDOUT_SETS)
    earlier = [bench.MODELS] + [
        bench.HELDOUT_SETS[w][0] for w in names[: names.index(which)]
    ]
    new = bench.HELDOUT_SETS[which][0]
    _check_new_set(new, earlier, which)
    assert which in bench.MEASURE_ONLY
    start = sum(len(models) for models in earlier)
    assert bench.ALL[start : start + len(new)] == list(new)


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


def test_distribution_counts_what_a_plan_at_the_margin_holds():
    def row(measured, estimate, run_ahead=0, error=""):
        return {
            "measured": measured,
            "estimate": estimate,
            "error": error,
            "breakdown": {"run_ahead": run_ahead},
        }

    rows = [
        row(100, 96),  # -4%
        row(100, 80),  # -20%: 1.25x its estimate, fits at 0.25 (1.33x)
        row(100, 70),  # -30%: 1.43x, does not fit at 0.25 ...
        row(100, 70, run_ahead=30),  # ... unless run_ahead covers it
        row(100, 110),  # +10%
        row(100, 10, error="raised"),  # left out
    ]
    text = distribution(rows, 0.25)
    assert text.startswith("5 cases; 1 within 5%, 2 within 10%"), text
    assert "3 within 20%, 3 within 25%" in text, text
    assert "50% 20.0%" in text and "worst 30.0%" in text, text
    assert text.endswith("in 4 of 5"), text
    assert distribution(rows, 0.15).endswith("in 3 of 5")


def test_unreachable_counts_the_measurements_own_spread():
    def row(*runs):
        return {"runs": list(runs), "spread": max(runs) / min(runs)}

    rows = [
        row(100, 100, 100, 100),  # nothing moves
        row(100, 100, 100, 128),  # 1.28x: over 1.12 / 0.88 = 1.273x
        row(100, 100, 100, 127),  # 1.27x: 113 is within 12% of both
        row(100, 110, 120, 130, 140, 150, 160),  # median 110 of 3, 130 of 7
    ]
    text = unreachable(rows)
    assert text.startswith("no number within 12% of every run in 2;"), text
    # The last row's stored median (110) is 15.4% under the median of all
    # its runs (130); the others' medians are equal.
    assert text.endswith("1 over 12% (worst 15.4%)"), text
