"""GPU checks through NVML: a thin adapter gathers facts, pure `check_gpu_*` functions judge them.

The adapter talks to nvidia-ml-py's `pynvml` module (never the deprecated `pynvml` shim package),
imported lazily so the rest of the health package starts without it. Without the library or the
driver, `probe_gpus` returns no snapshot and one line saying why; the caller skips the checks,
unless it expected GPUs, which `check_gpu_count` then reports.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from resilient_slurm.health.verdict import Finding
from resilient_slurm.health.xid_catalog import Action, recovery_action

# NVML C ABI values (nvml.h); fixed, so the checks need not import pynvml for them.
NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_TEMPERATURE_GPU = 0
NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230

DEFAULT_MAX_TEMP_C = 85.0


class NvmlLibrary(Protocol):
    """The part of nvidia-ml-py's `pynvml` module the adapter uses (the module itself fits)."""

    NVMLError: type[Exception]

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any: ...
    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter_type: int) -> int: ...
    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Any) -> int: ...
    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]: ...
    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: list[int]) -> Any: ...
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int: ...


@dataclasses.dataclass(frozen=True)
class GpuFacts:
    """What NVML says about one GPU; None where the GPU or driver does not support the query."""

    index: int
    pci: str = ""
    """`dddd:bb:dd`, the kernel log's form, to match Xid lines to GPUs."""
    error: str | None = None
    """Set when the GPU could not be queried at all (e.g. "GPU is lost")."""
    ecc_uncorrected_volatile: int | None = None
    retired_pages_pending: bool | None = None
    remap_pending: bool | None = None
    remap_failed: bool | None = None
    recovery_action: int | None = None
    temperature_c: int | None = None


@dataclasses.dataclass(frozen=True)
class GpuSnapshot:
    count: int
    gpus: tuple[GpuFacts, ...]


def probe_gpus(library: NvmlLibrary | None = None) -> tuple[GpuSnapshot | None, str]:
    """Init NVML, read every GPU, shut NVML down. Returns (snapshot, "") or (None, one line
    saying why NVML is unavailable). `library` defaults to the real `pynvml`."""
    if library is None:
        try:
            import pynvml  # type: ignore[import-untyped]  # nvidia-ml-py; lazy, see the module docstring
        except ImportError:
            return None, "NVML checks skipped: nvidia-ml-py is not installed"
        library = pynvml
    try:
        library.nvmlInit()
    except library.NVMLError as exc:
        return None, f"NVML checks skipped: {exc}"
    try:
        return read_gpus(library), ""
    finally:
        with contextlib.suppress(library.NVMLError):
            library.nvmlShutdown()


def read_gpus(library: NvmlLibrary) -> GpuSnapshot:
    """Facts for every GPU NVML counts; NVML must be initialized. A GPU that fails a query with
    anything but "not supported" is reported through `error`, never raised."""
    count = library.nvmlDeviceGetCount()
    return GpuSnapshot(count, tuple(_read_gpu(library, index) for index in range(count)))


def _read_gpu(lib: NvmlLibrary, index: int) -> GpuFacts:
    pci = ""
    try:
        handle = lib.nvmlDeviceGetHandleByIndex(index)
        pci = _pci(lib.nvmlDeviceGetPciInfo(handle).busId)
        remap = _optional(lib, lambda: lib.nvmlDeviceGetRemappedRows(handle))
        pending = _optional(lib, lambda: lib.nvmlDeviceGetRetiredPagesPendingStatus(handle))
        return GpuFacts(
            index,
            pci,
            ecc_uncorrected_volatile=_optional(
                lib,
                lambda: lib.nvmlDeviceGetTotalEccErrors(handle, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC),
            ),
            retired_pages_pending=None if pending is None else bool(pending),
            remap_pending=None if remap is None else bool(remap[2]),
            remap_failed=None if remap is None else bool(remap[3]),
            recovery_action=_recovery_field(lib, handle),
            temperature_c=_optional(lib, lambda: lib.nvmlDeviceGetTemperature(handle, NVML_TEMPERATURE_GPU)),
        )
    except lib.NVMLError as exc:
        return GpuFacts(index, pci, error=str(exc) or type(exc).__name__)


def _optional(lib: NvmlLibrary, query: Callable[[], Any]) -> Any:
    try:
        return query()
    except lib.NVMLError as exc:
        if getattr(exc, "value", None) in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_NO_PERMISSION):
            return None
        raise


