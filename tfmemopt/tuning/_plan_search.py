"""`plan`'s search: the candidates it estimates and the order it tries them.

A candidate is a combination of precision policy, checkpointing,
accumulation steps and (when the model state leaves too little room) an
optimizer-state or long-sequence option, estimated once by
`estimate_memory`. `Search` holds what has been estimated so far
(`considered`, the rows of `Plan.considered`) and tries, in rounds:
the fewest accumulation steps that fit for each policy and checkpointing
(aligned micro-batches first), then the long-sequence options for the terms
the step holds, then smaller optimizer states, least change first. `plan`
(`_planner.py`) checks the arguments, runs the search and chooses.
"""

from __future__ import annotations

import math

from tfmemopt._utils import auto_jit_compile_here
from tfmemopt.estimate import estimate_memory
from tfmemopt.estimate import resolve_optimizer
from tfmemopt.tuning import _state_options as state_options

# A pass over a micro-batch costs as much as this many extra samples
# (kernel launches, weight reads, the optimizer's share).
_PASS_OVERHEAD = 8
_CHECKPOINT_COST = 1.33  # one extra forward pass (+30% measured)
_FAST_16BIT = 0.6  # tensor cores (GPU >= 7.0, TPU)
_SLOW_16BIT = 1.3  # CPUs and older GPUs: converts, no faster matmuls
# The long-sequence options, against `Model.wrap(lm)` (BENCHMARKS.md
# `long_sequences`, keras-hub GPT-2 at 4 x 512 to 4 x 2048 tokens:
# chunked_loss 1.11-1.16x, attention="chunked" 0.98-1.05x, both
# 1.08-1.18x; `llm_families_time`, Llama, both: 1.15-1.36x).
_CHUNKED_LOSS_COST = 1.15
_CHUNKED_ATTENTION_COST = 1.1


def step_time(
    micro,
    steps,
    checkpointing,
    policy,
    fast_16bit,
    chunked_loss=False,
    attention=None,
) -> float:
    """Relative step time of a combination (1.0: whole batch, float32)."""
    batch = micro * steps
    t = steps * (micro + _PASS_OVERHEAD) / (batch + _PASS_OVERHEAD)
    if checkpointing is not None:
        t *= _CHECKPOINT_COST
    if policy.startswith("mixed") or policy in ("float16", "bfloat16"):
        t *= _FAST_16BIT if fast_16bit else _SLOW_16BIT
    if chunked_loss:
        t *= _CHUNKED_LOSS_COST
    if attention:
        t *= _CHUNKED_ATTENTION_COST
    return round(t, 4)


def _fit_by(candidate, margin) -> int:
    """Sets and returns the candidate's `"fit"`: what `choose` compares
    with `budget x (1 - margin)`. Its estimated peak, or more where the
    peak may exceed it by `run_ahead` (`MemoryEstimate.run_ahead`): then
    `peak + run_ahead` must fit the whole budget too (a bound needs no
    margin on top)."""
    peak, more = candidate["peak"], candidate["run_ahead"]
    if candidate.get("compiled"):
        # XLA's own figure: within XLA_ERROR of the step on the held-out
        # set, plus what a CPU allocator's chunk may add; that bound must
        # fit the whole budget, the user's margin is not needed on top.
        bound = peak * (1 + XLA_ERROR) + candidate.get("slack", 0)
        candidate["fit"] = max(peak, math.ceil(bound * (1 - margin)))
        return candidate["fit"]
    candidate["fit"] = max(peak, math.ceil((peak + more) * (1 - margin)))
    return candidate["fit"]


def _chunk_slack(est) -> int:
    """What TensorFlow's CPU allocator may count beyond XLA's figure: it
    grows in regions of powers of two and keeps a chunk whole (not split)
    unless the rest is at least the request or 128 MiB, so the temporary
    buffer may count up to min(its size, 128 MiB) more. 0 on a GPU or TPU
    (their allocators take the memory up front and split it) and for an
    estimate that was not compiled."""
    if not est.compiled or auto_jit_compile_here():
        return 0
    return min(int(est.compiled.get("largest", 0)), 128 * 2**20)


