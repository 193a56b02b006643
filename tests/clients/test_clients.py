"""Real client models: accumulation, monitor, save/load.

Each client of `models.CLIENTS` (keras-io examples adapted at a tiny size,
keras-hub task models from tiny configs, keras.applications MobileNetV2)
is trained by plain Keras and by `tfmemopt.Model.wrap(model, 4)` on the
same batches (dropout off). Checkpointing: test_clients_checkpointing.py.
"""

from __future__ import annotations

import pytest

from . import checks
from .models import CLIENTS

FAST = ["kio_text_transformer", "kio_captcha_ctc", "hub_gpt2_causal_lm"]
SLOW = [name for name in CLIENTS if name not in FAST]


# `make test` trains three clients, one per kind of model the others
# repeat (a keras-io transformer, the CTC model with its own loss layer,
# a keras-hub causal LM); `make test-full` all eight (#51).
_EXTENDED = pytest.mark.extended(
    reason="another client through the same accumulation path; make test "
    "trains three"
)


def _params(names, slow):
    marks = [pytest.mark.slow, _EXTENDED] if slow else []
    return [pytest.param(n, marks=marks, id=n) for n in names]


CASES = _params(FAST, False) + _params(SLOW, True)
# Every client, none extended (test_clients_checkpointing.py: "auto" on
# each architecture is a check of its own).
ALL_CLIENTS = [
    pytest.param(n, marks=[pytest.mark.slow] if n in SLOW else [], id=n)
    for n in FAST + SLOW
]


@pytest.mark.parametrize("name", CASES)
def test_accumulation_equals_plain_keras(name):
    out = checks.accumulation(name)
    assert out["change"] > 0
    # Float32 rounding of summed micro-batch gradients, through Adam.
    assert out["rel_diff"] <= 1e-4, out
    assert any(k.endswith("peak_mib") for k in out["monitor_keys"]), out
    assert out["loaded_type"] == "WrappedModel"
    assert out["save_diff"] <= 1e-5, out
