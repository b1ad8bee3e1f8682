"""CRC32 of a concatenation from the CRCs of its parts. Pure.

Lets several threads checksum different byte ranges of one file and still produce the file's
CRC32 (the same value `zlib.crc32` gives for the whole file). Python's zlib does not expose
`crc32_combine`, so this is the GF(2) polynomial arithmetic zlib 1.2.12 uses for it: appending
n zero bytes to a message multiplies its CRC by x^(8n) modulo the CRC polynomial.
"""

from __future__ import annotations

from functools import lru_cache

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


def combine_all(parts: list[tuple[int, int]]) -> int:
    """CRC32 of the concatenation of parts given as (crc32, length), in order."""
    crc = 0
    for part_crc, length in parts:
        crc = crc32_combine(crc, part_crc, length)
    return crc
