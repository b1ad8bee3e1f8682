"""The Xid catalog as frozen data: code → name, class, action; plus site overrides.

Rows follow NVIDIA's Xid catalog ("Analyzing Xid Errors with the Xid Catalog", resolution buckets)
and the project's notes (`shared/notes/xid-facts.md`). Actions are ordered by severity, so the
action for a set of findings is their maximum. Pure: no I/O; `parse_overrides` takes text.
"""

from __future__ import annotations

import configparser
import dataclasses
import enum
import json
from collections.abc import Mapping


class Action(enum.IntEnum):
    """What a finding asks for, least to most severe."""

    KEEP = 0  # NVIDIA's IGNORE: nothing to do for the node or the run
    RESTART_APP = 1  # rerun the workload; the node stays in service
    RESET_GPU = 2  # the node leaves service until its GPU is reset (`nvidia-smi -r`)
    EXCLUDE = 3  # the node leaves service and goes on the run's exclude list
    DRAIN = 4  # as EXCLUDE, and it needs an admin (reboot, RMA)

    @property
    def label(self) -> str:
        return self.name.lower().replace("_", "-")

    @property
    def takes_node_out(self) -> bool:
        return self >= Action.RESET_GPU

    @classmethod
    def parse(cls, label: str) -> Action:
        """`"reset-gpu"` → `Action.RESET_GPU`; raises ValueError naming the accepted labels."""
        try:
            return cls[label.strip().upper().replace("-", "_")]
        except KeyError:
            accepted = ", ".join(a.label for a in cls)
            raise ValueError(f"unknown action {label!r}: use one of {accepted}") from None


class XidClass(enum.Enum):
    APPLICATION = "application"
    HARDWARE = "hardware"
    DRIVER_FIRMWARE = "driver/firmware"
    INFORMATIONAL = "informational"
    UNKNOWN = "unknown"


@dataclasses.dataclass(frozen=True)
class XidRow:
    code: int
    mnemonic: str
    xid_class: XidClass
    action: Action
    """Action for one occurrence, when the line's own detail does not say more."""
    repeat_action: Action | None = None
    """Action when the same Xid hit the same GPU in a different job inside the history window."""
    detail_decides: bool = False
    """True when the decoded detail (154's new recovery action, 149's severity) replaces `action`;
    otherwise decoded detail (94/95 `RST: Yes`) can only raise it."""


_A, _H, _D, _I = XidClass.APPLICATION, XidClass.HARDWARE, XidClass.DRIVER_FIRMWARE, XidClass.INFORMATIONAL
_KEEP, _APP, _EXCL, _DRAIN = Action.KEEP, Action.RESTART_APP, Action.EXCLUDE, Action.DRAIN

_ROWS = (
    # Application faults: a code bug until the same GPU repeats them for a different job.
    XidRow(13, "ROBUST_CHANNEL_GR_EXCEPTION", _A, _APP, repeat_action=_EXCL),
    XidRow(31, "FIFO_ERROR_MMU_ERR_FLT", _A, _APP, repeat_action=_EXCL),
    XidRow(43, "RESETCHANNEL_VERIF_ERROR", _A, _KEEP, repeat_action=_EXCL),
    # Sympathetic cleanup after another error or a killed process: its companion Xid decides, and
    # alone it is what every scancel of a CUDA job leaves behind (k8s-device-plugin, GCM agree).
    XidRow(45, "PREEMPTIVE_REMOVAL", _A, _KEEP),
    XidRow(48, "GPU_ECC_DBE", _H, _EXCL, repeat_action=_DRAIN),
    XidRow(61, "PMU_BREAKPOINT", _H, _DRAIN),
    XidRow(62, "PMU_HALT_ERROR", _D, _EXCL),
    # Benign by itself; whether the remap still waits for a reset is NVML's row-remap check's call.
    XidRow(63, "INFOROM_DRAM_RETIREMENT_EVENT", _H, _KEEP, repeat_action=_EXCL),
    XidRow(64, "INFOROM_DRAM_RETIREMENT_FAILURE", _H, _DRAIN),
    XidRow(74, "NVLINK_ERROR", _H, _EXCL),
    XidRow(79, "GPU_HAS_FALLEN_OFF_THE_BUS", _H, _DRAIN),
    XidRow(92, "EXCESSIVE_SBE_INTERRUPTS", _H, _KEEP, repeat_action=_EXCL),
    XidRow(94, "ROBUST_CHANNEL_CONTAINED_ERROR", _H, _APP, repeat_action=_EXCL),
    XidRow(95, "ROBUST_CHANNEL_UNCONTAINED_ERROR", _H, _EXCL),
    XidRow(119, "GSP_RPC_TIMEOUT", _D, _EXCL),
    XidRow(120, "GSP_ERROR", _D, _EXCL),
    XidRow(140, "UNRECOVERABLE_ECC_ERROR_ESCAPE", _H, _DRAIN),
    XidRow(143, "GPU_INIT_ERROR", _H, _DRAIN),
    # Link-fatal sub-codes take the node out, BER events do not; an undecoded one counts as fatal.
    XidRow(149, "NVLINK_NETIR_ERROR", _H, _EXCL, detail_decides=True),
    # Only reports the driver's new recovery action, which is what counts.
    XidRow(154, "GPU_RECOVERY_ACTION_CHANGED", _I, _KEEP, detail_decides=True),
)

