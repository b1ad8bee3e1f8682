"""NHC style: the facts (parsed events, GPU findings, history) are injected, the judge is called."""

from __future__ import annotations

import pytest
from xid_corpus import CODE_LINES

from resilient_slurm.health.kernel_log import XidEvent, parse_line
from resilient_slurm.health.verdict import (
    HISTORY_LIMIT,
    Finding,
    HistoryEntry,
    check_xid_events,
    decide,
    event_action,
    remember,
)
from resilient_slurm.health.xid_catalog import CATALOG, Action, with_overrides

WEEK_S = 7 * 24 * 3600.0
NOW = 1_800_000_000.0


def judge(lines: list[str], history: list[HistoryEntry] = [], job: str | None = "100", catalog=CATALOG):  # noqa: B006
    events = [e for e in (parse_line(line) for line in lines) if e is not None]
    return decide(check_xid_events(events, catalog, history, job, NOW, WEEK_S))


@pytest.mark.parametrize("code", sorted(CODE_LINES))
def test_each_catalog_code_gets_its_action(code: int) -> None:
    line, label = CODE_LINES[code]
    verdict = judge([line])
    assert verdict.action.label == label
    assert verdict.ok == (label in ("keep", "restart-app"))
    assert verdict.xid == code


@pytest.mark.parametrize(
    ("line", "action"),
    [
        (
            "NVRM: Xid (PCI:0000:01:00): 94, pid=1, Contained: CE User Channel (0x9). RST: Yes, D-RST: No",
            Action.RESET_GPU,
        ),
        (
            "NVRM: Xid (PCI:0000:01:00): 94, pid=1, Contained: CE User Channel (0x9). RST: No, D-RST: Yes",
            Action.RESET_GPU,
        ),
        (
            "NVRM: Xid (PCI:0000:01:00): 94, pid=1, Contained: CE User Channel (0x9). RST: No, D-RST: No",
            Action.RESTART_APP,
        ),
        ("NVRM: Xid (PCI:0000:01:00): 95, pid=1, Uncontained: LTC TAG (0x2, 0x1). RST: Yes, D-RST: No", Action.EXCLUDE),
        ("NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x0 (None)", Action.KEEP),
        (
            "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (PF FLR)",
            Action.RESET_GPU,
        ),
        (
            "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (OS Reboot)",
            Action.DRAIN,
        ),
        ("NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x9 (Future)", Action.DRAIN),
        ("NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action text this parser cannot read", Action.KEEP),
        ("NVRM: Xid (PCI:0018:01:00): 149, NETIR_BER_EVENT Nonfatal XC0 i0 Link 03 (0x1)", Action.KEEP),
        ("NVRM: Xid (PCI:0018:01:00): 149, NETIR/NETIR_INT Fatal XC0 i0 Link 00 (0x18)", Action.EXCLUDE),
        ("NVRM: Xid (PCI:0018:01:00): 149, NETIR_NEW_THING XC0 i0 Link 00 (0x18)", Action.EXCLUDE),
    ],
)
def test_decoded_detail_refines_the_row(line: str, action: Action) -> None:
    assert judge([line]).action is action


def test_fallen_off_without_xid_drains() -> None:
    verdict = judge(["NVRM: GPU 0000:18:00.0: GPU has fallen off the bus."])
    assert verdict.action is Action.DRAIN and "fallen off the bus (no Xid line)" in verdict.reason


def test_worst_finding_decides_and_the_reason_is_one_line() -> None:
    verdict = judge([CODE_LINES[13][0], CODE_LINES[79][0], CODE_LINES[13][0], CODE_LINES[63][0]])
    assert verdict.action is Action.DRAIN
    assert verdict.reason.startswith("check_xid: Xid 79 GPU_HAS_FALLEN_OFF_THE_BUS on 0000:05:00 x1")
    assert verdict.reason.endswith("(+2 more)") and "\n" not in verdict.reason
    assert [f.xid for f in verdict.findings] == [79, 13, 63]
    assert "x2" in verdict.findings[1].detail


