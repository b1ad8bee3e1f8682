"""One health scan of a node: read the kernel log since the right cursor, probe the GPUs, judge,
and record what was judged. Used by `tools/xid_scan` (Prolog, Epilog, by hand) and by the job's
`preflight`.

Where the kernel log is judged from, by context:

- prolog:    from the node cursor (what happened since the last scan, e.g. between jobs); then
             the node cursor and this run's cursor both move to the end of the log.
- epilog:    from this run's cursor (its Prolog on this node), else from the node cursor, so only
             this run's lines count; then the node cursor moves to the end, the run cursor goes.
- preflight: as prolog, with the job's own state directory and no run cursor; a kernel log the
             job's user may not read is skipped with a note rather than failing the node.
- manual:    from the node cursor when a state directory is given, else the whole log; the whole
             file with `kernel_log`. Never moves a cursor, so a look by hand hides nothing from
             the next Epilog.

With no cursor at all, the whole log is judged once. The history of repeat-counted Xids is kept
only for scans inside a job (see `verdict`).
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable, Mapping

from resilient_slurm.health.kernel_log import KernelLogParser, XidEvent
from resilient_slurm.health.log_sources import (
    Cursor,
    LogReadError,
    ReadResult,
    read_log,
)
from resilient_slurm.health.node_state import NodeState
from resilient_slurm.health.nvml_checks import (
    DEFAULT_MAX_TEMP_C,
    check_gpus,
    probe_gpus,
)
from resilient_slurm.health.verdict import (
    Finding,
    HistoryEntry,
    Verdict,
    check_xid_events,
    decide,
    remember,
)
from resilient_slurm.health.xid_catalog import CATALOG, Action, XidRow

CONTEXTS = ("prolog", "epilog", "preflight", "manual")
DEFAULT_REPEAT_WINDOW_S = 7 * 24 * 3600.0


@dataclasses.dataclass(frozen=True)
class ScanRequest:
    context: str
    """One of CONTEXTS; decides where the log is judged from and what is recorded."""
    node: str
    """The Slurm node name (SLURMD_NODENAME): it keys the node's state directory."""
    job_id: str | None = None
    restart_count: int = 0
    """SLURM_JOB_RESTART_COUNT: a requeued job keeps its id; its runs differ by this."""
    kernel_log: str | None = None
    """Read this file instead of the system's kernel log."""
    source: str = "auto"
    """"auto", "kmsg", "dmesg" or "journal" when `kernel_log` is None."""
    state_dir: str | None = None
    """Parent of the per-node state directories; None keeps no state."""
    catalog: Mapping[int, XidRow] = dataclasses.field(default_factory=lambda: CATALOG)
    expected_gpus: int | None = None
    max_temp_c: float = DEFAULT_MAX_TEMP_C
    use_nvml: bool = True
    repeat_window_s: float = DEFAULT_REPEAT_WINDOW_S

    def __post_init__(self) -> None:
        if self.context not in CONTEXTS:
            raise ValueError(f"context {self.context!r} is not one of {', '.join(CONTEXTS)}")


@dataclasses.dataclass(frozen=True)
class ScanReport:
    verdict: Verdict
    notes: tuple[str, ...]
    """One line each: what was skipped or worth knowing (NVML missing, records lost, ...)."""
    events: tuple[XidEvent, ...]
    read: ReadResult | None
    """None when the kernel log was skipped (preflight without permission)."""


def choose_start(
    context: str, node_cursor: Cursor | None, run_cursor: Cursor | None, whole_file: bool
) -> Cursor | None:
    """The cursor to judge the log from (None: the whole log); see the module docstring."""
    if whole_file:
        return None
    if context == "epilog" and run_cursor is not None:
        return run_cursor
    return node_cursor


def run_scan(request: ScanRequest, now: float, on_stage: Callable[[str], None] = lambda stage: None) -> ScanReport:
    """Scan once and record the cursors and history the context calls for. `on_stage` hears
    what the scan is about to do, for a watchdog's message. Raises LogReadError when the kernel
    log cannot be read (except in preflight) and OSError when the state directory is unusable."""
    req = request
    state = NodeState(req.state_dir, req.node) if req.state_dir is not None else None
    notes: list[str] = []
    on_stage(f"reading the kernel log ({req.kernel_log or req.source})")
    events, read = _read_events(req, _start(req, state), notes)

    gpu_findings: list[Finding] = []
    if req.use_nvml:
        on_stage("querying NVML")
        snapshot, why = probe_gpus()
        notes += [why] if why else []
        gpu_findings = check_gpus(snapshot, req.expected_gpus, req.max_temp_c)

    on_stage("judging and recording")
    if state is None:
        xid_findings = check_xid_events(events, req.catalog, (), req.job_id, now, req.repeat_window_s)
    else:
        with state.lock():
            history = state.history() if req.job_id is not None else []
            xid_findings = check_xid_events(events, req.catalog, history, req.job_id, now, req.repeat_window_s)
            if req.context != "manual":
                _record(state, req, read, events, history, now)
    return ScanReport(decide(xid_findings + gpu_findings), tuple(notes), events, read)


