"""`.keras` files saved by tfmemopt 0.1.0.dev0 load, predict the same, train.

The files in tests/fixtures/v0_1_0/ were written by
tests/fixtures/make_v010_fixtures.py on main before the #15 restructuring
(c637af4), so they record that release's module paths
(`tfmemopt.model`, `tfmemopt._wrapped`, `tfmemopt.accumulating_optimizer`,
`tfmemopt.checkpointing.block`) and registered names (`tfmemopt>Model`, ...).
Keras 3 resolves a non-Keras class by its registered name only, so what must
hold is that a plain `import tfmemopt` registers every name under the same
key; the subprocess test checks exactly that in a fresh interpreter.
"""

from __future__ import annotations

import importlib.util
import os

import keras
import numpy as np
import pytest
from conftest import ROOT
from conftest import run_in_subprocess

FIXTURES = os.path.join(ROOT, "tests", "fixtures", "v0_1_0")
SCRIPT = os.path.join(ROOT, "tests", "fixtures", "make_v010_fixtures.py")
CASES = [
    "accumulation",
    "wrapped",
    "accumulating_optimizer",
    "checkpointed",
    # #23: checkpointing="auto" in the config; RecursionError before the fix
    "checkpointed_auto",
    "wrapped_auto",
]


def _fixture_module():
    """The script that wrote the files (it registers the keras-hub-style
    task class, `tfmemopt_fixtures>TinyTask`, that the wrapped file holds)."""
    spec = importlib.util.spec_from_file_location("_v010_fixtures", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", CASES)
def test_v010_file_loads_predicts_and_trains(name):
    _fixture_module()
    import tfmemopt

    saved = np.load(os.path.join(FIXTURES, f"{name}.npz"))
    model = keras.saving.load_model(os.path.join(FIXTURES, f"{name}.keras"))
    if name == "accumulation":
        assert isinstance(model, tfmemopt.Model)
        assert model.accumulation_steps == 2
    elif name == "wrapped":
        assert isinstance(model, tfmemopt.WrappedModel)
        assert model.accumulation_steps == 2
    elif name == "accumulating_optimizer":
        assert isinstance(model.optimizer, tfmemopt.AccumulatingOptimizer)
    elif name.endswith("_auto"):
        assert model.checkpointing == "auto"
        target = model.model if name == "wrapped_auto" else model
        report = tfmemopt.checkpointing.checkpointing_report(target)
        assert report is not None and len(report.segments) >= 2, report
    else:
        assert any(
            isinstance(layer, tfmemopt.CheckpointBlock)
            for layer in model.layers
        )
    np.testing.assert_allclose(
        model.predict(saved["x"], verbose=0),
        saved["predictions"],
        rtol=1e-6,
        atol=1e-6,
    )
    assert int(model.optimizer.iterations.numpy()) == int(saved["iterations"])

    before = [w.numpy().copy() for w in model.trainable_weights]
    history = model.fit(saved["x"][:4], saved["y"][:4], batch_size=4, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    after = [w.numpy() for w in model.trainable_weights]
    assert any(not np.array_equal(a, b) for a, b in zip(before, after))


@pytest.mark.slow
def test_v010_files_load_after_plain_import_tfmemopt():
    """A fresh interpreter that imports only `tfmemopt` (and the fixture
    task class) resolves every registered name in the saved configs."""
    result = run_in_subprocess(
        f"""
        import importlib.util
        import keras
        import numpy as np
        import tfmemopt
        spec = importlib.util.spec_from_file_location(
            "_v010_fixtures", {SCRIPT!r})
        fixtures = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(fixtures)
        errors = {{}}
        for name in {CASES!r}:
            saved = np.load({FIXTURES!r} + "/" + name + ".npz")
            model = keras.saving.load_model({FIXTURES!r} + "/" + name
                                            + ".keras")
            got = model.predict(saved["x"], verbose=0)
            errors[name] = float(np.max(np.abs(got - saved["predictions"])))
        emit(errors)
        """,
        n_cpus=1,
    )
    assert set(result) == set(CASES)
    for name, error in result.items():
        assert error <= 1e-6, (name, error)
