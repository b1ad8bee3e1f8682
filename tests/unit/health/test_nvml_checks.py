"""NVML checks.

This machine has no GPU and no NVIDIA driver, so NVML cannot answer for real: `nvmlInit` fails
with "NVML Shared Library Not Found" (tested below as it is). Everything a GPU would answer goes
through `FakeNvml`, a fake of nvidia-ml-py's `pynvml` module behind the same `NvmlLibrary`
interface the real adapter uses. It raises the real `pynvml.NVMLError` classes with NVML's real
codes and returns values in pynvml's shapes (a busId like "00000000:3B:00.0", field values
with `nvmlReturn` and `value.uiVal`), so the adapter code under test is the production code.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from resilient_slurm.health.nvml_checks import (
    GpuFacts,
    GpuSnapshot,
    NvmlLibrary,
    check_gpu_count,
    check_gpus,
    probe_gpus,
    read_gpus,
)
from resilient_slurm.health.xid_catalog import Action

NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
GPU_IS_LOST = pynvml.NVML_ERROR_GPU_IS_LOST


@dataclasses.dataclass
class FakeGpu:
    bus_id: bytes = b"00000000:3B:00.0"
    ecc_uncorrected: int | Exception = 0
    retired_pending: int | Exception = 0
    remapped_rows: tuple[int, int, int, int] | Exception = (0, 0, 0, 0)
    recovery: int | None = 0  # None: the driver does not know the field
    temperature: int = 45
    lost: bool = False


class FakeNvml:
    NVMLError = pynvml.NVMLError

    def __init__(self, gpus: list[FakeGpu], init_error: int | None = None) -> None:
        self.gpus, self.init_error, self.calls = gpus, init_error, []

    def nvmlInit(self) -> None:
        self.calls.append("init")
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        if self.gpus[index].lost:
            raise pynvml.NVMLError(GPU_IS_LOST)
        return self.gpus[index]

    def nvmlDeviceGetPciInfo(self, handle: FakeGpu) -> Any:
        return SimpleNamespace(busId=handle.bus_id)

    def nvmlDeviceGetTotalEccErrors(self, handle: FakeGpu, error_type: int, counter_type: int) -> int:
        assert (error_type, counter_type) == (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC)
        return _answer(handle.ecc_uncorrected)

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: FakeGpu) -> int:
        return _answer(handle.retired_pending)

    def nvmlDeviceGetRemappedRows(self, handle: FakeGpu) -> tuple[int, int, int, int]:
        return _answer(handle.remapped_rows)

    def nvmlDeviceGetFieldValues(self, handle: FakeGpu, field_ids: list[int]) -> Any:
        assert field_ids == [pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION]
        known = handle.recovery is not None
        value = SimpleNamespace(uiVal=handle.recovery or 0)
        return [SimpleNamespace(nvmlReturn=pynvml.NVML_SUCCESS if known else NOT_SUPPORTED, value=value)]

    def nvmlDeviceGetTemperature(self, handle: FakeGpu, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return handle.temperature


def _answer(value: Any) -> Any:
    if isinstance(value, Exception):
        raise value
    return value


def test_the_fake_and_the_real_module_offer_the_same_interface() -> None:
    wanted = [*NvmlLibrary.__annotations__, *(name for name in vars(NvmlLibrary) if name.startswith("nvml"))]
    assert len(wanted) == 11
    for name in wanted:
        assert hasattr(pynvml, name), name
        assert hasattr(FakeNvml, name), name


def test_without_a_driver_nvml_says_so_in_one_line_and_skips() -> None:
    snapshot, why = probe_gpus()  # the real pynvml on this GPU-less machine
    assert snapshot is None
    assert why == "NVML checks skipped: NVML Shared Library Not Found"


def test_fake_init_failure_is_the_same_one_line() -> None:
    fake = FakeNvml([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    assert probe_gpus(fake) == (None, "NVML checks skipped: NVML Shared Library Not Found")


def test_healthy_gpus_read_and_pass() -> None:
    fake = FakeNvml([FakeGpu(bus_id=f"00000000:{b:02X}:00.0".encode()) for b in (0x3B, 0x5E)])
    snapshot, why = probe_gpus(fake)
    assert why == "" and fake.calls == ["init", "shutdown"]
    assert snapshot == GpuSnapshot(
        2,
        (
            GpuFacts(0, "0000:3b:00", None, 0, False, False, False, 0, 45),
            GpuFacts(1, "0000:5e:00", None, 0, False, False, False, 0, 45),
        ),
    )
    assert check_gpus(snapshot, expected=2, max_temp_c=85) == []


@pytest.mark.parametrize(
    ("gpu", "check", "action"),
    [
        (FakeGpu(ecc_uncorrected=3), "check_gpu_ecc", Action.RESET_GPU),
        (FakeGpu(retired_pending=1), "check_gpu_retired_pages", Action.RESET_GPU),
        (FakeGpu(remapped_rows=(0, 1, 1, 0)), "check_gpu_row_remap", Action.RESET_GPU),
        (FakeGpu(remapped_rows=(0, 1, 0, 1)), "check_gpu_row_remap", Action.DRAIN),
        (FakeGpu(recovery=pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET), "check_gpu_recovery_action", Action.RESET_GPU),
        (FakeGpu(recovery=pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT), "check_gpu_recovery_action", Action.DRAIN),
        (FakeGpu(temperature=91), "check_gpu_temperature", Action.EXCLUDE),
        (FakeGpu(lost=True), "check_gpu_reachable", Action.DRAIN),
        (FakeGpu(ecc_uncorrected=pynvml.NVMLError(GPU_IS_LOST)), "check_gpu_reachable", Action.DRAIN),
    ],
)
def test_each_fault_is_one_finding(gpu: FakeGpu, check: str, action: Action) -> None:
    snapshot = read_gpus(FakeNvml([FakeGpu(), gpu]))
    [finding] = check_gpus(snapshot, expected=None, max_temp_c=85)
    assert (finding.check, finding.action) == (check, action)
    assert finding.detail.startswith("GPU 1")


def test_queries_the_gpu_does_not_support_are_skipped() -> None:
    unsupported = pynvml.NVMLError(NOT_SUPPORTED)
    gpu = FakeGpu(ecc_uncorrected=unsupported, retired_pending=unsupported, remapped_rows=unsupported, recovery=None)
    facts = read_gpus(FakeNvml([gpu])).gpus[0]
    assert (
        facts.ecc_uncorrected_volatile,
        facts.retired_pages_pending,
        facts.remap_pending,
        facts.recovery_action,
    ) == (
        None,
        None,
        None,
        None,
    )
    assert facts.error is None
    assert check_gpus(GpuSnapshot(1, (facts,)), expected=1, max_temp_c=85) == []


def test_gpu_count_against_what_the_job_expects() -> None:
    snapshot = read_gpus(FakeNvml([FakeGpu()] * 7))
    finding = check_gpu_count(snapshot, 8)
    assert finding is not None and finding.action is Action.DRAIN and finding.detail == "7 GPUs found, 8 expected"
    assert check_gpu_count(snapshot, 7) is None
    assert check_gpu_count(None, None) is None
    missing = check_gpu_count(None, 4)
    assert missing is not None and missing.detail == "NVML unavailable, 4 GPUs expected"


def test_str_bus_ids_from_newer_bindings_work_too() -> None:
    facts = read_gpus(FakeNvml([FakeGpu(bus_id="00000001:AF:00.0")])).gpus[0]  # type: ignore[arg-type]
    assert facts.pci == "0001:af:00"
