"""The `tfmemopt` command as a newcomer meets it: a quick --help, every
option explained, their own layers, other file formats, variable-length
inputs (keras-hub text models)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
from conftest import ROOT

from tfmemopt.cli import _main as cli


def test_help_and_argument_errors_do_not_import_tensorflow():
    # The console script is tfmemopt_cli:main (pyproject.toml); it parsed
    # after `import tfmemopt`, which imports TensorFlow (~10-30 s).
    code = textwrap.dedent(
        """
        import contextlib, io, sys
        from tfmemopt_cli import main
        codes = []
        for argv in (["--help"], ["plan", "--help"], ["estimate", "-h"],
                     ["find-batch-size", "--help"], ["plan", "m.keras"],
                     ["estimate", "m.keras", "--batch-size", "x"]):
            with contextlib.redirect_stdout(io.StringIO()), \\
                    contextlib.redirect_stderr(io.StringIO()):
                try:
                    main(argv)
                except SystemExit as e:
                    codes.append(e.code)
        print(codes, "tensorflow" in sys.modules, "keras" in sys.modules)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=ROOT),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["[0,", "0,", "0,", "0,", "2,", "2]"] + [
        "False",
        "False",
    ], proc.stdout


def test_every_option_has_help_and_allow_lists_its_values():
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    missing = []
    for name, command in sub.choices.items():
        for action in command._actions:
            if not action.help:
                missing.append(f"{name} {action.option_strings or action.dest}")
    assert not missing, missing
    allow = next(a for a in sub.choices["plan"]._actions if a.dest == "allow")
    for technique in ("accumulation", "checkpointing", "mixed_precision"):
        assert technique in allow.help


_LAYERS = """
import keras


class Doubler(keras.layers.Layer):  # not registered: a newcomer's layer
    def call(self, x):
        return 2.0 * x
"""


def test_own_layers_load_with_import_and_errors_say_so(
    tmp_path, monkeypatch, capsys
):
    (tmp_path / "tfm_user_layers.py").write_text(_LAYERS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    import tfm_user_layers

    inputs = keras.Input((8,))
    outputs = keras.layers.Dense(2)(tfm_user_layers.Doubler()(inputs))
    keras.Model(inputs, outputs).save("own.keras")
    argv = ["estimate", "own.keras", "--batch-size", "4"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "--import MODULE" in err and "Traceback" not in err
    # The class is named (Keras's text names it after 300 characters).
    assert "it uses the class 'Doubler', which is not registered" in err, err
    assert cli.main(argv + ["--import", "tfm_user_layers", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["parameters"] == 18 * 4
    assert cli.main(argv + ["--import", "no_such_module_here"]) == 2
    assert "cannot import it" in capsys.readouterr().err


def test_h5_loads_and_other_formats_say_what_is_supported(tmp_path, capsys):
    inputs = keras.Input((8,))
    model = keras.Model(inputs, keras.layers.Dense(2)(inputs))
    model.compile("sgd", "mse")
    model.save(str(tmp_path / "m.h5"))
    argv = ["--batch-size", "4", "--json"]
    assert cli.main(["estimate", str(tmp_path / "m.h5")] + argv) == 0
    assert json.loads(capsys.readouterr().out)["parameters"] == 18 * 4
    model.export(str(tmp_path / "exported"))  # a SavedModel directory
    assert cli.main(["estimate", str(tmp_path / "exported")] + argv) == 2
    err = capsys.readouterr().err
    assert "SavedModel directory" in err and "model.save(" in err
    (tmp_path / "weights.npz").write_bytes(b"")
    assert cli.main(["estimate", str(tmp_path / "weights.npz")] + argv) == 2
    assert ".keras, .h5, .hdf5" in capsys.readouterr().err


def _text_model():
    tokens = keras.Input((None,), dtype="int32", name="token_ids")
    mask = keras.Input((None,), dtype="int32", name="padding_mask")
    h = keras.layers.Embedding(50, 8)(tokens)
    h = h * keras.ops.expand_dims(keras.ops.cast(mask, h.dtype), -1)
    model = keras.Model(
        {"token_ids": tokens, "padding_mask": mask}, keras.layers.Dense(50)(h)
    )
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(True))
    return model


def test_variable_length_inputs_need_and_take_a_sequence_length(
    tmp_path, capsys
):
    path = str(tmp_path / "text.keras")
    _text_model().save(path)
    assert cli.main(["estimate", path, "--batch-size", "4"]) == 2
    assert "--seq-len" in capsys.readouterr().err
    sized = ["--batch-size", "4", "--json"]
    assert cli.main(["estimate", path, "--seq-len", "16"] + sized) == 0
    by_len = json.loads(capsys.readouterr().out)["total"]
    named = [
        "--input-shape",
        "token_ids=16",
        "--input-shape",
        "padding_mask=16",
    ]
    assert cli.main(["estimate", path] + named + sized) == 0
    assert json.loads(capsys.readouterr().out)["total"] == by_len
    assert (
        cli.main(["plan", path, "--seq-len", "16", "--memory", "1GiB"] + sized)
        == 0
    )
    assert json.loads(capsys.readouterr().out)["global_batch_size"] == 4
    found = ["find-batch-size", path, "--seq-len", "16", "--json"]
    assert cli.main(found + ["--max-batch-size", "16", "--steps", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["largest_fitting"] == 16
    assert (
        cli.main(
            ["plan", path, "--allow", "pruning"]
            + sized[:2]
            + ["--memory", "1GiB"]
        )
        == 2
    )
    assert "--allow takes names from" in capsys.readouterr().err


@pytest.mark.slow
def test_saved_gpt2_causal_lm_finds_a_batch_size(tmp_path, capsys):
    keras_hub = pytest.importorskip("keras_hub")
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=64,
        num_layers=1,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        max_sequence_length=32,
    )
    lm = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    lm.compile(optimizer="adam")  # keras-hub's default sparse CE loss
    path = str(tmp_path / "gpt2.keras")
    lm.save(path)
    argv = ["find-batch-size", path, "--max-batch-size", "16", "--steps", "1"]
    # It failed with "'NoneType' object cannot be interpreted as an integer".
    assert cli.main(argv + ["--json"]) == 2
    assert "--seq-len" in capsys.readouterr().err
    assert cli.main(argv + ["--seq-len", "32", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["largest_fitting"] == 16
    est = ["estimate", path, "--batch-size", "8", "--seq-len", "32", "--json"]
    assert cli.main(est) == 0
    assert json.loads(capsys.readouterr().out)["activations"] > 0
    assert np.isfinite(out["batch_size"])


def test_saved_trained_wrapped_model_is_estimated_and_planned(tmp_path, capsys):
    import tfmemopt

    inner = keras.Sequential([keras.Input((16,)), keras.layers.Dense(4)])
    wrapped = tfmemopt.Model.wrap(inner, 2)
    wrapped.compile("adam", "mse")
    wrapped.fit(np.zeros((8, 16)), np.zeros((8, 4)), verbose=0)
    path = str(tmp_path / "wrapped.keras")
    wrapped.save(path)
    # It said "not built" and suggested building it.
    assert cli.main(["estimate", path, "--batch-size", "8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["parameters"] == 68 * 4
    plan = ["plan", path, "--batch-size", "8", "--memory", "1GiB"]
    assert cli.main(plan) == 0
    assert "global batch 8" in capsys.readouterr().out