def choose(candidates: list[dict], budget: int) -> dict | None:
    """The fastest candidate whose `"fit"` (its estimated peak, or more:
    `_fit_by`) is within `budget` (ties: the least memory)."""
    fitting = [c for c in candidates if c.get("fit", c["peak"]) <= budget]
    if not fitting:
        return None
    return min(fitting, key=lambda c: (c["time"], c["peak"]))


def _steps_options(per_replica, multiple_of, allow) -> list[list[int]]:
    """The micro-batch counts to try, in rounds: those whose micro-batch is
    a multiple of `multiple_of` (and 1) first; every divisor only where
    none of them fits (the alignment is preferred, not required)."""
    if "accumulation" not in allow:
        return [[1]]
    divisors = [d for d in range(1, per_replica + 1) if per_replica % d == 0]
    aligned = [
        d for d in divisors if (per_replica // d) % multiple_of == 0 or d == 1
    ]
    if len(aligned) > 1 and aligned != divisors:
        return [aligned, divisors]
    return [divisors]


# Under XLA the estimate is XLA's buffer assignment of the compiled step;
# the allowance for its error is the goal the held-out set was judged by
# (benchmarks/estimator_xla.py, BENCHMARKS.md section estimator_xla: worst
# 4.0% measured), twice the worst seen.
XLA_ERROR = 0.08


def _long_sequence_options(considered, executor_terms=None, min_bytes=0):
    """`[(chunked_loss, attention)]` for the terms the plain step keeps
    (more than `min_bytes` each): the logits alone, the attention scores
    alone, then both (under XLA, read from `executor_terms()`: XLA's figure
    has no terms)."""
    terms = considered[0].get("terms", {}) if considered else {}
    if considered and considered[0].get("compiled") and executor_terms:
        terms = executor_terms()
    logits = terms.get("logits", 0) > min_bytes
    scores = terms.get("attention_scores", 0) > min_bytes
    out = []
    if logits:
        out.append((True, None))
    if scores:
        out.append((False, "chunked"))
    if logits and scores:
        out.append((True, "chunked"))
    return out


def _trainable_count(model) -> int:
    """Trainable parameters (each shared weight once)."""
    weights = {id(v): v for v in model.trainable_weights}.values()
    return int(sum(math.prod(v.shape) for v in weights))


def _key(c) -> tuple:
    """What identifies a candidate (its settings)."""
    return (
        c["policy"],
        c["checkpointing"],
        c["accumulation_steps"],
        c.get("optimizer"),
        c.get("sharding"),
        c.get("shard_parameters", False),
        c.get("chunked_loss", False),
        c.get("attention"),
    )


def _candidate(est, policy, ckpt, steps, micro, time) -> dict:
    """One row of `Plan.considered`: the settings and their estimate."""
    return {
        "policy": policy,
        "checkpointing": ckpt,
        "accumulation_steps": steps,
        "micro_batch_size": micro,
        "peak": int(est.total),
        # Under XLA the gradients are inside XLA's temporary buffer
        # (`gradients` is 0): one per trainable weight, as the executor's.
        "state": int(
            est.parameters
            + (est.gradients or est.compiled.get("gradients", 0))
            + est.optimizer_state
        ),
        "optimizer_state": int(est.optimizer_state),
        # trainable parameters, counting float32 gradients
        "parameter_count": int(est.gradients) // 4,
        "time": time,
        "gathered": int(est.gathered),
        "terms": dict(est.terms),
        "run_ahead": int(est.run_ahead),
        "compiled": bool(est.compiled),
        "slack": _chunk_slack(est),
    }


def _fewest_steps_that_fit(peak, steps_list, limit) -> None:
    """Estimates `peak(steps)` along `steps_list` (the peak falls as the
    steps grow), bisecting for the fewest steps within `limit`. When the
    most steps do not fit, the fewest are tried too: accumulators (a float32
    copy of the gradients) can outweigh the activations they save."""
    lo, hi = 0, len(steps_list) - 1
    if peak(steps_list[hi]) > limit:
        peak(steps_list[0])
        return
    while lo < hi:
        mid = (lo + hi) // 2
        if peak(steps_list[mid]) <= limit:
            hi = mid
        else:
            lo = mid + 1


class Search:
    """The candidates `plan` estimates, and the rounds it tries them in.

    Args:
        model, global_batch_size, optimizer, replicas, margin, input_shape,
            sequence_length: As for `plan`.
        limit: Bytes a candidate's `"fit"` must be within (the budget less
            the margin).
        allow: The tuple of what `plan` may change.
        multiple_of: The preferred micro-batch alignment.
        policies: `(policies, fast_16bit)` from `_planner._policies`.
    """

    def __init__(
        self,
        model,
        global_batch_size,
        limit,
        *,
        optimizer,
        allow,
        replicas,
        multiple_of,
        margin,
        input_shape,
        sequence_length,
        policies,
    ):
        self.model = model
        self.global_batch_size = global_batch_size
        self.limit = limit
        self.allow = allow
        self.replicas = replicas
        self.margin = margin
        self.input_shape = input_shape
        self.sequence_length = sequence_length
        self.policies, self.fast = list(policies[0]), policies[1]
        self.original = list(self.policies)
        self.considered: list = []
        self.base = resolve_optimizer(optimizer, model)[0]
        # The options under trial (each candidate records them).
        self.option = {
            "optimizer": None,
            "sharding": None,
            "opt": optimizer,
            "params": False,
            "chunked_loss": False,
            "attention": None,
        }
        self.ckpts = [None, "auto"] if "checkpointing" in allow else [None]
        # The long-sequence options the model takes (`try_long_sequences`).
        self.long_options: list = []
        self.rounds = _steps_options(
            global_batch_size // replicas, multiple_of, allow
        )

    def _estimate(self, policy, ckpt, steps, **overrides):
        option = self.option
        kwargs = dict(
            optimizer=option["opt"],
            policy=policy,
            accumulation_steps=steps,
            checkpointing=ckpt,
            replicas=self.replicas,
            input_shape=self.input_shape,
            sequence_length=self.sequence_length,
            shard_parameters=option["params"],
            chunked_loss=option["chunked_loss"],
            attention=option["attention"] or False,
        )
        kwargs.update(overrides)
        return estimate_memory(self.model, self.global_batch_size, **kwargs)

    def peak(self, policy, ckpt, steps) -> int:
        """The `"fit"` of a candidate, estimated once."""
        option = self.option
        key = (
            policy,
            ckpt,
            steps,
            option["optimizer"],
            option["sharding"],
            option["params"],
            option["chunked_loss"],
            option["attention"],
        )
        for c in self.considered:
            if _key(c) == key:
                return c["fit"]
        est = self._estimate(policy, ckpt, steps)
        micro = self.global_batch_size // self.replicas // steps
        time = self._time(policy, ckpt, steps)
        row = _candidate(est, policy, ckpt, steps, micro, time)
        row["parameter_count"] = _trainable_count(self.model)
        row.update(
            optimizer=option["optimizer"],
            sharding=option["sharding"],
            shard_parameters=option["params"],
            chunked_loss=option["chunked_loss"],
            attention=option["attention"],
            optimizer_name=type(state_options.unwrap(self.base)).__name__,
        )
        self.considered.append(row)
        return _fit_by(row, self.margin)

    def fits(self) -> bool:
        return choose(self.considered, self.limit) is not None

    def _time(self, policy, ckpt, steps) -> float:
        micro = self.global_batch_size // self.replicas // steps
        option = self.option
        return step_time(
            micro, steps, ckpt, policy, self.fast, option["chunked_loss"],
            option["attention"],
        )  # fmt: skip

    def _search(self, steps_list) -> None:
        """The fewest steps that fit for each policy and checkpointing,
        among the steps that could still be faster than the fastest
        candidate that fits so far (a slower one is never chosen: each
        estimate is a trace of the model, tens of seconds for a deep one)."""
        for policy in self.policies:
            for ckpt in self.ckpts:
                best = choose(self.considered, self.limit)
                steps_left = [
                    s
                    for s in steps_list
                    if best is None
                    or self._time(policy, ckpt, s) <= best["time"]
                ]
                if not steps_left:
                    continue
                _fewest_steps_that_fit(
                    lambda steps, p=policy, c=ckpt: self.peak(p, c, steps),
                    steps_left,
                    self.limit,
                )

    def search_rounds(self) -> None:
        """Aligned micro-batches first, every divisor where none fits;
        not where the model state alone is over the limit (no micro-batch
        can fit then)."""
        start = len(self.considered)
        for i, steps_list in enumerate(self.rounds):
            tried = self.considered[start:]
            over = bool(tried) and min(c["state"] for c in tried) > self.limit
            if i and (self.fits() or over):
                break
            self._search(steps_list)

    def _executor_terms(self) -> dict:
        # A compiled (XLA) estimate does not say what the logits and the
        # attention scores hold; the executor's trace does.
        try:
            return estimate_memory(
                self.model,
                self.global_batch_size,
                optimizer=self.option["opt"],
                replicas=self.replicas,
                input_shape=self.input_shape,
                sequence_length=self.sequence_length,
                jit_compile=False,
            ).terms
        except ValueError:
            return {}

    def _could_be_faster(self, chunked, attention) -> bool:
        """Whether an option's fastest case (one pass, no checkpointing,
        the fastest policy) beats the fastest candidate that fits so far."""
        best = choose(self.considered, self.limit)
        if best is None:
            return True
        micro = self.global_batch_size // self.replicas
        fastest = min(
            step_time(micro, 1, None, p, self.fast, chunked, attention)
            for p in self.policies
        )
        return fastest < best["time"]

    def try_long_sequences(self) -> None:
        """The logits or the attention scores fill the step: compute them in
        chunks (the same update), the term that is there first; also where
        something fits already, when the option could be faster (fewer
        micro-batches or no recompute: `_CHUNKED_LOSS_COST` against
        `_CHECKPOINT_COST`), so that `choose` takes the fastest."""
        # A term under 2% of the limit is not worth an option (an MLP's
        # 10 KiB of logits came back as chunked_loss=True beside Adam8bit
        # and checkpointing "auto", a combination that model's first fit
        # refuses).
        options = _long_sequence_options(
            self.considered, self._executor_terms, 0.02 * self.limit
        )
        for chunked, attention in options:
            if not self._could_be_faster(chunked, attention):
                self.long_options.append((chunked, attention))
                continue
            self.option.update(chunked_loss=chunked, attention=attention)
            try:
                self.search_rounds()
                self.long_options.append((chunked, attention))
            except ValueError:  # no linear head, no MultiHeadAttention, or
                pass
        self.option.update(chunked_loss=False, attention=None)

    def try_state_alternatives(self) -> None:
        """The model state leaves too little room: shrink the state itself,
        least change first (sharded, 8-bit, both, factored), each also
        with the long-sequence options."""
        for alt in state_options.alternatives(
            self.base, self.allow, self.replicas, self.original[0]
        ):
            if self.fits():
                break
            new = state_options.make_optimizer(self.base, alt.name, alt.stage)
            self.option.update(
                optimizer=alt.name,
                sharding=alt.stage,
                opt=new,
                params=alt.shard_parameters,
            )
            self.policies[:] = [alt.policy] if alt.policy else self.original
            self.search_rounds()
            # With the long-sequence options that were usable, least
            # change first: the recipe of a long-context fine-tune is a
            # smaller state *and* the chunked loss and attention.
            for chunked, attention in self.long_options:
                if self.fits():
                    break
                self.option.update(chunked_loss=chunked, attention=attention)
                try:
                    self.search_rounds()
                except ValueError:
                    pass
            self.option.update(chunked_loss=False, attention=None)
