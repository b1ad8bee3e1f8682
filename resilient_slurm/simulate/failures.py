"""What fails, how often, and what each fault leaves behind for the health check. Pure.

Failures arrive as a Poisson process: each GPU in use fails on average once per `gpu_mtbf_h`
hours, all causes together (the seed's "per-GPU MTBF of about 10,000 hours": one job failure an
hour on 10,000 GPUs). Each failure is one of the `Fault` rows below, drawn by weight. A row says
which node it hits (a random node in use), whether it crashes or hangs, what the failing rank
reports, and what the node's kernel log then holds: an Xid line that the project's own health
verdict judges (`health.verdict`), a node Slurm sees go down, or no trace at all.

Three behaviours follow from the rows and from the project's decisions about them:
- **transient**: the node is fine; a restart on the same nodes works;
- **bad node**: the verdict takes the node out (for good, or until a GPU reset), or the node is
  down; a node with no trace stays in the job and **fails again** (`recur_h`; 0 = as soon as
  the next attempt starts, like a dead link), until the crash-loop guard pins it;
- **code bug**: the same error at the same step on every attempt, until a person fixes it.

Default weights, by component, from published data:
- Components: the Llama 3 paper (Llama Team, "The Llama 3 Herd of Models", 2024, §3.3.4,
  Table 5): 419 unexpected interruptions in a 54-day snapshot on 16,384 H100s. GPU 268 (faulty
  GPU 148, HBM3 72, SRAM 19, GSP 17, silent data corruption 6, thermal 6) = 64.0%; network 49
  (switch/cable 35, NIC 7, NCCL watchdog timeouts 7) = 11.7%; host 46 (unplanned host
  maintenance 32, SSD, PSU, chassis, IO board, CPU, memory) = 11.0%; software 56 (software bug
  54, dependency 2) = 13.4%. The paper adds that "significant manual intervention was only
  required three times": the code-bug row.
- Within GPU and network faults, recoverable vs replacement: Crusoe's H200 cluster data (GTC 2025,
  as tabulated in G. Lockwood's "component reliability" notes): GPU recoverable faults 19.5% vs
  GPU host replacement 41.5% (so 32% of GPU faults are cured by a reset); InfiniBand recoverable
  4.9%, hardware 12.2%, other 17% (so 36% of network faults are broken hardware).
Assumptions (no published figure found; change them with the rows): which Xid stands for a
reset-cured fault (94 with `RST: Yes`) and for a replacement (79); that network faults show up
as hangs (NCCL timeouts) and leave no Xid; that a broken link fails again at the next start;
that a GPU with silent data corruption strikes again about once a week (`SDC_RECUR_H`). The
published totals include such returns: `scenario.LLAMA3` takes them out before it sets the rate
of new faults.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass, replace

COMPONENTS = ("gpu", "network", "host", "software")
SDC_RECUR_H = 168.0

# Llama 3 Table 5 counts, and the Crusoe splits applied inside GPU and network faults.
_GPU, _NET, _HOST, _SW, _ALL = 268, 49, 46, 56, 419
_SDC = 6
_GPU_RESET = 19.5 / (19.5 + 41.5)
_NET_HW = 12.2 / (4.9 + 12.2 + 17.0)
_CODE_BUG = 3


@dataclass(frozen=True)
class Fault:
    name: str
    component: str
    weight: float
    """Share of all failures (the rows of a component sum to its share)."""
    error: str
    """What the failing rank reports (the crash event's `error`, or the hang's reason)."""
    xid: int | None = None
    """The Xid line the node's kernel log gets; None: nothing the health check can see."""
    xid_rst: bool | None = None
    """Xid 94/95's `RST:` flag (the GPU needs a reset)."""
    node_down: bool = False
    """The node itself is gone (power, board, maintenance): Slurm marks it down."""
    recur_h: float | None = None
    """A bad node that shows no trace: it fails again after this many hours of running on
    average (0: at the next start). None: it does not fail again."""
    hang: bool = False
    """Shows up as a hang (found at the collective timeout), not a crash."""
    code_bug: bool = False
    """Fails at this step on every attempt until fixed."""