CATALOG: Mapping[int, XidRow] = {row.code: row for row in _ROWS}

UNKNOWN_ACTION = Action.RESTART_APP
"""Action for an Xid the catalog lacks: the node stays, but a repeat across jobs excludes it."""

RECOVERY_ACTIONS: Mapping[int, Action] = {
    0: Action.KEEP,  # NONE
    1: Action.RESET_GPU,  # GPU_RESET
    2: Action.DRAIN,  # NODE_REBOOT
    3: Action.RESET_GPU,  # DRAIN_P2P: finish P2P work, then reset
    4: Action.RESET_GPU,  # DRAIN_AND_RESET
    5: Action.DRAIN,  # RECOVER_IMEX_DOMAIN: needs the admin's IMEX recovery
    6: Action.RESET_GPU,  # BUS_RESET
    7: Action.DRAIN,  # SYSTEM_REBOOT
}
"""NVML's GPU recovery action (field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, and Xid 154's
"changed from … to 0xN") → action. A code missing here means a newer driver: drain."""


def row_for(catalog: Mapping[int, XidRow], code: int) -> XidRow:
    """The catalog row for `code`, or a synthetic row for an Xid the catalog does not know."""
    row = catalog.get(code)
    if row is None:
        row = XidRow(code, "UNKNOWN_XID", XidClass.UNKNOWN, UNKNOWN_ACTION, repeat_action=_EXCL)
    return row


def recovery_action(code: int) -> Action:
    return RECOVERY_ACTIONS.get(code, Action.DRAIN)


def parse_overrides(text: str, fmt: str) -> dict[int, Action]:
    """Site overrides, Xid → action, from JSON (`{"63": "reset-gpu"}`) or INI (`[xid]` section,
    `63 = reset-gpu`). `fmt` is "json" or "ini". Raises ValueError naming the bad entry."""
    if fmt == "json":
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"catalog overrides are not valid JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise ValueError('catalog overrides must be a JSON object like {"63": "reset-gpu"}')
        items = list(raw.items())
    elif fmt == "ini":
        parser = configparser.ConfigParser()
        try:
            parser.read_string(text)
        except configparser.Error as exc:
            raise ValueError(f"catalog overrides are not valid INI: {exc}") from None
        if not parser.has_section("xid"):
            raise ValueError("catalog overrides need an [xid] section with lines like `63 = reset-gpu`")
        items = list(parser.items("xid"))
    else:
        raise ValueError(f"unknown overrides format {fmt!r}: use json or ini")
    overrides: dict[int, Action] = {}
    for key, value in items:
        try:
            code = int(key)
        except ValueError:
            raise ValueError(f"catalog override key {key!r} is not an Xid number") from None
        if not isinstance(value, str):
            raise ValueError(f"catalog override for Xid {code} must be an action name, got {value!r}")
        overrides[code] = Action.parse(value)
    return overrides


def with_overrides(catalog: Mapping[int, XidRow], overrides: Mapping[int, Action]) -> dict[int, XidRow]:
    """A copy of `catalog` whose rows take the site's actions; codes it lacks become site rows.
    An overridden row's action is final: its repeat escalation and detail decoding are dropped."""
    merged = dict(catalog)
    for code, action in overrides.items():
        base = row_for(catalog, code)
        mnemonic = base.mnemonic if code in catalog else "SITE_DEFINED"
        merged[code] = XidRow(code, mnemonic, base.xid_class, action)
    return merged
