"""tfmemopt.plan: the fastest settings that fit, keeping the global batch."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import tfmemopt
from tfmemopt import memory
from tfmemopt._utils import format_bytes
from tfmemopt.tuning import _plan_search as search
from tfmemopt.tuning import _planner as planner
from tfmemopt.tuning._planner import MARGIN
from tfmemopt.tuning._trials import TrialRunner

needs_stats = pytest.mark.skipif(
    not memory.stats_available("CPU:0"),
    reason="CPU allocator statistics need TF_ENABLE_ONEDNN_OPTS=1",
)


def transformer(seq=64, width=64, blocks=2, heads=4):
    inputs = keras.Input((seq, width))
    h = inputs
    for _ in range(blocks):
        a = keras.layers.MultiHeadAttention(heads, width // heads)(h, h)
        h = keras.layers.LayerNormalization()(h + a)
        f = keras.layers.Dense(4 * width, activation="gelu")(h)
        f = keras.layers.Dense(width)(f)
        h = keras.layers.LayerNormalization()(h + f)
    pooled = keras.layers.GlobalAveragePooling1D()(h)
    outputs = keras.layers.Dense(1)(pooled)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer="adam", loss="mse")
    return model


def mlp():
    model = keras.Sequential(
        [
            keras.Input((16,)),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer="adam", loss="mse")
    return model


# --- the pure parts ---------------------------------------------------------


def test_step_time_model():
    whole = search.step_time(256, 1, None, "float32", False)
    assert whole == 1.0
    four = search.step_time(64, 4, None, "float32", False)
    sixteen = search.step_time(16, 16, None, "float32", False)
    assert four > 1.0 and sixteen > four
    # (4 x (64 + 8)) / (256 + 8), worked out by hand
    assert four == pytest.approx(288 / 264, abs=1e-4)
    ckpt = search.step_time(256, 1, "auto", "float32", False)
    assert ckpt == pytest.approx(1.33)
    assert search.step_time(256, 1, None, "mixed_bfloat16", True) < 1.0
    assert search.step_time(256, 1, None, "mixed_bfloat16", False) > 1.0


def test_choose_fastest_that_fits():
    rows = [
        {"peak": 100, "time": 1.0},
        {"peak": 60, "time": 1.2},
        {"peak": 40, "time": 1.2},
        {"peak": 10, "time": 2.0},
    ]
    assert planner.choose(rows, 100) is rows[0]
    assert planner.choose(rows, 70) is rows[2]  # tie on time: less memory
    assert planner.choose(rows, 5) is None


# --- plans from the estimator -------------------------------------------------


def test_whole_batch_when_it_fits():
    p = tfmemopt.plan(mlp(), 64, "1GiB")
    assert (p.accumulation_steps, p.micro_batch_size) == (1, 64)
    assert p.checkpointing is None and p.policy == "float32"
    assert p.relative_step_time == 1.0
    assert "fits as it is" in p.why
    assert p.estimated_peak <= p.memory_budget
    assert p.model_kwargs == {"accumulation_steps": 1, "checkpointing": None}


def test_replicas_and_accumulation_keep_the_global_batch():
    model = transformer(seq=32)
    full = tfmemopt.estimate_memory(model, 64, replicas=2).total
    p = tfmemopt.plan(model, 64, full // 2, replicas=2, allow=("accumulation",))
    assert p.micro_batch_size * p.accumulation_steps * p.replicas == 64
    assert p.accumulation_steps > 1 and p.replicas == 2
    assert p.estimated_peak <= full // 2
    assert p.checkpointing is None and p.policy == "float32"


def _transformer_data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 64, 64)).astype("float32")
    y = rng.normal(size=(64, 1)).astype("float32")
    return x, y


@needs_stats
@pytest.mark.slow
def test_transformer_at_2_5x_the_budget_fits_when_applied():
    """Planned with and without `verify`, applied, measured under the
    budget and trained; a plan that both give is measured once."""
    x, y = _transformer_data()
    with TrialRunner(transformer(), (x, y), steps=1) as runner:
        plain = runner.run(64)[0]
    budget = int(plain / 2.5)
    plans = {
        verify: tfmemopt.plan(
            transformer(), 64, budget, verify=verify, data=(x, y)
        )
        for verify in (False, True)
    }
    measured = {}
    for verify, p in plans.items():
        assert p.micro_batch_size * p.accumulation_steps * p.replicas == 64
        assert p.accumulation_steps > 1 or p.checkpointing is not None
        assert (p.measured_peak is not None) == verify
        key = (p.micro_batch_size, p.checkpointing, p.policy)
        if key in measured:
            continue
        applied = p.apply(transformer())
        assert isinstance(applied, tfmemopt.Model)
        assert applied.accumulation_steps == p.accumulation_steps
        with TrialRunner(applied, (x, y), steps=2) as runner:
            measured[key] = runner.run(64)[0]
        assert measured[key] <= budget, (plain, budget, measured, str(p))
        history = applied.fit(x, y, batch_size=64, epochs=1, verbose=0)
        assert np.isfinite(history.history["loss"][0])


def test_margin_keeps_room_for_the_estimators_error():
    model = transformer(seq=32)
    whole = tfmemopt.estimate_memory(model, 64).total
    # Just enough for the whole batch: without a margin it is planned...
    p = tfmemopt.plan(model, 64, whole, allow=("accumulation",), margin=0.0)
    assert p.accumulation_steps == 1
    # ... with one, the batch is split (the estimate may be low).
    p = tfmemopt.plan(model, 64, whole, allow=("accumulation",))
    assert p.accumulation_steps > 1 and p.estimated_peak <= (1 - MARGIN) * whole
    with pytest.raises(ValueError, match="`margin` must be a fraction"):
        tfmemopt.plan(model, 64, whole, margin=1.0)


def test_applied_checkpointing_is_saved_with_the_model(tmp_path):
    # Applied on the model itself, not through the wrapper, it was not in
    # the saved config: the loaded model trained without it (fresh-user
    # trial).
    from tfmemopt.checkpointing import checkpointing_report

    x, y = _transformer_data()
    p = planner.Plan(64, 32, 2, 1, "auto", "float32", 0, 1.0, 1)

    def applied():
        keras.utils.set_random_seed(0)
        return p.apply(transformer(seq=16))

    def fit(model, epochs):
        model.fit(x[:, :16], y, batch_size=64, epochs=epochs, verbose=0)

    uninterrupted = applied()
    start = uninterrupted.get_weights()
    fit(uninterrupted, 2)
    model = applied()
    fit(model, 1)
    path = str(tmp_path / "planned.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert loaded.get_config()["checkpointing"] == "auto"
    assert checkpointing_report(loaded.inner) is not None
    fit(loaded, 1)
    update = max(
        np.abs(a - b).max() for a, b in zip(uninterrupted.get_weights(), start)
    )
    gap = max(
        np.abs(a - b).max()
        for a, b in zip(loaded.get_weights(), uninterrupted.get_weights())
    )
    assert gap <= 1e-6 * update, (gap, update)


def test_apply_mixed_precision_keeps_weights_and_float32_outputs():
    model = mlp()
    p = planner.Plan(64, 32, 2, 1, None, "mixed_bfloat16", 0, 1.0, 1)
    applied = p.apply(model)
    inner = applied.inner
    assert inner is not model
    assert inner.layers[0].compute_dtype == "bfloat16"
    assert inner.layers[-1].compute_dtype == "float32"
    for a, b in zip(model.get_weights(), inner.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert applied.accumulation_steps == 2
    assert applied.compiled and model.layers[0].compute_dtype == "float32"


# --- bad input ----------------------------------------------------------------


def test_budget_smaller_than_the_state_cannot_fit():
    with pytest.raises(ValueError, match="cannot fit at any batch size") as e:
        tfmemopt.plan(mlp(), 64, 1024)
    # The real sizes (a 1 KiB budget printed "0.0 MiB more than 0.0 MiB")
    # and the budget that would do.
    message = str(e.value)
    assert "memory_budget=1.0 KiB (1,024 bytes)" in message
    assert "0.0 MiB" not in message
    assert "Raise memory_budget to at least" in message
    # The state as compiled first, then the smallest one tried, named (it
    # gave the smallest alone, then "the optimizer keeps" the compiled
    # one's slots).
    est = tfmemopt.estimate_memory(mlp(), 64)
    own = est.parameters + est.gradients + est.optimizer_state
    assert f"alone take {format_bytes(own)} ({own:,} bytes)" in message
    assert "(the smallest state tried)" in message, message


def test_budget_below_the_smallest_plan_says_what_would_fit():
    model = mlp()
    state = tfmemopt.estimate_memory(model, 64)
    state = state.parameters + state.gradients + state.optimizer_state
    with pytest.raises(ValueError, match="No allowed combination") as e:
        tfmemopt.plan(model, 64, state + 1, allow="accumulation")
    assert f"({state + 1:,} bytes)" in str(e.value)
    assert "Raise memory_budget to at least" in str(e.value)


def test_unaligned_micro_batches_are_tried_where_no_aligned_one_fits():
    """`multiple_of` is a preference: where no micro-batch that is a
    multiple of it fits, the other divisors are tried (it said "raise the
    budget" where 16 micro-batches of 4 fitted)."""
    keras.utils.set_random_seed(0)
    layers = keras.layers
    inputs = keras.Input((28, 28, 1))
    h = layers.MaxPooling2D()(layers.Conv2D(32, 3, activation="relu")(inputs))
    h = layers.MaxPooling2D()(layers.Conv2D(64, 3, activation="relu")(h))
    model = keras.Model(inputs, layers.Dense(10)(layers.Flatten()(h)))
    model.compile("adam", "mse")
    est = {
        steps: tfmemopt.estimate_memory(
            model, 64, accumulation_steps=steps
        ).total
        for steps in (8, 16)  # micro-batches of 8 (aligned) and 4
    }
    assert est[16] < est[8]
    between = int((est[8] + est[16]) / 2 / (1 - MARGIN))
    p = tfmemopt.plan(model, 64, between, allow="accumulation")
    assert (p.micro_batch_size, p.accumulation_steps) == (4, 16)
    # Before switching the optimizer too: the compiled one is kept.
    allow = ("accumulation", "optimizer_state")
    p = tfmemopt.plan(model, 64, between, allow=allow)
    assert (p.micro_batch_size, p.optimizer) == (4, None), p
    # Where an aligned one fits, it is chosen over fewer unaligned steps:
    # at batch 48, 4 micro-batches of 12 fit, and 6 of 8 are chosen.
    at_48 = {
        micro: tfmemopt.estimate_memory(
            model, 48, accumulation_steps=48 // micro
        ).total
        for micro in (16, 12)
    }
    assert at_48[12] < at_48[16]
    room = int(at_48[12] * 1.01 / (1 - MARGIN))
    p = tfmemopt.plan(model, 48, room, allow="accumulation")
    assert (p.micro_batch_size, p.accumulation_steps) == (8, 6), p
    assert (
        tfmemopt.plan(
            model, 48, room, allow="accumulation", multiple_of=4
        ).micro_batch_size
        == 12
    )


def test_allow_takes_one_name_as_a_str():
    # A str is one technique (or "a,b"), not its letters.
    p = tfmemopt.plan(mlp(), 64, "1GiB", allow="accumulation")
    assert p.policy == "float32" and p.checkpointing is None
    with pytest.raises(TypeError, match="`allow` must be a tuple of names"):
        tfmemopt.plan(mlp(), 64, "1GiB", allow=3)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"allow": ("accumulation", "pruning")}, "unknown: \\['pruning'\\]"),
        ({"allow": "accumulation,pruning"}, "unknown: \\['pruning'\\]"),
        ({"replicas": 3}, "divisible by `replicas`"),
        ({"verify": True}, "needs `data`"),
        ({"memory_budget": "lots"}, "such as '16GiB'"),
    ],
)
def test_bad_arguments(kwargs, match):
    args = {"memory_budget": "1GiB", **kwargs}
    with pytest.raises(ValueError, match=match):
        tfmemopt.plan(mlp(), 64, **args)


