"""`tools/xid_scan`: the node health scan as a Slurm Prolog/Epilog or by hand, and the exclude list.

    xid_scan [--kernel-log FILE] [--state-dir DIR] [--exclude-file FILE] [--append-node-record FILE]
             [--drain] ...
    xid_scan exclude {list,add,clear,render} --file FILE ...
    xid_scan --node-record FILE [--policy SPEC] [--clear NODE ...]

Slurm runs a Prolog or Epilog with no arguments and no PATH, so a site points `Prolog=`/`Epilog=`
at a two-line wrapper that execs this with its flags, e.g.

    #!/bin/sh
    exec /opt/resilient_slurm/tools/xid_scan --exclude-file /shared/exclude.json --drain

Context, node, job and restart count come from Slurm's environment (SLURM_SCRIPT_CONTEXT,
SLURMD_NODENAME, SLURM_JOB_ID, SLURM_JOB_RESTART_COUNT); flags override them.

stdout gets exactly one line, the verdict; notes (NVML missing, lost records, a failed drain)
go to stderr. Exit codes: 0 the node stays; 1 the node must go out; 2 usage or configuration
error; 3 the scan could not finish (unreadable log, watchdog expired): a failure, never a pass.
Under Slurm any non-zero exit drains the node, and a failing Prolog also requeues the job.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence

from resilient_slurm.files import utc_stamp
from resilient_slurm.health import exclude_list, node_record
from resilient_slurm.health.node_policy import KINDS, excluded, parse_limits
from resilient_slurm.health.log_sources import LogReadError
from resilient_slurm.health.nvml_checks import DEFAULT_MAX_TEMP_C
from resilient_slurm.health.scan import (
    CONTEXTS,
    DEFAULT_REPEAT_WINDOW_S,
    ScanRequest,
    context_from_env,
    node_from_env,
    restart_count_from_env,
    run_scan,
)
from resilient_slurm.health.verdict import Verdict
from resilient_slurm.health.xid_catalog import (
    CATALOG,
    Action,
    XidRow,
    parse_overrides,
    with_overrides,
)
from resilient_slurm.slurm.scontrol import DEFAULT_SCONTROL, drain_node

EXIT_OK, EXIT_NODE_OUT, EXIT_USAGE, EXIT_SCAN_FAILED = 0, 1, 2, 3
DEFAULT_STATE_DIR = "/var/lib/resilient_slurm/xid_scan"
"""State for Prolog/Epilog runs when neither --state-dir nor XID_SCAN_STATE_DIR names one."""
DEFAULT_TIMEOUT_S = 30.0


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Run the command line; returns the exit code. The scan's watchdog ends the process itself
    (exit 3) if the scan outlives --timeout-s."""
    args_in = list(sys.argv[1:] if argv is None else argv)
    env = os.environ if environ is None else environ
    if args_in[:1] == ["exclude"]:
        return _exclude_main(args_in[1:], time.time())
    if args_in[:1] == ["--node-record"] or any(a.startswith("--node-record=") for a in args_in[:1]):
        return _record_main(args_in, time.time())
    args = _scan_parser().parse_args(args_in)
    context = context_from_env(env) if args.context == "auto" else args.context
    node = args.node or node_from_env(env)
    if args.timeout_s <= 0:
        return _usage(node, f"--timeout-s must be positive, got {args.timeout_s:g}")
    watchdog = _Watchdog(args.timeout_s, node)
    try:
        return _scan(args, env, context, node, watchdog)
    finally:
        watchdog.cancel()


def _scan(args: argparse.Namespace, env: Mapping[str, str], context: str, node: str, watchdog: _Watchdog) -> int:
    try:
        request = _request(args, env, context, node)
        report = run_scan(request, time.time(), watchdog.set_stage)
    except ValueError as exc:  # a bad flag, override file, node name or job id
        return _usage(node, str(exc))
    except (LogReadError, OSError, TimeoutError) as exc:
        print(f"xid_scan {node}: scan failed: {exc}", flush=True)
        return EXIT_SCAN_FAILED
    except Exception as exc:  # a crash must read as "scan failed", not as exit 1 "node out"
        print(f"xid_scan {node}: scan failed: {type(exc).__name__}: {exc}", flush=True)
        return EXIT_SCAN_FAILED
    for note in report.notes:
        print(f"xid_scan {node}: {note}", file=sys.stderr)
    verdict = report.verdict
    if not verdict.ok:
        watchdog.set_stage("taking the node out")
        _take_out(verdict, request, args)
    print(verdict_line(node, verdict), flush=True)
    return EXIT_OK if verdict.ok else EXIT_NODE_OUT


