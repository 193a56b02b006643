"""Choose accumulation, checkpointing and precision that fit a memory budget.

`plan` asks the estimator (`tfmemopt.estimate_memory`) for the peak of
each combination of precision policy, checkpointing and accumulation steps
that keeps the requested global batch exactly, and picks the fastest one
that fits, by a simple step-time model. With `verify=True` it also trains
a few steps of the applied plan and moves on when the measurement says it
does not fit. The choice itself is a pure function (`choose`).
"""

from __future__ import annotations

import keras

from tfmemopt._compat import compiled_metric_names
from tfmemopt._utils import check_int
from tfmemopt._utils import cpu_has_native_bfloat16
from tfmemopt._utils import format_mib as _mib
from tfmemopt._utils import keyword_options
from tfmemopt.precision import choose_policy
from tfmemopt.precision import detect_hardware
from tfmemopt.tuning import _search
from tfmemopt.tuning import _state_options as state_options
from tfmemopt.tuning._plan import Plan
from tfmemopt.tuning._plan_apply import measure_plan
from tfmemopt.tuning._plan_chosen import _make_plan
from tfmemopt.tuning._plan_no_fit import raise_no_fit
from tfmemopt.tuning._plan_search import Search
from tfmemopt.tuning._plan_search import choose

ALLOW = (
    "accumulation",
    "checkpointing",
    "mixed_precision",
    "sharding",
    "optimizer_state",
    "long_sequences",
)


def _policies(model, allow) -> tuple[list[str], bool]:
    base = keras.config.dtype_policy().name
    if hasattr(model, "dtype_policy"):
        base = model.dtype_policy.name
    if "mixed_precision" not in allow or base.startswith("mixed"):
        return [base], False
    try:
        hardware = detect_hardware()
        suited, _ = choose_policy(hardware)
    except Exception:  # noqa: BLE001 - planning must not depend on probing
        hardware, suited = None, "float32"
    if suited.startswith("mixed"):
        return [base, suited], True
    on_cpu = getattr(hardware, "kind", None) == "cpu"
    if on_cpu and cpu_has_native_bfloat16() is False:
        # A CPU without avx512_bf16 / amx_bf16 emulates bfloat16 and keeps
        # float32 copies the estimate does not count: applied to keras-hub
        # Llama at 2 x 2048 (800 MiB budget), a mixed_bfloat16 plan
        # estimated at 500.1 MiB measured 1033.8 on an AVX2-only AMD EPYC.
        return [base], False
    return [base, "mixed_bfloat16"], False


# The fraction of a budget `plan` keeps free for the estimator's error. The
# estimate errs low more often than high: on the held-out set of
# docs/estimator.md (28 cases of 8 model families no rule was designed on)
# it was under the measured peak in 22 cases, at worst by 24.0% (a peak of
# 1.32x the estimate), and the design set's worst was -12.6%. 0.25 keeps a
# plan's peak within the budget up to 1/0.75 = 1.33x its estimate (0.15,
# the default until issue #23, covered 24 of the 28 held-out cases).
MARGIN = 0.25