def test_cli_plan(tmp_path, capsys):
    from tfmemopt.cli import _main as cli

    path = str(tmp_path / "m.keras")
    mlp().save(path)
    assert (
        cli.main(["plan", path, "--batch-size", "64", "--memory", "1GiB"]) == 0
    )
    assert "global batch 64" in capsys.readouterr().out
    code = cli.main(
        ["plan", path, "--batch-size", "64", "--memory", "1GiB", "--json"]
        + ["--margin", "0.5"]
    )
    assert code == 0
    assert '"memory_budget": 1073741824' in capsys.readouterr().out
    assert (
        cli.main(
            ["plan", path, "--batch-size", "8", "--memory", "1GiB"]
            + ["--margin", "1"]
        )
        == 2
    )
    assert "`margin` must be a fraction" in capsys.readouterr().err
    code = cli.main(
        ["plan", path, "--batch-size", "64", "--memory", "1KiB", "--json"]
    )
    assert code == 2
    assert "cannot fit at any batch size" in capsys.readouterr().err
    assert (
        cli.main(
            ["plan", "nope.keras", "--batch-size", "8", "--memory", "1GiB"]
        )
        == 2
    )


@pytest.mark.parametrize("native", [True, False, None])
def test_mixed_bfloat16_is_not_planned_where_the_cpu_emulates_it(
    monkeypatch, native
):
    """On a CPU without avx512_bf16 / amx_bf16 oneDNN emulates bfloat16 and
    keeps float32 copies the estimate does not count (a mixed_bfloat16
    plan for keras-hub Llama at 2 x 2048, estimated 500.1 MiB, measured
    1033.8 on an AVX2-only AMD EPYC): the plan keeps float32 there."""
    from tfmemopt.tuning import _planner

    monkeypatch.setattr(_planner, "cpu_has_native_bfloat16", lambda: native)
    cpu = _planner.detect_hardware().__class__(
        kind="cpu", name="CPU", compute_capability=None, count=1, note=""
    )
    monkeypatch.setattr(_planner, "detect_hardware", lambda: cpu)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    policies, _ = _planner._policies(model, ("mixed_precision",))
    want = ["float32"] if native is False else ["float32", "mixed_bfloat16"]
    assert policies == want
