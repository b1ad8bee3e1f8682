import os
import zlib

import pytest

from resilient_slurm.checkpoint.crc32 import combine_all, crc32, crc32_combine


@pytest.mark.parametrize(
    "a, b",
    [(b"", b""), (b"abc", b""), (b"", b"xyz"), (b"x", b"y"), (os.urandom(1000), os.urandom(77777)),
     (os.urandom(5), os.urandom(1 << 20)), (b"\0" * 4096, b"\xff" * 3)],
    # ids of their own: random bytes would name the cases differently in every collection (xdist)
    ids=["empty", "a-empty", "empty-b", "x-y", "random-1000-77777", "random-5-1MiB", "zeros-ones"],
)
def test_combined_crc_is_the_crc_of_the_concatenation(a, b):
    assert crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)


@pytest.mark.parametrize("piece", [1, 7, 4096, 100_003])
def test_any_split_of_a_buffer_combines_to_its_crc(piece):
    data = os.urandom(300_000)
    parts = [(zlib.crc32(data[i : i + piece]), len(data[i : i + piece])) for i in range(0, len(data), piece)]
    assert combine_all(parts) == zlib.crc32(data)


def test_no_parts_is_the_crc_of_nothing():
    assert combine_all([]) == zlib.crc32(b"") == 0


def test_the_checksum_in_use_is_zlibs_crc32_and_continues_like_it():
    # ISA-L's CRC32 when `isal` is installed: checkpoints written with it must verify with zlib's.
    data = os.urandom(3 << 20)
    assert crc32(data) == zlib.crc32(data)
    assert crc32(data[5:], crc32(data[:5])) == zlib.crc32(data)


def test_the_native_combine_agrees_with_the_polynomial_arithmetic():
    a, b = os.urandom(1000), os.urandom(1 << 20)
    assert combine_all([(zlib.crc32(a), len(a)), (zlib.crc32(b), len(b))]) == \
        crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)
