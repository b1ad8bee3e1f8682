"""Benchmark of `tools/xid_scan`: scan rate over a large kernel log, and start-up time.

    python3 bench/xid_scan.py [--size-mb 100] [--runs 21] [--dir DIR]

Writes a kernel log of --size-mb (dmesg format: mostly ordinary kernel lines, some non-Xid NVRM
lines, one Xid line in about 20,000), then prints one table:
- the scan rate (MB/s, lines/s) of the library's reader+parser in this process, and of the whole
  command (`--kernel-log FILE --no-nvml`) under each interpreter;
- the start-up time (median of --runs) of `--help` and of a scan of an empty file under each
  interpreter, and through the shebang with an empty environment, which is how slurmd starts a
  Prolog (no PATH: `/usr/bin/env` finds /usr/bin/python3).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from resilient_slurm.health.kernel_log import KernelLogParser  # noqa: E402
from resilient_slurm.health.log_sources import read_file  # noqa: E402

TOOL = os.path.join(REPO, "tools", "xid_scan")
ORDINARY = [
    "EXT4-fs (nvme0n1p2): mounted filesystem with ordered data mode. Quota mode: none.",
    "usb 1-1: new high-speed USB device number 2 using xhci_hcd",
    "mlx5_core 0000:0c:00.0: mlx5_pcie_event:301:(pid 1053): PCIe slot advertised sufficient power (75W).",
    "IPv6: ADDRCONF(NETDEV_CHANGE): ib0: link becomes ready",
    'audit: type=1400 audit(1700000000.123:42): apparmor="STATUS" operation="profile_load" name="slurmd"',
    "Memory cgroup out of memory: Killed process 4242 (python3) total-vm:123456kB, anon-rss:65536kB",
    "nvidia-nvswitch0: open (major=511)",
    "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024",
    "NVRM: GPU at PCI:0000:3b:00: GPU-5f8c1a6e-0a4c-2b7e-9d3f-6c1e2a7b8d90",
    "nvidia-uvm: Loaded the UVM driver, major device number 505.",
]
XID_LINES = [
    "NVRM: Xid (PCI:0000:3b:00): 13, pid=4242, name=python3, Graphics Exception: ESR 0x504648=0x10001",
    "NVRM: Xid (PCI:0000:5e:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
    "NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). RST: No, D-RST: No",
]


def write_log(path: str, size_mb: int) -> int:
    """A dmesg-format log of at least `size_mb` MiB; returns its line count."""
    rng = random.Random(0)
    target, written, lines, stamp = size_mb << 20, 0, 0, 0.0
    with open(path, "w", encoding="ascii") as f:
        while written < target:
            block = []
            for _ in range(20_000):
                stamp += rng.random() / 100
                block.append(f"[{stamp:12.6f}] {rng.choice(ORDINARY)}\n")
            block[rng.randrange(len(block))] = f"[{stamp:12.6f}] {rng.choice(XID_LINES)}\n"
            text = "".join(block)
            f.write(text)
            written += len(text)
            lines += len(block)
    return lines


def time_in_process(path: str) -> tuple[float, int]:
    """Seconds to read and parse `path`, and the number of Xid events found."""
    parser = KernelLogParser()
    started = time.perf_counter()
    read_file(path, None, parser.feed)
    return time.perf_counter() - started, len(parser.events)


def median_s(argv: list[str], runs: int, env: dict[str, str] | None = None) -> float:
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(argv, capture_output=True, env=env, check=False)
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mb", type=int, default=100)
    p.add_argument("--runs", type=int, default=21)
    p.add_argument("--dir", default=None, help="where to write the log (default: a temporary directory)")
    args = p.parse_args()
    interpreters = [sys.executable] + (["/usr/bin/python3"] if os.path.exists("/usr/bin/python3") else [])

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        big, empty = os.path.join(tmp, "kern.log"), os.path.join(tmp, "empty.log")
        open(empty, "w").close()
        lines = write_log(big, args.size_mb)
        size = os.path.getsize(big)
        mb = size / 1e6
        rows = []
        timings = [time_in_process(big) for _ in range(3)]
        in_process = min(t for t, _ in timings)
        if timings[0][1] != lines // 20_000:
            raise SystemExit(f"parser found {timings[0][1]} Xid events, the log has {lines // 20_000}")
        rows.append(
            (
                "scan, in process (read_file + parser), best of 3",
                f"{mb / in_process:8.0f} MB/s",
                f"{lines / in_process:12,.0f} lines/s",
            )
        )
        for python in interpreters:
            argv = [python, "-I", TOOL, "--kernel-log", big, "--no-nvml", "--node", "bench"]
            elapsed = median_s(argv, 3)
            rows.append(
                (
                    f"scan, whole command, {python}, median of 3",
                    f"{mb / elapsed:8.0f} MB/s",
                    f"{lines / elapsed:12,.0f} lines/s",
                )
            )
        for python in interpreters:
            help_s = median_s([python, "-I", TOOL, "--help"], args.runs)
            rows.append((f"start-up, --help, {python}", f"{help_s * 1000:8.1f} ms", f"median of {args.runs}"))
            scan_s = median_s([python, "-I", TOOL, "--kernel-log", empty, "--node", "bench"], args.runs)
            rows.append(
                (
                    f"start-up, empty-file scan with NVML probe, {python}",
                    f"{scan_s * 1000:8.1f} ms",
                    f"median of {args.runs}",
                )
            )
        prolog_s = median_s([TOOL, "--kernel-log", empty, "--node", "bench"], args.runs, env={})
        rows.append(
            (
                "start-up, empty-file scan via shebang, empty environment",
                f"{prolog_s * 1000:8.1f} ms",
                f"median of {args.runs}",
            )
        )

    print(f"kernel log: {size / (1 << 20):.0f} MiB, {lines:,} lines, dmesg format, 1 Xid line in 20,000")
    width = max(len(r[0]) for r in rows)
    print(f"{'measurement':{width}}  {'value':>13}  note")
    for name, value, note in rows:
        print(f"{name:{width}}  {value:>13}  {note}")


if __name__ == "__main__":
    main()
