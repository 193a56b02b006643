"""The update of a sparse gradient (issue #23): an embedding's gradient is
its rows (`tf.IndexedSlices`), and an optimizer that reads the gradient in
two ops (Adam's `g - m` and `square(g)`) makes a new tensor of the rows'
size with the first element-wise op that keeps them sparse; one that reads
it once (SGD with momentum's `g * lr`) writes over the rows' buffer. The
square is made once the op that made the rows has ended (its inputs are
free by then), and the rows stay allocated while the update reads them.
Allocator trace on CPU: the memory network of held-out set 18 at batch
192, Adam, the step's peak with two embeddings' rows (`Tile`, [115200,
64], 28 MiB each) and each one's `adam/Square` alive together (estimated
74.8 MiB before, measured 131.8)."""

import keras
import pytest
import tensorflow as tf
from keras import layers
from keras import ops

from tfmemopt.estimate import _consumers
from tfmemopt.estimate import _step_graph
from tfmemopt.estimate._simulate import _simulate

from ._graphs import graph_ops
from ._graphs import size

MIB = 1 << 20
NEVER = 1 << 60  # an update that lasts longer than the step


@pytest.mark.parametrize(
    "optimizer, reads",
    [
        (lambda: keras.optimizers.Adam(), 2),
        (lambda: keras.optimizers.RMSprop(), 2),
        (lambda: keras.optimizers.SGD(momentum=0.9), 1),
    ],
)
def test_the_gradient_s_reads_are_traced(optimizer, reads):
    opt = optimizer()
    assert _consumers.gradient_reads(opt) == reads
    (use,) = _consumers.consumers(opt, False, 1, lambda v: 4096)([None])
    assert use.copies_rows == (reads > 1)


def _rows(pieces, n_rows):
    # `n_rows` sparse gradients' rows, one after another from `x`, each the
    # concatenation of `pieces` tiles of 4 MiB.
    def build():
        x = tf.compat.v1.placeholder(tf.float32, (1024,), name="x")
        for i in range(n_rows):
            parts = [tf.tile(x, [1024]) for _ in range(pieces)]
            if pieces > 1:
                tf.concat(parts, 0, name=f"rows{i}")

    ops_ = graph_ops(build)
    kind = "ConcatV2" if pieces > 1 else "Tile"
    return ops_, [op.outputs[0] for op in ops_ if op.type == kind]


def _peak(ops_, rows, rows_square, lingering=0):
    consumed = {t.name: [size(t)] for t in rows}
    return _simulate(
        ops_,
        [],
        size,
        {},
        in_place=False,
        consumed=consumed,
        lingering={t.name: lingering for t in rows},
        rows_square={t.name for t in rows} if rows_square else (),
    )


def test_the_square_of_the_rows_comes_after_their_pieces_are_free():
    # Rows of 8 MiB concatenated from two pieces of 4 (the hierarchical
    # attention network of held-out set 9: `adam/Square` made after the
    # concatenation's pieces were freed). With the pieces: 4+4 + 8 + 8.
    ops_, rows = _rows(2, 1)
    assert _peak(ops_, rows, rows_square=False) == 24 * MIB
    assert _peak(ops_, rows, rows_square=True) == 16 * MIB


def test_the_rows_stay_while_their_update_lingers():
    # Two embeddings' rows (4 MiB each) updated one after the other: the
    # first's rows and square are alive when the second's are made.
    ops_, rows = _rows(1, 2)
    assert _peak(ops_, rows, rows_square=True, lingering=NEVER) == 16 * MIB
    # Without the update lingering, the first rows and square are free.
    assert _peak(ops_, rows, rows_square=True) == 8 * MIB + 4096


def _memory_network(optimizer):
    # Two embeddings looked up over [batch, 50 sentences, 12 words] and
    # summed over the words (the memory network of held-out set 18): each
    # gradient's rows are [batch * 600, 64].
    words = keras.Input((50, 12), dtype="int32")
    memory = ops.sum(layers.Embedding(1000, 64)(words), axis=2)
    output = ops.sum(layers.Embedding(1000, 64)(words), axis=2)
    p = ops.softmax(ops.mean(memory, axis=2))
    h = ops.sum(output * p[..., None], axis=1)
    model = keras.Model(words, layers.Dense(1000)(h))
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
    return model


ROWS = 64 * 600 * 64 * 4  # one embedding's rows at batch 64


@pytest.mark.parametrize(
    "optimizer, copies",
    [
        # Measured (tfmemopt.Model, batch 64, 3 steps): 49.2, 49.2, 49.2
        # MiB; estimated 33.6 without the rows' squares, 49.2 with them:
        # both embeddings' squares at the peak.
        ("adam", 2),
        # Measured: 32.8, 32.8, 32.8 MiB; estimated 33.6.
        (lambda: keras.optimizers.SGD(momentum=0.9), 0),
    ],
)
def test_an_embedding_s_update_copies_its_rows_when_read_twice(
    optimizer, copies
):
    model = _memory_network(optimizer() if callable(optimizer) else optimizer)

    def counted(v):
        n = 4
        for d in v.shape:
            n *= d
        return n

    update = _consumers.consumers(model.optimizer, False, 1, counted)

    def without_copies(variables):
        return [u._replace(copies_rows=False) for u in update(variables)]

    def peak(use):
        return _step_graph.trace_step(model, 64, update=use).updating_peak

    more = peak(update) - peak(without_copies)
    # Both squares, less what the ops that made the rows freed first.
    assert (copies - 1) * ROWS < more <= copies * ROWS
