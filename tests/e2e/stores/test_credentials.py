"""Both credential stores against real storage: a tmp sealed file, a real redis-server."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from conftest import SANDGATE
from support import RedisServer

from sandgate.brokers import Secret
from sandgate.proxy.config import RedisConfig
from sandgate.proxy.redis.client import Keys, connect
from sandgate.proxy.stores.credentials import RekeyableStore
from sandgate.proxy.stores.credentials_file import FileCredentialStore
from sandgate.proxy.stores.credentials_redis import RedisCredentialStore
from sandgate.proxy.stores.protocols import StoreError
from sandgate.proxy.stores.sealing_keys import StoreKeys

VALUE = "sk-live-STORED-0123456789abcdef"
ROTATED = "sk-live-ROTATED-9876543210fedcba"


@pytest.fixture(params=["file", "redis"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[RekeyableStore]:
    keys = StoreKeys(f"file:{tmp_path / 'store.keys'}", create=True)
    if request.param == "file":
        yield FileCredentialStore(tmp_path / "credentials.sealed.json", keys)
        return
    server: RedisServer = request.getfixturevalue("redis_server")
    s = RedisCredentialStore(connect(RedisConfig(url=server.url)), Keys("sandgate:"), keys)
    yield s
    await s.aclose()


async def raw_storage(store: RekeyableStore) -> bytes:
    """Everything the backend holds at rest."""
    if isinstance(store, FileCredentialStore):
        return store.path.read_bytes()
    assert isinstance(store, RedisCredentialStore)
    raw = await store.client.hgetall(store.hash)
    held = b""
    for k, v in raw.items():
        assert isinstance(k, bytes) and isinstance(v, bytes)
        held += k + v
    return held


async def test_put_get_list_remove(store: RekeyableStore) -> None:
    info = await store.put("acme", "openai", Secret(VALUE))
    assert (info.tenant, info.name, info.version) == ("acme", "openai", 1)
    assert info.updated.endswith("Z")
    await store.put("other", "openai", Secret("theirs-0123456789"))
    assert (await store.get("acme", "openai")) == Secret(VALUE)
    assert await store.get("acme", "missing") is None
    assert [(i.tenant, i.name) for i in await store.list()] == [("acme", "openai"), ("other", "openai")]
    assert [i.tenant for i in await store.list("other")] == ["other"]
    assert await store.remove("acme", "openai") is True
    assert await store.remove("acme", "openai") is False
    assert await store.get("acme", "openai") is None


async def test_rotation_bumps_the_version_and_rotate_requires_an_existing_value(
    store: RekeyableStore,
) -> None:
    with pytest.raises(StoreError, match="credential openai of tenant acme is not set") as info:
        await store.put("acme", "openai", Secret(VALUE), must_exist=True)
    assert info.value.status == 404
    await store.put("acme", "openai", Secret(VALUE))
    rotated = await store.put("acme", "openai", Secret(ROTATED), must_exist=True)
    assert rotated.version == 2
    assert (await store.get("acme", "openai")) == Secret(ROTATED)
    assert [i.version for i in await store.list()] == [2]


async def test_concurrent_writers_lose_no_version(store: RekeyableStore) -> None:
    await asyncio.gather(*(store.put("acme", "openai", Secret(f"{VALUE}-{n}")) for n in range(10)))
    assert [i.version for i in await store.list()] == [10]


async def test_raw_storage_holds_only_ciphertext(store: RekeyableStore) -> None:
    await store.put("acme", "openai", Secret(VALUE))
    await store.put("acme", "openai", Secret(ROTATED))
    raw = await raw_storage(store)
    assert VALUE.encode() not in raw and ROTATED.encode() not in raw
    assert b"acme/openai" in raw and b"ciphertext" in raw


@pytest.mark.parametrize(
    "bad", ["bad tenant", "../x"], ids=["a name with a space is refused", "a path-like name is refused"]
)
async def test_names_are_checked(store: RekeyableStore, bad: str) -> None:
    with pytest.raises(StoreError, match="not valid"):
        await store.put(bad, "openai", Secret(VALUE))
    with pytest.raises(StoreError, match="not valid"):
        await store.put("acme", bad, Secret(VALUE))


async def test_key_rotation_and_rekey_let_the_old_key_go(store: RekeyableStore, tmp_path: Path) -> None:
    keys_path = tmp_path / "store.keys"
    await store.put("acme", "openai", Secret(VALUE))
    StoreKeys(f"file:{keys_path}", create=True).add_key()  # k2, newest
    await store.put("acme", "github", Secret(ROTATED))
    assert (await store.get("acme", "openai")) == Secret(VALUE), "values sealed with k1 still open"
    assert await store.rekey() == 1
    assert await store.rekey() == 0
    # Drop k1: everything still opens.
    keys_path.write_text(
        "".join(line + "\n" for line in keys_path.read_text().splitlines() if line.startswith("k2:"))
    )
    assert (await store.get("acme", "openai")) == Secret(VALUE)
    assert (await store.get("acme", "github")) == Secret(ROTATED)
    assert [i.version for i in await store.list()] == [1, 1], "a re-seal is not a new version"


async def test_a_value_with_a_removed_key_or_moved_record_is_a_clear_error(
    store: RekeyableStore, tmp_path: Path
) -> None:
    await store.put("acme", "openai", Secret(VALUE))
    # Move acme's record onto another tenant's entry: it must not open there.
    if isinstance(store, FileCredentialStore):
        doc = json.loads(store.path.read_text())
        doc["credentials"]["other/openai"] = doc["credentials"]["acme/openai"]
        store.path.write_text(json.dumps(doc))
    else:
        assert isinstance(store, RedisCredentialStore)
        raw = await store.client.hget(store.hash, "acme/openai")
        await store.client.hset(store.hash, "other/openai", raw)
    with pytest.raises(StoreError, match="altered, or moved") as info:
        await store.get("other", "openai")
    assert VALUE not in str(info.value)
    (tmp_path / "store.keys").write_text("")
    StoreKeys(f"file:{tmp_path / 'other.keys'}", create=True).keyring()
    (tmp_path / "store.keys").write_text((tmp_path / "other.keys").read_text())
    with pytest.raises(StoreError, match="does not open with key k1"):
        await store.get("acme", "openai")


def test_the_file_store_is_private_and_replaced_atomically(tmp_path: Path) -> None:
    store = FileCredentialStore(tmp_path / "state" / "credentials.sealed.json", StoreKeys(
        f"file:{tmp_path / 'state' / 'store.keys'}", create=True))  # fmt: skip
    asyncio.run(store.put("acme", "openai", Secret(VALUE)))
    first = store.stamp()
    asyncio.run(store.put("acme", "openai", Secret(ROTATED)))
    assert store.stamp() != first
    for name in ("credentials.sealed.json", "store.keys"):
        assert stat.S_IMODE((tmp_path / "state" / name).stat().st_mode) == 0o600
    assert not [p for p in (tmp_path / "state").iterdir() if p.name.startswith(".credentials.")]


def test_a_broken_store_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "credentials.sealed.json"
    path.write_text("{not json")
    store = FileCredentialStore(path, StoreKeys(f"file:{tmp_path / 'k'}", create=True))
    with pytest.raises(StoreError, match=f"{path}: not valid JSON"):
        asyncio.run(store.list())


async def test_redis_writes_publish_a_change_event(redis_server: RedisServer, tmp_path: Path) -> None:
    keys = StoreKeys(f"file:{tmp_path / 'store.keys'}", create=True)
    store = RedisCredentialStore(connect(RedisConfig(url=redis_server.url)), Keys("fleet1:"), keys)
    listener = aioredis.Redis.from_url(redis_server.url)
    pubsub = listener.pubsub()
    await pubsub.subscribe("fleet1:events")
    try:
        await store.put("acme", "openai", Secret(VALUE))
        await store.remove("acme", "openai")
        got: list[bytes] = []
        async with asyncio.timeout(5):
            while len(got) < 2:
                msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1)
                if msg is not None:
                    got.append(msg["data"])
        assert got == [b"credentials", b"credentials"]
        assert await listener.exists("fleet1:credentials") == 0
    finally:
        await pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]  # typed from redis 8.2
        await listener.aclose()
        await store.aclose()


async def test_a_dead_redis_is_a_503_store_error(redis_server: RedisServer, tmp_path: Path) -> None:
    keys = StoreKeys(f"file:{tmp_path / 'store.keys'}", create=True)
    store = RedisCredentialStore(connect(RedisConfig(url=redis_server.url)), Keys("sandgate:"), keys)
    redis_server.kill()
    try:
        with pytest.raises(StoreError, match="redis is unreachable") as info:
            await store.get("acme", "openai")
        assert info.value.status == 503
    finally:
        await store.aclose()


def test_a_fleet_without_store_keys_says_how_to_make_them(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="sandgate credentials add-key"):
        StoreKeys(f"file:{tmp_path / 'missing.keys'}", create=False).keyring()


def test_a_group_readable_key_file_is_refused(tmp_path: Path) -> None:
    keys = StoreKeys(f"file:{tmp_path / 'store.keys'}", create=True)
    keys.keyring()
    os.chmod(tmp_path / "store.keys", 0o640)
    with pytest.raises(Exception, match="chmod 600"):
        keys.keyring()


def cli(
    home: Path, *args: str, stdin: str = "", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SANDGATE, "credentials", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "SANDGATE_HOME": str(home), **(env or {})},
    )


def test_the_cli_never_shows_a_value(tmp_path: Path) -> None:
    home = tmp_path / "home"
    outs = [
        cli(home, "set", "--tenant", "acme", "openai", stdin=VALUE + "\n"),
        cli(home, "rotate", "--tenant", "acme", "openai", "--from-env", "V", env={"V": ROTATED}),
        cli(home, "list"),
        cli(home, "list", "--format", "json"),
        cli(home, "rekey"),
    ]
    assert [o.returncode for o in outs] == [0, 0, 0, 0, 0], [o.stderr for o in outs]
    assert json.loads(outs[3].stdout) == [
        {
            "tenant": "acme",
            "name": "openai",
            "version": 2,
            "updated": json.loads(outs[3].stdout)[0]["updated"],
        }
    ]
    assert "acme" in outs[2].stdout and "2" in outs[2].stdout
    for o in outs:
        assert VALUE not in o.stdout + o.stderr and ROTATED not in o.stdout + o.stderr
    missing = cli(home, "rotate", "--tenant", "acme", "nope", stdin="x-value")
    assert missing.returncode == 2 and "credential nope of tenant acme is not set" in missing.stderr
    empty = cli(home, "set", "--tenant", "acme", "openai", stdin="\n")
    assert empty.returncode == 2 and "empty" in empty.stderr
    removed = cli(home, "remove", "--tenant", "acme", "openai")
    assert removed.returncode == 0
    assert cli(home, "remove", "--tenant", "acme", "openai").returncode == 1


async def test_a_redis_restart_drops_the_cached_values(redis_server: RedisServer, tmp_path: Path) -> None:
    """redis-py resubscribes by itself after a reconnect: a change published before that is
    missed, so the watcher must drop the cache on the reconnect (not wait for the ttl)."""
    from sandgate.brokers.sources.stored import StoredSource
    from sandgate.policy.model.secret_refs import parse_ref
    from sandgate.proxy.stores.credentials_watch import CredentialWatcher

    keys = StoreKeys(f"file:{tmp_path / 'store.keys'}", create=True)
    store = RedisCredentialStore(connect(RedisConfig(url=redis_server.url)), Keys("sandgate:"), keys)
    source = StoredSource(store, ttl=300.0)
    watcher = CredentialWatcher(store, source)
    ref = parse_ref("stored:openai").for_tenant("acme")
    await store.put("acme", "openai", Secret(VALUE))
    watcher.start()
    try:
        await asyncio.sleep(0.3)  # subscribed
        assert (await source.get(ref)).reveal() == VALUE
        redis_server.kill()
        redis_server.start()  # a fresh, empty redis on the same port
        writer = RedisCredentialStore(connect(RedisConfig(url=redis_server.url)), Keys("sandgate:"), keys)
        await writer.put("acme", "openai", Secret(ROTATED))  # published before the watcher is back
        await writer.aclose()
        async with asyncio.timeout(10):
            while True:
                try:
                    if (await source.get(ref)).reveal() == ROTATED:
                        break
                except Exception:
                    pass
                await asyncio.sleep(0.1)
    finally:
        await watcher.stop()
        await store.aclose()
