"""The gateway config: a key renamed is still read, with a warning naming file, line and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandgate.proxy.config import load_config
from sandgate.proxy.errors import ConfigError


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sandgate.yaml"
    path.write_text(text)
    return path


def test_limits_sync_sets_the_interval_without_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = load_config(write(tmp_path, "limits_sync:\n  interval_seconds: 0.3\n"))
    assert config.limits_sync.interval_seconds == 0.3
    assert capsys.readouterr().err == ""


def test_the_old_limits_key_is_read_with_a_warning_naming_file_line_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, "log:\n  level: info\nlimits:\n  sync_interval_seconds: 0.05\n")
    assert load_config(path).limits_sync.interval_seconds == 0.05
    assert capsys.readouterr().err == (
        f"sandgate: warning: {path}:3:1: `limits: {{sync_interval_seconds: ...}}` is deprecated; "
        "write `limits_sync: {interval_seconds: ...}` (the same setting)\n"
    )


def test_an_invalid_old_value_is_reported_where_it_is_written(tmp_path: Path) -> None:
    path = write(tmp_path, "limits:\n  sync_interval_seconds: 50\n")
    with pytest.raises(
        ConfigError, match=rf"^{path}:2:3: limits_sync.interval_seconds: .*less than or equal to 10"
    ):
        load_config(path)


def test_both_the_old_and_the_new_key_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "limits_sync:\n  interval_seconds: 0.3\nlimits:\n  sync_interval_seconds: 1\n")
    with pytest.raises(
        ConfigError, match="`limits` is the old name of `limits_sync`: keep only `limits_sync`"
    ):
        load_config(path)
