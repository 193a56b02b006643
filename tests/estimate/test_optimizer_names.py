"""Optimizer names: every name the planner prints is accepted back by
`estimate_memory` and by `tfmemopt estimate --optimizer` (issue #23)."""

from __future__ import annotations

import json

import keras
import pytest

import tfmemopt
from tfmemopt import cli
from tfmemopt import estimate_memory
from tfmemopt.cli._main import build_parser
from tfmemopt.tuning import Plan
from tfmemopt.tuning import _state_options as state_options

_ALLOW = (state_options.SHARDING, state_options.OPTIMIZER_STATE)
_BASES = {
    "Adam": keras.optimizers.Adam,
    "AdamW": keras.optimizers.AdamW,
    "SGD": lambda: keras.optimizers.SGD(momentum=0.9),
    "RMSprop": keras.optimizers.RMSprop,
}


def _printed_names() -> dict:
    """`{name the planner prints: (base, tfmemopt name, stage)}`, driven
    from the planner's own list of options (`alternatives`) and its own
    ways of printing one (`Plan.optimizer`, `Plan.optimizer_name`, the
    label of a considered candidate)."""
    names = {}
    for base_name, make in _BASES.items():
        base = make()
        for alt in state_options.alternatives(base, _ALLOW, 2):
            name, stage = alt.name, alt.stage
            plan = Plan(
                global_batch_size=8,
                micro_batch_size=4,
                accumulation_steps=1,
                replicas=2,
                checkpointing=None,
                policy="float32",
                estimated_peak=0,
                relative_step_time=1.0,
                memory_budget=1,
                optimizer=name,
                sharding=stage,
                base_optimizer=base_name,
            )
            if plan.optimizer:  # the class alone (`Plan.sharding` apart)
                names[plan.optimizer] = (base_name, name, None)
            for text in (
                plan.optimizer_name,
                state_options.describe(base, name, stage),
            ):
                if text is not None:  # shard_parameters keeps the optimizer
                    names[text] = (base_name, name, stage)
    return names


PRINTED = _printed_names()


def test_the_planner_prints_the_names_this_file_feeds_back():
    assert {"AdamW8bit", "Adam8bit", "Adafactor"} <= set(PRINTED)
    assert "tfmemopt.optimizers.AdamW8bit" in PRINTED
    assert "tfmemopt.optimizers.Adafactor" in PRINTED
    assert "tfmemopt.ShardedOptimizer(AdamW8bit, stage=1)" in PRINTED
    assert "ShardedOptimizer(Adam, stage=1)" in PRINTED


def _mlp():
    inp = keras.Input((32,))
    h = keras.layers.Dense(16, activation="relu")(inp)
    return keras.Model(inp, keras.layers.Dense(1)(h))


def _planned(printed):
    """What the name means: a name carries no arguments, so the planner's
    option built from a default optimizer of the printed class."""
    base_name, name, stage = PRINTED[printed]
    base = keras.optimizers.get(base_name.lower())
    return state_options.make_optimizer(base, name, stage)


@pytest.mark.parametrize("printed", sorted(PRINTED))
@pytest.mark.parametrize("case", [str, str.lower, str.upper])
def test_every_printed_name_is_accepted_by_estimate_memory(printed, case):
    model = _mlp()
    replicas = 2 if "Sharded" in printed else 1
    got = estimate_memory(
        model, 8, optimizer=case(printed), replicas=replicas
    ).to_dict()
    want = estimate_memory(
        model, 8, optimizer=_planned(printed), replicas=replicas
    ).to_dict()
    assert got["settings"]["optimizer"] == want["settings"]["optimizer"]
    assert got["optimizer_state"] == want["optimizer_state"]
    assert got["total"] == want["total"]


@pytest.mark.parametrize(
    "name, cls",
    [
        ("adamw8bit", tfmemopt.optimizers.AdamW8bit),
        ("ADAM8BIT", tfmemopt.optimizers.Adam8bit),
        ("tfmemopt_adafactor", tfmemopt.optimizers.Adafactor),
        ("tfmemopt.optimizers.adafactor", tfmemopt.optimizers.Adafactor),
        ("keras.optimizers.Adafactor", keras.optimizers.Adafactor),
        ("keras_adafactor", keras.optimizers.Adafactor),
        ("Adam", keras.optimizers.Adam),
        ("keras.optimizers.AdamW", keras.optimizers.AdamW),
    ],
)
def test_names_resolve_to_the_class_they_spell(name, cls):
    from tfmemopt.estimate._optimizer_names import optimizer_from_name

    optimizer, _ = optimizer_from_name(name)
    assert type(optimizer) is cls


def test_bare_adafactor_is_tfmemopts_and_the_notes_say_so():
    model = _mlp()
    est = estimate_memory(model, 8, optimizer="adafactor")
    ours = estimate_memory(model, 8, optimizer=tfmemopt.optimizers.Adafactor())
    keras_own = estimate_memory(model, 8, optimizer="keras_adafactor")
    assert est.optimizer_state == ours.optimizer_state
    assert est.optimizer_state < keras_own.optimizer_state  # no velocity
    note = " ".join(est.notes)
    assert "tfmemopt.optimizers.Adafactor" in note
    assert "keras.optimizers.Adafactor" in note


@pytest.mark.parametrize(
    "name, match",
    [
        ("adamw9bit", "AdamW8bit"),
        ("tfmemopt.optimizers.Adam", "no such tfmemopt optimizer"),
        ("tfmemopt.ShardedOptimizer(Adafactor, stage=1)", "Adafactor"),
        ("tfmemopt.ShardedOptimizer(Adam, stage=3)", "stage"),
    ],
)
def test_unknown_names_say_what_is_accepted(name, match):
    with pytest.raises(ValueError, match=match):
        estimate_memory(_mlp(), 8, optimizer=name)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    model = _mlp()
    model.compile(optimizer="sgd", loss="mse")
    path = str(tmp_path_factory.mktemp("names") / "m.keras")
    model.save(path)
    return path


@pytest.mark.parametrize("printed", sorted(PRINTED))
def test_every_printed_name_is_accepted_by_the_cli(printed, saved, capsys):
    argv = ["estimate", saved, "--batch-size", "8", "--optimizer", printed]
    if "Sharded" in printed:
        argv += ["--replicas", "2"]
    assert build_parser().parse_args(argv).optimizer == printed
    assert cli.main(argv + ["--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    replicas = 2 if "Sharded" in printed else 1
    want = estimate_memory(
        _mlp(), 8, optimizer=_planned(printed), replicas=replicas
    )
    assert got["optimizer_state"] == want.optimizer_state
    assert got["settings"]["optimizer"] == want.settings["optimizer"]


def test_cli_unknown_name_is_one_line_with_the_fix(saved, capsys):
    rc = cli.main(
        ["estimate", saved, "--batch-size", "8", "--optimizer", "adamw9bit"]
    )
    assert rc == 2
    err = capsys.readouterr().err
    assert "AdamW8bit" in err and "Traceback" not in err
