"""One accumulation window: micro-batches one at a time, one update.

The first micro-batch is traced outside the loop: it reveals which loss
terms carry a mask (their normaliser is known only after the forward pass)
and which variables receive gradients, which fixes the accumulators'
structure. The remaining full micro-batches run in a `tf.while_loop` with
`parallel_iterations=1` (the default of 10 keeps several micro-batches'
activations alive), then the short tail micro-batch, if any. The
accumulators (dense float32 sums, sparse rows) are `_window_accumulators`.

Under `shard_parameters=True` the micro-batches are traced one after
another in Python instead (`_run_unrolled`): each layer's all-gather and
its gradient (an all-reduce) call `merge_call`, which cannot run inside a
`tf.while_loop` or `tf.cond` in a replica, and the raw collective ops that
take explicit keys time out there (each replica's loop is its own frame).
"""

from __future__ import annotations

import tensorflow as tf

from tfmemopt import _compat
from tfmemopt.accumulation import _loss_normalization as ln
from tfmemopt.accumulation._micro_batching import slice_batch
from tfmemopt.accumulation._window_accumulators import WindowAccumulators
from tfmemopt.distribute import gathers_after
from tfmemopt.distribute import step_hooks as _dist
from tfmemopt.longseq import training_forward


def _call(model, x, loss):
    """`(y_pred, forward)`: the outputs, and where `loss.needs_forward`
    (`chunked_loss`) the record of the pass (`longseq.Forward`) that says
    which output the taken-over head computed (its loss then comes in
    chunks from the head's input); None otherwise."""
    if not loss.needs_forward:
        return _forward_pass(model, x), None
    with training_forward(model) as forward:
        y_pred = _forward_pass(model, x)
    return forward.checked(y_pred), forward


def _forward_pass(model, x):
    if getattr(model, "_call_has_training_arg", True):
        return model(x, training=True)
    return model(x)


def _after(acc, value):
    """`value` as an int32 tensor that exists only once `acc` is computed.

    Graph execution lowers `tf.while_loop` and `tf.cond` to per-input
    control flow: a micro-batch whose slice start is a constant would start
    its forward pass while the previous micro-batch is still alive. Making
    the start depend on the accumulators keeps them strictly one at a time.

    XLA keeps no control dependencies: there the start comes out of an
    optimization barrier with the accumulators, a data dependency its
    scheduler keeps (it unrolled a loop of one micro-batch and ran the
    next micro-batch's forward pass beside the previous one's backward).
    """
    value = tf.cast(value, tf.int32)
    if _compat.in_xla_function():
        flat = [t for t in tf.nest.flatten(acc) if t is not None]
        return _compat.optimization_barrier(flat + [value])[-1]
    with tf.control_dependencies(tf.nest.flatten(acc)):
        return tf.identity(value)