FAULTS: tuple[Fault, ...] = (
    Fault("gpu-reset", "gpu", (_GPU - _SDC) * _GPU_RESET / _ALL,
          "RuntimeError: CUDA error: uncorrectable ECC error encountered", xid=94, xid_rst=True),
    Fault("gpu-replace", "gpu", (_GPU - _SDC) * (1 - _GPU_RESET) / _ALL,
          "no step completed within the collective timeout (a GPU stopped answering)", xid=79, hang=True),
    Fault("gpu-sdc", "gpu", _SDC / _ALL, "FloatingPointError: loss is NaN after a bit flip", recur_h=SDC_RECUR_H),
    Fault("net-transient", "network", _NET * (1 - _NET_HW) / _ALL,
          "no step completed for 300 s (collective stuck)", hang=True),
    Fault("net-link", "network", _NET * _NET_HW / _ALL,
          "RuntimeError: ibv_poll_cq: transport retry counter exceeded", recur_h=0.0),
    Fault("host-down", "host", _HOST / _ALL, "srun: error: node not responding", node_down=True),
    Fault("sw-crash", "software", (_SW - _CODE_BUG) / _ALL, "RuntimeError: DataLoader worker exited unexpectedly"),
    Fault("sw-code-bug", "software", _CODE_BUG / _ALL,
          "IndexError: index 4096 is out of bounds for dimension 0 with size 4096", code_bug=True),
)


CUDA_CLASS = re.compile(r"CUDA error|CUBLAS_STATUS|CUDNN_STATUS|illegal memory access|device-side assert",
                        re.IGNORECASE)
"""An error that leaves a CUDA context no one can trust (sticky: every later call fails)."""


def survivors_trusted(fault: Fault) -> tuple[bool, str]:
    """Whether the ranks a fault did not kill may restart inside their own processes (issue 23),
    and if not, why. Not after a hang: it does not say which rank is stuck, and a rank stuck in a
    CUDA call may not answer the abort (NVRx's in-process wrapper ends such a rank with SIGKILL at
    its hard timeout, so it is no longer in-process). Not after a CUDA-class error: a sticky error
    poisons the context it happened in, and the decision cannot tell from the error which processes
    shared it (NVRx runs a CUDA health check on every rank before it restarts in place). Everything
    else (a lost node, a Python exception, a dead link, a NaN) leaves the survivors' processes
    sound. With the default catalog (Llama 3's mix): hangs 50.0% of new faults (a GPU that stops
    answering 42.5%, a stuck collective 7.5%), CUDA errors 20.0% (GPU faults a reset cures); the
    survivors restart in their processes after the other 30.0%: a lost host 11.0%, software
    crashes 12.7% and code bugs 0.7%, dead links 4.2%, silent data corruption 1.4%."""
    if fault.hang:
        return False, "hang"
    if CUDA_CLASS.search(fault.error):
        return False, "CUDA error"
    return True, ""


def component_shares(faults: Iterable[Fault]) -> dict[str, float]:
    shares: dict[str, float] = {}
    for f in faults:
        shares[f.component] = shares.get(f.component, 0.0) + f.weight
    return shares


def with_mix(faults: tuple[Fault, ...], mix: Mapping[str, float]) -> tuple[Fault, ...]:
    """The rows rescaled so each component in `mix` gets its share (normalized); the rows of a
    component keep their relative weights, and components left out of `mix` get none."""
    unknown = sorted(set(mix) - set(COMPONENTS))
    if unknown:
        raise ValueError(f"--mix: unknown component(s) {', '.join(unknown)}; use {', '.join(COMPONENTS)}")
    if any(v < 0 for v in mix.values()) or sum(mix.values()) <= 0:
        raise ValueError("--mix: shares must be >= 0 with a positive sum, e.g. gpu=0.6,network=0.2,host=0.1,software=0.1")
    total = sum(mix.values())
    current = component_shares(faults)
    return tuple(replace(f, weight=f.weight / current[f.component] * mix.get(f.component, 0) / total)
                 for f in faults if current.get(f.component) and mix.get(f.component, 0) > 0)


