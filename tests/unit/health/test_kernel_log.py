from __future__ import annotations

import random

import pytest
from xid_corpus import CODE_LINES, PREFIXES, REAL_LINES, THREE_LINE_FALLEN_OFF

from resilient_slurm.health.kernel_log import (
    MAX_LINE_BYTES,
    KernelLogParser,
    XidEvent,
    parse_line,
)


def parse_text(data: bytes) -> list[XidEvent]:
    parser = KernelLogParser()
    parser.feed(data)
    return parser.events


@pytest.mark.parametrize(
    ("line", "xid", "pci", "fields"), REAL_LINES, ids=[f"{x}-{i}" for i, (_, x, _, _) in enumerate(REAL_LINES)]
)
def test_real_lines_decode(line: str, xid: int, pci: str, fields: dict[str, object]) -> None:
    event = parse_line(line)
    assert event is not None
    assert (event.xid, event.pci) == (xid, pci)
    for name, value in fields.items():
        assert getattr(event, name) == value, name


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize(("line", "xid", "pci", "fields"), REAL_LINES[:3] + REAL_LINES[5:7])
def test_every_log_prefix(prefix: str, line: str, xid: int, pci: str, fields: dict[str, object]) -> None:
    events = parse_text((prefix + line + "\n").encode())
    assert [(e.xid, e.pci) for e in events] == [(xid, pci)]


@pytest.mark.parametrize("code", sorted(CODE_LINES))
def test_every_catalog_code_parses(code: int) -> None:
    event = parse_line(CODE_LINES[code][0])
    assert event is not None and event.xid == code


def test_three_line_fallen_off_the_bus_takes_the_bus_id_from_above() -> None:
    [event] = parse_text(THREE_LINE_FALLEN_OFF.encode())
    assert (event.xid, event.pci, event.bus_only) == (79, "0000:b3:00", True)


def test_three_line_message_split_across_chunks() -> None:
    parser = KernelLogParser()
    first, rest = THREE_LINE_FALLEN_OFF.split("\n", 1)
    parser.feed((first + "\n").encode())
    parser.feed(rest.encode())
    assert [(e.xid, e.pci) for e in parser.events] == [(79, "0000:b3:00")]


def test_bus_id_context_does_not_reach_far() -> None:
    lines = ["NVRM: The NVIDIA GPU 0000:b3:00.0"] + [f"NVRM: unrelated {i}" for i in range(5)]
    lines.append("NVRM: fallen off the bus and is not responding to commands.")
    [event] = parse_text("\n".join(lines).encode())
    assert event.pci == ""


def test_a_log_of_many_lines_keeps_order_and_ignores_the_rest() -> None:
    noise = "[ 1.000000] EXT4-fs (vda): mounted filesystem r/w. NVRM: loading NVIDIA UNIX x86_64 Kernel Module\n"
    text = noise * 50 + REAL_LINES[1][0] + "\n" + noise * 50 + REAL_LINES[3][0] + "\n" + noise
    assert [e.xid for e in parse_text(text.encode())] == [79, 63]


def test_lines_split_across_feeds_each_count_once() -> None:
    parser = KernelLogParser()
    parser.feed((REAL_LINES[0][0] + "\n").encode())
    parser.feed((REAL_LINES[1][0] + "\n" + REAL_LINES[2][0]).encode())
    assert [e.xid for e in parser.events] == [119, 79, 79]


MALFORMED = [
    b"",
    b"\n\n\n",
    b"NVRM",
    b"NVRM: Xid",
    b"NVRM: Xid (",
    b"NVRM: Xid (PCI:0000:3b",
    b"NVRM: Xid (PCI:0000:3b:00)",
    b"NVRM: Xid (PCI:0000:3b:00):",
    b"NVRM: Xid (PCI:0000:3b:00): ",
    b"NVRM: Xid (PCI:0000:3b:00): abc, pid=1",
    b"NVRM: Xid (PCI:0000:3b:00): 999999, pid=1",
    b"NVRM: Xid (PCI:0000:3b:00): 79abc",
    b"NVRM: Xid (PCI:0000:3b:00)): 79, x",
    b"\x00\x01\x02NVRM\xff\xfe\xfd",
    b"off the bus",
    b"[ 5.1] pcieport 0000:00:01.0: device has fallen off the bus",  # not the NVIDIA driver
    b"\xc3\x28 invalid utf-8 \xa0\xa1 NVRM: Xid \xe2\x82",
    bytes(range(256)) * 4,
]


@pytest.mark.parametrize("data", MALFORMED, ids=range(len(MALFORMED)))
def test_malformed_input_yields_no_event(data: bytes) -> None:
    assert parse_text(data) == []


def test_a_valid_line_inside_invalid_utf8_still_counts() -> None:
    data = b"\xff\xfe garbage\n\xc3(NVRM: Xid (PCI:0000:3b:00): 48, pid=5, name=x, DBE \xa0\n\x00\x00"
    assert [e.xid for e in parse_text(data)] == [48]


def test_every_truncation_of_a_line_is_safe() -> None:
    line = CODE_LINES[95][0].encode()
    for cut in range(len(line) + 1):
        for event in parse_text(line[:cut]):
            assert event.xid in (9, 95)  # cut inside the number leaves its first digit


def test_very_long_lines_are_skipped_not_fatal() -> None:
    long_line = b"x" * (1 << 20) + b" " + CODE_LINES[79][0].encode()
    data = long_line + b"\n" + CODE_LINES[48][0].encode() + b"\n" + b"NVRM " * 300_000
    assert len(long_line) > MAX_LINE_BYTES
    assert [e.xid for e in parse_text(data)] == [48]


def test_random_binary_and_mutated_lines_never_crash() -> None:
    rng = random.Random(7)
    lines = [line.encode() for line, *_ in REAL_LINES]
    blobs = [rng.randbytes(4096) for _ in range(200)]
    for _ in range(3000):
        line = bytearray(rng.choice(lines))
        for _ in range(rng.randint(1, 6)):
            line[rng.randrange(len(line))] = rng.randrange(256)
        blobs.append(bytes(line))
    parser = KernelLogParser()
    for blob in blobs:
        parser.feed(blob)
    assert all(0 <= e.xid <= 99999 for e in parser.events)
