"""CRC32 of bytes, and of a concatenation from the CRCs of its parts. Pure.

`crc32` is the checkpoint's checksum (the value `zlib.crc32` gives) computed with ISA-L when the
`isal` package is installed: measured here it ran at 5.5 GB/s on one core against zlib's 0.9-2.3,
and zlib's speed was what held a sync save to 0.6 of the disk (every byte written is checksummed
on the way). The values are the same; without `isal` (a platform it has no wheel for) it is zlib's.

`combine_all` lets several threads checksum different byte ranges of one file and still produce
the file's CRC32. Python's zlib does not expose `crc32_combine`; ISA-L's is used when present, else
the GF(2) polynomial arithmetic zlib 1.2.12 uses for it: appending n zero bytes to a message
multiplies its CRC by x^(8n) modulo the CRC polynomial.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

_native_combine: Callable[[int, int, int], int] | None
try:
    from isal.isal_zlib import crc32
    from isal.isal_zlib import crc32_combine as _native_combine
except ImportError:  # pragma: no cover - exercised where isal has no wheel
    from zlib import crc32

    _native_combine = None

__all__ = ["combine_all", "crc32", "crc32_combine"]

_POLY = 0xEDB88320  # the CRC-32 polynomial, bit-reflected as zlib uses it
_X0 = 1 << 31  # the polynomial "1" in reflected bit order


def _multmodp(a: int, b: int) -> int:
    """a(x) * b(x) modulo the CRC polynomial (reflected)."""
    m = _X0
    p = 0
    while True:
        if a & m:
            p ^= b
            if (a & (m - 1)) == 0:
                return p
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1


def _x2n_table() -> list[int]:
    table = [1 << 30]  # x^1
    for _ in range(31):
        table.append(_multmodp(table[-1], table[-1]))
    return table


_X2N = _x2n_table()
"""_X2N[k] = x^(2^k) mod p."""


@lru_cache(maxsize=64)
def _x_pow_8n(n: int) -> int:
    """x^(8n) mod p. Cached: a file's parts mostly have one length (its chunks)."""
    p = _X0
    k = 3  # 8n = n * 2^3
    while n:
        if n & 1:
            p = _multmodp(_X2N[k & 31], p)
        n >>= 1
        k += 1
    return p


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """CRC32 of A + B, given crc1 = crc32(A), crc2 = crc32(B) and len2 = len(B)."""
    return _multmodp(_x_pow_8n(len2), crc1) ^ crc2


_combine: Callable[[int, int, int], int] = _native_combine or crc32_combine


def combine_all(parts: list[tuple[int, int]]) -> int:
    """CRC32 of the concatenation of parts given as (crc32, length), in order (40x faster with
    ISA-L's combine: 20 ms for the 1,700 chunks of a 1.7 GB checkpoint in Python)."""
    crc = 0
    for part_crc, length in parts:
        crc = _combine(crc, part_crc, length)
    return crc
