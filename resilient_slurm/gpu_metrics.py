"""GPU utilization and memory for the metrics row, when the run has a GPU (nothing on a CPU)."""

from __future__ import annotations

import contextlib

import torch

_GIB = float(1 << 30)


def gpu_metrics(device: torch.device) -> dict[str, float]:
    if device.type != "cuda":
        return {}
    out = {
        "gpu_mem_gb": torch.cuda.memory_allocated(device) / _GIB,
        "gpu_mem_peak_gb": torch.cuda.max_memory_allocated(device) / _GIB,
    }
    # Utilization needs NVML (nvidia-ml-py and driver access); without it the row has memory only.
    with contextlib.suppress(Exception):
        out["gpu_util"] = float(torch.cuda.utilization(device))
    return out