def _request(args: argparse.Namespace, env: Mapping[str, str], context: str, node: str) -> ScanRequest:
    state_dir = args.state_dir or env.get("XID_SCAN_STATE_DIR") or None
    if state_dir is None and context in ("prolog", "epilog"):
        state_dir = DEFAULT_STATE_DIR
    return ScanRequest(
        context,
        node,
        job_id=args.job_id or env.get("SLURM_JOB_ID") or None,
        restart_count=restart_count_from_env(env) if args.restart_count is None else args.restart_count,
        kernel_log=args.kernel_log.replace("%n", node) if args.kernel_log else None,
        source=args.source,
        state_dir=state_dir,
        catalog=_catalog(args.catalog_overrides),
        expected_gpus=args.expect_gpus,
        max_temp_c=args.max_temp_c,
        use_nvml=not args.no_nvml,
        repeat_window_s=args.repeat_window_h * 3600.0,
    )


def verdict_line(node: str, verdict: Verdict) -> str:
    """The one line a Prolog/Epilog leaves: `xid_scan NODE: ok|node out (ACTION): REASON`."""
    status = "ok" if verdict.ok else "node out"
    return f"xid_scan {node}: {status} ({verdict.action.label}): {verdict.reason}"


def _take_out(verdict: Verdict, request: ScanRequest, args: argparse.Namespace) -> None:
    # Best effort: the exit code already takes the node out; these only add the exclude entry
    # and a precise drain reason, so their failures are notes, not a different verdict.
    if args.exclude_file and verdict.action >= Action.EXCLUDE:
        try:
            exclude_list.add(
                args.exclude_file,
                request.node,
                reason=verdict.reason,
                now=time.time(),
                xid=verdict.xid,
                job_id=request.job_id,
                ttl_s=args.exclude_ttl_h * 3600.0,
            )
        except (exclude_list.ExcludeListError, OSError, TimeoutError) as exc:
            print(f"xid_scan {request.node}: not added to the exclude list: {exc}", file=sys.stderr)
    if args.append_node_record:
        try:
            node_record.append(args.append_node_record, node_record.Mark(
                request.node, node_record.XID, time.time(), request.job_id,
                {"xid": verdict.xid, "action": verdict.action.label, "reason": verdict.reason}))
        except (OSError, TimeoutError) as exc:
            print(f"xid_scan {request.node}: not added to the node record: {exc}", file=sys.stderr)
    if args.drain:
        ok, message = drain_node(request.node, f"xid_scan: {verdict.reason}", args.scontrol)
        if not ok:
            print(f"xid_scan {request.node}: drain failed: {message}", file=sys.stderr)


