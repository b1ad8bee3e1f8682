"""Readers of the kernel log: /dev/kmsg, `dmesg`, `journalctl -k`, or a file.

Each reader hands whole lines, in chunks, to a `sink` (the parser) and returns a `Cursor` at the
end of what it read. Given the cursor of an earlier read of the same log, it skips everything up
to it, so no line is judged twice. A cursor from another source, another boot or another file is
ignored and the whole log is read: when in doubt, judge more, never less.

Blocking: /dev/kmsg is read non-blocking and the commands run with a timeout; a file may block
(a FIFO with no writer, a hung mount), which the caller's watchdog must bound.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import stat
from collections.abc import Callable

SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""Where the log commands are looked up: a Prolog or Epilog gets no PATH."""

KMSG = "/dev/kmsg"
KMSG_READ_BYTES = 8192
"""One read returns one record and fails with EINVAL if the buffer is smaller than it; the kernel
formats records into 8 KiB (CONSOLE_EXT_LOG_MAX)."""
FILE_CHUNK_BYTES = 4 << 20
JOURNAL_DIRS = ("/run/log/journal", "/var/log/journal")
COMMAND_TIMEOUT_S = 20.0

Sink = Callable[[bytes], None]


class LogReadError(Exception):
    """The kernel log could not be read; the message names the source and the cause."""


@dataclasses.dataclass(frozen=True)
class Cursor:
    """Where a read of one kernel-log source ended."""

    source: str
    """"kmsg", "dmesg", "journal" or "file"."""
    identity: str
    """Which log: the boot id for kmsg, dmesg and journal; `realpath#inode` for a file."""
    position: int | str
    """kmsg: last sequence number; dmesg: last timestamp in µs since boot; journal: its cursor
    string ("" when it returned no entry); file: byte offset after the last whole line."""

    def to_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, raw: object) -> Cursor | None:
        """The cursor in `raw`, or None when `raw` is not one (a torn or foreign state file)."""
        if not isinstance(raw, dict):
            return None
        source, identity, position = raw.get("source"), raw.get("identity"), raw.get("position")
        if not (isinstance(source, str) and isinstance(identity, str) and isinstance(position, (int, str))):
            return None
        return cls(source, identity, position)


@dataclasses.dataclass(frozen=True)
class ReadResult:
    cursor: Cursor
    lost: int
    """Records that the ring buffer overwrote before they could be read (kmsg only)."""


def boot_id() -> str:
    with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
        return f.read().strip()


def _position(start: Cursor | None, source: str, identity: str) -> int | str | None:
    if start is None or start.source != source or start.identity != identity:
        return None
    return start.position


