"""GPU utilization and memory for the metrics row, when the run has a GPU (nothing on a CPU)."""

from __future__ import annotations

import torch

_GIB = float(1 << 30)


def gpu_metrics(device: torch.device) -> dict[str, float]:
    if device.type != "cuda":
        return {}
    out = {
        "gpu_mem_gb": torch.cuda.memory_allocated(device) / _GIB,
        "gpu_mem_peak_gb": torch.cuda.max_memory_allocated(device) / _GIB,
    }
    try:
        out["gpu_util"] = float(torch.cuda.utilization(device))
    except Exception:  # noqa: BLE001 - no NVML (pynvml missing or no driver access): memory only
        pass
    return out
