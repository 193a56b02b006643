"""The round-trip matrix's one-device rows of keras-hub models and LoRA
fine-tunes (#47), checked as tests/round_trip/test_round_trip.py checks
the others."""

from __future__ import annotations

import pytest

from tests.round_trip import cases
from tests.round_trip.test_round_trip import run_and_check

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", cases.rows("keras_hub_and_lora"))
def test_round_trip_keras_hub_and_lora(name, tmp_path):
    run_and_check(name, tmp_path)
