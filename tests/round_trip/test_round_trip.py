"""Nothing a user saves is lost: every feature through every way to save.

Rows are the cases of tests/round_trip/cases.py (models: functional, one
of nested `Sequential` blocks, `Model.wrap` of a `Sequential`, a subclassed
`tfmemopt.Model`, `Model.wrap` of a keras-hub `GPT2CausalLM`; features:
accumulation, checkpointing `"auto"` / `"blocks"` / a list, `AdamW8bit`,
`Adafactor`,
`AccumulatingOptimizer`, `ShardedOptimizer` on 2 logical CPUs, mixed
policies, and the pairs users combine). Columns are the ways to save:
`model.save` + `load_model`, `save_weights` + `load_weights`,
`BackupAndRestore` resume, `ModelCheckpoint` + `load_model`.

For each cell: the restored model has the same features (checkpointing
segments, optimizer chain, 8-bit codes, dtype policies), predicts exactly
what the saved model predicted (difference 0.0), holds exactly its optimizer
state, and one more epoch trained from it equals the uninterrupted run to
1e-6 of the whole update.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest

from tests.round_trip import cases

pytestmark = pytest.mark.slow

# The one-device rows are split over three files (this one, the
# optimizers' and keras-hub's with LoRA), so that the suite's workers
# (whole files each) share the matrix's time.
ONE_DEVICE = cases.rows("keras_optimizers")


def check(name, results):
    assert results["update"] > 0, results
    expected = results["features"]
    if cases.CASES[name].kwargs.get("checkpointing"):
        assert expected["segments"], expected
    if cases.CASES[name].kwargs.get("chunked_loss"):
        assert expected["chunked_head"], expected
    if cases.CASES[name].kwargs.get("attention") == "chunked":
        assert expected["chunked_attention"], expected
    if cases.CASES[name].kwargs.get("shard_parameters"):
        assert expected["sharded"], expected
    if cases.CASES[name].lora:
        assert expected["lora_layers"], expected
    failures = []
    for way in cases.WAYS:
        got = results[way]
        if got["features"] != expected:
            failures.append(f"{way}: features {got['features']} != {expected}")
        if got["predict"] != 0.0:
            failures.append(f"{way}: predictions differ by {got['predict']}")
        if got["state"] != 0.0:
            failures.append(f"{way}: optimizer state {got['state']}")
        if not got["resume"] <= 1e-6:
            failures.append(
                f"{way}: resumed training is {got['resume']:.3g} of the "
                "update away from the uninterrupted run"
            )
    assert not failures, f"{name}:\n" + "\n".join(failures)


def run_and_check(name, tmp_path):
    """Runs one-device row `name` in this process and checks it."""
    if cases.CASES[name].model in ("gpt2", "llama"):
        pytest.importorskip("keras_hub")
    check(name, cases.run_case(name, str(tmp_path)))


@pytest.mark.parametrize("name", ONE_DEVICE)
def test_round_trip(name, tmp_path):
    run_and_check(name, tmp_path)


def test_wrap_restores_the_policies_of_nested_models(tmp_path):
    """Keras loads a nested model under the global policy; the wrapper
    gives it back the one it was saved with (the `nested` row checks the
    same for `tfmemopt.Model`, and resumed training)."""
    import keras

    import tfmemopt

    keras.config.set_dtype_policy("mixed_float16")
    try:
        inputs = keras.Input((4,))
        block = keras.Sequential([keras.layers.Dense(4)], name="block")
        inner = keras.Model(inputs, keras.layers.Dense(2)(block(inputs)))
        model = tfmemopt.Model.wrap(inner, accumulation_steps=2)
    finally:
        keras.config.set_dtype_policy("float32")
    model.save(str(tmp_path / "m.keras"))
    loaded = keras.saving.load_model(str(tmp_path / "m.keras"))
    policies = {
        layer.name: layer.dtype_policy.name for layer in loaded.inner.layers
    }
    assert policies["block"] == "mixed_float16", policies


def test_same_archive_sees_one_changed_array(tmp_path):
    """The model_checkpoint way reuses the save way's results only for an
    equal file (cases.same_archive): saved twice, equal; one weight moved
    by one float32 step, or the config changed, not."""
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile("adam", "mse")
    a, b, c, d = (str(tmp_path / f"{n}.keras") for n in "abcd")
    model.save(a)
    model.save(b)
    assert cases.same_archive(a, b)
    kernel = model.layers[0].kernel
    value = kernel.numpy()
    value[0, 0] = np.nextafter(value[0, 0], np.float32(np.inf))
    kernel.assign(value)
    model.save(c)
    assert not cases.same_archive(a, c)
    model.layers[0].trainable = False
    model.save(d)
    assert not cases.same_archive(c, d)
