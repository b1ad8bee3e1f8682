"""The one place that runs `scontrol` (and `scancel`): requeue, excluded nodes, drain, node addresses
and states, job states, cancelling. Never raises.

Standard library only: `tools/xid_scan` drains nodes through this module from a bare Prolog.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

DEFAULT_SCONTROL = "/usr/bin/scontrol"
"""Absolute: Prologs and Epilogs run without PATH; jobs use it too, so both see the same binary."""
DEFAULT_SCANCEL = "/usr/bin/scancel"
SCONTROL_TIMEOUT_S = 30.0
OUT_OF_SERVICE = ("DOWN", "DRAIN", "FAIL")
"""Node state words (and their -ING/-ED forms) of a node that takes no work until someone returns it."""
REASON_MAX_CHARS = 200


def scontrol(*args: str, binary: str = DEFAULT_SCONTROL, timeout_s: float = SCONTROL_TIMEOUT_S) -> tuple[bool, str]:
    """Run `scontrol ARGS`; (ok, stdout or a one-line reason). Never raises."""
    # Imported here: subprocess costs start-up time that a healthy xid_scan never needs.
    import signal
    import subprocess

    # A job that requeues itself is sent SIGTERM, every process of it, right away; the command that
    # follows (ExcNodeList of the now pending job) must still finish. The child inherits this
    # thread's signal mask (blocked here, around the fork, rather than in a preexec_fn, which is
    # unsafe in a process with threads); the timeout and Slurm's SIGKILL after KillWait bound it.
    # A SIGTERM meant for this process stays pending until the mask is restored, then is handled.
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    try:
        done = subprocess.run(
            [binary, *args], stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout_s, check=False,
            # Keep the caller's environment: SLURM_CONF tells scontrol which cluster it is on.
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", **os.environ},
        )
    except subprocess.TimeoutExpired:
        return False, f"{binary} {args[0]} did not finish within {timeout_s:g} s"
    except OSError as exc:
        return False, f"cannot run {binary}: {exc.strerror}"
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    if done.returncode != 0:
        why = done.stderr.decode("utf-8", "replace").strip().splitlines()
        return False, f"{binary} {args[0]} exited {done.returncode}: {why[0] if why else 'no message'}"
    return True, done.stdout.decode("utf-8", "replace")


def requeue(job_id: str) -> tuple[bool, str]:
    """Put the job back in the queue under the same id (its tasks are signalled and end)."""
    return scontrol("requeue", job_id)


def set_excluded_nodes(job_id: str, nodes: list[str]) -> tuple[bool, str]:
    """ExcNodeList of a pending job (Slurm refuses it for a running one)."""
    return scontrol("update", f"jobid={job_id}", f"ExcNodeList={','.join(nodes)}")


def drain_node(node: str, reason: str, binary: str = DEFAULT_SCONTROL) -> tuple[bool, str]:
    """`scontrol update nodename=NODE state=drain reason=REASON`."""
    reason = " ".join(reason.split())[:REASON_MAX_CHARS]
    ok, out = scontrol("update", f"nodename={node}", "state=drain", f"reason={reason}", binary=binary, timeout_s=10.0)
    return ok, f"drained {node}" if ok else out


def node_address(node: str) -> str:
    """NodeAddr of a node, from Slurm rather than DNS (node names need not resolve)."""
    ok, out = scontrol("show", "node", node)
    m = re.search(r"\bNodeAddr=(\S+)", out) if ok else None
    return m.group(1) if m else node


def node_states(nodes: Sequence[str]) -> tuple[dict[str, str], str | None]:
    """({node: State}, None) of these nodes (`IDLE`, `ALLOCATED+DRAIN`, `DOWN*+DRAIN`, ...), or
    ({}, why scontrol could not answer)."""
    ok, out = scontrol("show", "node", "--oneliner", ",".join(nodes))
    return (parse_node_states(out), None) if ok else ({}, out)


def parse_node_states(text: str) -> dict[str, str]:
    """{node: State} from `scontrol show node --oneliner` (one node a line; some values hold spaces)."""
    found = {}
    for line in text.splitlines():
        name, state = re.search(r"\bNodeName=(\S+)", line), re.search(r"\bState=(\S+)", line)
        if name and state:
            found[name.group(1)] = state.group(1)
    return found


def in_service(state: str) -> bool:
    """A node in this State takes work: it answers (no `*`) and is not down, drained or failed."""
    words = state.replace("*", "+*").split("+")
    return not any(w == "*" or w.startswith(OUT_OF_SERVICE) for w in words)


def job_state(job_id: str) -> tuple[bool, str]:
    """(ok, JobState) of a job: PENDING, RUNNING, COMPLETED, ...; GONE once Slurm forgot it (MinJobAge
    after it ended). Not ok when scontrol could not answer: the state is unknown, not ended."""
    ok, out = scontrol("show", "job", "--oneliner", job_id)
    if not ok:
        return (True, "GONE") if "Invalid job id" in out else (False, out)
    m = re.search(r"\bJobState=(\S+)", out)
    return (True, m.group(1)) if m else (False, f"no JobState for job {job_id}")


def jobs_named(name: str) -> tuple[bool, dict[str, str]]:
    """(ok, {job id: JobState}) of the jobs Slurm knows by this name."""
    ok, out = scontrol("show", "job", "--oneliner")
    if not ok:
        return (True, {}) if "No jobs in the system" in out else (False, {})
    found = {}
    for line in out.splitlines():
        fields = dict(item.partition("=")[::2] for item in line.split())
        if fields.get("JobName") == name and "JobId" in fields:
            found[fields["JobId"]] = fields.get("JobState", "")
    return True, found


def cancel(job_id: str) -> tuple[bool, str]:
    """`scancel JOB`: the job's tasks get SIGTERM (an emergency save), then SIGKILL after KillWait."""
    return scontrol(job_id, binary=DEFAULT_SCANCEL)


def kill_step(job_id: str, step_id: int) -> tuple[bool, str]:
    """SIGKILL to every task of one job step: a driver ends a failed step at once, so no rank stays
    behind in a collective or on a GPU."""
    return scontrol("--signal=KILL", f"{job_id}.{step_id}", binary=DEFAULT_SCANCEL)

