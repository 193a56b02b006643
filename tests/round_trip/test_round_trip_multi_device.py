"""The round-trip matrix's rows on 2 logical CPUs (`ShardedOptimizer`,
`shard_parameters`): every multi-device case in one subprocess, checked as
tests/round_trip/test_round_trip.py checks the others. A file of its own so
that the suite's workers (whole files each) share the matrix's time."""

from __future__ import annotations

import pytest
from conftest import run_in_subprocess

from tests.round_trip import cases
from tests.round_trip.test_round_trip import check

pytestmark = pytest.mark.slow

MULTI_DEVICE = cases.rows("replicas")


def run_rows(names, workdir):
    """Rows `names` in one subprocess with 2 logical CPUs."""
    return run_in_subprocess(
        f"""
        import os
        import tensorflow as tf
        from tests.round_trip import cases
        strategy = tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
        emit({{
            name: cases.run_case(name, os.path.join({workdir!r}, str(i)),
                                 strategy)
            for i, name in enumerate({names!r})
        }})
        """,
        n_cpus=2,
        timeout=600,
    )


@pytest.fixture(scope="module")
def multi_device_results(tmp_path_factory):
    """Every multi-device row (before #47) in one subprocess."""
    return run_rows(MULTI_DEVICE, str(tmp_path_factory.mktemp("round_trip")))


@pytest.mark.parametrize("name", MULTI_DEVICE)
def test_round_trip_multi_device(name, multi_device_results):
    check(name, multi_device_results[name])