@keyword_options
def plan(
    model: keras.Model,
    global_batch_size: int,
    memory_budget: int | str,
    *,
    optimizer=None,
    allow: tuple[str, ...] = ALLOW,
    replicas: int | None = None,
    multiple_of: int = 8,
    verify: bool = False,
    data=None,
    margin: float = MARGIN,
    input_shape=None,
    sequence_length: int | None = None,
) -> Plan:
    """Chooses the fastest settings that train a batch within a budget.

    For each precision policy (the model's; a 16-bit one if allowed) and
    checkpointing (off; `"auto"` if allowed) it finds, with the estimator,
    the fewest accumulation steps whose estimated peak fits, keeping
    `micro_batch_size x accumulation_steps x replicas == global_batch_size`
    (aligned micro-batches preferred). Among those that fit it picks the
    lowest estimated step time: fewer micro-batches are faster, checkpointing
    costs about one extra forward pass, 16-bit compute is faster only on
    tensor cores, the long-sequence options (`chunked_loss`, chunked
    attention; tried where their terms are large) cost a little, and
    `Plan.why` says what the choice traded. When nothing fits because the
    model state (weights,
    gradients, optimizer state) leaves too little room, it tries, least
    change first: `tfmemopt.ShardedOptimizer(optimizer, stage=1)` with
    several replicas (1/R of the state per replica, the same updates), the
    8-bit twin of an Adam-like optimizer (`AdamW8bit`/`Adam8bit`, ~2 bytes
    of state per parameter instead of 8), both, then
    `tfmemopt.optimizers.Adafactor` (the least state), each alone and then
    with the long-sequence options; the first that fits is the plan
    (`Plan.optimizer`, `Plan.sharding`). Cost: a few traces
    of the model (seconds each); with `verify=True` also a few training
    steps of each plan it checks.

    Args:
        model: A built `keras.Model`.
        global_batch_size: Int, samples per optimizer update, all replicas.
        memory_budget: Int bytes or str (`"16GiB"`), per device.
        optimizer: `None` (the model's, else Adam), a name or an optimizer.
        allow: Tuple of str, defaults to all of `("accumulation",
            "checkpointing", "mixed_precision", "sharding",
            "optimizer_state")`. `"sharding"` lets the plan wrap the
            optimizer in `ShardedOptimizer` (needs replicas > 1);
            `"optimizer_state"` lets it switch to an 8-bit or factored
            optimizer (other updates: drop it to keep yours).
        replicas: Int or `None`, defaults to `None`: the
            `num_replicas_in_sync` of the `tf.distribute` strategy the model
            was built under (else the active one's; 1 without a strategy).
            Call `plan` outside `strategy.scope()` (the estimator traces the
            model there) and `Plan.apply` inside it.
        multiple_of: Int, defaults to `8`: preferred micro-batch alignment.
            Micro-batches that are multiples of it are tried first; other
            divisors of the per-replica batch only where none of them fits.
        verify: Bool, defaults to `False`: measure the applied plan on this
            device (needs `data` and a compiled model; changes nothing).
        data: As for `find_batch_size`, when `verify=True`.
        margin: Float, defaults to `MARGIN` (0.25): the fraction of the
            budget kept free for the estimator's error: plans are chosen by
            estimated peak <= `memory_budget x (1 - margin)`, so a peak up
            to 1.33x its estimate still fits. The estimate errs low more
            often than high: on the 20 held-out sets of docs/estimator.md
            (534 cases of model families no rule was designed on, CPU)
            the largest measured peak was 1.30x its estimate; 0.25 covers
            every case (recurrent layers with accumulation, up to 1.75x,
            through `run_ahead`, which must fit the whole budget). Use
            `verify=True` to measure. Under XLA (a model compiled with
            `jit_compile=True`, or `"auto"` on a GPU or TPU) each candidate
            is compiled and its estimate is XLA's own (docs/estimator.md):
            then the estimate x 1.08 (twice the held-out set's worst
            error, 4.0%), plus on a CPU what the allocator's chunk may add
            (up to 128 MiB), must fit the whole budget, and `margin` is not
            applied on top.
        input_shape: `None`, one sample's shape, a list or a dict of them,
            as for `estimate_memory`: for inputs of unknown size.
        sequence_length: `None` or Int, as for `estimate_memory`: the size
            of every unknown input dimension (keras-hub text models).

    Returns:
        A `Plan` (`.apply(model)`, `.model_kwargs`, `str(plan)`).

    Raises:
        ValueError: bad arguments; a budget smaller than the weights,
            gradients and optimizer state (no batch fits); nothing allowed
            fits.

    Example:

    >>> p = tfmemopt.plan(model, 256, "8GiB")  # doctest: +SKIP
    >>> model = p.apply(model)  # doctest: +SKIP
    >>> model.fit(x, y, batch_size=p.global_batch_size)  # doctest: +SKIP
    """
    allow = _allow_tuple(allow)
    check_int("global_batch_size", global_batch_size)
    if replicas is None:
        replicas = state_options.replicas_of(model)
    check_int("replicas", replicas)
    check_int("multiple_of", multiple_of)
    budget = _search.parse_bytes(memory_budget)
    _check_choices(allow, global_batch_size, replicas, verify, data, margin)
    search = Search(
        model,
        global_batch_size,
        budget * (1 - margin),
        optimizer=optimizer,
        allow=allow,
        replicas=replicas,
        multiple_of=multiple_of,
        margin=margin,
        input_shape=input_shape,
        sequence_length=sequence_length,
        policies=_policies(model, allow),
    )
    search.search_rounds()
    if "long_sequences" in allow:
        search.try_long_sequences()
    # The model state leaves too little room: shrink the state itself,
    # least change first (sharded, 8-bit, both, factored).
    search.try_state_alternatives()
    considered, limit = search.considered, search.limit

    def make(best) -> Plan:
        return _make_plan(
            best, global_batch_size, replicas, budget, considered, limit
        )

    def no_fit(scale):
        raise_no_fit(considered, budget, global_batch_size, scale, margin)

    # chunked_loss never forms the logits the compiled metrics read: the
    # plan compiles the model without them (Plan.apply) and says so.
    metric_names = compiled_metric_names(model)
    for c in considered:
        if c.get("chunked_loss") and metric_names:
            c["drops_metrics"] = metric_names
    measure = (lambda p: measure_plan(p, model, data)) if verify else None
    return _choose(considered, limit, budget, make, no_fit, measure)


