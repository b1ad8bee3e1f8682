"""The NVML sampler against a FAKE NVML: this machine has no GPU and no driver, so a stand-in with
the same calls and return shapes as nvidia-ml-py's `pynvml` plays the GPU. The real library is
exercised only for its "no driver" path, which is real here."""

import time
from types import SimpleNamespace

import pytest

from resilient_slurm.monitor.gpu_sampler import GpuSampler, read_sample


class NotSupported(Exception):
    """Stands for pynvml.NVMLError_NotSupported (ECC on a consumer card)."""


class FakeNvml:
    NVML_TEMPERATURE_GPU = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0

    def __init__(self, ecc=True):
        self.ecc = ecc
        self.reads = 0

    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByIndex(self, index):
        return f"gpu{index}"

    def nvmlDeviceGetUtilizationRates(self, handle):
        self.reads += 1
        return SimpleNamespace(gpu=87, memory=40)

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(total=80 * 2**30, used=60 * 2**30, free=20 * 2**30)

    def nvmlDeviceGetTemperature(self, handle, sensor):
        assert sensor == self.NVML_TEMPERATURE_GPU
        return 71

    def nvmlDeviceGetTotalEccErrors(self, handle, error_type, counter_type):
        if not self.ecc:
            raise NotSupported("Not Supported")
        return 2


def test_a_sample_has_every_field_the_gpu_supports():
    assert read_sample(FakeNvml(), "gpu0") == {
        "util_pct": 87.0, "memory_used_frac": 0.75, "temperature_c": 71.0, "ecc_uncorrectable": 2.0}
    assert "ecc_uncorrectable" not in read_sample(FakeNvml(ecc=False), "gpu0")


def test_the_sampler_thread_keeps_the_latest_sample():
    nvml = FakeNvml()
    sampler = GpuSampler(0, interval_s=0.01, nvml=nvml)
    sampler.start()
    deadline = time.monotonic() + 5
    while nvml.reads < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    sampler.stop()
    assert nvml.reads >= 3 and sampler.latest["temperature_c"] == 71.0


def _has_nvml() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        return True
    except Exception:
        return False


@pytest.mark.skipif(_has_nvml(), reason="this machine has an NVIDIA driver; the no-driver path cannot be seen")
def test_without_a_driver_metrics_are_simply_missing():
    sampler = GpuSampler(0, interval_s=0.01)  # the real nvidia-ml-py: no driver on this machine
    sampler.start()
    sampler.stop()
    assert sampler.latest == {}
