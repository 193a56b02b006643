"""Mixed precision chosen for the hardware, and a scoped way to set it.

`configure()` is the one place in tfmemopt that sets Keras's global dtype
policy. It picks the policy from the hardware it finds (or that you pass),
says why, and can put the previous policy back (`restore()`, or use it as a
context manager).

Hardware detection is small and never hangs: it reads the active
`tf.distribute` strategy and the local physical devices only. It never
probes a TPU address (an unserved `grpc://` address hangs for over a minute)
and never initialises the TensorFlow runtime, so logical-device and
memory-growth settings can still be made after it.
"""

from __future__ import annotations

import dataclasses
import os
import platform

import keras
import tensorflow as tf

POLICIES = ("auto", "float32", "mixed_float16", "mixed_bfloat16")

_TPU_ENV_VARS = ("TPU_NAME", "COLAB_TPU_ADDR", "TPU_WORKER_HOSTNAMES")


@dataclasses.dataclass(frozen=True)
class Hardware:
    """What the accelerator is, as far as precision and alignment care.

    Args:
        kind: String, one of `"cpu"`, `"gpu"`, `"tpu"`.
        name: String, defaults to `""`. A readable device name.
        compute_capability: Tuple `(major, minor)` for NVIDIA GPUs, defaults
            to `None` (unknown or not a GPU).
        count: Int, defaults to `1`. Number of devices (TPU cores, GPUs).
        note: String, defaults to `""`. Anything the detection noticed.

    Example:

    >>> Hardware("gpu", "A100", (8, 0)).tensor_cores
    True
    """

    kind: str
    name: str = ""
    compute_capability: tuple[int, int] | None = None
    count: int = 1
    note: str = ""

    def __post_init__(self):
        if self.kind not in ("cpu", "gpu", "tpu"):
            raise ValueError(
                "`kind` must be one of 'cpu', 'gpu', 'tpu'. "
                f"Received: kind={self.kind!r}."
            )

    @property
    def tensor_cores(self) -> bool:
        """Whether 16-bit matmuls run on tensor cores (GPU cc >= 7.0)."""
        cc = self.compute_capability
        return self.kind == "gpu" and cc is not None and cc >= (7, 0)

    @property
    def bfloat16_native(self) -> bool:
        """Whether bfloat16 is native: TPUs and GPUs with cc >= 8.0."""
        cc = self.compute_capability
        return self.kind == "tpu" or (
            self.kind == "gpu" and cc is not None and cc >= (8, 0)
        )

    def __str__(self) -> str:
        text = self.name or self.kind.upper()
        if self.compute_capability is not None:
            major, minor = self.compute_capability
            text += f" (compute capability {major}.{minor})"
        if self.count > 1:
            text += f" x{self.count}"
        return text


# Named hardware for planning on one machine for another, e.g.
# `check_alignment(model, hardware="a100")` on a CPU laptop.
PRESETS = {
    "cpu": Hardware("cpu", "CPU"),
    "gpu": Hardware("gpu", "GPU (compute capability 7.0)", (7, 0)),
    "v100": Hardware("gpu", "V100", (7, 0)),
    "t4": Hardware("gpu", "T4", (7, 5)),
    "a100": Hardware("gpu", "A100", (8, 0)),
    "l4": Hardware("gpu", "L4", (8, 9)),
    "h100": Hardware("gpu", "H100", (9, 0)),
    "tpu": Hardware("tpu", "TPU", None, 8),
}


def _gpu_details(device) -> tuple[str, tuple[int, int] | None]:
    try:
        details = tf.config.experimental.get_device_details(device)
    except (ValueError, RuntimeError, tf.errors.OpError):
        details = {}
    cc = details.get("compute_capability")
    cc = (int(cc[0]), int(cc[1])) if cc else None
    return str(details.get("device_name", device.name)), cc


