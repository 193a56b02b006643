"""The `tfmemopt` command: through its console script, and in-process."""

import json
import os
import subprocess
import sys
import warnings

import keras
import pytest

from tfmemopt import estimate_memory
from tfmemopt.cli import _main as cli

SCRIPT = os.path.join(os.path.dirname(sys.executable), "tfmemopt")


def _run(*args):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TF_ENABLE_ONEDNN_OPTS="1")
    return subprocess.run(
        [SCRIPT, *args], capture_output=True, text=True, timeout=300, env=env
    )


def _saved_model(tmp_path):
    inp = keras.Input((32,))
    h = keras.layers.Dense(16, activation="relu")(inp)
    model = keras.Model(inp, keras.layers.Dense(1)(h))
    model.compile(optimizer="sgd", loss="mse")
    path = str(tmp_path / "m.keras")
    model.save(path)
    return model, path


@pytest.mark.skipif(not os.path.exists(SCRIPT), reason="console script")
def test_estimate_through_the_entry_point_prints_json(tmp_path):
    model, path = _saved_model(tmp_path)
    proc = _run(
        "estimate", path, "--batch-size", "64", "--optimizer", "adam", "--json"
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout)
    expected = estimate_memory(model, 64, optimizer="adam").to_dict()
    assert got["parameters"] == (32 * 16 + 16 + 16 + 1) * 4
    assert got["optimizer_state"] == 2 * got["parameters"]
    assert got["total"] == expected["total"]
    assert got["settings"]["optimizer"] == "Adam"


@pytest.mark.skipif(not os.path.exists(SCRIPT), reason="console script")
def test_missing_file_through_the_entry_point(tmp_path):
    missing = str(tmp_path / "nope.keras")
    proc = _run("estimate", missing, "--batch-size", "8")
    assert proc.returncode == 2
    assert "no such file" in proc.stderr and "nope.keras" in proc.stderr
    assert "model.save" in proc.stderr


def test_doctor_reports_versions_devices_and_policy(capsys):
    assert cli.main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    import tensorflow as tf

    assert report["tensorflow"] == tf.__version__
    assert report["keras"] == keras.__version__
    cpu = [d for d in report["devices"] if d["device"] == "CPU:0"]
    # conftest sets TF_ENABLE_ONEDNN_OPTS=1 before TensorFlow is imported.
    assert cpu and cpu[0]["stats"] is True
    assert report["auto_policy"]["policy"] in (
        "float32",
        "mixed_float16",
        "mixed_bfloat16",
    )
    # No GPU or TPU here: Keras's jit_compile="auto" is off (#46).
    assert report["auto_jit_compile"] is bool(
        tf.config.list_physical_devices("GPU")
        or tf.config.list_physical_devices("TPU")
    )
    assert cli.main(["doctor"]) == 0
    text = capsys.readouterr().out
    assert "configure('auto') would choose" in text
    regime = (
        "XLA here"
        if report["auto_jit_compile"]
        else "TensorFlow's graph executor here"
    )
    assert f"compile(jit_compile='auto') runs the step under {regime}" in (
        " ".join(text.split())
    )


