"""The gateway config's `agent_protocols:` section: today's bounds by default, a value read
where it is written, an absurd one refused at load naming file, line, column and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandgate.proxy.config import AgentProtocolsConfig, load_config
from sandgate.proxy.errors import ConfigError


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sandgate.yaml"
    path.write_text(text)
    return path


def test_without_the_section_the_bounds_are_todays(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "log:\n  level: info\n")).agent_protocols
    assert config == AgentProtocolsConfig()
    assert (config.max_body_bytes, config.max_depth, config.max_batch) == (1 << 20, 64, 64)
    graphql = config.graphql
    assert (graphql.max_query_bytes, graphql.max_tokens, graphql.max_nesting, graphql.max_batch) == (
        64 * 1024,
        10_000,
        64,
        16,
    )


def test_lowered_bounds_are_read(tmp_path: Path) -> None:
    text = "agent_protocols:\n  max_body_bytes: 65536\n  max_depth: 16\n  max_batch: 8\n  graphql:\n    max_batch: 2\n"
    config = load_config(write(tmp_path, text)).agent_protocols
    assert (config.max_body_bytes, config.max_depth, config.max_batch, config.graphql.max_batch) == (
        65536,
        16,
        8,
        2,
    )


@pytest.mark.parametrize(
    ("text", "where", "message"),
    [
        ("max_body_bytes: 2097152", "2:3: agent_protocols.max_body_bytes", "less than or equal to 1048576"),
        ("max_body_bytes: 10", "2:3: agent_protocols.max_body_bytes", "greater than or equal to 1024"),
        ("max_depth: 1", "2:3: agent_protocols.max_depth", "greater than or equal to 4"),
        ("max_depth: 100000", "2:3: agent_protocols.max_depth", "less than or equal to 256"),
        ("max_batch: 0", "2:3: agent_protocols.max_batch", "greater than or equal to 1"),
        (
            "graphql:\n    max_nesting: 500",
            "3:5: agent_protocols.graphql.max_nesting",
            "less than or equal to 64",
        ),
        ("max_bytes: 1024", "2:3: agent_protocols", "max_bytes"),
    ],
    ids=[
        "a body bound over the 1 MiB the gateway buffers before deciding is refused",
        "a body bound too small for any message is refused",
        "a depth too shallow for a tool's arguments is refused",
        "a depth past the strict reader's ceiling is refused",
        "an empty batch bound is refused",
        "a GraphQL nesting past the parser's safe bound is refused",
        "an unknown key is refused",
    ],
)
def test_an_absurd_bound_is_refused_at_load_naming_file_line_and_field(
    tmp_path: Path, text: str, where: str, message: str
) -> None:
    path = write(tmp_path, f"agent_protocols:\n  {text}\n")
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    assert str(refused.value).startswith(f"{path}:{where}")
    assert message in str(refused.value)