def _allow_tuple(allow) -> tuple:
    """`allow` as a tuple: one name or `"a,b"` is taken whole (iterating
    `"accumulation"` gave its letters)."""
    if isinstance(allow, str):
        return tuple(a.strip() for a in allow.split(",") if a.strip())
    try:
        return tuple(allow)
    except TypeError:
        raise TypeError(
            f"`allow` must be a tuple of names from {ALLOW} (or one name as "
            f"a str). Received: allow={allow!r} (of type "
            f"{type(allow).__name__})."
        ) from None


def _check_choices(allow, global_batch_size, replicas, verify, data, margin):
    """Checks `plan`'s other arguments (what/expected/fix)."""
    unknown = [a for a in allow if a not in ALLOW]
    if unknown:
        raise ValueError(
            f"`allow` must be a tuple of {ALLOW}. Received: allow={allow!r}"
            + (f" (unknown: {unknown})" if unknown else "")
            + "."
        )
    if global_batch_size % replicas:
        raise ValueError(
            "`global_batch_size` must be divisible by `replicas`. Received: "
            f"global_batch_size={global_batch_size}, replicas={replicas}."
        )
    if verify and data is None:
        raise ValueError("`verify=True` needs `data` to train on.")
    if not isinstance(margin, (int, float)) or not 0 <= margin < 1:
        raise ValueError(
            "`margin` must be a fraction in [0, 1) of the budget to keep "
            f"free. Received: margin={margin!r}."
        )


def _choose(considered, limit, budget, make, no_fit, measure) -> Plan:
    """The fastest candidate that fits (`make(best)` makes its `Plan`,
    `no_fit(scale)` raises); with `measure` (verify), measured, up to four
    times (each miss scales every estimate by how low it was)."""
    rejected, scale = [], 1.0
    for _ in range(1 if measure is None else 4):
        pool = [c for c in considered if id(c) not in rejected]
        best = choose(pool, limit / scale)
        if best is None:
            no_fit(scale)
        result = make(best)
        result.considered = considered
        if measure is None:
            return result
        result.measured_peak = measure(result)
        if result.measured_peak is None or result.measured_peak <= budget:
            return result
        # The estimate was low here: trust it that much less from now on.
        rejected.append(id(best))
        scale = max(scale, result.measured_peak / max(best["peak"], 1))
    raise ValueError(
        f"No plan was measured within memory_budget={_mib(budget)} after 4 "
        f"tries (last: {result.micro_batch_size} x "
        f"{result.accumulation_steps}, measured "
        f"{_mib(result.measured_peak)}). Raise the budget."
    )