def detect_hardware() -> Hardware:
    """Finds the local accelerator without probing anything remote.

    Looks, in order, at the active `tf.distribute.TPUStrategy`, the local
    physical TPUs (TPU VMs), the local physical GPUs (with their compute
    capability) and falls back to the CPU. Costs a few milliseconds; never
    connects to a TPU address and never initialises the TensorFlow runtime.
    A remote TPU is seen only once you connect to it and enter its
    strategy's scope; otherwise pass `hardware=PRESETS["tpu"]` to
    `configure`.

    Returns:
        A `Hardware`.

    Example:

    >>> detect_hardware().kind in ("cpu", "gpu", "tpu")
    True
    """
    strategy = tf.distribute.get_strategy()
    if isinstance(strategy, tf.distribute.TPUStrategy):
        return Hardware("tpu", "TPU", None, int(strategy.num_replicas_in_sync))
    tpus = tf.config.list_physical_devices("TPU")
    if tpus:
        return Hardware("tpu", "TPU", None, len(tpus))
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        details = [_gpu_details(g) for g in gpus]
        known = [cc for _, cc in details if cc is not None]
        # The slowest GPU decides what all replicas can run.
        cc = min(known) if known else None
        return Hardware("gpu", details[0][0], cc, len(gpus))
    note = ""
    named = [v for v in _TPU_ENV_VARS if os.environ.get(v)]
    if named:
        note = (
            f"{named[0]} is set but no TPU is connected in this process "
            "(tfmemopt does not probe TPU addresses; connect first, or pass "
            "hardware='tpu')."
        )
    return Hardware("cpu", platform.processor() or "CPU", None, 1, note)


def choose_policy(hardware: Hardware | str) -> tuple[str, str]:
    """The policy that suits `hardware`, and why (a pure function).

    Args:
        hardware: A `Hardware`, or a preset name (a key of `PRESETS`:
            `"t4"`, `"a100"`, `"tpu"`, `"cpu"`, ...), as `configure` takes.

    Returns:
        `(policy_name, reason)`.

    Example:

    >>> choose_policy(PRESETS["v100"])[0]
    'mixed_float16'
    >>> choose_policy("a100")[0]
    'mixed_bfloat16'
    """
    if hardware is None or hardware == "auto":
        raise ValueError(
            "choose_policy decides for the hardware it is given and detects "
            f"nothing. Received: hardware={hardware!r}. Pass a Hardware or "
            f"a preset name (one of {sorted(PRESETS)}), or call "
            "detect_hardware() first."
        )
    hardware = _resolve_hardware(hardware)
    cc = hardware.compute_capability
    if hardware.kind == "tpu":
        return "mixed_bfloat16", (
            f"{hardware}: the TPU's matrix units compute in bfloat16 "
            "natively; bfloat16 has float32's range, so no loss scaling."
        )
    if hardware.kind == "gpu" and cc is not None and cc >= (8, 0):
        return "mixed_bfloat16", (
            f"{hardware}: compute capability >= 8.0 has bfloat16 tensor "
            "cores; bfloat16 has float32's range, so no loss scaling."
        )
    if hardware.kind == "gpu" and cc is not None and cc >= (7, 0):
        return "mixed_float16", (
            f"{hardware}: compute capability 7.x has float16 but no "
            "bfloat16 tensor cores; float16 needs loss scaling, which "
            "`compile()` adds (auto_scale_loss=True)."
        )
    if hardware.kind == "gpu":
        return "float32", (
            f"{hardware}: no tensor cores (compute capability < 7.0 or "
            "unknown), so 16-bit compute would not be faster."
        )
    reason = (
        f"{hardware}: CPUs have no tensor cores and 16-bit matmuls are "
        "rarely faster there; mixed precision would still halve activation "
        "memory: force it with configure('mixed_bfloat16') if memory "
        "matters more than speed."
    )
    if hardware.note:
        reason += " " + hardware.note
    return "float32", reason


def _resolve_hardware(hardware) -> Hardware:
    if hardware is None or hardware == "auto":
        return detect_hardware()
    if isinstance(hardware, Hardware):
        return hardware
    if isinstance(hardware, str) and hardware.lower() in PRESETS:
        return PRESETS[hardware.lower()]
    raise ValueError(
        "`hardware` must be 'auto', a `tfmemopt.mixed_precision.Hardware` "
        f"or one of {sorted(PRESETS)}. Received: hardware={hardware!r}."
    )