def _catalog(overrides_path: str | None) -> Mapping[int, XidRow]:
    if overrides_path is None:
        return CATALOG
    try:
        with open(overrides_path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise ValueError(f"cannot read --catalog-overrides {overrides_path}: {exc.strerror}") from None
    fmt = "json" if overrides_path.endswith(".json") else "ini"
    return with_overrides(CATALOG, parse_overrides(text, fmt))


def _usage(node: str, message: str) -> int:
    print(f"xid_scan {node}: usage: {message}", flush=True)
    return EXIT_USAGE


class _Watchdog:
    """Ends the process with exit 3 and one line if the scan outlives its bound. A thread, not
    SIGALRM: a signal handler only runs between bytecodes, never during a hung C call (NVML)."""

    def __init__(self, timeout_s: float, node: str) -> None:
        self._timeout_s, self._node, self._stage = timeout_s, node, "starting"
        self._timer = threading.Timer(timeout_s, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def set_stage(self, stage: str) -> None:
        self._stage = stage

    def cancel(self) -> None:
        self._timer.cancel()

    def _expire(self) -> None:
        line = f"xid_scan {self._node}: scan failed: watchdog expired after {self._timeout_s:g} s while {self._stage}\n"
        os.write(1, line.encode())
        os._exit(EXIT_SCAN_FAILED)


def _scan_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="xid_scan",
        description="Judge this node's GPUs from the kernel log (Xid lines) and NVML; "
        "exit 0 if it stays in service, 1 if it must go out, 2 on usage errors, 3 if the scan failed.",
        epilog="Exclude list: xid_scan exclude {list,add,clear,render} --file FILE (see xid_scan exclude -h).",
    )
    p.add_argument("--kernel-log", metavar="FILE",
                   help="read this file instead of the system kernel log; %%n becomes the node name")
    p.add_argument(
        "--source",
        choices=("auto", "kmsg", "dmesg", "journal"),
        default="auto",
        help="system kernel log to read; auto: /dev/kmsg, else the journal if any, else dmesg",
    )
    p.add_argument(
        "--context",
        choices=("auto", *CONTEXTS),
        default="auto",
        help="auto: from SLURM_SCRIPT_CONTEXT (prolog/epilog), preflight inside a job, else manual",
    )
    p.add_argument(
        "--state-dir",
        metavar="DIR",
        help=f"per-node cursors and history (default: $XID_SCAN_STATE_DIR; {DEFAULT_STATE_DIR} as Prolog/Epilog)",
    )
    p.add_argument("--node", help="node name (default: $SLURMD_NODENAME, else the host name)")
    p.add_argument("--job-id", help="job id (default: $SLURM_JOB_ID)")
    p.add_argument("--restart-count", type=int, help="default: $SLURM_JOB_RESTART_COUNT or $SLURM_RESTART_COUNT")
    p.add_argument("--catalog-overrides", metavar="FILE", help='Xid → action: JSON {"63": "reset-gpu"} or INI [xid]')
    p.add_argument("--expect-gpus", type=int, metavar="N", help="fail if NVML sees fewer GPUs (or none)")
    p.add_argument("--max-temp-c", type=float, default=DEFAULT_MAX_TEMP_C, help="GPU temperature limit (%(default)s)")
    p.add_argument("--no-nvml", action="store_true", help="skip the NVML checks")
    p.add_argument(
        "--repeat-window-h",
        type=float,
        default=DEFAULT_REPEAT_WINDOW_S / 3600,
        help="how long an application Xid counts towards a repeat in another job (%(default)s h)",
    )
    p.add_argument("--exclude-file", metavar="FILE", help="add the node to this exclude list on exclude/drain")
    p.add_argument("--exclude-ttl-h", type=float, default=24.0, help="life of that entry (%(default)s h)")
    p.add_argument("--append-node-record", metavar="FILE",
                   help="when the node goes out, add the verdict to this node record (see xid_scan --node-record)")
    p.add_argument("--drain", action="store_true", help="also run scontrol drain with the reason")
    p.add_argument("--scontrol", default=DEFAULT_SCONTROL, help="scontrol to run for --drain (%(default)s)")
    p.add_argument("--node-record", metavar="FILE",
                   help="instead of a scan: print this node record (first argument; see --node-record -h)")
    p.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S, help="watchdog bound (%(default)s s)")
    return p


