"""Blockwise dynamic 8-bit quantisation: hand-computed cases and edges."""

import numpy as np
import pytest
import tensorflow as tf

from tfmemopt.optimizers import _quantization as q


def roundtrip(x, block_size, signed):
    codes, absmax = q.quantize(tf.constant(x, tf.float32), block_size, signed)
    out = q.dequantize(codes, absmax, block_size, signed)
    return codes.numpy(), absmax.numpy(), out.numpy()


def test_maps_match_bitsandbytes_construction():
    signed, unsigned = q.dynamic_map(True), q.dynamic_map(False)
    assert signed.shape == unsigned.shape == (256,)
    assert np.all(np.diff(signed) > 0) and np.all(np.diff(unsigned) > 0)
    # bitsandbytes: signed has 127 negatives, 0, and 1.0 on top; the most
    # negative value is -(1 - 0.9/128).
    assert (signed < 0).sum() == 127 and signed[127] == 0.0
    assert signed[-1] == 1.0
    np.testing.assert_allclose(signed[0], -(1 - 0.9 / 128), rtol=1e-6)
    assert unsigned[0] == 0.0 and unsigned[-1] == 1.0
    # smallest non-zero: 1e-6 * midpoint of the first split of [0.1, 1]
    np.testing.assert_allclose(unsigned[1], 1e-6 * (0.1 + 0.9 / 4), rtol=1e-6)
    assert q.zero_code(True) == 127 and q.zero_code(False) == 0


def test_hand_computed_block():
    # signed top decade: means of linspace(0.1, 1, 65), step 0.9/64
    step = 0.9 / 64
    codes, absmax, out = roundtrip([1.0, 0.5, -0.25, 0.0], 4, True)
    assert absmax.tolist() == [1.0]
    expected = [1.0, 0.1 + 28.5 * step, -(0.1 + 10.5 * step), 0.0]
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    assert codes.tolist() == [255, 128 + 91, 127 - 74, 127]
    # unsigned: step 0.9/128; 0.5 -> 0.1 + 56.5 * step, scale 2.0
    codes, absmax, out = roundtrip([2.0, 1.0], 4, False)
    np.testing.assert_allclose(absmax, [2.0])
    np.testing.assert_allclose(out, [2.0, 2 * (0.1 + 56.5 * 0.9 / 128)])


def test_documented_error_bounds_hold_on_random_blocks():
    bounds = {True: q.max_error(True), False: q.max_error(False)}
    # the figures stated in docs/optimizers.md
    assert bounds[True]["absolute"] == pytest.approx(0.9 / 128, rel=1e-5)
    assert bounds[False]["absolute"] == pytest.approx(0.9 / 256, rel=1e-5)
    assert bounds[True]["top_decade"] == pytest.approx(0.0616, abs=5e-4)
    assert bounds[False]["top_decade"] == pytest.approx(0.0328, abs=5e-4)
    rng = np.random.default_rng(0)
    for signed in (True, False):
        x = rng.standard_normal(5000).astype("float32")
        x = x if signed else np.abs(x)
        _, absmax, out = roundtrip(x, 256, signed)
        scale = np.repeat(absmax, 256)[: x.size]
        err = np.abs(out - x) / scale
        assert err.max() <= bounds[signed]["absolute"] * (1 + 1e-5)
        top = np.abs(x) >= 0.1 * scale
        rel = np.abs(out - x)[top] / np.abs(x)[top]
        assert rel.max() <= bounds[signed]["top_decade"] * (1 + 1e-5)


def test_zeros_tiny_and_sizes_not_multiple_of_block():
    codes, absmax, out = roundtrip(np.zeros(300), 256, True)
    assert absmax.tolist() == [0.0, 0.0] and codes.shape == (300,)
    assert np.all(codes == 127) and np.all(out == 0.0)
    tiny = np.full(5, 1e-30, "float32")
    tiny[0] = 3e-38  # below 1e-7 of the block maximum: decodes to 0
    codes, absmax, out = roundtrip(tiny, 256, False)
    assert absmax[0] == np.float32(1e-30) and codes[0] == 0
    np.testing.assert_array_equal(out, [0.0] + [np.float32(1e-30)] * 4)
    # a block of subnormals: finite, never NaN (flushed to 0 or kept)
    _, _, out = roundtrip(np.full(3, 1e-40, "float32"), 256, True)
    assert np.isfinite(out).all() and np.all(out >= 0)


def test_one_huge_value_among_small_ones():
    x = np.full(256, 1e-3, "float32")
    x[7] = 1e3  # small values are 1e-6 of the block maximum
    _, _, out = roundtrip(x, 256, False)
    assert out[7] == pytest.approx(1e3)
    # a linear int8 map would give 0; the dynamic map keeps them within 40%
    assert np.all(out[x == 1e-3] > 0)
    np.testing.assert_allclose(out[x == 1e-3], 1e-3, rtol=0.4)
    # other blocks are unaffected by the huge value
    y = np.concatenate([x, np.full(256, 1e-3, "float32")])
    _, _, out = roundtrip(y, 256, False)
    np.testing.assert_allclose(out[256:], 1e-3, rtol=0.02)


def test_negative_first_moments_keep_their_sign():
    x = -np.abs(np.random.default_rng(1).standard_normal(1000)) - 1e-3
    codes, absmax, out = roundtrip(x.astype("float32"), 128, True)
    assert np.all(out < 0) and np.all(codes < 127)
    scale = np.repeat(absmax, 128)[: x.size]
    assert np.all(np.abs(out - x) <= scale * 0.9 / 128 * (1 + 1e-5))


def test_codes_cover_full_range_without_wrapping():
    x = np.linspace(-1, 1, 4001).astype("float32")
    codes, _, _ = roundtrip(x, 4001, True)
    assert codes.min() == 0 and codes.max() == 255
    assert np.all(np.diff(codes.astype(int)) >= 0)  # monotone, no wrap


def test_bucket_lookup_equals_a_binary_search_over_the_midpoints():
    rng = np.random.default_rng(3)
    x = np.concatenate(
        [
            rng.uniform(-1, 1, 20000),
            np.sign(rng.standard_normal(20000))
            * 10.0 ** rng.uniform(-9, 0, 20000),
            [0.0, -0.0, 1.0, -1.0, 1e-45, -1e-45, 3e-38],
        ]
    ).astype("float32")
    for signed in (True, False):
        mids = q._midpoints(signed)
        # every midpoint and its float32 neighbours
        edges = np.concatenate(
            [mids, np.nextafter(mids, 2), np.nextafter(mids, -2)]
        ).astype("float32")
        values = np.concatenate([x if signed else np.abs(x), edges])
        got = q._nearest_codes(tf.constant(values), signed).numpy()
        want = np.searchsorted(mids, values, side="left")
        np.testing.assert_array_equal(got, want)
