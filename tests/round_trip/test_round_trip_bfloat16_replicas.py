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

ROWS = cases.rows("bfloat16_replicas")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    pytest.importorskip("keras_hub")
    return run_rows(ROWS, str(tmp_path_factory.mktemp("round_trip")))


@pytest.mark.parametrize("name", ROWS)
def test_round_trip_bfloat16_replicas(name, results):
    check(name, results[name])