def parse_mix(text: str) -> dict[str, float]:
    """`gpu=0.6,network=0.2` → {"gpu": 0.6, "network": 0.2}; raises ValueError naming the bad item."""
    out: dict[str, float] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = item.partition("=")
        try:
            if not sep:
                raise ValueError
            out[name.strip()] = float(value)
        except ValueError:
            raise ValueError(f"--mix: {item!r} is not COMPONENT=SHARE (e.g. gpu=0.6)") from None
    return out


class FaultDraw:
    """Draws fault rows by weight with one uniform number each (cumulative weights, bisected)."""

    def __init__(self, faults: tuple[Fault, ...]) -> None:
        self.faults = tuple(f for f in faults if f.weight > 0)
        if not self.faults:
            raise ValueError("the failure mix has no fault with a positive weight")
        self.total = sum(f.weight for f in self.faults)
        self.cumulative: list[float] = []
        acc = 0.0
        for f in self.faults:
            acc += f.weight
            self.cumulative.append(acc)

    def __call__(self, rng: random.Random) -> Fault:
        u = rng.random() * self.total
        for fault, edge in zip(self.faults, self.cumulative):
            if u < edge:
                return fault
        return self.faults[-1]


@dataclass(frozen=True)
class Strike:
    fault: Fault
    node: str
    recurrence: bool
    """A latent bad node failing again (not a new fault)."""
    at_start: bool
    """It failed as the step started (before any step ran)."""


class FailureProcess:
    """Failures of the nodes a job step runs on: every GPU at 1/`gpu_mtbf_h`, plus each latent bad
    node at its own rate (`recur_h`; 0: the moment a step starts on it). Poisson, so memoryless:
    the next failure may be drawn afresh whenever the nodes in use change."""

    def __init__(self, faults: tuple[Fault, ...], gpus_per_node: int, gpu_mtbf_h: float) -> None:
        self.draw = FaultDraw(faults)
        self.node_rate = gpus_per_node / (gpu_mtbf_h * 3600.0)
        self.latent: dict[str, Fault] = {}
        """Bad nodes that left no trace → their fault."""

    def next_at(self, t: float, in_use: Set[str], rng: random.Random) -> float:
        rate = len(in_use) * self.node_rate + sum(r for _, r in self._recurring(in_use))
        return t if rate == math.inf else t + rng.expovariate(rate)

    def strike(self, in_use: tuple[str, ...], in_use_set: Set[str], rng: random.Random) -> Strike:
        """Which fault hits which node, now that one does."""
        recurring = self._recurring(in_use_set)
        pick = rng.random() * (len(in_use) * self.node_rate + sum(r for _, r in recurring))
        for node, rate in recurring:
            if rate == math.inf or pick < rate:
                return Strike(self.latent[node], node, recurrence=True, at_start=rate == math.inf)
            pick -= rate
        fault, node = self.draw(rng), rng.choice(in_use)
        if fault.recur_h is not None:
            self.latent[node] = fault
        return Strike(fault, node, recurrence=False, at_start=False)

    def forget(self, nodes: Iterable[str]) -> None:
        """These nodes left for good: their faults go with them."""
        for n in nodes:
            self.latent.pop(n, None)

    def _recurring(self, in_use: Set[str]) -> list[tuple[str, float]]:
        return [(n, 1.0 / (f.recur_h * 3600.0) if f.recur_h else math.inf) for n, f in self.latent.items()
                if n in in_use]
