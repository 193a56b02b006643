"""One accumulation window: micro-batches one at a time, one update.

The first micro-batch is traced outside the loop: it reveals which loss
terms carry a mask (their normaliser is known only after the forward pass)
and which variables receive gradients, which fixes the accumulators'
structure. The remaining full micro-batches run in a `tf.while_loop` with
`parallel_iterations=1` (the default of 10 keeps several micro-batches'
activations alive), then the short tail micro-batch, if any.
"""

from __future__ import annotations

import keras
import tensorflow as tf
from keras import ops

from tfmemopt import loss_normalization as ln
from tfmemopt.distribute import _hooks as _dist
from tfmemopt.micro_batching import slice_batch


class _Spec:
    """What the first trace of a micro-step revealed (static structure)."""

    def __init__(self, dynamic, has_static, connected, generic):
        self.dynamic = dynamic  # indices of dynamic terms
        self.has_static = has_static
        self.connected = connected  # per variable: gets a gradient
        self.generic = generic


def _uses_keras_compute_loss(model):
    from tfmemopt.model import Model

    return type(model).compute_loss in (
        keras.Model.compute_loss,
        Model.compute_loss,
    )


def _call(model, x):
    if getattr(model, "_call_has_training_arg", True):
        return model(x, training=True)
    return model(x)


def _as_dense_f32(grad):
    if isinstance(grad, tf.IndexedSlices):
        grad = tf.convert_to_tensor(grad)
    return tf.cast(grad, tf.float32)


