"""Slurm: what a task learns from its environment, how a job is described to sbatch, and the one
place that runs `scontrol` (requeue, excluded nodes, drain, node addresses).

Standard library only: `tools/xid_scan` drains nodes through this module from a bare Prolog.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

DEFAULT_SCONTROL = "/usr/bin/scontrol"
"""Absolute: Prologs and Epilogs run without PATH; jobs use it too, so both see the same binary."""
SCONTROL_TIMEOUT_S = 30.0
REASON_MAX_CHARS = 200


@dataclass(frozen=True)
class SlurmEnv:
    """What a task of a running Slurm job knows about itself, from its environment."""

    job_id: str
    restart_count: int
    """SLURM_RESTART_COUNT: 0 on the first run, n after the n-th requeue."""
    procid: int
    ntasks: int
    localid: int
    local_ntasks: int
    nodename: str
    nodes: tuple[str, ...]
    cpus_per_task: int | None

    @staticmethod
    def from_env(env: dict[str, str] | None = None) -> SlurmEnv | None:
        """None outside a Slurm task (no SLURM_JOB_ID or no SLURM_PROCID)."""
        e = os.environ if env is None else env
        if "SLURM_JOB_ID" not in e or "SLURM_PROCID" not in e:
            return None
        nodes = tuple(expand_hostlist(e.get("SLURM_JOB_NODELIST", e.get("SLURMD_NODENAME", ""))))
        nodename = e.get("SLURMD_NODENAME", nodes[0] if nodes else "")
        counts = tasks_per_node(e.get("SLURM_STEP_TASKS_PER_NODE", e.get("SLURM_TASKS_PER_NODE", "1")))
        index = nodes.index(nodename) if nodename in nodes else 0
        cpus = e.get("SLURM_CPUS_PER_TASK")
        return SlurmEnv(
            job_id=e["SLURM_JOB_ID"],
            restart_count=int(e.get("SLURM_RESTART_COUNT", "0") or 0),
            procid=int(e["SLURM_PROCID"]),
            ntasks=int(e.get("SLURM_NTASKS", e.get("SLURM_NPROCS", "1"))),
            localid=int(e.get("SLURM_LOCALID", "0")),
            local_ntasks=counts[index] if index < len(counts) else counts[-1],
            nodename=nodename,
            nodes=nodes,
            cpus_per_task=int(cpus) if cpus else None,
        )

    def context(self) -> dict[str, Any]:
        """Fields stamped on every event of this task."""
        return {"job_id": self.job_id, "restart": self.restart_count, "node": self.nodename}


def expand_hostlist(hostlist: str) -> list[str]:
    """`n[1-3,7],gpu[08-09],login` -> `[n1, n2, n3, n7, gpu08, gpu09, login]`. Pure."""
    out: list[str] = []
    for item in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", hostlist):
        m = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", item)
        if not m:
            out.append(item)
            continue
        prefix, ranges, suffix = m.groups()
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            width = len(lo)
            for n in range(int(lo), int(hi or lo) + 1):
                out.append(f"{prefix}{n:0{width}d}{suffix}")
    return out


def tasks_per_node(spec: str) -> list[int]:
    """`2(x3),1` -> `[2, 2, 2, 1]` (the format of SLURM_TASKS_PER_NODE). Pure."""
    out: list[int] = []
    for part in spec.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if m:
            out += [int(m.group(1))] * int(m.group(2) or 1)
    return out or [1]


def master_port(job_id: str) -> int:
    """A rendezvous port every task of a job derives alike, different for concurrent jobs."""
    return 29500 + int(re.sub(r"\D", "", job_id) or 0) % 10000


# --- the scontrol adapter ---------------------------------------------------------------------


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
