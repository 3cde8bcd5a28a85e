"""`sandgate audit` over the fleet stream: the same filters and output as over the files."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from support import RedisServer, free_port
from support.audit_trail import DECISIONS, TRAIL, line

from sandgate.proxy.audit.redis_stream import RedisStreamSink
from sandgate.proxy.cli.main import main
from sandgate.proxy.config import RedisConfig
from sandgate.proxy.redis.client import Keys, connect_sync

PREFIX = "fleet1:"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run `sandgate audit ...`: exit code, stdout, stderr."""
    code = main(["audit", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def sink(redis_server: RedisServer, tmp_path: Path) -> Iterator[RedisStreamSink]:
    made = RedisStreamSink(
        connect_sync(RedisConfig(url=redis_server.url)),
        Keys(PREFIX),
        tmp_path / "spool",
        maxlen=10_000,
        dedupe_ttl=3600,
        gateway="gw-a",
    )
    yield made
    made.close()


@pytest.fixture
def both(tmp_path: Path, sink: RedisStreamSink, redis_server: RedisServer) -> tuple[list[str], list[str]]:
    """The shared trail as rotated files and in the stream: the two source options."""
    for name, records in TRAIL.items():
        (tmp_path / name).write_text("".join(line(r) for r in records))
    sink.write([line(r) for f in TRAIL.values() for r in f])
    return ["--file", str(tmp_path / "audit.jsonl")], ["--redis", redis_server.url, "--prefix", PREFIX]


@pytest.mark.parametrize(
    "argv",
    [
        ["query", "--format", "json"],
        ["query", "--format", "table", "--reason", "host_not_allowed", "--reason", "path_not_allowed"],
        ["query", "--format", "json", "--host", "*.test", "--tenant", "t1", "--limit", "3"],
        ["query", "--format", "json", "--event", "policy_reload"],
        ["query", "--format", "json", "--since", "2026-11-30T10:20:00Z", "--until", "2026-11-30T10:50:00Z"],
        ["tail", "-n", "4", "--format", "json"],
        ["tail", "-n", "2", "--decision", "deny"],
        ["stats", "--format", "json"],
        ["stats"],
        ["suggest", "--sandbox", "sb1", "--min-count", "1"],
    ],
    ids=[
        "query lists every decision oldest first",
        "query filters by reason as a table",
        "query stops at its limit",
        "query selects reload events",
        "query keeps to a time window",
        "tail gives the newest records",
        "tail filters denials",
        "stats count per tenant as json",
        "stats print a table",
        "suggest proposes rules for a sandbox",
    ],
)
def test_the_stream_gives_the_same_answers_as_the_files(
    both: tuple[list[str], list[str]], argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    files, stream = both
    from_files = run(capsys, *argv, *files)
    from_stream = run(capsys, *argv, *stream)
    assert from_files[0] == 0 and from_files[1]
    assert from_stream == from_files


def test_config_stream_reads_the_redis_section(
    both: tuple[list[str], list[str]],
    redis_server: RedisServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = tmp_path / "gw.yaml"
    config.write_text(yaml.safe_dump({"redis": {"url": redis_server.url, "prefix": PREFIX}}))
    code, out, err = run(capsys, "query", "--config", str(config), "--stream", "--format", "json")
    assert (code, err) == (0, "")
    assert [json.loads(x)["decision_id"] for x in out.splitlines()] == DECISIONS


def test_config_stream_without_a_redis_section_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "gw.yaml"
    config.write_text(yaml.safe_dump({"state_dir": str(tmp_path)}))
    code, _, err = run(capsys, "stats", "--config", str(config), "--stream")
    assert code == 2
    assert f"--stream: {config} has no redis: section" in err


def test_an_unreachable_redis_is_an_error_that_names_it_but_not_its_password(
    capsys: pytest.CaptureFixture[str],
) -> None:
    port = free_port()
    code, out, err = run(capsys, "query", "--redis", f"redis://:hunter2@127.0.0.1:{port}/0")
    assert code == 2
    assert f"cannot read the audit stream 'sandgate:audit' at 127.0.0.1:{port}" in err
    assert "hunter2" not in err + out


def test_a_bad_prefix_is_refused(redis_server: RedisServer, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "query", "--redis", redis_server.url, "--prefix", "no spaces")
    assert code == 2 and "redis prefix" in err


def test_tail_follow_waits_on_the_stream_for_new_records(
    sink: RedisStreamSink, redis_server: RedisServer
) -> None:
    records = [r for f in TRAIL.values() for r in f if r["event"] == "decision"]
    sink.write([line(r) for r in records[:3]])
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sandgate.proxy.cli.main",
            "audit",
            "tail",
            "--follow",
            "-n",
            "1",
            "--format",
            "json",
        ]
        + ["--redis", redis_server.url, "--prefix", PREFIX],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for text in proc.stdout:
            lines.put(text)

    threading.Thread(target=read, daemon=True).start()
    try:
        assert json.loads(lines.get(timeout=15))["decision_id"] == records[2]["decision_id"]
        sink.write([line(r) for r in records[3:6]])
        got = [json.loads(lines.get(timeout=15))["decision_id"] for _ in range(3)]
        assert got == [r["decision_id"] for r in records[3:6]]
        assert lines.empty()
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=15)
    assert proc.returncode == 0 and err == ""
