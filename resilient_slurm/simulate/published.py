"""What a CPU cannot measure, from published figures: communicator creation at scale, silent data
corruption, fail-slow nodes, and the replica-group costs of per-step fault tolerance. Pure.

Each figure names its source (shared/notes/replica-ft-facts.md gathers them); each derived
default says how it was derived, so `scenario.SOURCES` can print it beside the value used.
"""

from __future__ import annotations

# --- NCCL communicator creation
RING_S, RING_RANKS = 26.0, 96_000
TRANSPORTS_S, TRANSPORTS_RANKS = 11.0, 48_000
"""Meta's figures (NVIDIA/nccl PR #1789), before their fix: ncclBuildRing about 26 s of busy CPU at
96K ranks, initTransportsRank 11 s at 48K."""


def comm_init_s(ranks: int) -> float:
    """Creating one communicator over `ranks`, each of the two published parts scaled linearly
    from its scale down to this one (both walk every rank): 5.0 s at 10,000 ranks, 0.5 s at 1,000."""
    return RING_S * ranks / RING_RANKS + TRANSPORTS_S * ranks / TRANSPORTS_RANKS


NCCL_STOCK_INIT_S, NCCL_STOCK_RANKS = 265.0, 96_000
"""Meta's NCCLX paper (arXiv 2510.20171): stock NCCL's whole initialisation took ~265 s at 96k GPUs
and grows super-linearly, so linear scaling is an upper bound at smaller scale (27.6 s at 10,000)."""


def comm_init_upper_s(ranks: int) -> float:
    return NCCL_STOCK_INIT_S * ranks / NCCL_STOCK_RANKS


COMM_INIT_SOURCE = ("published: Meta, NVIDIA/nccl PR #1789 (ncclBuildRing ~26 s at 96K ranks, initTransportsRank "
                    "11 s at 48K, before the fix), each scaled linearly to the ranks that create it; stock NCCL's whole "
                    "init, 265 s at 96k (NCCLX paper), bounds it from above at 27.6 s for 10,000")

# --- silent data corruption
LLAMA3_SDC, LLAMA3_GPUS, LLAMA3_HOURS = 6, 16_384, 54 * 24
SDC_GPU_MTBF_H = LLAMA3_GPUS * LLAMA3_HOURS / LLAMA3_SDC
"""Hours of one GPU between silent data corruptions: Llama 3's 6 in 54 days on 16,384 H100s
(3.5M GPU-hours each) is one every 14.7 days at 10,000 GPUs, within Gemini's "every week or two"
(Gemini's chip count is not published: several 4,096-chip TPUv4 SuperPods)."""
SDC_NAN_SHARE = 0.0101
"""Share of SDC outcomes that are NaN or Inf, which the NaN rollback catches at once (gate-level
fault injection on a production-class GPU, arXiv 2605.04213)."""
SDC_FOUND_AFTER_H = 4.0
"""Assumed: a corruption no detector sees is found by a loss excursion or an eval regression this
many hours later (no published latency found), and the run rolls back to a checkpoint before it."""

# --- fail-slow nodes (stragglers)
STRAGGLER_SLOWDOWN = 1.34
"""Greyhound/Falcon (ATC'25, arXiv 2410.12588; a 10,000+ GPU production cluster): fail-slows delay
large jobs 1.34x on average. Taken here as the slowdown while an episode lasts (a synchronous job
runs at its slowest rank's pace)."""
STRAGGLER_DURATION_H = 1.0
"""Assumed mean length of an episode: Greyhound's last "from sub-minutes to nearly ten hours"."""
STRAGGLER_GPU_MTBF_H = 1024 * 168.0
"""Assumed: one episode a week on a 1,024-GPU job, scaled per GPU (Greyhound: 16 of 27 large jobs
hit at least once; their sizes and lengths are not given)."""
STRAGGLER_DETECT_S = 60.0
"""Assumed: a slow rank is declared after a few steps slower than the median (Greyhound detects
with > 99% accuracy; no latency given)."""

# --- per-step fault tolerance across replica groups
QUORUM_S = 1.0
"""A quorum change on the survivors (a group leaves or joins): torchft on Crusoe reinitialised
its cross-group Gloo communicator in under 1 s (PyTorch blog, 2025-06)."""
HEAL_FIXED_S = 1.0
NETWORK_BYTES_S = 50e9
"""A heal from a live peer: 1 s of set-up (assumed) plus the group's state per GPU over one
ConnectX-7 at 400 Gb/s per GPU (DGX H100)."""
FINGERPRINT_S = 0.01
"""Assumed: a checksum of one GPU's parameter shard at HBM speed (a 96 MB shard at 3.35 TB/s is
0.03 ms) and the compare across replicas, taken as 10 ms a step."""