class _Window(WindowAccumulators):
    def __init__(self, model, x, y, sample_weight, plan, loss):
        self.model = model
        self.x, self.y, self.sw = x, y, sample_weight
        self.plan = plan
        self.loss = loss  # an `ln.WindowLoss`, chosen when `fit` started
        # Read after the first forward pass: a subclassed model creates its
        # variables on its first call, inside this very trace.
        self.variables = None
        self.replicas = ln.num_replicas()
        local = tf.cast(plan.batch_size, tf.float32)
        self.batch_global = ln.global_sum(local)
        self.weight_sums = None
        self.spec = None

    # -- one micro-batch -------------------------------------------------
    def _weight_sums(self):
        """The whole batch's weight sums, for "mean_with_sample_weight"."""
        if self.weight_sums is None:
            self.weight_sums = [
                None if s is None else ln.global_sum(s)
                for s in ln.sample_weight_sums(self.model, self.sw)
            ]
        return self.weight_sums

    def _n_targets(self, x, y, sw, size):
        """Separate gradients a micro-step takes (see `ln.count_targets`)."""
        if self.spec is not None:
            return int(self.spec.has_static) + len(self.spec.dynamic)

        def losses():
            y_pred, forward = _call(self.model, x, self.loss)
            weight_sums = lambda: ln.sample_weight_sums(self.model, sw)  # noqa: E731
            return self.loss(x, y, sw, y_pred, size, self.batch_global,
                             weight_sums, forward)  # fmt: skip

        return ln.count_targets(losses)

    def micro_step(self, start, size):
        model = self.model
        x = slice_batch(self.x, start, size)
        y = slice_batch(self.y, start, size)
        sw = slice_batch(self.sw, start, size)
        optimizer = model.optimizer
        persistent = self._n_targets(x, y, sw, size) != 1
        with tf.GradientTape(persistent=persistent) as tape:
            y_pred, forward = _call(model, x, self.loss)
            if self.variables is None:
                self.variables = list(model.trainable_variables)
                if not self.variables:
                    raise ValueError(
                        "The model has no trainable weights: there is nothing "
                        "to accumulate. Check `layer.trainable` on the "
                        "model's layers."
                    )
            static, dyn_num, dyn_norm, terms, generic = self.loss(
                x, y, sw, y_pred, size, self.batch_global,
                self._weight_sums, forward,
            )  # fmt: skip
            targets = []
            if static is not None:
                targets.append(optimizer.scale_loss(static))
            targets.extend(optimizer.scale_loss(s) for s in dyn_num)
        grads = [tape.gradient(t, self.variables) for t in targets]
        del tape
        model.compute_metrics(x, y, y_pred, sample_weight=sw)
        term_values = [getattr(t, "window_value", t.numerator) for t in terms]
        return {
            "static": static,
            "dyn_num": dyn_num,
            "dyn_norm": dyn_norm,
            "grads": grads,
            "terms": term_values,
            "generic": generic,
            "dynamic_idx": [k for k, t in enumerate(terms) if t.dynamic],
            "x": x,
        }

    def _step_and_add(self, acc, start, size):
        new, rows = self._pack(self.micro_step(start, size))
        return tf.nest.map_structure(tf.add, acc, new), rows

    def run(self):
        if getattr(self.model, "_shards", None) is not None:
            return self._run_unrolled()
        plan = self.plan
        acc, rows = self._first(self.micro_step(0, plan.size))
        pieces = [rows]
        if plan.counts_known:
            if plan.num_full > 1:
                acc, loop_rows = self._loop(acc, plan.num_full, plan.size)
                pieces.append(loop_rows)
            if plan.tail > 0:
                start = _after(acc, plan.num_full * plan.size)
                acc, tail_rows = self._step_and_add(acc, start, plan.tail)
                pieces.append(tail_rows)
        else:
            acc, loop_rows = self._loop(acc, plan.num_full, plan.size)
            pieces.append(loop_rows)
            start = _after(acc, plan.num_full * plan.size)
            acc, tail_rows = tf.cond(
                plan.tail > 0,
                lambda: self._step_and_add(acc, start, plan.tail),
                lambda: (acc, self._empty_rows()),
            )
            pieces.append(tail_rows)
        return self._finish(acc, self._concat_rows(pieces))

    def _cuts(self):
        """(start, size) of each micro-batch, for `_run_unrolled`.

        A static batch is cut as the plan says. A batch whose size is known
        only at run time is cut into exactly `accumulation_steps` parts as
        even as possible (sizes differ by at most one, none above the
        plan's `ceil(B / N)`); a part is empty only when the batch has
        fewer than N samples.
        """
        plan = self.plan
        if plan.is_static:
            cuts = [(i * plan.size, plan.size) for i in range(plan.num_full)]
            if plan.tail > 0:
                cuts.append((plan.num_full * plan.size, plan.tail))
            return cuts
        steps = self.model.accumulation_steps or 1
        base, extra = plan.batch_size // steps, plan.batch_size % steps
        return [
            (
                i * base + tf.minimum(i, extra),
                base + tf.cast(i < extra, tf.int32),
            )
            for i in range(steps)
        ]

    def _run_unrolled(self):
        """The window with each micro-batch traced in turn (FSDP).

        The grads are taken with respect to the shards, so each replica's
        accumulators hold only its 1/R of the summed gradient. Each
        micro-batch's slice starts only once the previous one is added
        (`_after`), and its all-gathers wait for that start
        (`gathers_after`): a guard against graph execution running later
        gathers early (docs/sharding.md has the measured peaks).
        """
        acc, pieces = None, []
        for i, (start, size) in enumerate(self._cuts()):
            if acc is not None:
                start = _after(acc, start)
            with gathers_after(start):
                out = self.micro_step(start, size)
            new, rows = self._first(out) if acc is None else self._pack(out)
            if not isinstance(size, int):
                new = _zero_if_empty(new, size)
            acc = (
                new if acc is None else tf.nest.map_structure(tf.add, acc, new)
            )
            pieces.append(rows)
        return self._finish(acc, self._concat_rows(pieces))

    def _loop(self, acc, num_full, size):
        flat = tf.nest.flatten(acc)
        sparse_shapes = [
            tuple(v.shape[1:])
            for v, kind in zip(self.variables, self.kinds)
            if kind == "sparse"
        ]
        n_arrays = len(sparse_shapes) * len(self._groups())

        def new_arrays():
            arrays = []
            for _ in self._groups():
                for shape in sparse_shapes:
                    for dtype, element in (
                        (tf.float32, (None,) + shape),
                        (tf.int32, (None,)),
                    ):
                        arrays.append(
                            tf.TensorArray(
                                dtype,
                                size=num_full - 1,
                                element_shape=tf.TensorShape(element),
                                infer_shape=False,
                            )
                        )
            return arrays

        def cond(i, *_):
            return i < num_full

        def body(i, *loop_vars):
            current = tf.nest.pack_sequence_as(
                acc, list(loop_vars[: len(flat)])
            )
            arrays = list(loop_vars[len(flat) :])
            # XLA may unroll a loop of a few iterations: the start waits
            # for the accumulators so that one micro-batch still ends
            # before the next begins, also then (4 micro-batches measured
            # 116.5 MiB under XLA with and without this wait).
            start = _after(current, i * size)
            new, rows = self._step_and_add(current, start, size)
            flat_rows = [t for group in rows for pair in group for t in pair]
            arrays = [a.write(i - 1, t) for a, t in zip(arrays, flat_rows)]
            return [i + 1] + tf.nest.flatten(new) + arrays

        out = tf.while_loop(
            cond,
            body,
            [_after(acc, 1)] + flat + new_arrays(),
            parallel_iterations=1,
        )
        acc = tf.nest.pack_sequence_as(acc, list(out[1 : 1 + len(flat)]))
        arrays = list(out[1 + len(flat) :])
        assert len(arrays) == 2 * n_arrays  # noqa: S101 - internal invariant
        rows, it = [], iter(arrays)
        for _ in self._groups():
            rows.append(
                [(next(it).concat(), next(it).concat()) for _ in sparse_shapes]
            )
        return acc, rows

    # -- the update --------------------------------------------------------
    def _finish(self, acc, rows):
        model, spec = self.model, self.spec
        dyn_norm = [ln.global_sum(d) for d in acc["dyn_norm"]]
        weights = self._dynamic_weights()
        scales = []
        if spec.has_static:
            scales.append(None)
        for norm, w in zip(dyn_norm, weights):
            scales.append(
                tf.math.divide_no_nan(tf.constant(w, tf.float32), norm)
            )
        dense_total, sparse_values, sparse_indices = None, None, None
        for g, scale in enumerate(scales):
            dense = acc["grads"][g]
            values = [v for v, _ in rows[g]]
            if scale is not None:
                dense = [a * scale for a in dense]
                values = [v * scale for v in values]
            indices = [i for _, i in rows[g]]
            if dense_total is None:
                dense_total, sparse_values, sparse_indices = (
                    dense,
                    values,
                    indices,
                )
                continue
            dense_total = [a + b for a, b in zip(dense_total, dense)]
            sparse_values = [
                tf.concat([a, b], 0) for a, b in zip(sparse_values, values)
            ]
            sparse_indices = [
                tf.concat([a, b], 0) for a, b in zip(sparse_indices, indices)
            ]
        dense_it = iter(dense_total)
        sparse_it = iter(zip(sparse_values, sparse_indices))
        grads_and_vars = []
        for j, (v, kind) in enumerate(zip(self.variables, self.kinds)):
            if kind == "dense":
                dtype = _dist.gradient_dtype(v)
                grads_and_vars.append((tf.cast(next(dense_it), dtype), v))
            elif kind == "shared":
                grad = tf.IndexedSlices(
                    tf.cast(next(dense_it), _dist.gradient_dtype(v)),
                    self.shared_indices[j],
                    dense_shape=tf.constant(list(v.shape), tf.int32),
                )
                grads_and_vars.append((grad, v))
            elif kind == "sparse":
                values, indices = next(sparse_it)
                grad = tf.IndexedSlices(
                    tf.cast(values, _dist.gradient_dtype(v)),
                    indices,
                    dense_shape=tf.constant(list(v.shape), tf.int32),
                )
                grads_and_vars.append((grad, v))
        if grads_and_vars:
            grads_and_vars = _dist.before_apply(
                grads_and_vars,
                model.optimizer,
                sharded=getattr(model, "_shards", None) is not None,
            )
            model.optimizer.apply_gradients(grads_and_vars)
        return self._log(acc, dyn_norm, weights)

    def _dynamic_weights(self):
        terms = getattr(self.model._compile_loss, "_flat_losses", None) or []
        weights = []
        for k in self.spec.dynamic:
            w = terms[k].loss_weights
            weights.append(1.0 if w is None else float(w))
        return weights

    def _log(self, acc, dyn_norm, weights):
        model = self.model
        loss = acc["static"]
        term_values = list(acc["terms"])
        for k, (num, norm, w) in enumerate(
            zip(acc["dyn_num"], dyn_norm, weights)
        ):
            value = tf.math.divide_no_nan(num, norm)
            term_values[self.spec.dynamic[k]] = value
            loss = loss + w * value
        batch = tf.cast(self.plan.batch_size, tf.float32)
        model._loss_tracker.update_state(
            loss * self.replicas, sample_weight=batch
        )
        if not self.spec.generic:
            for metric, value in zip(
                ln.per_output_loss_metrics(model), term_values
            ):
                metric.update_state(value * self.replicas, sample_weight=batch)
        return model.get_metrics_result()


def _zero_if_empty(acc, size):
    """An empty micro-batch's contribution, zero (its means are 0 / 0)."""
    keep = size > 0
    return tf.nest.map_structure(
        lambda t: tf.where(keep, t, tf.zeros_like(t)), acc
    )


def run_window(model, x, y, sample_weight, plan, loss):
    """Runs one accumulation window and applies one update (`loss`: the
    `WindowLoss` the micro-steps compute)."""
    return _Window(model, x, y, sample_weight, plan, loss).run()
