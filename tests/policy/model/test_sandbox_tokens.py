"""Tests for sandgate.policy.model.sandbox_tokens: token references, digests and comparison."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from sandgate.policy.errors import TokenFileMissingError, TokenReferenceError
from sandgate.policy.model.sandbox_tokens import (
    digest_token,
    new_token,
    resolve_token_reference,
    tokens_equal,
)

TOKEN = "0123456789abcdef-token"
VAR = "SANDGATE_TEST_PROXY_TOKEN"


def private_file(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


# --- env: --------------------------------------------------------------------------------------


def test_an_env_reference_resolves_to_the_digest(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(VAR, TOKEN)
    assert resolve_token_reference(f"env:{VAR}", tmp_path) == hashlib.sha256(TOKEN.encode()).digest()


@pytest.mark.parametrize(
    "value",
    [None, ""],
    ids=["an unset variable is refused", "an empty variable is refused"],
)
def test_an_env_reference_needs_a_value(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, value: str | None
) -> None:
    if value is None:
        monkeypatch.delenv(VAR, raising=False)
    else:
        monkeypatch.setenv(VAR, value)
    with pytest.raises(TokenReferenceError, match=f"^environment variable {VAR} is not set$"):
        resolve_token_reference(f"env:{VAR}", tmp_path)


def test_a_short_env_token_is_refused_without_echoing_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(VAR, "fifteen-chars!!")
    with pytest.raises(TokenReferenceError) as info:
        resolve_token_reference(f"env:{VAR}", tmp_path)
    assert str(info.value) == f"token from environment variable {VAR} is shorter than 16 characters"
    assert "fifteen" not in str(info.value)


def test_a_sixteen_character_token_is_long_enough(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(VAR, "x" * 16)
    assert resolve_token_reference(f"env:{VAR}", tmp_path) == digest_token("x" * 16)


# --- file: -------------------------------------------------------------------------------------


def test_a_file_reference_is_relative_to_the_tenant_file(tmp_path: Path) -> None:
    private_file(tmp_path / "t.token", TOKEN + "\n")
    assert resolve_token_reference("file:t.token", tmp_path) == digest_token(TOKEN)


def test_a_file_reference_may_be_absolute(tmp_path: Path) -> None:
    path = private_file(tmp_path / "t.token", f"  {TOKEN}  \n")
    assert resolve_token_reference(f"file:{path}", Path("/nonexistent")) == digest_token(TOKEN)


@pytest.mark.parametrize(
    "mode",
    [0o644, 0o640, 0o604, 0o620, 0o602, 0o610],
    ids=[
        "a world readable file is refused",
        "a group readable file is refused",
        "an other readable file is refused",
        "a group writable file is refused",
        "an other writable file is refused",
        "a group executable file is refused",
    ],
)
def test_a_token_file_must_be_private(tmp_path: Path, mode: int) -> None:
    path = private_file(tmp_path / "t.token", TOKEN, mode)
    with pytest.raises(TokenReferenceError) as info:
        resolve_token_reference("file:t.token", tmp_path)
    assert str(info.value) == (
        f"token file {path} is accessible by group or others (mode {mode:o}); chmod 600 it"
    )
    assert TOKEN not in str(info.value)


@pytest.mark.parametrize(
    "mode",
    [0o600, 0o400, 0o700],
    ids=[
        "an owner read write file is accepted",
        "an owner read only file is accepted",
        "mode 700 is accepted",
    ],
)
def test_a_private_token_file_is_accepted(tmp_path: Path, mode: int) -> None:
    private_file(tmp_path / "t.token", TOKEN, mode)
    assert resolve_token_reference("file:t.token", tmp_path) == digest_token(TOKEN)


def test_a_missing_token_file_is_its_own_error(tmp_path: Path) -> None:
    with pytest.raises(TokenFileMissingError, match=r"^token file .*/nope\.token does not exist yet"):
        resolve_token_reference("file:nope.token", tmp_path)


def test_a_short_file_token_is_refused_without_echoing_it(tmp_path: Path) -> None:
    path = private_file(tmp_path / "t.token", "short\n")
    with pytest.raises(TokenReferenceError) as info:
        resolve_token_reference("file:t.token", tmp_path)
    assert str(info.value) == f"token from file {path} is shorter than 16 characters"


def test_a_token_file_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.token"
    path.write_bytes(b"\xff" * 32)
    path.chmod(0o600)
    with pytest.raises(TokenReferenceError, match="UnicodeDecodeError"):
        resolve_token_reference("file:t.token", tmp_path)


# --- sha256: -----------------------------------------------------------------------------------

DIGEST = hashlib.sha256(TOKEN.encode()).hexdigest()


@pytest.mark.parametrize(
    "hex_digits",
    [DIGEST, DIGEST.upper()],
    ids=["lower case hex is accepted", "upper case hex is accepted"],
)
def test_a_sha256_reference_is_the_digest(tmp_path: Path, hex_digits: str) -> None:
    assert resolve_token_reference(f"sha256:{hex_digits}", tmp_path) == digest_token(TOKEN)


@pytest.mark.parametrize(
    "hex_digits",
    [
        "",
        DIGEST[:-2],
        DIGEST + "00",
        DIGEST[:-1],
        DIGEST[:-1] + "g",
        "z" * 64,
        " " + DIGEST,
        DIGEST + " ",
        DIGEST + "\n",
        DIGEST[:32] + " " + DIGEST[32:],
        " ".join(DIGEST[i : i + 2] for i in range(0, 64, 2)),
        "0x" + DIGEST[2:],
        "\uff10" * 64,
    ],
    ids=[
        "no digits are refused",
        "too few digits are refused",
        "too many digits are refused",
        "an odd number of digits is refused",
        "a non hex digit is refused",
        "letters that are not hex are refused",
        "a leading space is refused",
        "a trailing space is refused",
        "a trailing newline is refused",
        "a space in the middle is refused",
        "hex bytes separated by spaces are refused",
        "a 0x prefix is refused",
        "full width digits are refused",
    ],
)
def test_a_sha256_reference_needs_64_hex_digits(tmp_path: Path, hex_digits: str) -> None:
    with pytest.raises(TokenReferenceError, match=r"^sha256: needs 64 hex digits$"):
        resolve_token_reference(f"sha256:{hex_digits}", tmp_path)


@pytest.mark.parametrize(
    "reference",
    [TOKEN, "", "plain:abc", "ENV:VAR", "https://example.com/token"],
    ids=[
        "a bare token is refused",
        "an empty reference is refused",
        "an unknown scheme is refused",
        "schemes are case sensitive",
        "a url is refused",
    ],
)
def test_an_unknown_reference_is_refused(tmp_path: Path, reference: str) -> None:
    with pytest.raises(TokenReferenceError) as info:
        resolve_token_reference(reference, tmp_path)
    assert str(info.value) == "a token reference is 'env:VAR', 'file:PATH' or 'sha256:HEX'"


# --- comparison ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("presented", "expected"),
    [
        (TOKEN, True),
        (TOKEN + "x", False),
        (TOKEN[:-1], False),
        (TOKEN.upper(), False),
        ("", False),
    ],
    ids=[
        "the same token is equal",
        "a longer token is not equal",
        "a shorter token is not equal",
        "tokens are case sensitive",
        "an empty token is not equal",
    ],
)
def test_tokens_equal(presented: str, expected: bool) -> None:
    assert tokens_equal(presented, digest_token(TOKEN)) is expected


def test_a_non_ascii_token_is_compared_as_utf8() -> None:
    token = "pässwörd-and-more-characters"
    assert digest_token(token) == hashlib.sha256(token.encode("utf-8")).digest()
    assert tokens_equal(token, digest_token(token))


def test_new_tokens_are_long_random_and_usable(tmp_path: Path) -> None:
    tokens = {new_token() for _ in range(50)}
    assert len(tokens) == 50
    assert all(len(t) >= 32 for t in tokens)
    token = tokens.pop()
    private_file(tmp_path / "t.token", token)
    assert tokens_equal(token, resolve_token_reference("file:t.token", tmp_path))
