"""GPU utilization, memory, temperature and ECC counters through NVML, sampled off the hot path.

A daemon thread reads the rank's GPU every `gpu_sample_s`; the step loop only copies the latest
sample. Without NVML (no driver, no GPU) the sampler says so once and every sample is empty.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Protocol

from resilient_slurm.console import LOG_ONLY

log = logging.getLogger("resilient_slurm")


class NvmlLike(Protocol):
    """The part of nvidia-ml-py's `pynvml` module the sampler uses (tests pass a fake)."""

    NVML_TEMPERATURE_GPU: int
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED: int
    NVML_VOLATILE_ECC: int

    def nvmlInit(self) -> None: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any: ...
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int: ...
    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter_type: int) -> int: ...


def read_sample(nvml: NvmlLike, handle: Any) -> dict[str, float]:
    """One sample; a field the GPU does not support (ECC on consumer cards) is left out."""
    out: dict[str, float] = {}
    readers = {
        "util_pct": lambda: float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu),
        "memory_used_frac": lambda: (lambda m: m.used / m.total)(nvml.nvmlDeviceGetMemoryInfo(handle)),
        "temperature_c": lambda: float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
        "ecc_uncorrectable": lambda: float(nvml.nvmlDeviceGetTotalEccErrors(
            handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC)),
    }
    for key, read in readers.items():
        try:
            out[key] = read()
        except Exception:  # noqa: BLE001 - NVMLError_NotSupported and friends: the field is simply missing
            continue
    return out


def _import_nvml() -> NvmlLike:
    import pynvml  # nvidia-ml-py: imported here, a heavy optional dependency of one adapter

    return pynvml  # type: ignore[return-value]


class GpuSampler:
    def __init__(self, device_index: int, interval_s: float, nvml: NvmlLike | None = None) -> None:
        self.device_index = device_index
        self.interval_s = interval_s
        self.latest: dict[str, float] = {}
        self._nvml = nvml
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        try:
            nvml = self._nvml or _import_nvml()
            nvml.nvmlInit()
            handle = nvml.nvmlDeviceGetHandleByIndex(self.device_index)
        except Exception as e:  # noqa: BLE001 - no driver, no GPU, no library: run without GPU metrics
            log.info("GPU metrics off: %s", str(e).splitlines()[0] if str(e) else type(e).__name__, extra=LOG_ONLY)
            return
        self._thread = threading.Thread(target=self._loop, args=(nvml, handle), name="gpu-metrics", daemon=True)
        self._thread.start()

    def _loop(self, nvml: NvmlLike, handle: Any) -> None:
        while True:
            self.latest = read_sample(nvml, handle)
            if self._stop.wait(self.interval_s):
                return

    def stop(self) -> None:
        self._stop.set()