def test_estimate_table_and_settings_in_process(tmp_path, capsys):
    model, path = _saved_model(tmp_path)
    rc = cli.main(
        [
            "estimate",
            path,
            "--batch-size",
            "32",
            "--policy",
            "mixed_bfloat16",
            "--accumulation-steps",
            "2",
            "--checkpointing",
            "auto",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "total" in out and "optimizer state" in out
    assert "policy=mixed_bfloat16" in out and "accumulation_steps=2" in out
    # The compiled optimizer was saved with the model and is used.
    assert "optimizer=SGD" in out


def test_loading_a_model_saved_before_training_does_not_warn(tmp_path, capsys):
    # Saved with its optimizer unbuilt: Keras's `load_model` builds it and
    # warns that it skips the saved optimizer variables, which the commands
    # never read.
    model, _ = _saved_model(tmp_path)
    model.compile(optimizer="adam", loss="mse")  # slots: Keras warns
    path = str(tmp_path / "adam.keras")
    model.save(path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        keras.saving.load_model(path)
    assert any("Skipping variable loading" in str(w.message) for w in caught)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cli.main(["estimate", path, "--batch-size", "8"]) == 0
    assert "total" in capsys.readouterr().out
    assert not [w for w in caught if "Skipping variable" in str(w.message)]


def test_estimate_shard_parameters(tmp_path, capsys):
    model, path = _saved_model(tmp_path)
    args = ["estimate", path, "--batch-size", "32", "--replicas", "2"]
    args += ["--optimizer", "adam"]
    assert cli.main(args + ["--json"]) == 0
    whole = json.loads(capsys.readouterr().out)
    assert cli.main(args + ["--shard-parameters", "--json"]) == 0
    sharded = json.loads(capsys.readouterr().out)
    assert sharded["settings"]["shard_parameters"] is True
    assert sharded["gathered"] > 0 and whole["gathered"] == 0
    assert sharded["optimizer_state"] < whole["optimizer_state"]
    # With accumulation, as tfmemopt.Model trains it: shard accumulators.
    args += ["--shard-parameters", "--accumulation-steps", "2", "--json"]
    assert cli.main(args) == 0
    accumulating = json.loads(capsys.readouterr().out)
    # float32, each weight's shard: ceil(n / 2) elements
    shards = sum(-(-w.size // 2) for w in model.get_weights())
    assert accumulating["accumulation"] == 4 * shards
    # Refusals keep their exit code: a factored optimizer is not elementwise.
    args[args.index("adam")] = "tfmemopt.Adafactor"
    assert cli.main(args) == 2
    assert "elementwise" in capsys.readouterr().err


def test_estimate_long_sequence_options(tmp_path, capsys):
    inp = keras.Input((64,), dtype="int32")
    h = keras.layers.Embedding(300, 16)(inp)
    h = h + keras.layers.MultiHeadAttention(2, 8)(h, h)
    model = keras.Model(inp, keras.layers.Dense(300)(h))
    model.compile(
        "adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    path = str(tmp_path / "lm.keras")
    model.save(path)
    args = ["estimate", path, "--batch-size", "4", "--json"]
    assert cli.main(args) == 0
    plain = json.loads(capsys.readouterr().out)
    assert cli.main(args + ["--chunked-loss", "--attention", "chunked"]) == 0
    both = json.loads(capsys.readouterr().out)
    assert both["settings"]["chunked_loss"] is True
    assert both["settings"]["attention"] == "chunked"
    for term in ("logits", "attention_scores"):
        assert both["terms"][term] < plain["terms"][term]


def test_bad_policy_is_reported_not_raised(tmp_path, capsys):
    _, path = _saved_model(tmp_path)
    rc = cli.main(["estimate", path, "--batch-size", "8", "--policy", "fp8"])
    assert rc == 2
    assert "Unknown dtype policy 'fp8'" in capsys.readouterr().err


def test_doctor_text_says_how_to_get_cpu_statistics():
    report = {
        "tensorflow": "2.x",
        "keras": "3.x",
        "python": "3.11",
        "TF_ENABLE_ONEDNN_OPTS": None,
        "devices": [{"device": "CPU:0", "stats": False, "why": "x"}],
        "missing": {"nvidia-ml-py": cli._INSTALL["nvidia-ml-py"]},
        "auto_policy": None,
    }
    text = cli._doctor_text(report)
    assert "TF_ENABLE_ONEDNN_OPTS=1" in text
    assert "pip install nvidia-ml-py" in text
    assert "mixed_precision not found" in text


@pytest.mark.parametrize("command", [[], ["estimate"], ["doctor"]])
def test_help_on_every_subcommand(command, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(command + ["--help"])
    assert e.value.code == 0
    assert "usage: tfmemopt" in capsys.readouterr().out


def test_subcommand_table_takes_new_commands(capsys):
    @cli.subcommand(
        "echo-test", "Echo for the test.", lambda p: p.add_argument("word")
    )
    def _echo(args):
        print(args.word)
        return 0

    try:
        assert cli.main(["echo-test", "hi"]) == 0
        assert capsys.readouterr().out.strip() == "hi"
    finally:
        del cli.COMMANDS["echo-test"]


def test_no_command_prints_help_and_fails(capsys):
    assert cli.main([]) == 2
    assert "estimate" in capsys.readouterr().out


def test_estimate_jit_compile(tmp_path, capsys):
    """#49: --jit-compile true compiles the step and reads XLA's figure;
    false and this CPU-only machine's auto give the executor's."""
    _, path = _saved_model(tmp_path)
    args = ["estimate", path, "--batch-size", "32", "--json"]
    assert cli.main(args + ["--jit-compile", "true"]) == 0
    compiled = json.loads(capsys.readouterr().out)
    assert compiled["settings"]["jit_compile"] is True
    assert compiled["compiled"]["temporary"] > 0
    assert cli.main(args + ["--jit-compile", "false"]) == 0
    assert "compiled" not in json.loads(capsys.readouterr().out)
    with pytest.raises(SystemExit):
        cli.main(args + ["--jit-compile", "maybe"])
    assert "auto, true or false" in capsys.readouterr().err
