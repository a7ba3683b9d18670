"""Extension points found by name (fleetscope/components.py) and the trainer's use of one."""

from __future__ import annotations

import argparse

import pytest

from fleetscope import components


def test_resolve_finds_the_preflight_check() -> None:
    from fleetscope.kernels.preflight import check_before_training

    assert components.resolve(components.PREFLIGHT) is check_before_training


def test_a_missing_component_is_named() -> None:
    with pytest.raises(components.ComponentMissing, match="fleetscope.nosuchpart.probe is not installed"):
        components.resolve("fleetscope.nosuchpart.probe:run")


def test_an_import_error_inside_a_component_is_not_hidden(tmp_path, monkeypatch) -> None:
    (tmp_path / "brokenpart.py").write_text("import nosuchdependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="nosuchdependency_xyz"):
        components.resolve("brokenpart:run")


def test_train_preflight_without_the_kernels_is_a_cli_error(monkeypatch) -> None:
    from fleetscope.trainer.cli import build_config, register

    from fleetscope.cli import CliError

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["train", "--preflight", "--steps", "1"])
    monkeypatch.setattr(components, "PREFLIGHT", "fleetscope.kernels_absent.preflight:check")
    with pytest.raises(CliError, match="--preflight: fleetscope.kernels_absent.preflight is not installed"):
        build_config(args)
    monkeypatch.undo()
    assert build_config(args).preflight is True


def test_the_dashboard_mount_is_found_by_name() -> None:
    from fleetscope.dashboard.mount import mount_dashboard

    assert components.resolve(components.DASHBOARD_MOUNT) is mount_dashboard
