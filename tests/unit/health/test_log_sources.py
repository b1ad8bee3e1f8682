from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from resilient_slurm.health import log_sources
from resilient_slurm.health.log_sources import (
    Cursor,
    LogReadError,
    boot_id,
    read_dmesg,
    read_file,
    read_journal,
    read_kmsg,
    read_log,
)


class Collect:
    def __init__(self) -> None:
        self.chunks: list[bytes] = []

    def __call__(self, chunk: bytes) -> None:
        self.chunks.append(chunk)

    @property
    def lines(self) -> list[bytes]:
        return b"".join(self.chunks).splitlines()


def test_file_read_then_only_appended_lines(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_bytes(b"old 1\nold 2\n")
    first = read_file(str(log), None, seen := Collect())
    assert seen.lines == [b"old 1", b"old 2"]
    assert first.cursor.position == 12 and first.cursor.source == "file"
    with log.open("ab") as f:
        f.write(b"new 3\n")
    second = read_file(str(log), first.cursor, seen := Collect())
    assert seen.lines == [b"new 3"] and second.cursor.position == 18
    third = read_file(str(log), second.cursor, seen := Collect())
    assert seen.lines == [] and third.cursor == second.cursor


def test_a_partial_last_line_is_judged_but_read_again_when_complete(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_bytes(b"whole\nhalf a li")
    first = read_file(str(log), None, seen := Collect())
    assert seen.lines == [b"whole", b"half a li"] and first.cursor.position == 6
    with log.open("ab") as f:
        f.write(b"ne\n")
    read_file(str(log), first.cursor, seen := Collect())
    assert seen.lines == [b"half a line"]


def test_truncated_or_replaced_file_is_read_from_its_start(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_bytes(b"a\nb\nc\n")
    cursor = read_file(str(log), None, Collect()).cursor
    log.write_bytes(b"x\n")  # truncated in place: shorter than the cursor
    read_file(str(log), cursor, seen := Collect())
    assert seen.lines == [b"x"]
    replacement = tmp_path / "new.log"
    replacement.write_bytes(b"a\nb\nc\nd\n")
    cursor = read_file(str(log), None, Collect()).cursor
    os.replace(replacement, log)  # rotated: a new inode at the same path
    read_file(str(log), cursor, seen := Collect())
    assert seen.lines == [b"a", b"b", b"c", b"d"]


def test_a_cursor_from_another_source_is_ignored(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_bytes(b"a\nb\n")
    read_file(str(log), Cursor("kmsg", boot_id(), 1), seen := Collect())
    assert seen.lines == [b"a", b"b"]


def test_a_line_longer_than_a_chunk_is_dropped_and_the_cursor_stays_right(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(log_sources, "FILE_CHUNK_BYTES", 64)
    log = tmp_path / "kern.log"
    data = b"short\n" + b"y" * 1000 + b"\nafter\n" + b"z" * 500
    log.write_bytes(data)
    result = read_file(str(log), None, seen := Collect())
    assert seen.lines == [b"short", b"after"]
    assert result.cursor.position == len(data) - 500


def test_a_missing_file_is_a_read_error(tmp_path: Path) -> None:
    with pytest.raises(LogReadError, match=r"cannot open kernel log .*missing\.log: No such file"):
        read_file(str(tmp_path / "missing.log"), None, Collect())


def _kmsg_usable() -> bool:
    return os.access(log_sources.KMSG, os.R_OK | os.W_OK)


def _log_marker(text: bytes) -> None:
    # A trailing newline finalises the record at once; without it the kernel holds the record
    # back for a continuation and readers do not see it yet.
    fd = os.open(log_sources.KMSG, os.O_WRONLY)
    try:
        os.write(fd, text + b"\n")
    finally:
        os.close(fd)


@pytest.mark.skipif(not _kmsg_usable(), reason="needs read and write access to /dev/kmsg (root)")
def test_kmsg_cursor_skips_what_was_read_before() -> None:
    before = read_kmsg(None, seen := Collect())
    assert before.cursor.identity == boot_id() and seen.lines
    marker = f"resilient_slurm-test {uuid.uuid4()}".encode()
    _log_marker(marker + b" first\nsecond")
    after = read_kmsg(before.cursor, seen := Collect())
    # The multi-line record arrives escaped (\x0a); the reader gives back its lines.
    assert seen.lines[-2:] == [marker + b" first", b"second"]
    assert after.cursor.position > before.cursor.position and after.lost == 0
    read_kmsg(after.cursor, seen := Collect())
    assert marker + b" first" not in seen.lines


@pytest.mark.skipif(not _kmsg_usable(), reason="needs read and write access to /dev/kmsg (root)")
def test_kmsg_reports_records_lost_to_the_ring_buffer() -> None:
    fd = os.open(log_sources.KMSG, os.O_RDONLY | os.O_NONBLOCK)
    try:
        first_seq = int(os.read(fd, log_sources.KMSG_READ_BYTES).split(b",")[1])
    finally:
        os.close(fd)
    if first_seq < 10:
        pytest.skip("the ring buffer has not wrapped on this machine")
    gap = read_kmsg(Cursor("kmsg", boot_id(), first_seq - 10), Collect())
    assert gap.lost == 9


@pytest.mark.skipif(not _kmsg_usable(), reason="needs read and write access to /dev/kmsg (root)")
def test_dmesg_cursor_is_the_time_since_boot() -> None:
    before = read_dmesg(None, Collect())
    marker = f"resilient_slurm-test {uuid.uuid4()}".encode()
    _log_marker(marker)
    read_dmesg(before.cursor, seen := Collect())
    assert any(marker in line for line in seen.lines)
    assert all(line.startswith(b"[") for line in seen.lines)


def test_journal_without_journal_files_is_a_read_error() -> None:
    if log_sources.journal_present():
        pytest.skip("this machine keeps a journal")
    with pytest.raises(LogReadError, match="journalctl exited 1"):
        read_journal(None, Collect())


def test_journal_output_and_cursor(tmp_path: Path, monkeypatch) -> None:
    # This machine runs no journald, so `journalctl -k` cannot return entries here. A stand-in
    # prints journalctl's real `-o short-monotonic --show-cursor` output and records its argv.
    fake = tmp_path / "journalctl"
    fake.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {tmp_path}/argv\n'
        "echo '[  176830.774761] gpu-node-07 kernel: NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.'\n"
        "echo '-- cursor: s=4bd6;i=2a1;b=f467;m=2a2f;t=5f1;x=9c1'\n"
    )
    fake.chmod(0o755)
    monkeypatch.setattr(log_sources, "SAFE_PATH", str(tmp_path))
    first = read_journal(None, seen := Collect())
    assert seen.lines == [
        b"[  176830.774761] gpu-node-07 kernel: NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."
    ]
    assert first.cursor == Cursor("journal", boot_id(), "s=4bd6;i=2a1;b=f467;m=2a2f;t=5f1;x=9c1")
    read_journal(first.cursor, Collect())
    calls = (tmp_path / "argv").read_text().splitlines()
    assert calls[0] == "-k -b --no-pager -o short-monotonic --show-cursor"
    assert calls[1].endswith("--after-cursor=s=4bd6;i=2a1;b=f467;m=2a2f;t=5f1;x=9c1")


def test_a_hanging_command_is_bounded(tmp_path: Path, monkeypatch) -> None:
    fake = tmp_path / "dmesg"
    fake.write_text("#!/bin/sh\nexec /bin/sleep 30\n")
    fake.chmod(0o755)
    monkeypatch.setattr(log_sources, "SAFE_PATH", str(tmp_path))
    with pytest.raises(LogReadError, match=r"dmesg did not finish within 0\.5 s"):
        read_dmesg(None, Collect(), timeout_s=0.5)


@pytest.mark.skipif(not _kmsg_usable(), reason="needs read access to /dev/kmsg (root)")
def test_auto_prefers_kmsg() -> None:
    assert read_log("auto", None, Collect()).cursor.source == "kmsg"


def test_auto_falls_back_and_names_every_failure(monkeypatch) -> None:
    monkeypatch.setattr(log_sources, "KMSG", "/nonexistent/kmsg")
    monkeypatch.setattr(log_sources, "SAFE_PATH", "/nonexistent")
    monkeypatch.setattr(log_sources, "journal_present", lambda: True)
    monkeypatch.setattr(log_sources.read_kmsg, "__defaults__", ("/nonexistent/kmsg",))
    with pytest.raises(LogReadError) as failure:
        read_log("auto", None, Collect())
    assert str(failure.value) == (
        "cannot open /nonexistent/kmsg: No such file or directory; "
        "journalctl not found in /nonexistent; dmesg not found in /nonexistent"
    )
