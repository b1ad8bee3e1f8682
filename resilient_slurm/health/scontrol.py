"""The one Slurm command the health checker runs itself: draining its node with a reason."""

from __future__ import annotations

import os

DEFAULT_SCONTROL = "/usr/bin/scontrol"
"""Absolute: a Prolog or Epilog runs without PATH."""

REASON_MAX_CHARS = 200


def drain_node(node: str, reason: str, scontrol: str = DEFAULT_SCONTROL, timeout_s: float = 10.0) -> tuple[bool, str]:
    """`scontrol update nodename=NODE state=drain reason=REASON`; returns (ok, one-line message).
    Never raises: the caller's own exit code already takes the node out if this fails."""
    # Imported here: subprocess costs start-up time that a healthy scan never needs.
    import subprocess

    reason = " ".join(reason.split())[:REASON_MAX_CHARS]
    argv = [scontrol, "update", f"nodename={node}", "state=drain", f"reason={reason}"]
    try:
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout_s,
            # Keep the caller's environment: SLURM_CONF tells scontrol which cluster it is on.
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", **os.environ},
            check=False,
        )
    except subprocess.TimeoutExpired:
        return False, f"{scontrol} did not finish within {timeout_s:g} s"
    except OSError as exc:
        return False, f"cannot run {scontrol}: {exc.strerror}"
    if done.returncode != 0:
        why = done.stderr.decode("utf-8", "replace").strip().splitlines()
        return False, f"{scontrol} exited {done.returncode}: {why[0] if why else 'no message'}"
    return True, f"drained {node}"
