"""Tamper evidence for the audit file: a hash chain with signed checkpoints.

Definitions (stable: `sandgate audit verify` and a SIEM check against them):

- A line's hash is the hex SHA-256 of its exact bytes as written, without the newline.
- Every line carries `prev`: the hash of the line before it in the trail (across rotation:
  the previous file's last line), or `GENESIS` (64 zeros) for the first line of a chain.
  `prev` is spliced in as the object's last member, so a record is not encoded twice.
- A checkpoint is a line `{"event":"checkpoint","seq":S,"hash":H,"count":C,"time":T,
  "key_id":K,"sig":B,"prev":H}`: H is the hash of the line before it, C the lines of the chain
  that are not checkpoints up to it, S its number (1, 2, ...), K the first 16 hex digits of
  the SHA-256 of the raw public key, B the base64 Ed25519 signature of
  `checkpoint_message(S, C, H, T, K)`. One is written after every `every` records, with the
  first batch written `seconds` after the last one (or by `JsonlFileSink.tick`) and at close.
- A gateway that cannot read the end of the trail at start (a last line that is no JSON
  object) starts a new chain: a line `{"event":"chain_restart","reason":...}` with `prev`
  GENESIS, which `audit verify` reports as a break.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from sandgate.proxy.audit.files import audit_files, reverse_lines

__all__ = [
    "GENESIS",
    "Chain",
    "ChainState",
    "checkpoint_message",
    "key_id",
    "line_hash",
    "load_or_create_key",
    "public_key_path",
    "recover_state",
]

GENESIS = "0" * 64
KEY_NAME = "audit-signing.key"
PUBLIC_NAME = "audit-signing.pub.pem"


def line_hash(line: bytes) -> str:
    """The hash of one line (its bytes without the newline)."""
    return hashlib.sha256(line).hexdigest()


def checkpoint_message(seq: int, count: int, head: str, at: str, kid: str) -> bytes:
    """The bytes a checkpoint's signature covers."""
    return f"sandgate-audit-checkpoint/1\n{seq}\n{count}\n{head}\n{at}\n{kid}".encode()


def key_id(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def public_key_path(key_dir: Path) -> Path:
    """The exported public key (PEM, for a SIEM and `audit verify`)."""
    return key_dir / PUBLIC_NAME


def public_pem(public: Ed25519PublicKey) -> str:
    return public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode()


def load_public_key(path: Path) -> Ed25519PublicKey:
    """The public key of a PEM file; ValueError when it is none."""
    key = serialization.load_pem_public_key(path.read_bytes())
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError(f"{path}: not an Ed25519 public key")
    return key


def load_or_create_key(key_dir: Path) -> Ed25519PrivateKey:
    """The gateway's signing key in `key_dir` (created once, mode 0600), its public key exported."""
    key_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = key_dir / KEY_NAME
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except FileNotFoundError:
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)  # never replaces a key another process made meanwhile
        except FileExistsError:
            key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        finally:
            tmp.unlink()
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{path}: not an Ed25519 private key")
    pub = public_key_path(key_dir)
    text = public_pem(key.public_key())
    if not pub.is_file() or pub.read_text() != text:
        tmp = pub.with_name(pub.name + ".tmp")
        tmp.write_text(text)
        tmp.replace(pub)
    return key


@dataclass(frozen=True, slots=True)
class ChainState:
    head: str = GENESIS  # hash of the last line written
    count: int = 0  # lines of the chain that are not checkpoints
    seq: int = 0  # number of the last checkpoint
    since: int = 0  # records since the last checkpoint
    checkpoint_at: float = 0.0  # monotonic time of the last checkpoint (or of the start)
    restart: str | None = None  # why a new chain starts (the end of the trail was unreadable)


