"""The round-trip matrix's rows of bfloat16 weights with `AdamW8bit
(bf16_update="stochastic")` on 2 logical CPUs, with and without
`shard_parameters` (#47: TensorFlow's collectives take no bfloat16; both
failed at the first step). One subprocess, a file of its own so that the
suite's workers share the matrix's time."""

from __future__ import annotations

import pytest

from tests.round_trip import cases
from tests.round_trip.test_round_trip import check
from tests.round_trip.test_round_trip_multi_device import run_rows

pytestmark = pytest.mark.slow

# keras-hub's GPT-2 row repeats the embedding row's path (an embedding's
# IndexedSlices gradient and a vocabulary head, summed across replicas in
# bfloat16 before #47) on the model users fine-tune, at about twice its
# time (#51): `make test-full` runs it.
KERAS_HUB = ["gpt2/bfloat16+adamw8bit_stochastic+accumulation"]
ROWS = [
    name for name in cases.rows("bfloat16_replicas") if name not in KERAS_HUB
]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_rows(ROWS, str(tmp_path_factory.mktemp("round_trip")))


@pytest.mark.parametrize("name", ROWS)
def test_round_trip_bfloat16_replicas(name, results):
    check(name, results[name])


@pytest.mark.extended(
    reason="the embedding row's path on keras-hub's GPT-2 (make test runs "
    "the embedding row)"
)
@pytest.mark.parametrize("name", KERAS_HUB)
def test_round_trip_bfloat16_replicas_keras_hub(name, tmp_path):
    pytest.importorskip("keras_hub")
    check(name, run_rows([name], str(tmp_path))[name])
