"""arrays.bytes_finite (what a restore from disk runs on every chunk it reads) finds exactly the NaN and Inf values:
every one of the 65,536 float16 and bfloat16 bit patterns alone, the boundary patterns of float32 and float64, and
one bad value anywhere in an array spanning several of its pieces."""

from __future__ import annotations

import numpy as np
import pytest

from engramctl.store import arrays


def _each_alone(bits: np.ndarray, code: str) -> np.ndarray:
    return np.array([arrays.bytes_finite(memoryview(bits[i : i + 1].view(np.uint8)), code) for i in range(bits.size)])


def test_every_float16_pattern():
    bits = np.arange(1 << 16, dtype=np.uint16)
    assert (_each_alone(bits, "F16") == np.isfinite(bits.view(np.float16))).all()


def test_every_bfloat16_pattern():
    bits = np.arange(1 << 16, dtype=np.uint16)
    as_f32 = (bits.astype(np.uint32) << 16).view(np.float32)  # bfloat16 is float32's top half
    assert (_each_alone(bits, "BF16") == np.isfinite(as_f32)).all()


@pytest.mark.parametrize("code,dtype", [("F32", np.float32), ("F64", np.float64)])
def test_boundary_patterns_of_wider_floats(code, dtype):
    info = np.finfo(dtype)
    values = np.array(
        [
            0.0,
            -0.0,
            info.max,
            -info.max,
            info.tiny,
            -info.tiny,
            info.smallest_subnormal,
            -info.smallest_subnormal,
            np.inf,
            -np.inf,
            np.nan,
            -np.nan,
        ],
        dtype,
    )
    bits = values.view(f"u{values.itemsize}")
    width = 8 * values.itemsize
    exponent = {32: 0x7F800000, 64: 0x7FF0000000000000}[width]
    sign = 1 << (width - 1)
    extra = np.array(
        [exponent | 1, sign | exponent | 1, sign | (exponent - 1), exponent - 1, (1 << width) - 1], bits.dtype
    )  # signalling NaNs, the largest finite patterns, an all-ones NaN
    bits = np.concatenate([bits, extra])
    assert (_each_alone(bits, code) == np.isfinite(bits.view(dtype))).all()


@pytest.mark.parametrize("code,dtype", [("F16", np.float16), ("F32", np.float32)])
@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan, -np.nan])
def test_one_bad_value_anywhere_in_a_long_array(code, dtype, bad):
    n = 3 * arrays._PIECE_BYTES // np.dtype(dtype).itemsize + 7  # several pieces and a short last one
    good = np.random.default_rng(0).standard_normal(n).astype(dtype)
    assert arrays.bytes_finite(memoryview(good.view(np.uint8)), code)
    for at in (0, n // 2, n - 1):
        a = good.copy()
        a[at] = bad
        assert not arrays.bytes_finite(memoryview(a.view(np.uint8)), code), at


def test_other_dtypes_and_empty_data_are_finite():
    assert arrays.bytes_finite(memoryview(np.full(4, -1, np.int64).view(np.uint8)), "I64")
    assert arrays.bytes_finite(memoryview(np.zeros(0, np.uint8)), "F32")
