from __future__ import annotations

import dataclasses

import pytest

from resilient_slurm.health.xid_catalog import (
    CATALOG,
    RECOVERY_ACTIONS,
    Action,
    XidClass,
    parse_overrides,
    recovery_action,
    row_for,
    with_overrides,
)

REQUIRED = {13, 31, 43, 45, 48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140, 143, 149, 154}


def test_catalog_covers_the_issue_codes_as_frozen_rows() -> None:
    assert set(CATALOG) >= REQUIRED
    row = CATALOG[79]
    with pytest.raises(dataclasses.FrozenInstanceError):
        row.action = Action.KEEP  # type: ignore[misc]
    assert all(code == r.code for code, r in CATALOG.items())


@pytest.mark.parametrize("code", [13, 31, 43, 63])
def test_application_and_benign_xids_stay_alone_but_repeat_takes_the_node_out(code: int) -> None:
    row = CATALOG[code]
    assert not row.action.takes_node_out
    assert row.repeat_action is not None and row.repeat_action.takes_node_out


def test_classes_follow_the_catalog() -> None:
    assert {c for c in REQUIRED if CATALOG[c].xid_class is XidClass.APPLICATION} == {13, 31, 43, 45}
    assert CATALOG[154].xid_class is XidClass.INFORMATIONAL
    assert CATALOG[119].xid_class is XidClass.DRIVER_FIRMWARE
    assert CATALOG[79].xid_class is XidClass.HARDWARE


@pytest.mark.parametrize(
    ("code", "action"), [(79, Action.DRAIN), (48, Action.EXCLUDE), (64, Action.DRAIN), (45, Action.KEEP)]
)
def test_hardware_faults_take_the_node_out(code: int, action: Action) -> None:
    assert CATALOG[code].action is action


def test_unknown_xid_keeps_the_node_but_counts_repeats() -> None:
    row = row_for(CATALOG, 4242)
    assert row.xid_class is XidClass.UNKNOWN
    assert row.action is Action.RESTART_APP and row.repeat_action is Action.EXCLUDE


def test_action_labels_round_trip() -> None:
    for action in Action:
        assert Action.parse(action.label) is action
    assert Action.parse(" Reset-GPU ") is Action.RESET_GPU
    with pytest.raises(ValueError, match="use one of keep, restart-app, reset-gpu, exclude, drain"):
        Action.parse("reboot")


def test_recovery_actions_follow_nvml_and_unknown_codes_drain() -> None:
    assert recovery_action(0) is Action.KEEP
    assert recovery_action(1) is Action.RESET_GPU
    assert recovery_action(2) is Action.DRAIN
    assert recovery_action(99) is Action.DRAIN
    assert set(RECOVERY_ACTIONS) == set(range(8))


def test_overrides_from_json_and_ini() -> None:
    assert parse_overrides('{"63": "reset-gpu", "200": "drain"}', "json") == {63: Action.RESET_GPU, 200: Action.DRAIN}
    assert parse_overrides("[xid]\n63 = reset-gpu\n13 = keep\n", "ini") == {63: Action.RESET_GPU, 13: Action.KEEP}


@pytest.mark.parametrize(
    ("text", "fmt", "message"),
    [
        ("{", "json", "not valid JSON"),
        ("[1]", "json", "must be a JSON object"),
        ('{"x": "drain"}', "json", "not an Xid number"),
        ('{"63": 2}', "json", "must be an action name"),
        ('{"63": "reboot"}', "json", "unknown action"),
        ("63 = drain", "ini", "not valid INI"),
        ("[other]\n63 = drain\n", "ini", r"\[xid\] section"),
        ("{}", "yaml", "unknown overrides format"),
    ],
)
def test_bad_overrides_name_the_problem(text: str, fmt: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_overrides(text, fmt)


def test_with_overrides_replaces_and_adds_rows_without_touching_the_catalog() -> None:
    merged = with_overrides(CATALOG, {63: Action.RESET_GPU, 200: Action.DRAIN, 13: Action.KEEP})
    assert merged[63].action is Action.RESET_GPU and merged[63].mnemonic == CATALOG[63].mnemonic
    assert merged[200].mnemonic == "SITE_DEFINED" and merged[200].action is Action.DRAIN
    assert merged[13].repeat_action is None  # the site's word is final
    assert CATALOG[63].action is Action.KEEP