def _exclude_main(argv: list[str], now: float) -> int:
    p = argparse.ArgumentParser(prog="xid_scan exclude", description="Read and edit the run's exclude list.")
    sub = p.add_subparsers(dest="command", required=True)
    for name, text in (
        ("list", "show the active entries"),
        ("add", "add or replace a node's entry"),
        ("clear", "remove the named nodes, or every node"),
        ("render", "print the sbatch --exclude value"),
    ):
        cmd = sub.add_parser(name, help=text, description=text)
        cmd.add_argument("--file", required=True, metavar="FILE", help="the exclude list (JSON)")
        if name == "add":
            cmd.add_argument("node")
            cmd.add_argument("--reason", required=True)
            cmd.add_argument("--xid", type=int)
            cmd.add_argument("--job-id")
            cmd.add_argument("--ttl-h", type=float, default=exclude_list.DEFAULT_TTL_S / 3600)
        if name == "clear":
            cmd.add_argument("nodes", nargs="*", metavar="NODE")
    args = p.parse_args(argv)
    if args.command in ("list", "clear") and not os.path.exists(args.file):
        # `add` creates the file and `render` (for scripts) takes a missing one as empty; by hand, a
        # missing file is most likely a wrong path.
        print(f"xid_scan exclude: {args.file}: no such file; give the exclude list's path (cluster.exclude_file; "
              f"`xid_scan exclude add` creates it)", file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.command == "add":
            entry = exclude_list.add(
                args.file,
                args.node,
                reason=args.reason,
                now=now,
                xid=args.xid,
                job_id=args.job_id,
                ttl_s=args.ttl_h * 3600.0,
            )
            print(f"excluded {entry.node} until {utc_stamp(entry.expires_s)}")
        elif args.command == "clear":
            removed = exclude_list.clear(args.file, args.nodes or None, now)
            print(f"cleared {', '.join(removed)}" if removed else "nothing to clear")
        elif args.command == "render":
            print(exclude_list.exclude_value(exclude_list.load(args.file), now))
        else:
            for e in exclude_list.active(exclude_list.load(args.file), now):
                xid = "-" if e.xid is None else e.xid
                print(f"{e.node}\tuntil {utc_stamp(e.expires_s)}\txid {xid}\tjob {e.job_id or '-'}\t{e.reason}")
    except exclude_list.ExcludeListError as exc:
        print(f"xid_scan exclude: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (OSError, TimeoutError) as exc:
        print(f"xid_scan exclude: {args.file}: {exc}", file=sys.stderr)
        return EXIT_SCAN_FAILED
    return EXIT_OK


DEFAULT_POLICY = "window_h=168,xid=2,sdc=2,straggler=3,hang=3"
"""health.node_record_policy's defaults, spelled for the command line."""


def _record_main(argv: list[str], now: float) -> int:
    """Print the node record: per node, its marks by kind within the policy's window, its newest mark,
    and whether the policy keeps it out of new jobs; `--clear NODE` vouches for a repaired node."""
    p = argparse.ArgumentParser(prog="xid_scan --node-record", description="Print the cluster's node record.")
    p.add_argument("--node-record", required=True, metavar="FILE", help="the node record (JSON lines)")
    p.add_argument("--policy", default=DEFAULT_POLICY,
                   help="window_h=HOURS and KIND=COUNT that keep a node out (%(default)s)")
    p.add_argument("--clear", nargs="+", metavar="NODE", help="mark these nodes repaired: their marks stop counting")
    args = p.parse_args(argv)
    try:
        window_s, limits = parse_limits(args.policy)
        if args.clear:
            for node in args.clear:
                node_record.append(args.node_record, node_record.Mark(node, node_record.CLEARED, now))
        marks = node_record.read(args.node_record)
    except ValueError as exc:
        print(f"xid_scan --node-record: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (OSError, TimeoutError) as exc:
        print(f"xid_scan --node-record: {args.node_record}: {exc}", file=sys.stderr)
        return EXIT_SCAN_FAILED
    out = excluded(marks, window_s, limits, now)
    nodes = sorted({m.node for m in marks})
    if not nodes:
        print(f"{args.node_record}: no marks")
    for node in nodes:
        mine = [m for m in marks if m.node == node]
        since = max((m.at for m in mine if m.kind == node_record.CLEARED), default=float("-inf"))
        recent = [m for m in mine if m.at > since and now - window_s <= m.at <= now]
        counts = " ".join(f"{k} {sum(m.kind == k for m in recent)}" for k in KINDS if k != node_record.CLEARED)
        last = max(mine, key=lambda m: m.at)
        newest = f"{utc_stamp(last.at)} {last.kind}" + (f" (job {last.job_id})" if last.job_id else "")
        print(f"{node}\t{counts}\tnewest {newest}\t{'OUT: ' + out[node] if node in out else 'in'}")
    return EXIT_OK