def read_file(path: str, start: Cursor | None, sink: Sink) -> ReadResult:
    """Lines of `path` after `start`. A file that shrank or was replaced is read from its start.
    A last line without its newline is handed on but left before the cursor, so it is read again
    once complete. Raises LogReadError when the file cannot be opened or read."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise LogReadError(f"cannot open kernel log {path}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        identity = f"{os.path.realpath(path)}#{info.st_ino}"
        offset = _position(start, "file", identity)
        if not (isinstance(offset, int) and stat.S_ISREG(info.st_mode) and 0 <= offset <= info.st_size):
            offset = 0
        if offset:
            os.lseek(fd, offset, os.SEEK_SET)
        total, since_newline, carry, skipping = 0, 0, b"", False
        while True:
            try:
                data = os.read(fd, FILE_CHUNK_BYTES)
            except OSError as exc:
                raise LogReadError(f"cannot read kernel log {path}: {exc.strerror}") from None
            if not data:
                break
            total += len(data)
            buf = carry + data if carry else data
            last_newline = buf.rfind(b"\n")
            if last_newline == -1:
                since_newline += len(data)
                # Hold the start of a line until its end arrives, unless it is already longer
                # than any kernel record: then drop it, and its rest when the end comes.
                skipping = skipping or len(buf) > FILE_CHUNK_BYTES
                carry = b"" if skipping else buf
                continue
            since_newline = len(buf) - last_newline - 1
            whole, carry = buf[: last_newline + 1], buf[last_newline + 1 :]
            if skipping:
                whole, skipping = whole[whole.find(b"\n") + 1 :], False
            sink(whole)
        if carry and not skipping:
            sink(carry)
    finally:
        os.close(fd)
    return ReadResult(Cursor("file", identity, offset + total - since_newline), 0)


def read_kmsg(start: Cursor | None, sink: Sink, path: str = KMSG) -> ReadResult:
    """Records of /dev/kmsg newer than `start`'s sequence number. Raises LogReadError when the
    device cannot be opened (no CAP_SYSLOG with dmesg_restrict=1, or no /dev/kmsg)."""
    identity = boot_id()
    after = _position(start, "kmsg", identity)
    after = after if isinstance(after, int) else -1
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise LogReadError(f"cannot open {path}: {exc.strerror}") from None
    lines: list[bytes] = []
    last, first, lost = after, None, 0
    try:
        while True:
            try:
                record = os.read(fd, KMSG_READ_BYTES)
            except BlockingIOError:
                break
            except BrokenPipeError:
                lost += 1  # overwritten while being read; the next read continues after it
                continue
            except OSError as exc:
                raise LogReadError(f"cannot read {path}: {exc.strerror}") from None
            if not record:
                break
            header, _, body = record.partition(b";")
            try:
                seq = int(header.split(b",")[1])
            except (IndexError, ValueError):
                continue
            if seq <= after:
                continue
            first = seq if first is None else first
            last = seq
            # Dictionary lines (" KEY=value") follow the text; a multi-line message arrives with
            # its newlines escaped, and the parser wants them back to join "fallen off the bus"
            # to the bus id two lines above.
            lines.append(body.split(b"\n", 1)[0].replace(b"\\x0a", b"\n"))
            if len(lines) >= 4096:
                sink(b"\n".join(lines) + b"\n")
                lines.clear()
    finally:
        os.close(fd)
    if lines:
        sink(b"\n".join(lines) + b"\n")
    if after >= 0 and first is not None and first > after + 1:
        lost += first - after - 1
    return ReadResult(Cursor("kmsg", identity, last), lost)


def read_dmesg(start: Cursor | None, sink: Sink, timeout_s: float = COMMAND_TIMEOUT_S) -> ReadResult:
    """Lines of `dmesg` stamped after `start`'s time since boot (lines without a stamp, the rest
    of a multi-line message, go with the line above). Raises LogReadError when dmesg fails."""
    identity = boot_id()
    after = _position(start, "dmesg", identity)
    after = after if isinstance(after, int) else -1
    out = _run(["dmesg"], timeout_s)
    stamp, kept = -1, []
    for line in out.splitlines():
        if line.startswith(b"["):
            with contextlib.suppress(ValueError):
                stamp = round(float(line[1 : line.find(b"]")]) * 1_000_000)
        if stamp > after:
            kept.append(line)
    if kept:
        sink(b"\n".join(kept) + b"\n")
    return ReadResult(Cursor("dmesg", identity, max(stamp, after)), 0)


def read_journal(start: Cursor | None, sink: Sink, timeout_s: float = COMMAND_TIMEOUT_S) -> ReadResult:
    """Kernel messages of this boot from the journal, after `start`'s journal cursor.
    Raises LogReadError when journalctl fails."""
    identity = boot_id()
    after = _position(start, "journal", identity)
    argv = ["journalctl", "-k", "-b", "--no-pager", "-o", "short-monotonic", "--show-cursor"]
    if isinstance(after, str) and after:
        argv.append(f"--after-cursor={after}")
    out = _run(argv, timeout_s)
    cursor = after if isinstance(after, str) else ""
    kept = []
    for line in out.splitlines():
        if line.startswith(b"-- cursor: "):
            cursor = line[len(b"-- cursor: ") :].decode("ascii", "replace").strip()
        elif not line.startswith(b"-- "):
            kept.append(line)
    if kept:
        sink(b"\n".join(kept) + b"\n")
    return ReadResult(Cursor("journal", identity, cursor), 0)


def journal_present() -> bool:
    """Whether this machine keeps a systemd journal (a non-empty journal directory)."""
    for directory in JOURNAL_DIRS:
        try:
            if os.listdir(directory):
                return True
        except OSError:
            continue
    return False


def read_log(source: str, start: Cursor | None, sink: Sink, kernel_log: str | None = None) -> ReadResult:
    """Read with the named source: "file" (needs `kernel_log`), "kmsg", "dmesg", "journal", or
    "auto": /dev/kmsg, else the journal where one exists, else dmesg."""
    if kernel_log is not None:
        return read_file(kernel_log, start, sink)
    if source == "kmsg":
        return read_kmsg(start, sink)
    if source == "dmesg":
        return read_dmesg(start, sink)
    if source == "journal":
        return read_journal(start, sink)
    if source != "auto":
        raise ValueError(f"unknown kernel-log source {source!r}")
    failures = []
    readers: list[Callable[[Cursor | None, Sink], ReadResult]] = [read_kmsg]
    readers += [read_journal] if journal_present() else []
    readers.append(read_dmesg)
    for reader in readers:
        try:
            return reader(start, sink)
        except LogReadError as exc:
            failures.append(str(exc))
    raise LogReadError("; ".join(failures))


def _run(argv: list[str], timeout_s: float) -> bytes:
    # Imported here: subprocess costs start-up time that the common /dev/kmsg path never needs.
    import subprocess

    program = _which(argv[0])
    if program is None:
        raise LogReadError(f"{argv[0]} not found in {SAFE_PATH}")
    try:
        done = subprocess.run(
            [program, *argv[1:]],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout_s,
            env={"PATH": SAFE_PATH, "LC_ALL": "C"},
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise LogReadError(f"{argv[0]} did not finish within {timeout_s:g} s") from None
    except OSError as exc:
        raise LogReadError(f"cannot run {program}: {exc.strerror}") from None
    if done.returncode != 0:
        why = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise LogReadError(f"{argv[0]} exited {done.returncode}: {why[0] if why else 'no message'}")
    return done.stdout


def _which(name: str) -> str | None:
    for directory in SAFE_PATH.split(":"):
        candidate = os.path.join(directory, name)
        if os.access(candidate, os.X_OK):
            return candidate
    return None