def _validate_policy(policy) -> str:
    if not isinstance(policy, str):
        raise TypeError(
            f"`policy` must be a string, one of {list(POLICIES)}. "
            f"Received: policy={policy!r} (of type {type(policy).__name__})."
        )
    if policy not in POLICIES:
        raise ValueError(
            f"Unknown precision policy {policy!r}. Valid policies: "
            f"{', '.join(repr(p) for p in POLICIES)}. For pure 16-bit "
            "policies call keras.config.set_dtype_policy() yourself."
        )
    return policy


@dataclasses.dataclass
class PrecisionConfig:
    """What `configure()` chose, why, and how to undo it.

    Use it as a context manager to scope the policy, or call `restore()`.

    Args:
        policy: String, the policy now global in Keras.
        reason: String, why it was chosen.
        hardware: `Hardware` the choice was made for.
        forced: Bool, whether the caller named the policy.
        previous: `keras.DTypePolicy` that was global before.
    """

    policy: str
    reason: str
    hardware: Hardware
    forced: bool
    previous: keras.DTypePolicy

    @property
    def loss_scaling(self) -> bool:
        """Whether training needs loss scaling (`mixed_float16` only)."""
        return self.policy == "mixed_float16"

    def restore(self) -> None:
        """Puts back the global dtype policy that was set before."""
        keras.config.set_dtype_policy(self.previous)

    def __enter__(self) -> "PrecisionConfig":
        return self

    def __exit__(self, *exc) -> None:
        self.restore()

    def __str__(self) -> str:
        how = "forced" if self.forced else "auto"
        return f"{self.policy} ({how}): {self.reason}"


def configure(policy: str = "auto", hardware=None) -> PrecisionConfig:
    """Sets Keras's global dtype policy for the hardware; says why.

    `"auto"` picks `mixed_bfloat16` on TPUs and on NVIDIA GPUs with compute
    capability >= 8.0, `mixed_float16` on 7.x, and `float32` on older GPUs
    and on CPUs. Mixed precision halves activation memory and uses tensor
    cores; variables, gradients and optimizer slots stay float32, so model
    state does not shrink. Call it before building the model: layers take
    the global policy when they are created. Keep the model's outputs and
    softmax in float32 (`tfmemopt.check_precision` finds where not).

    Args:
        policy: String, defaults to `"auto"`. One of `"auto"`, `"float32"`,
            `"mixed_float16"`, `"mixed_bfloat16"`; a name forces that
            policy whatever the hardware.
        hardware: Defaults to `None` (detect). A `Hardware`, or a preset name
            (`"cpu"`, `"v100"`, `"t4"`, `"a100"`, `"h100"`, `"tpu"`...).

    Returns:
        A `PrecisionConfig` (policy, reason, hardware, previous policy),
        usable as a context manager that restores the previous policy.

    Raises:
        ValueError: unknown policy (the message lists the valid ones) or
            hardware.
        TypeError: `policy` is not a string.

    Example:

    >>> with configure("mixed_bfloat16") as chosen:
    ...     layer = keras.layers.Dense(4)
    >>> layer.compute_dtype, chosen.policy
    ('bfloat16', 'mixed_bfloat16')
    """
    policy = _validate_policy(policy)
    found = _resolve_hardware(hardware)
    previous = keras.config.dtype_policy()
    if policy == "auto":
        name, reason = choose_policy(found)
        forced = False
    else:
        name, forced = policy, True
        suited, _ = choose_policy(found)
        reason = f"forced by the caller (on {found}, 'auto' picks {suited})."
        if name == "mixed_bfloat16" and not found.bfloat16_native:
            reason += (
                " bfloat16 is not native here: it saves activation memory "
                "but may run slower than float32."
            )
        if name == "mixed_bfloat16" and found.kind == "cpu":
            reason += (
                " On CPU it halves the activations kept for the backward "
                "pass, but oneDNN's fused bfloat16 MatMul+BiasAdd kernel "
                "takes a float32-sized scratch buffer per call, so the "
                "step's peak shrinks less; "
                "tf.config.optimizer.set_experimental_options("
                "{'remapping': False}) avoids that buffer."
            )
        if name == "mixed_float16":
            reason += (
                " float16 needs loss scaling: `compile()` adds it; a custom "
                "loop must use keras.optimizers.LossScaleOptimizer."
            )
    keras.config.set_dtype_policy(name)
    return PrecisionConfig(name, reason, found, forced, previous)
