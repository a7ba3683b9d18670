"""The agent's flags are generated from AgentConfig: one default, one help text per setting."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
from fleetscope.agent.cli import build_config
from fleetscope.agent.config import BATCH_DELAY_S, AgentConfig
from fleetscope.agent.shipper import Shipper
from fleetscope.agent.transport import Transport

from fleetscope.cli import CliError, build_parser
from fleetscope.dataclass_cli import FLAG, field_docs


def _args(*extra: str):
    return build_parser().parse_args(["agent", "--server", "http://127.0.0.1:1", "--spool", "/tmp/s", *extra])


def _help() -> str:
    return build_parser()._subparsers._group_actions[0].choices["agent"].format_help()  # type: ignore[union-attr]


def test_every_flagged_field_is_a_flag_with_its_docstring_and_default():
    text = " ".join(_help().split())
    docs = field_docs(AgentConfig)
    flagged = [f for f in dataclasses.fields(AgentConfig) if FLAG in f.metadata]
    assert len(flagged) >= 20
    for f in flagged:
        name = f.metadata[FLAG]["name"]
        assert name in text, name
        assert docs[f.name].split()[0] in text, (f.name, docs[f.name])
    assert "--batch-delay S ...or once the oldest pending frame has waited this many seconds. (default 0.5)" in text


def test_no_flags_means_the_dataclass_defaults():
    cfg = build_config(_args())
    ref = AgentConfig(server="http://127.0.0.1:1", spool="/tmp/s")  # type: ignore[arg-type]
    for f in dataclasses.fields(AgentConfig):
        if f.name not in ("host", "token"):
            assert getattr(cfg, f.name) == getattr(ref, f.name), f.name
    assert cfg.batch_delay_s == BATCH_DELAY_S == 0.5


def test_flags_reach_the_config():
    cfg = build_config(_args("--batch-delay", "0.2", "--batch-bytes", "256K", "--no-gpu",
                             "--no-clock-sync", "--disk-budget", "2G", "--retain-acked",
                             "--compression", "none", "--job", "j1", "--host", "h7"))  # fmt: skip
    assert (cfg.batch_delay_s, cfg.batch_bytes, cfg.gpu, cfg.clock_sync) == (0.2, 256 << 10, False, False)
    assert (cfg.disk_budget_bytes, cfg.retain_acked, cfg.compression) == (2 << 30, True, None)
    assert (cfg.job, cfg.host) == ("j1", "h7")


@pytest.mark.parametrize("argv,says", [
    (("--batch-delay", "-1"), "--batch-delay -1.0: must be positive"),
    (("--max-backoff", "0"), "--max-backoff 0.0: must be positive"),
    (("--batch-bytes", "4X"), "bad size '4X'"),
    (("--server", "ftp://x"), "expected an http:// or https:// URL"),
    (("--nice", "30"), "--nice 30: must be in -20..19"),
])  # fmt: skip
def test_bad_values_name_the_flag(argv, says):
    with pytest.raises(CliError, match=says.replace("(", r"\(").replace(".", r"\.")):
        build_config(_args(*argv))


def test_shipper_and_transport_defaults_are_the_configs():
    ship = inspect.signature(Shipper).parameters
    ref = AgentConfig(server="http://x", spool="/tmp/s")  # type: ignore[arg-type]
    for name in ("batch_bytes", "batch_delay_s", "poll_s", "rejected_max_bytes", "in_flight"):
        assert ship[name].default == getattr(ref, name), name
    assert inspect.signature(Transport).parameters["max_backoff_s"].default == ref.max_backoff_s