class _Window:
    def __init__(self, model, x, y, sample_weight, plan):
        self.model = model
        self.x, self.y, self.sw = x, y, sample_weight
        self.plan = plan
        self.variables = list(model.trainable_variables)
        self.replicas = ln.num_replicas()
        local = tf.cast(plan.batch_size, tf.float32)
        self.batch_global = ln.global_sum(local)
        self.weight_sums = None
        self.spec = None

    # -- one micro-batch -------------------------------------------------
    def _window_weight_sums(self, y_pred):
        if self.weight_sums is None:
            sums = ln.sample_weight_sums(self.model, self.y, y_pred, self.sw)
            self.weight_sums = [
                None if s is None else ln.global_sum(s) for s in sums
            ]
        return self.weight_sums

    def _losses(self, x, y, sw, y_pred, size):
        """(static loss, [dynamic numerators], [dynamic normalisers], terms)."""
        model = self.model
        frac = tf.cast(size, tf.float32) / self.batch_global
        generic = not _uses_keras_compute_loss(model)
        terms = []
        if not generic:
            try:
                terms = ln.compiled_terms(model, y, y_pred, sw)
            except ln.UnsupportedLoss:
                generic = True
        if generic:
            loss = model.compute_loss(x, y, y_pred, sw, training=True)
            loss = tf.cast(loss, tf.float32) * (
                tf.cast(size, tf.float32) * self.replicas / self.batch_global
            )
            return loss, [], [], [], True
        static = []
        extra = [ops.cast(ops.sum(v), "float32") for v in model.losses]
        if extra:
            static.append(frac * ops.sum(ops.stack(extra)) / self.replicas)
        sums = None
        for k, term in enumerate(terms):
            if term.dynamic:
                continue
            if term.per_sample:
                window_norm = (
                    term.normaliser
                    * self.batch_global
                    / tf.cast(size, tf.float32)
                )
            elif term.uses_weight_sum:
                sums = sums or self._window_weight_sums(y_pred)
                window_norm = sums[k]
            else:
                window_norm = tf.ones((), tf.float32)
            term.window_value = tf.math.divide_no_nan(
                term.numerator, window_norm
            )
            static.append(term.weight * term.window_value)
        if not static and not any(t.dynamic for t in terms):
            raise ValueError(
                "No loss to compute. Provide a `loss` argument in `compile()`."
            )
        static_loss = ops.sum(ops.stack(static)) if static else None
        dyn = [t for t in terms if t.dynamic]
        return (
            static_loss,
            [t.numerator for t in dyn],
            [t.normaliser for t in dyn],
            terms,
            False,
        )

    def micro_step(self, start, size):
        model = self.model
        x = slice_batch(self.x, start, size)
        y = slice_batch(self.y, start, size)
        sw = slice_batch(self.sw, start, size)
        optimizer = model.optimizer
        with tf.GradientTape(persistent=True) as tape:
            y_pred = _call(model, x)
            static, dyn_num, dyn_norm, terms, generic = self._losses(
                x, y, sw, y_pred, size
            )
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
        }

    # -- accumulation ----------------------------------------------------
    def _first(self, out):
        connected = [
            any(g[j] is not None for g in out["grads"])
            for j in range(len(self.variables))
        ]
        self.spec = _Spec(
            out["dynamic_idx"],
            out["static"] is not None,
            connected,
            out["generic"],
        )
        return self._pack(out)

    def _pack(self, out):
        """Micro-step output -> flat accumulator values (float32)."""
        grads = []
        for group in out["grads"]:
            grads.append(
                [
                    _as_dense_f32(g)
                    if g is not None
                    else tf.zeros_like(v, tf.float32)
                    for g, v, c in zip(
                        group, self.variables, self.spec.connected
                    )
                    if c
                ]
            )
        zero = tf.zeros((), tf.float32)
        static = out["static"] if out["static"] is not None else zero
        return {
            "grads": grads,
            "static": tf.cast(static, tf.float32),
            "dyn_num": [tf.cast(s, tf.float32) for s in out["dyn_num"]],
            "dyn_norm": [tf.cast(d, tf.float32) for d in out["dyn_norm"]],
            "terms": [tf.cast(t, tf.float32) for t in out["terms"]],
        }

    def _step_and_add(self, acc, start, size):
        new = self._pack(self.micro_step(start, size))
        return tf.nest.map_structure(tf.add, acc, new)

    def run(self):
        plan = self.plan
        acc = self._first(self.micro_step(0, plan.size))
        if plan.is_static:
            if plan.num_full > 1:
                acc = self._loop(acc, plan.num_full, plan.size)
            if plan.tail > 0:
                acc = self._step_and_add(
                    acc, plan.num_full * plan.size, plan.tail
                )
        else:
            acc = self._loop(acc, plan.num_full, plan.size)
            acc = tf.cond(
                plan.tail > 0,
                lambda: self._step_and_add(
                    acc, plan.num_full * plan.size, plan.tail
                ),
                lambda: acc,
            )
        return self._finish(acc)

    def _loop(self, acc, num_full, size):
        flat = tf.nest.flatten(acc)

        def cond(i, *_):
            return i < num_full

        def body(i, *flat_acc):
            current = tf.nest.pack_sequence_as(acc, list(flat_acc))
            new = self._step_and_add(current, i * size, size)
            return [i + 1] + tf.nest.flatten(new)

        out = tf.while_loop(
            cond,
            body,
            [tf.constant(1, tf.int32)] + flat,
            parallel_iterations=1,
        )
        return tf.nest.pack_sequence_as(acc, list(out[1:]))

    # -- the update --------------------------------------------------------
    def _finish(self, acc):
        model, spec = self.model, self.spec
        groups = acc["grads"]
        dyn_norm = [ln.global_sum(d) for d in acc["dyn_norm"]]
        weights = self._dynamic_weights()
        offset = 1 if spec.has_static else 0
        total = None
        if spec.has_static:
            total = list(groups[0])
        for g, (norm, w) in enumerate(zip(dyn_norm, weights)):
            scale = tf.math.divide_no_nan(tf.constant(w, tf.float32), norm)
            scaled = [a * scale for a in groups[offset + g]]
            total = (
                scaled
                if total is None
                else [a + b for a, b in zip(total, scaled)]
            )
        connected_vars = [
            v for v, c in zip(self.variables, spec.connected) if c
        ]
        grads_and_vars = [
            (tf.cast(g, v.dtype), v) for g, v in zip(total, connected_vars)
        ]
        if grads_and_vars:
            grads_and_vars = _dist.before_apply(grads_and_vars, model.optimizer)
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


def run_window(model, x, y, sample_weight, plan):
    """Runs one accumulation window and applies one update."""
    if not model.trainable_variables:
        raise ValueError(
            "The model has no trainable weights: there is nothing to "
            "accumulate. Check `layer.trainable` on the model's layers."
        )
    return _Window(model, x, y, sample_weight, plan).run()
