"""FP8 codes from float32 values, for the Python tests: the nearest code, written from the formats' definitions.

Independent of rope's C++ conversion and of every library cast (PyTorch's and
ml_dtypes' casts do not saturate everywhere): each format's 256 codes are
decoded from their bit fields, and a value takes the code of the nearest
finite value (ties to the code with an even mantissa), +-max beyond the
largest, the format's NaN for NaN. rope stores
``round_to_nearest_even(saturate(value / scale))``, the division in float32.
"""

import numpy as np

# (exponent bits, mantissa bits, bias, whether the all-ones exponent is inf/NaN (IEEE-like))
FORMATS = {"e4m3fn": (4, 3, 7, False), "e5m2": (5, 2, 15, True)}


def decode(fmt):
    """The float64 value of each code 0..255 (NaN for NaN codes, +-inf for e5m2's infinities)."""
    e_bits, m_bits, bias, ieee = FORMATS[fmt]
    values = np.empty(256)
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        exponent = (code >> m_bits) & ((1 << e_bits) - 1)
        mantissa = code & ((1 << m_bits) - 1)
        top = (1 << e_bits) - 1
        if ieee and exponent == top:
            values[code] = sign * np.inf if mantissa == 0 else np.nan
        elif not ieee and exponent == top and mantissa == (1 << m_bits) - 1:
            values[code] = np.nan  # e4m3fn: S.1111.111 is NaN; no infinity
        elif exponent == 0:
            values[code] = sign * mantissa * 2.0 ** (1 - bias - m_bits)  # subnormal
        else:
            values[code] = sign * (1 + mantissa / 2 ** m_bits) * 2.0 ** (exponent - bias)
    return values


def quantize(values, fmt):
    """uint8 codes of float32 ``values``: nearest finite code, ties to even, saturating, NaN kept."""
    table = decode(fmt)
    positive = [c for c in range(128) if np.isfinite(table[c])]  # ascending with the code
    magnitudes = table[positive]
    largest = positive[-1]
    x = np.asarray(values, dtype=np.float32).astype(np.float64)
    a = np.abs(x)
    hi = np.clip(np.searchsorted(magnitudes, a), 1, len(positive) - 1)  # magnitudes[hi-1] <= a <= magnitudes[hi]
    lo = hi - 1
    d_lo, d_hi = a - magnitudes[lo], magnitudes[hi] - a
    codes = np.where(d_lo < d_hi, np.array(positive)[lo], np.array(positive)[hi])
    tie = d_lo == d_hi
    even_lo = (np.array(positive)[lo] & 1) == 0
    codes = np.where(tie, np.where(even_lo, np.array(positive)[lo], np.array(positive)[hi]), codes)
    codes = np.where(a >= magnitudes[-1], largest, codes)  # saturate (and +-inf)
    nan_code = 0x7F if fmt == "e4m3fn" else 0x7E
    codes = np.where(np.isnan(x), nan_code, codes) | np.where(np.signbit(x), 0x80, 0)  # the sign kept, NaN's too
    return codes.astype(np.uint8)


def quantize_scaled(values, scale, fmt):
    """rope's cache codes of float32 ``values`` with dequantisation ``scale`` (broadcast): value / scale in float32."""
    quotient = np.asarray(values, dtype=np.float32) / np.asarray(scale, dtype=np.float32)
    return quantize(quotient.astype(np.float32), fmt)
