"""The round-trip matrix's one-device rows with tfmemopt's optimizers
(`AdamW8bit`, `Adafactor`, `AccumulatingOptimizer`), checked as
tests/round_trip/test_round_trip.py checks the others."""

from __future__ import annotations

import pytest

from tests.round_trip import cases
from tests.round_trip.test_round_trip import run_and_check

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", cases.rows("tfmemopt_optimizers"))
def test_round_trip_optimizers(name, tmp_path):
    run_and_check(name, tmp_path)
