"""Secret sources: env, file (re-read on change, private only), command (timeout, no shell, TTL), registry."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from sandgate.brokers import (
    SecretReferenceError,
    SecretRegistry,
    SecretUnavailable,
    default_registry,
    parse_ref,
)
from sandgate.brokers.sources.command import CommandSource
from sandgate.brokers.sources.env import EnvSource
from sandgate.brokers.sources.file import FileSource

from ..conftest import Clock, MemorySource

SECRET = "s3cr3t-value-0123456789"
PY = sys.executable


def private(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


# --- references -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "scheme", "value"),
    [
        ("env:OPENAI_KEY", "env", "OPENAI_KEY"),
        ("file:/run/secrets/x", "file", "/run/secrets/x"),
        ("cmd:vault kv get -field=key secret/x", "cmd", "vault kv get -field=key secret/x"),
        ("redis:tenants/t1/openai", "redis", "tenants/t1/openai"),
    ],
    ids=["an env reference", "a file reference", "a command reference", "another scheme (redis) parses"],
)
def test_references_parse(text: str, scheme: str, value: str) -> None:
    ref = parse_ref(text)
    assert (ref.scheme, ref.value, str(ref)) == (scheme, value, text)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "OPENAI_KEY",
        "env:",
        "env:1BAD",
        "env:A B",
        "ENV:X",
        "cmd:",
        "cmd:'unbalanced",
        "file: /x",
        "file:/x\n",
    ],
    ids=[
        "empty",
        "no scheme",
        "no value",
        "an env name starting with a digit",
        "an env name with a space",
        "an upper-case scheme",
        "a command without a program",
        "a command with unbalanced quotes",
        "a value with leading space",
        "a value with a newline",
    ],
)
def test_bad_references_are_refused(text: str) -> None:
    with pytest.raises(SecretReferenceError):
        parse_ref(text)


def test_a_relative_file_reference_resolves_against_the_base_dir(tmp_path: Path) -> None:
    assert str(parse_ref("file:keys/a").relative_to(tmp_path)) == f"file:{tmp_path}/keys/a"
    assert str(parse_ref("file:/abs").relative_to(tmp_path)) == "file:/abs"
    assert str(parse_ref("env:X").relative_to(tmp_path)) == "env:X"


# --- env ------------------------------------------------------------------------------


async def test_env_reads_the_variable_at_each_use() -> None:
    environ = {"KEY": SECRET}
    source = EnvSource(environ)
    assert (await source.get(parse_ref("env:KEY"))).reveal() == SECRET
    environ["KEY"] = SECRET + "-rotated"
    assert (await source.get(parse_ref("env:KEY"))).reveal() == SECRET + "-rotated"


@pytest.mark.parametrize("environ", [{}, {"KEY": ""}, {"KEY": "  \n"}], ids=["missing", "empty", "blank"])
async def test_env_without_a_value_is_unavailable(environ: dict[str, str]) -> None:
    with pytest.raises(SecretUnavailable, match="KEY is not set or empty"):
        await EnvSource(environ).get(parse_ref("env:KEY"))


# --- file -----------------------------------------------------------------------------


async def test_a_file_is_read_stripped(tmp_path: Path) -> None:
    path = private(tmp_path / "s", SECRET + "\n")
    assert (await FileSource().get(parse_ref(f"file:{path}"))).reveal() == SECRET


async def test_a_changed_file_is_re_read_on_the_next_use(tmp_path: Path) -> None:
    path = private(tmp_path / "s", SECRET)
    source = FileSource()
    ref = parse_ref(f"file:{path}")
    assert (await source.get(ref)).reveal() == SECRET
    path.write_text("rotated-" + SECRET)
    assert (await source.get(ref)).reveal() == "rotated-" + SECRET
    # Same size, new content, mtime forced back: the ctime still moves.
    st = path.stat()
    path.write_text("ROTATED-" + SECRET)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (await source.get(ref)).reveal() == "ROTATED-" + SECRET


async def test_a_file_replaced_by_rename_is_re_read(tmp_path: Path) -> None:
    path = private(tmp_path / "s", SECRET)
    source = FileSource()
    ref = parse_ref(f"file:{path}")
    await source.get(ref)
    new = private(tmp_path / "s.new", "renamed-" + SECRET)
    new.replace(path)
    assert (await source.get(ref)).reveal() == "renamed-" + SECRET


@pytest.mark.parametrize(
    "mode", [0o640, 0o604, 0o660, 0o644, 0o610, 0o601], ids=lambda m: f"mode {m:o} is refused"
)
async def test_a_group_or_world_accessible_file_is_refused(tmp_path: Path, mode: int) -> None:
    path = private(tmp_path / "s", SECRET, mode)
    with pytest.raises(SecretUnavailable, match="chmod 600") as info:
        await FileSource().get(parse_ref(f"file:{path}"))
    assert SECRET not in str(info.value)


async def test_a_file_made_readable_after_first_use_is_refused(tmp_path: Path) -> None:
    path = private(tmp_path / "s", SECRET)
    source = FileSource()
    await source.get(parse_ref(f"file:{path}"))
    path.chmod(0o644)
    with pytest.raises(SecretUnavailable):
        await source.get(parse_ref(f"file:{path}"))


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda p: None, "No such file"),
        (lambda p: private(p, "\n\n"), "is empty"),
        (lambda p: p.mkdir(mode=0o700), "not a regular file"),
    ],
    ids=["a missing file is unavailable", "an empty file is unavailable", "a directory is unavailable"],
)
async def test_unusable_files_are_unavailable(tmp_path: Path, setup: object, message: str) -> None:
    path = tmp_path / "s"
    setup(path)  # type: ignore[operator]
    with pytest.raises(SecretUnavailable, match=message):
        await FileSource().get(parse_ref(f"file:{path}"))


async def test_a_relative_file_path_is_refused_by_the_source() -> None:
    with pytest.raises(SecretUnavailable, match="not absolute"):
        await FileSource().get(parse_ref("file:relative/s"))


# --- command --------------------------------------------------------------------------


def cmd(code: str) -> str:
    return f"cmd:{PY} -c '{code}'"


async def test_a_command_prints_the_secret() -> None:
    secret = await CommandSource().get(parse_ref(cmd(f'print(" {SECRET} ")')))
    assert secret.reveal() == SECRET


async def test_a_command_runs_without_a_shell() -> None:
    secret = await CommandSource().get(parse_ref("cmd:echo $HOME;rm-never-runs"))
    assert secret.reveal() == "$HOME;rm-never-runs"


# The hang is what the short timeout is for; the others get headroom for a slow Python start.
@pytest.mark.parametrize(
    ("code", "timeout", "message"),
    [
        (
            f'import sys; print("{SECRET}"); sys.stderr.write("{SECRET}"); sys.exit(3)',
            30,
            "exited with status 3",
        ),
        ("print()", 30, "printed nothing"),
        ("import time; time.sleep(5)", 0.3, "timed out after 0.3s"),
        ('import sys; sys.stdout.write("x" * (2 << 20))', 30, "printed more than"),
    ],
    ids=[
        "a failing command is unavailable and its output is not echoed",
        "a command that prints nothing is unavailable",
        "a command that hangs times out",
        "a command that prints too much is refused",
    ],
)
async def test_failing_commands_are_unavailable(code: str, timeout: float, message: str) -> None:
    with pytest.raises(SecretUnavailable, match=message) as info:
        await CommandSource(timeout=timeout).get(parse_ref(cmd(code)))
    assert SECRET not in str(info.value)


async def test_a_missing_program_is_unavailable() -> None:
    with pytest.raises(SecretUnavailable, match="cannot be started"):
        await CommandSource().get(parse_ref("cmd:/nonexistent/vault get x"))


async def test_a_command_result_is_kept_for_its_ttl(tmp_path: Path) -> None:
    counter = tmp_path / "runs"
    code = f'import pathlib; p = pathlib.Path("{counter}"); p.write_text(p.read_text() + "x" if p.exists() else "x"); print("value-" + str(len(p.read_text())) * 8)'
    clock = Clock()
    source = CommandSource(ttl=60, clock=clock)
    ref = parse_ref(cmd(code))
    first = await source.get(ref)
    assert (await source.get(ref)) == first
    assert counter.read_text() == "x"
    clock.advance(61)
    second = await source.get(ref)
    assert second != first
    assert second.reveal() == "value-" + "2" * 8


# --- registry -------------------------------------------------------------------------


async def test_the_registry_dispatches_on_the_scheme(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDGATE_TEST_SECRET", SECRET)
    memory = MemorySource(k=SECRET + "-mem")
    registry = default_registry().with_source("mem", memory)
    assert (await registry.get("env:SANDGATE_TEST_SECRET")).reveal() == SECRET
    assert (await registry.get("mem:k")).reveal() == SECRET + "-mem"
    assert registry.schemes == {"env", "file", "cmd", "mem"}
    assert not default_registry().supports("mem:k")


async def test_an_unknown_scheme_is_a_reference_error() -> None:
    with pytest.raises(SecretReferenceError, match="no secret source handles 'redis:'"):
        await SecretRegistry({}).get("redis:x")
