"""bfloat16 weights meeting an optimizer whose step is zero or rounds away:
check_precision, `tfmemopt doctor MODEL` and the OOM report say so."""

import json

import keras
import numpy as np
import tensorflow as tf

import tfmemopt
from tfmemopt.cli._main import main
from tfmemopt.optimizers import AdamW8bit
from tfmemopt.tuning._oom import build_report


def _model(policy, optimizer):
    keras.config.set_dtype_policy(policy)
    try:
        inputs = keras.Input((8,))
        h = keras.layers.Dense(16, activation="relu")(inputs)
        model = keras.Model(inputs, keras.layers.Dense(2, dtype="float32")(h))
    finally:
        keras.config.set_dtype_policy("float32")
    model.compile(optimizer, "mse")
    return model


def _lost(findings):
    return [f for f in findings if f.code.startswith("bf16-")]


def test_check_precision_names_the_optimizer_and_the_fix():
    keras_adamw = _lost(
        tfmemopt.check_precision(
            _model("bfloat16", keras.optimizers.AdamW(1e-3))
        )
    )
    assert [f.code for f in keras_adamw] == ["bf16-step-lost"]
    message = keras_adamw[0].message
    assert "AdamW makes no step at all on bfloat16" in message
    assert "bf16_update=" in message and "mixed_bfloat16" in message
    # SGD's step is not zero, but 1e-3 is under half an ulp of 1.0
    sgd = _lost(
        tfmemopt.check_precision(_model("bfloat16", keras.optimizers.SGD(1e-3)))
    )
    assert len(sgd) == 1 and "rounds its step" in sgd[0].message
    assert not _lost(
        tfmemopt.check_precision(_model("bfloat16", keras.optimizers.SGD(0.1)))
    )
    # ours: float32 step, unbiased write; "plain" is lossy
    assert not _lost(tfmemopt.check_precision(_model("bfloat16", AdamW8bit())))
    plain = _lost(
        tfmemopt.check_precision(
            _model("bfloat16", AdamW8bit(bf16_update="plain"))
        )
    )
    assert [f.code for f in plain] == ["bf16-update-lossy"]
    # wrapped optimizers are looked through; float32 weights are fine
    wrapped = tfmemopt.AccumulatingOptimizer(
        keras.optimizers.Adam(), accumulation_steps=2
    )
    assert len(_lost(tfmemopt.check_precision(_model("bfloat16", wrapped))))
    for policy in ("float32", "mixed_bfloat16"):
        model = _model(policy, keras.optimizers.AdamW())
        assert not _lost(tfmemopt.check_precision(model))


def test_oom_report_and_doctor_say_so(tmp_path, capsys):
    model = _model("bfloat16", keras.optimizers.Adam(1e-3))
    error = tf.errors.ResourceExhaustedError(None, None, "OOM when allocating")
    report = build_report(error, model, batch_size=None)
    assert [f.code for f in report.precision] == ["bf16-step-lost"]
    assert "precision: Adam makes no step" in report.text
    assert "AdamW8bit" in report.text
    fine = build_report(error, _model("bfloat16", AdamW8bit()), None)
    assert fine.precision == [] and "precision:" not in fine.text

    path = str(tmp_path / "bf16.keras")
    model.fit(np.ones((4, 8)), np.ones((4, 2)), verbose=0)
    model.save(path)
    assert main(["doctor", path, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [f["code"] for f in out["precision"]] == ["bf16-step-lost"]
    assert main(["doctor", path]) == 0
    text = capsys.readouterr().out
    assert f"Precision of {path}:" in text and "no step at all" in text
    # Compiled without jit_compile on a CPU-only machine: the graph
    # executor (#46: doctor says which regime the saved model's step runs).
    assert out["regime"] == "graph"
    assert f"{path}'s step runs under: TensorFlow's graph executor" in text
