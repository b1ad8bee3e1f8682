"""Kernel-log lines for the health tests.

REAL_LINES are lines seen in the wild (sources in shared/notes/xid-facts.md and the driver's
format strings). CODE_LINES has one line per catalog code: the real line where one is public,
otherwise the driver's exact format (`NVRM: Xid (PCI:%04x:%02x:%02x): %d, pid=%s, name=%s, %s`)
around the catalog's description. PREFIXES are the ways log tools prefix a kernel line.
"""

from __future__ import annotations

# (line, xid, pci, extra fields the parser must decode)
REAL_LINES: list[tuple[str, int, str, dict[str, object]]] = [
    (
        "[Sun Feb 23 16:24:18 2025] NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, "
        "Timeout after 6s of waiting for RPC response from GPU4 GSP! Expected function 103 (GSP_RM_ALLOC) (0x2081 0x4).",
        119,
        "0000:9b:00",
        {"pid": "2024380", "name": "nvidia-smi"},
    ),
    ("NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.", 79, "0000:2b:00", {"pid": None, "name": None}),
    (
        "NVRM: Xid (PCI:0000:05:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
        79,
        "0000:05:00",
        {"pid": "<unknown>", "name": "<unknown>", "text": "GPU has fallen off the bus."},
    ),
    (
        "NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate.",
        63,
        "0000:10:1c",
        {"pid": "1896", "name": None},
    ),
    (
        "NVRM: Xid (PCI:0000:01:00): 94, pid=7062, Contained: CE User Channel (0x9). RST: No, D-RST: No",
        94,
        "0000:01:00",
        {"rst": False, "d_rst": False},
    ),
    (
        "NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). RST: No, D-RST: No",
        94,
        "0000:01:00",
        {"gpu_instance": 5, "compute_instance": None, "rst": False},
    ),
    (
        "NVRM: Xid (PCI:0000:01:00): 95, pid=7062, Uncontained: LTC TAG (0x2, 0x1). RST: Yes, D-RST: No",
        95,
        "0000:01:00",
        {"rst": True, "d_rst": False},
    ),
    (
        "NVRM: Xid (PCI:000d:00:00): 31, pid=3234, Graphics SM Warp Exception on (GPC 2, TPC 2, SM 1): Out Of Range Address",
        31,
        "000d:00:00",
        {"pid": "3234"},
    ),
    (
        "NVRM: Xid (PCI:0008:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 "
        "(0x021425c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
        149,
        "0008:01:00",
        {"link_fatal": True},
    ),
    (
        "NVRM: Xid (PCI:0018:01:00): 149, NETIR_BER_EVENT Nonfatal XC0 i0 Link 03 "
        "(0x00086226 0x00000001 0x00000000 0x00000000 0x00000000 0x00000000)",
        149,
        "0018:01:00",
        {"link_fatal": False},
    ),
    (
        "NVRM: Xid (PCI:0009:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)",
        154,
        "0009:01:00",
        {"recovery_to": 4},
    ),
    (
        "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
        154,
        "0000:01:00",
        {"recovery_to": 2},
    ),
    # Older drivers: no "PCI:" and no pid/name.
    (
        "May 10 22:25:01 jambi kernel: [176830.774761] NVRM: Xid (0000:03:00): 13, 0003 00000000 00008297 00001098 00000000 00000044",
        13,
        "0000:03:00",
        {"pid": None},
    ),
    (
        "NVRM: Xid (0000:af:00): 48, pid='<unknown>', name=<unknown>, Ch 00000008",
        48,
        "0000:af:00",
        {"pid": "<unknown>"},
    ),
    # MIG compute instance (driver format string with both GPU-I and GPU-CI).
    (
        "NVRM: Xid (PCI:0000:01:00 GPU-I:05 GPU-CI:01): 13, pid=4242, name=python3, Graphics Exception: ESR 0x405840=0x0",
        13,
        "0000:01:00",
        {"gpu_instance": 5, "compute_instance": 1, "name": "python3"},
    ),
    # Fallen off the bus without an Xid line (reported as 79, bus_only).
    ("NVRM: GPU 0000:18:00.0: GPU has fallen off the bus.", 79, "0000:18:00", {"bus_only": True}),
    (
        "NVRM: The NVIDIA GPU 0000:05:00.0 installed in this system has fallen off the bus and is not responding to commands.",
        79,
        "0000:05:00",
        {"bus_only": True},
    ),
]

THREE_LINE_FALLEN_OFF = (
    "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0\n"
    "               NVRM: (PCI ID: 10de:26b5) installed in this system has\n"
    "               NVRM: fallen off the bus and is not responding to commands.\n"
)


def _driver_line(code: int, text: str) -> str:
    return f"NVRM: Xid (PCI:0000:3b:00): {code}, pid=4242, name=python3, {text}"


# code → (line, action label for one occurrence in a fresh job)
CODE_LINES: dict[int, tuple[str, str]] = {
    13: (_driver_line(13, "Graphics Exception: ESR 0x504648=0x10001"), "restart-app"),
    31: (REAL_LINES[7][0], "restart-app"),
    43: (_driver_line(43, "Ch 00000010"), "keep"),
    45: (_driver_line(45, "Ch 00000010"), "keep"),
    48: (REAL_LINES[13][0], "exclude"),
    61: (_driver_line(61, "PMU breakpoint (0x0)"), "drain"),
    62: (_driver_line(62, "PMU halt error (0x0)"), "exclude"),
    63: (REAL_LINES[3][0], "keep"),
    64: (_driver_line(64, "Row Remapper Error: failed to remap row"), "drain"),
    74: (_driver_line(74, "NVLink: fatal error detected on link 3(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)"), "exclude"),
    79: (REAL_LINES[2][0], "drain"),
    92: (_driver_line(92, "High single-bit ECC error rate"), "keep"),
    94: (REAL_LINES[4][0], "restart-app"),
    95: (REAL_LINES[6][0], "exclude"),
    119: (REAL_LINES[0][0], "exclude"),
    120: (_driver_line(120, "GSP task timeout @ pc:0x4a9a8e4, task: 1"), "exclude"),
    140: (_driver_line(140, "An uncorrectable ECC error detected (possible firmware handling failure)"), "drain"),
    143: (_driver_line(143, "GPU Initialization Failure"), "drain"),
    149: (REAL_LINES[8][0], "exclude"),
    154: (REAL_LINES[10][0], "reset-gpu"),
}

PREFIXES = [
    "",
    "[ 1843.308145] ",  # dmesg
    "[Sun Feb 23 16:24:18 2025] ",  # dmesg -T
    "May 10 22:25:01 gpu-node-07 kernel: ",  # syslog
    "May 10 22:25:01 gpu-node-07 kernel: [176830.774761] ",  # syslog with the kernel's own stamp
    "[  176830.774761] gpu-node-07 kernel: ",  # journalctl -o short-monotonic
    "2025-02-23T16:24:18.123456+00:00 gpu-node-07 kernel: ",  # rsyslog high-precision
    "<4>[ 1843.308145] ",  # dmesg -r (raw priority)
    "4,9921,93700000,-;",  # a /dev/kmsg record copied into a file
]