def _start(req: ScanRequest, state: NodeState | None) -> Cursor | None:
    if state is None:
        return None
    run_cursor = state.run_cursor(req.job_id, req.restart_count) if req.job_id is not None else None
    whole_file = req.context == "manual" and req.kernel_log is not None
    return choose_start(req.context, state.node_cursor(), run_cursor, whole_file)


def _read_events(
    req: ScanRequest, start: Cursor | None, notes: list[str]
) -> tuple[tuple[XidEvent, ...], ReadResult | None]:
    parser = KernelLogParser()
    try:
        read = read_log(req.source, start, parser.feed, req.kernel_log)
    except LogReadError as exc:
        if req.context != "preflight":
            raise
        notes.append(f"kernel log skipped: {exc}")
        return (), None
    if read.lost:
        notes.append(f"{read.lost} kernel-log records were overwritten before they could be read")
    return tuple(parser.events), read


def _record(
    state: NodeState,
    req: ScanRequest,
    read: ReadResult | None,
    events: tuple[XidEvent, ...],
    history: list[HistoryEntry],
    now: float,
) -> None:
    if read is not None:
        state.save_node_cursor(read.cursor)
        if req.context == "prolog" and req.job_id is not None:
            state.save_run_cursor(req.job_id, req.restart_count, read.cursor)
    if req.context == "epilog" and req.job_id is not None:
        state.drop_run_cursor(req.job_id, req.restart_count)
    if req.job_id is not None:
        state.save_history(remember(history, events, req.catalog, req.job_id, now, req.repeat_window_s))


def context_from_env(environ: Mapping[str, str]) -> str:
    """prolog/epilog from SLURM_SCRIPT_CONTEXT, preflight inside a job, manual otherwise."""
    script = environ.get("SLURM_SCRIPT_CONTEXT", "")
    if script.startswith("prolog"):
        return "prolog"
    if script.startswith("epilog"):
        return "epilog"
    return "preflight" if environ.get("SLURM_JOB_ID") else "manual"


def node_from_env(environ: Mapping[str, str]) -> str:
    return environ.get("SLURMD_NODENAME") or os.uname().nodename.split(".")[0]


def restart_count_from_env(environ: Mapping[str, str]) -> int:
    # The Prolog and Epilog see SLURM_JOB_RESTART_COUNT, the job's own tasks SLURM_RESTART_COUNT.
    raw = environ.get("SLURM_JOB_RESTART_COUNT") or environ.get("SLURM_RESTART_COUNT") or "0"
    return int(raw) if raw.isdigit() else 0


def preflight(
    *,
    state_dir: str | None,
    expected_gpus: int | None = None,
    kernel_log: str | None = None,
    catalog: Mapping[int, XidRow] = CATALOG,
    max_temp_c: float = DEFAULT_MAX_TEMP_C,
    timeout_s: float = 30.0,
    environ: Mapping[str, str] | None = None,
    now: float | None = None,
) -> ScanReport:
    """The job-side health check of the node it starts on, for sites without the Prolog/Epilog.

    Node, job and restart come from the Slurm environment. `state_dir` should be on storage
    the job can write (e.g. the run directory); its per-node cursor makes each preflight judge
    only what is new. A kernel log the job's user may not read is skipped with a note.
    Bounded by `timeout_s`: a scan that has not finished by then (a hung read or NVML call, left
    behind in a daemon thread) yields a verdict that excludes the node, never a pass.
    `report.verdict.ok` says whether to keep the node. Raises what the scan raised for a broken
    setup (an unusable `state_dir`, a bad node name): that is the job's fault, not the node's,
    and excluding the node would only move the fault to the next one.
    """
    env = os.environ if environ is None else environ
    request = ScanRequest(
        "preflight",
        node_from_env(env),
        job_id=env.get("SLURM_JOB_ID") or None,
        restart_count=restart_count_from_env(env),
        kernel_log=kernel_log,
        state_dir=state_dir,
        catalog=catalog,
        expected_gpus=expected_gpus,
        max_temp_c=max_temp_c,
    )
    outcome: list[ScanReport] = []
    failure: list[BaseException] = []
    stage = ["starting"]

    def work() -> None:
        try:
            outcome.append(run_scan(request, time.time() if now is None else now, stage.append))
        except BaseException as exc:  # handed to the caller's thread below
            failure.append(exc)

    worker = threading.Thread(target=work, name="xid-preflight", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if failure:
        raise failure[0]
    if outcome:
        return outcome[0]
    finding = Finding("preflight", Action.EXCLUDE, f"did not finish within {timeout_s:g} s while {stage[-1]}")
    return ScanReport(decide([finding]), (), (), None)