class Chain:
    """Links lines into the chain; the sink commits the new state only once they are written."""

    def __init__(
        self, key: Ed25519PrivateKey, state: ChainState, *, every: int = 1000, seconds: float = 60.0
    ) -> None:
        self._key = key
        self.key_id = key_id(key.public_key())
        self.state = state
        self._every = every
        self.seconds = seconds

    def link(self, lines: list[str], *, final: bool = False) -> tuple[bytes, ChainState]:
        """The bytes to append for `lines` (each `{...}\\n`), and the chain's state after them."""
        st = self.state
        out: list[bytes] = []
        if st.restart is not None:
            note = json.dumps({"event": "chain_restart", "reason": st.restart}, separators=(",", ":"))
            st = replace(st, head=GENESIS, count=0, restart=None)
            st = replace(st, head=_append(out, note + "\n", st.head), count=st.count + 1, since=st.since + 1)
        head, count, since, every = st.head, st.count, st.since, self._every
        for line in lines:  # the hot loop: one splice, one encode, one hash per record
            head = _append(out, line, head)
            count += 1
            since += 1
            if since >= every:
                st = self._checkpoint(out, replace(st, head=head, count=count, since=since))
                head, since = st.head, 0
        st = replace(st, head=head, count=count, since=since)
        if st.since and (final or time.monotonic() - st.checkpoint_at >= self.seconds):
            st = self._checkpoint(out, st)
        return b"".join(out), st

    def commit(self, state: ChainState) -> None:
        self.state = state

    def _checkpoint(self, out: list[bytes], st: ChainState) -> ChainState:
        seq = st.seq + 1
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        sig = self._key.sign(checkpoint_message(seq, st.count, st.head, at, self.key_id))
        cp = {
            "event": "checkpoint",
            "seq": seq,
            "hash": st.head,
            "count": st.count,
            "time": at,
            "key_id": self.key_id,
            "sig": base64.b64encode(sig).decode(),
        }
        head = _append(out, json.dumps(cp, separators=(",", ":")) + "\n", st.head)
        return replace(st, head=head, seq=seq, since=0, checkpoint_at=time.monotonic())


def _append(out: list[bytes], line: str, prev: str) -> str:
    """Append `line` (a JSON object, newline-ended) with `prev` spliced in; the hash of what was added."""
    if line.endswith("}\n") and line != "{}\n":
        data = f'{line[:-2]},"prev":"{prev}"}}'.encode()
    else:  # not written by sandgate's encoder: kept whole as a string
        data = json.dumps({"line": line.rstrip("\n"), "prev": prev}, separators=(",", ":")).encode()
    out.append(data)
    out.append(b"\n")
    return hashlib.sha256(data).hexdigest()


def recover_state(path: Path) -> ChainState:
    """Where the chain of the trail at `path` (and its rotated files) stands, read from its end."""
    now = time.monotonic()
    head: str | None = None
    records = 0
    for line in _lines_newest_first(path):
        value = _decode(line) if line is not None else None
        if head is None:
            if value is None:
                return ChainState(checkpoint_at=now, restart="the last line of the trail is unreadable")
            head = line_hash(line) if line is not None else GENESIS
        if value is None:
            return ChainState(head=head, count=records, checkpoint_at=now, since=records)
        if "prev" not in value:  # written before the chain existed: the chain starts after it
            return ChainState(head=head, count=records, checkpoint_at=now, since=records)
        if value.get("event") == "checkpoint":
            count, seq = value.get("count"), value.get("seq")
            if isinstance(count, int) and isinstance(seq, int):
                return ChainState(head, count + records, seq, records, now)
            return ChainState(checkpoint_at=now, restart="the last checkpoint of the trail is unreadable")
        records += 1
        if value.get("prev") == GENESIS:
            break
    return ChainState(head=head or GENESIS, count=records, since=records, checkpoint_at=now)


def _lines_newest_first(path: Path) -> Iterator[bytes | None]:
    for file in audit_files(path):
        with contextlib.suppress(FileNotFoundError), open(file, "rb") as f:
            end = os.fstat(f.fileno()).st_size
            lines = reverse_lines(f, end)
            if end and (first := next(lines, None)) == b"":
                pass  # the empty piece after the last newline
            elif end:
                yield first
            yield from lines


def _decode(line: bytes) -> dict[str, object] | None:
    try:
        value = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None
