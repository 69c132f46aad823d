"""The command line as users type it: global flags on either side of the sub-command (as kubectl and promtool
take them), and a flag given before the sub-command is not reset by the sub-command's own default."""

from __future__ import annotations

import pytest

from stallwatch.cli import _parser, _write_timeout


@pytest.mark.parametrize("argv", [
    ["--config.file", "F", "--log.level", "debug", "diagnose", "seed"],
    ["diagnose", "--config.file", "F", "--log.level", "debug", "seed"],
    ["diagnose", "seed", "--config.file=F", "--log.level=debug"],
    ["--config.file", "F", "diagnose", "--log.level", "debug", "seed"],
])
def test_global_flags_on_either_side_of_the_sub_command(argv: list[str]) -> None:
    args = _parser().parse_args(argv)
    assert (args.command, args.server, args.config_file, args.log_level) == ("diagnose", "seed", "F", "debug")


def test_flags_left_out_keep_their_defaults_under_a_sub_command() -> None:
    args = _parser().parse_args(["serve"])
    assert (args.config_file, args.log_level, args.listen_address, args.collector_gpu) == (None, "info", ":9847", None)


def test_a_collector_flag_after_serve_and_a_listen_address_before_it() -> None:
    args = _parser().parse_args(["--web.listen-address", "127.0.0.1:1", "serve", "--no-collector.gpu"])
    assert (args.listen_address, args.collector_gpu) == ("127.0.0.1:1", False)


def test_the_sub_commands_own_flags_stay_its_own() -> None:
    with pytest.raises(SystemExit):
        _parser().parse_args(["--json", "diagnose"])  # --json is diagnose's, not a global flag


def test_the_write_timeout_is_a_duration_above_zero() -> None:
    assert _write_timeout("30s") == 30.0 and _write_timeout("1m") == 60.0
    for bad in ("0", "0s", "soon", "-1s"):
        with pytest.raises(ValueError, match=r"--web\.write-timeout: expected a duration above 0"):
            _write_timeout(bad)