def _recovery_field(lib: NvmlLibrary, handle: Any) -> int | None:
    values = _optional(lib, lambda: lib.nvmlDeviceGetFieldValues(handle, [NVML_FI_DEV_GET_GPU_RECOVERY_ACTION]))
    if values is None or values[0].nvmlReturn != NVML_SUCCESS:
        return None  # older drivers do not know the field
    return int(values[0].value.uiVal)


def _pci(bus_id: bytes | str) -> str:
    text = bus_id.decode("ascii", "replace") if isinstance(bus_id, bytes) else bus_id
    domain, bus, rest = [*text.split(":"), "", ""][:3]
    return f"{domain[-4:]}:{bus}:{rest.split('.')[0]}".lower()


def check_gpu_count(snapshot: GpuSnapshot | None, expected: int | None) -> Finding | None:
    if expected is None:
        return None
    if snapshot is None:
        return Finding("check_gpu_count", Action.DRAIN, f"NVML unavailable, {expected} GPUs expected")
    if snapshot.count < expected:
        return Finding("check_gpu_count", Action.DRAIN, f"{snapshot.count} GPUs found, {expected} expected")
    return None


def check_gpu_reachable(gpu: GpuFacts) -> Finding | None:
    if gpu.error is None:
        return None
    return Finding("check_gpu_reachable", Action.DRAIN, f"{_name(gpu)} query failed: {gpu.error}", gpu=gpu.pci)


def check_gpu_ecc(gpu: GpuFacts) -> Finding | None:
    count = gpu.ecc_uncorrected_volatile
    if not count:
        return None
    detail = f"{_name(gpu)} has {count} uncorrectable ECC errors since the driver loaded, limit 0"
    return Finding("check_gpu_ecc", Action.RESET_GPU, detail, gpu=gpu.pci)


def check_gpu_retired_pages(gpu: GpuFacts) -> Finding | None:
    if not gpu.retired_pages_pending:
        return None
    detail = f"{_name(gpu)} has retired pages pending, a reset activates them"
    return Finding("check_gpu_retired_pages", Action.RESET_GPU, detail, gpu=gpu.pci)


def check_gpu_row_remap(gpu: GpuFacts) -> Finding | None:
    if gpu.remap_failed:
        return Finding("check_gpu_row_remap", Action.DRAIN, f"{_name(gpu)} row remapping failed", gpu=gpu.pci)
    if gpu.remap_pending:
        detail = f"{_name(gpu)} has a row remap pending, a reset activates it"
        return Finding("check_gpu_row_remap", Action.RESET_GPU, detail, gpu=gpu.pci)
    return None


def check_gpu_recovery_action(gpu: GpuFacts) -> Finding | None:
    if not gpu.recovery_action:
        return None
    action = recovery_action(gpu.recovery_action)
    detail = f"{_name(gpu)} driver asks for recovery action {gpu.recovery_action}"
    return Finding("check_gpu_recovery_action", action, detail, gpu=gpu.pci)


def check_gpu_temperature(gpu: GpuFacts, max_c: float) -> Finding | None:
    if gpu.temperature_c is None or gpu.temperature_c <= max_c:
        return None
    detail = f"{_name(gpu)} at {gpu.temperature_c} C, limit {max_c:g} C"
    return Finding("check_gpu_temperature", Action.EXCLUDE, detail, gpu=gpu.pci)


def check_gpus(snapshot: GpuSnapshot | None, expected: int | None, max_temp_c: float) -> list[Finding]:
    """Every GPU check over one snapshot; no finding means healthy (or nothing to check)."""
    found = [check_gpu_count(snapshot, expected)]
    gpus: Sequence[GpuFacts] = snapshot.gpus if snapshot is not None else ()
    for gpu in gpus:
        found += [
            check_gpu_reachable(gpu),
            check_gpu_ecc(gpu),
            check_gpu_retired_pages(gpu),
            check_gpu_row_remap(gpu),
            check_gpu_recovery_action(gpu),
            check_gpu_temperature(gpu, max_temp_c),
        ]
    return [f for f in found if f is not None]


def _name(gpu: GpuFacts) -> str:
    return f"GPU {gpu.index} ({gpu.pci})" if gpu.pci else f"GPU {gpu.index}"
