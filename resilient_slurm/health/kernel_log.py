"""Kernel-log parsing: NVIDIA Xid and fallen-off-the-bus lines → `XidEvent`. Pure, no I/O.

Accepts every form the driver and the log tools produce (see `shared/notes/xid-facts.md`):
`NVRM: Xid (PCI:0000:3b:00): 79, pid=…, name=…, text`, the MIG forms with `GPU-I:`/`GPU-CI:`,
older lines without `PCI:` or without pid/name, `pid='<unknown>'`, any prefix before `NVRM:`
(dmesg `[ seconds]` or `-T` time, syslog or journald `host kernel:`), and NVRM's "fallen off the
bus" without an Xid, including the three-line "The NVIDIA GPU …" message. Anything else, including
garbage, binary, invalid UTF-8, truncated lines and lines over `MAX_LINE_BYTES`, yields no event.
"""

from __future__ import annotations

import dataclasses
import re

MAX_LINE_BYTES = 8192
"""Longer lines are skipped: the kernel never logs a record this long, so such a line is not one."""

_XID = re.compile(r"NVRM: Xid \(([^()]{0,80})\): (\d{1,5})(?:,\s*(.*))?$")
_LOCATION = re.compile(
    r"(?:PCI:)?([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.[0-9a-fA-F])?"
    r"(?: GPU-I:(\d+))?(?: GPU-CI:(\d+))?"
)
_BUS_ID = re.compile(r"\b([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.[0-9a-fA-F]\b")
_THE_GPU = re.compile(r"NVRM: The NVIDIA GPU ([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})")
_RST = re.compile(r"(?<![-\w])RST: (Yes|No)")
_D_RST = re.compile(r"D-RST: (Yes|No)")
_RECOVERY = re.compile(r"recovery action changed from (?:0x[0-9a-fA-F]+|\d+).*? to (0x[0-9a-fA-F]+|\d+)")
_SEVERITY = re.compile(r"\b(Fatal|Nonfatal)\b")
_NEEDLES = (b"Xid", b"off the bus", b"The NVIDIA GPU")
_CONTEXT_LINES = 3
"""How many lines after "The NVIDIA GPU <bus id>" its "fallen off the bus" may come (two in the
driver's message, one more for a line another CPU logged in between)."""


@dataclasses.dataclass(frozen=True)
class XidEvent:
    """One GPU fault seen in the kernel log."""

    xid: int
    pci: str
    """`dddd:bb:dd` in lower case (domain, bus, device: the driver's form), or "" when unknown."""
    text: str
    """The message after pid/name, cut to 200 characters."""
    pid: str | None = None
    name: str | None = None
    gpu_instance: int | None = None
    compute_instance: int | None = None
    rst: bool | None = None
    """94/95 `RST:`: the GPU needs a reset."""
    d_rst: bool | None = None
    """94/95 `D-RST:`: drain the GPU and reset it."""
    recovery_to: int | None = None
    """154: the NVML recovery action the driver changed to."""
    link_fatal: bool | None = None
    """149: the NVLink5 sub-code is Fatal (True) or Nonfatal (False)."""
    bus_only: bool = False
    """A "fallen off the bus" message without an Xid line, reported as Xid 79."""


def normalize_pci(domain: str, bus: str, device: str) -> str:
    """Bus id parts → the driver's `dddd:bb:dd` form (NVML uses an 8-digit domain and a function)."""
    return f"{domain[-4:]}:{bus}:{device}".lower()


def parse_line(text: str, context_pci: str = "") -> XidEvent | None:
    """The event on one kernel-log line, or None. `context_pci` is the bus id from a preceding
    "The NVIDIA GPU <bus id>" line, for the last line of the three-line fallen-off message."""
    match = _XID.search(text)
    if match is not None:
        return _xid_event(int(match.group(2)), match.group(1), match.group(3) or "")
    if "fallen off the bus" not in text or "NVRM:" not in text:
        return None
    bus = _BUS_ID.search(text) or _THE_GPU.search(text)
    pci = normalize_pci(*bus.groups()) if bus is not None else context_pci
    return XidEvent(79, pci, _cut(text), bus_only=True)


def _xid_event(xid: int, location: str, rest: str) -> XidEvent:
    pci, gpu_instance, compute_instance = "", None, None
    loc = _LOCATION.fullmatch(location.strip())
    if loc is not None:
        pci = normalize_pci(loc.group(1), loc.group(2), loc.group(3))
        gpu_instance = int(loc.group(4)) if loc.group(4) else None
        compute_instance = int(loc.group(5)) if loc.group(5) else None
    pid = name = None
    if rest.startswith("pid="):
        pid, _, rest = rest[4:].partition(", ")
        pid = pid.strip("'")
        if rest.startswith("name="):
            name, _, rest = rest[5:].partition(", ")
    return XidEvent(
        xid,
        pci,
        _cut(rest),
        pid=pid,
        name=name,
        gpu_instance=gpu_instance,
        compute_instance=compute_instance,
        rst=_yes_no(_RST.search(rest)) if xid in (94, 95) else None,
        d_rst=_yes_no(_D_RST.search(rest)) if xid in (94, 95) else None,
        recovery_to=_recovery_to(rest) if xid == 154 else None,
        link_fatal=_severity(rest) if xid == 149 else None,
    )


def _yes_no(match: re.Match[str] | None) -> bool | None:
    return None if match is None else match.group(1) == "Yes"


def _recovery_to(rest: str) -> int | None:
    match = _RECOVERY.search(rest)
    return None if match is None else int(match.group(1), 0)


def _severity(rest: str) -> bool | None:
    match = _SEVERITY.search(rest)
    return None if match is None else match.group(1) == "Fatal"


def _cut(text: str) -> str:
    return text.strip()[:200]


class KernelLogParser:
    """Collects the events in chunks of kernel-log lines fed in order.

    Only lines containing "Xid", "off the bus" or "The NVIDIA GPU" are decoded, which keeps a
    scan of a large log near memory speed. Each chunk must hold whole lines; a final line
    without its newline is parsed as it stands.
    """

    def __init__(self) -> None:
        self.events: list[XidEvent] = []
        self._context_pci = ""
        self._context_age = 0  # lines since the "The NVIDIA GPU <bus id>" line

    def feed(self, chunk: bytes) -> None:
        pos = 0
        for start, end in _candidate_spans(chunk):
            self._age(chunk, pos, start)
            pos = start
            if end - start > MAX_LINE_BYTES:
                continue
            text = chunk[start:end].decode("utf-8", "replace")
            event = parse_line(text, self._context_pci)
            if event is not None:
                self.events.append(event)
                continue
            gpu = _THE_GPU.search(text)
            if gpu is not None:
                self._context_pci, self._context_age = normalize_pci(*gpu.groups()), 0
        self._age(chunk, pos, len(chunk))

    def _age(self, chunk: bytes, start: int, end: int) -> None:
        if self._context_pci:
            self._context_age += chunk.count(b"\n", start, end)
            if self._context_age > _CONTEXT_LINES:
                self._context_pci = ""


def _candidate_spans(chunk: bytes) -> list[tuple[int, int]]:
    spans: dict[int, int] = {}
    for needle in _NEEDLES:
        hit = chunk.find(needle)
        while hit != -1:
            start = chunk.rfind(b"\n", 0, hit) + 1
            end = chunk.find(b"\n", hit)
            if end == -1:
                end = len(chunk)
            spans[start] = end
            hit = chunk.find(needle, end)
    return sorted(spans.items())