def test_no_events_is_healthy() -> None:
    verdict = judge([])
    assert verdict.ok and verdict.action is Action.KEEP and verdict.xid is None


XID13 = CODE_LINES[13][0]  # on 0000:3b:00


@pytest.mark.parametrize(
    ("history", "job", "action"),
    [
        ([HistoryEntry(13, "0000:3b:00", "99", NOW - 3600)], "100", Action.EXCLUDE),  # another job, same GPU
        ([HistoryEntry(13, "0000:3b:00", "100", NOW - 3600)], "100", Action.RESTART_APP),  # same job, requeued
        ([HistoryEntry(13, "0000:5e:00", "99", NOW - 3600)], "100", Action.RESTART_APP),  # another GPU
        ([HistoryEntry(31, "0000:3b:00", "99", NOW - 3600)], "100", Action.RESTART_APP),  # another Xid
        ([HistoryEntry(13, "0000:3b:00", "99", NOW - WEEK_S - 1)], "100", Action.RESTART_APP),  # too old
        ([HistoryEntry(13, "0000:3b:00", "99", NOW - 3600)], None, Action.RESTART_APP),  # no job to differ from
    ],
)
def test_application_xid_repeat_across_jobs(history: list[HistoryEntry], job: str | None, action: Action) -> None:
    verdict = judge([XID13], history, job)
    assert verdict.action is action
    if action is Action.EXCLUDE:
        assert "same GPU in job 99 within 168 h" in verdict.reason


def test_repeat_of_a_hardware_xid_escalates_to_drain() -> None:
    history = [HistoryEntry(48, "0000:af:00", "7", NOW - 60)]
    assert judge([CODE_LINES[48][0]], history).action is Action.DRAIN


def test_site_override_changes_the_action() -> None:
    catalog = with_overrides(CATALOG, {63: Action.RESET_GPU})
    assert judge([CODE_LINES[63][0]], catalog=catalog).action is Action.RESET_GPU


def test_remember_keeps_repeat_counted_xids_per_job_within_the_window() -> None:
    events = [parse_line(CODE_LINES[c][0]) for c in (13, 13, 79, 63)]
    old = [HistoryEntry(31, "0000:3b:00", "1", NOW - WEEK_S - 5), HistoryEntry(13, "0000:3b:00", "2", NOW - 50)]
    history = remember(old, [e for e in events if e], CATALOG, "3", NOW, WEEK_S)
    assert {(h.xid, h.gpu, h.job) for h in history} == {
        (13, "0000:3b:00", "2"),
        (13, "0000:3b:00", "3"),
        (63, "0000:10:1c", "3"),
    }
    assert [h.time_s for h in history] == sorted(h.time_s for h in history)


def test_remember_is_bounded() -> None:
    many = [HistoryEntry(13, "0000:3b:00", str(i), NOW - i) for i in range(HISTORY_LIMIT + 50)]
    assert len(remember(many, [], CATALOG, "x", NOW, WEEK_S)) == HISTORY_LIMIT


def test_event_action_only_raises_where_the_row_does_not_defer_to_detail() -> None:
    rst = XidEvent(95, "", "", rst=False)
    assert event_action(rst, CATALOG[95]) is Action.EXCLUDE


def test_gpu_findings_join_xid_findings_in_one_verdict() -> None:
    gpu = Finding("check_gpu_row_remap", Action.RESET_GPU, "GPU 0 (0000:3b:00) has a row remap pending")
    xid = check_xid_events([parse_line(CODE_LINES[63][0])], CATALOG, [], "1", NOW, WEEK_S)  # type: ignore[list-item]
    verdict = decide([*xid, gpu])
    assert verdict.action is Action.RESET_GPU and verdict.reason.startswith("check_gpu_row_remap:")
    assert verdict.xid is None
