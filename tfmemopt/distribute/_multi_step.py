"""`steps_per_execution > 1` under collective all-reduce strategies.

Keras 3 runs several steps per call as a `tf.while_loop` over
`iterator.get_next_as_optional()` with a `tf.cond` around each step, and each
step is a nested `tf.function` (keras-team/keras#19246). A collective
all-reduce takes its instance key as a call-time capture
(`capture_call_time_value`) of the function that holds it. When the nested
step function is called inside the `cond`, its call-time capture is re-created
as a placeholder of the cond's branch graph, which nobody feeds: "You must feed
a value for placeholder tensor 'while/body/.../while/cond/Placeholder_1'".
TensorFlow walks out of control-flow graphs for collectives created there
directly, but not for a nested function's captures.

So here the same loop is built with the step traced inline (no nested
`tf.function`): the collectives' instance keys are then captured by the outer
function and fed when it is called. The loop, the end-of-data handling and the
outputs are Keras's: at most `steps_per_execution` steps, stopping early when
the data ends, returning the last step's logs.
"""

from __future__ import annotations

import tensorflow as tf


def _reduce_mean(values, strategy, multi_worker):
    """Keras's `reduce_per_replica(..., "mean")` (a cross-worker mean)."""

    def _reduce(v):
        if multi_worker:
            return strategy.reduce("MEAN", v, axis=0)
        if isinstance(v, tf.distribute.DistributedValues):
            local = strategy.experimental_local_results(v)
            return tf.reduce_mean(tf.stack(local), axis=0)
        return v

    return tf.nest.map_structure(_reduce, values)


def _without_optionals(data):
    return tf.nest.map_structure(
        lambda i: None if isinstance(i, tf.experimental.Optional) else i,
        data,
    )


def make_multi_step_function(model, step_function, multi_worker=False):
    """Keras's train function for `steps_per_execution > 1`, step inline.

    Args:
        model: The compiled `keras.Model` (its `steps_per_execution`,
            `distribute_strategy` and `run_eagerly` are read).
        step_function: Callable taking one replica's batch (`train_step`).
        multi_worker: Bool, defaults to `False`. Whether the strategy spans
            several workers: the logs are then averaged over all of them.

    Returns:
        A function of a distributed iterator that runs up to
        `steps_per_execution` steps and returns the last step's reduced logs,
        raising `StopIteration` when the iterator had no data at all.
    """
    strategy = model.distribute_strategy
    steps = int(model.steps_per_execution)

    def one_step(data):
        data = _without_optionals(data)
        outputs = strategy.run(step_function, args=(data,))
        return _reduce_mean(outputs, strategy, multi_worker)

    def multi_step(iterator):
        empty = tf.experimental.Optional.empty(None)

        def cond(i, outputs, next_inputs):
            return tf.logical_and(tf.less(i, steps), next_inputs.has_value())

        def body(i, outputs, next_inputs):
            def has_next():
                result = tf.experimental.Optional.from_value(
                    one_step(next_inputs.get_value())
                )
                empty._element_spec = result.element_spec
                return result

            def no_next():
                outputs._element_spec = empty._element_spec
                return outputs

            outputs = tf.cond(next_inputs.has_value(), has_next, no_next)
            next_inputs = tf.cond(
                tf.less(i + 1, steps),
                iterator.get_next_as_optional,
                lambda: next_inputs,
            )
            return i + 1, outputs, next_inputs

        _, outputs, _ = tf.while_loop(
            cond,
            body,
            loop_vars=[tf.constant(0), empty, iterator.get_next_as_optional()],
        )
        outputs._element_spec = empty.element_spec
        return outputs

    if not model.run_eagerly:
        multi_step = tf.function(multi_step, reduce_retracing=True)

    def function(iterator):
        outputs = multi_step(iterator)
        if not outputs.has_value():
            raise StopIteration
        return outputs.get_value()

    return function
