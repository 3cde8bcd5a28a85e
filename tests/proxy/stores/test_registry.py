"""The SandboxStore backends against real storage: redis (a real redis-server) and sandboxes.json."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from conftest import TOKEN, tenant_yaml, write_gateway_files
from support import RedisServer

from sandgate.policy.errors import PolicySetError
from sandgate.policy.model.loader import load_policy_dir
from sandgate.proxy.config import RedisConfig, load_config
from sandgate.proxy.fleet.channel import FleetKeys, gateway_versions, publish_reload, record_gateway
from sandgate.proxy.redis.client import connect
from sandgate.proxy.stores.protocols import StoreError
from sandgate.proxy.stores.registry import DynamicSandbox, merge_registry, merge_registry_lenient
from sandgate.proxy.stores.registry_file import FileSandboxStore
from sandgate.proxy.stores.registry_redis import RedisSandboxStore, rules_checker

DIGEST = "sha256:" + hashlib.sha256(TOKEN.encode()).hexdigest()


def _sb(id_: str = "dyn1", **kw: str) -> DynamicSandbox:
    return DynamicSandbox.model_validate({"id": id_, "tenant": "t1", "token": DIGEST, **kw})


@pytest.fixture
async def client(redis_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    c = connect(RedisConfig(url=redis_server.url, prefix="t:"))
    yield c
    await c.aclose()


@pytest.fixture
def rules(tmp_path: Path) -> Path:
    write_gateway_files(tmp_path, {"t1.yaml": tenant_yaml("t1", [{"hosts": ["api.test"]}])})
    return tmp_path / "rules"


# -- the entry ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ({"id": "a", "tenant": "t1"}, "needs an address, a token digest, or both"),
        ({"id": "a", "tenant": "t1", "interface": "tap0", "token": DIGEST}, "needs its addresses"),
        ({"id": "a", "tenant": "t1", "token": "env:X"}, "pattern"),
        ({"id": "a", "tenant": "t1", "token": TOKEN}, "pattern"),
        ({"id": "a", "tenant": "t1", "address": "10.0.0.300"}, "'10.0.0.300' is not an IP address"),
    ],
    ids=[
        "neither address nor token is refused",
        "an interface without an address is refused",
        "a token reference other than sha256 is refused",
        "a raw token is refused",
        "a bad address is refused",
    ],
)
def test_invalid_entries_are_refused_with_the_reason(entry: dict[str, str], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        DynamicSandbox.model_validate(entry)


def test_the_token_digest_never_appears_in_the_repr() -> None:
    assert DIGEST.removeprefix("sha256:") not in repr(_sb())


def test_a_raw_token_sent_by_mistake_is_not_echoed_in_the_error() -> None:
    with pytest.raises(ValueError, match="token") as e:
        DynamicSandbox.model_validate({"id": "a", "tenant": "t1", "token": TOKEN})
    assert TOKEN not in str(e.value)


def test_a_token_sandbox_authenticates_like_a_static_one(rules: Path) -> None:
    policy = merge_registry(load_policy_dir(rules), [_sb("dyn1")], Path("x"))
    identity = policy.authenticate("dyn1", TOKEN)
    assert identity is not None and (identity.tenant, identity.sandbox) == ("t1", "dyn1")
    assert policy.authenticate("dyn1", TOKEN + "x") is None
    assert policy.identify_address("10.0.0.2") is None


def test_lenient_merge_keeps_the_good_entries_and_names_the_bad(rules: Path) -> None:
    base = load_policy_dir(rules)
    good, unknown, taken = _sb("dyn1"), _sb("dyn2").model_copy(update={"tenant": "nope"}), _sb("sb1")
    merged, errors = merge_registry_lenient(base, [good, unknown, taken], "redis")
    assert "dyn1" in merged.sandboxes and "dyn2" not in merged.sandboxes
    assert ["unknown tenant 'nope'" in str(errors[0]), "already registered" in str(errors[1])] == [True, True]
    with pytest.raises(PolicySetError):
        merge_registry(base, [good, unknown], Path("x"))


# -- the redis store ---------------------------------------------------------------------------


async def test_redis_store_add_list_remove_bumps_the_version_and_publishes(client: aioredis.Redis) -> None:
    keys = FleetKeys.for_prefix("t:")
    store = RedisSandboxStore(client, keys)
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    await pubsub.subscribe(keys.events)
    await store.add(_sb("dyn1"))
    await store.add(_sb("dyn2", address="10.9.0.2"))
    assert [s.id for s in await store.list()] == ["dyn1", "dyn2"]
    assert (await store.snapshot()).version == 2
    assert await store.remove("dyn1") is True
    assert await store.remove("dyn1") is False
    assert [s.id for s in await store.list()] == ["dyn2"]
    kinds = []
    for _ in range(20):  # get_message answers None for the (ignored) subscribe confirmation
        message = await pubsub.get_message(timeout=0.2)
        if message is not None:
            kinds.append(json.loads(message["data"])["kind"])
        elif len(kinds) >= 3:
            break
    # Three changes, three messages; removing what was not there publishes nothing.
    assert kinds == ["registry"] * 3
    assert (await store.snapshot()).version == 3
    await pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]  # typed from redis 8.2
    # Stored as the digest; nothing else of the token.
    stored = await client.hget(keys.sandboxes, "dyn2")
    assert stored is not None and json.loads(stored)["token"] == DIGEST


async def test_redis_store_add_is_idempotent_and_refuses_conflicts(client: aioredis.Redis) -> None:
    store = RedisSandboxStore(client, FleetKeys.for_prefix("t:"))
    await store.add(_sb("dyn1", address="10.9.0.2"))
    await store.add(_sb("dyn1", address="10.9.0.2"))
    assert (await store.snapshot()).version == 1
    with pytest.raises(StoreError, match="already registered with other settings") as e:
        await store.add(_sb("dyn1", address="10.9.0.3"))
    assert e.value.status == 409
    with pytest.raises(StoreError, match="belongs to 'dyn1'"):
        await store.add(_sb("dyn2", address="10.9.0.2"))


async def test_redis_store_replace_changes_an_entry_in_one_published_write(client: aioredis.Redis) -> None:
    keys = FleetKeys.for_prefix("t:")
    store = RedisSandboxStore(client, keys)
    assert await store.replace(_sb("dyn1")) is None  # not registered: nothing written
    assert await store.list() == [] and (await store.snapshot()).version == 0
    await store.add(_sb("dyn1", address="10.9.0.2"))
    await store.add(_sb("dyn2", address="10.9.0.3"))
    moved = _sb("dyn1", address="10.9.0.4").model_copy(update={"tenant": "t2"})
    previous = await store.replace(moved)
    assert previous is not None and previous.tenant == "t1" and previous.addresses == ("10.9.0.2",)
    assert {s.id: (s.tenant, s.addresses) for s in await store.list()} == {
        "dyn1": ("t2", ("10.9.0.4",)),
        "dyn2": ("t1", ("10.9.0.3",)),
    }
    assert (await store.snapshot()).version == 3
    with pytest.raises(StoreError, match="belongs to 'dyn2'") as e:
        await store.replace(_sb("dyn1", address="10.9.0.3"))
    assert e.value.status == 409
    assert (await store.snapshot()).version == 3


async def test_concurrent_adds_of_one_address_register_exactly_one(client: aioredis.Redis) -> None:
    store = RedisSandboxStore(client, FleetKeys.for_prefix("t:"))
    results = await asyncio.gather(
        *(store.add(_sb(f"dyn{i}", address="10.9.0.2")) for i in range(8)), return_exceptions=True
    )
    assert sum(r is None for r in results) == 1
    assert all(isinstance(r, StoreError) and r.status == 409 for r in results if r is not None)
    assert len(await store.list()) == 1


async def test_redis_store_checks_against_the_rules(client: aioredis.Redis, rules: Path) -> None:
    store = RedisSandboxStore(client, FleetKeys.for_prefix("t:"), check=rules_checker(rules))
    with pytest.raises(StoreError, match="unknown tenant"):
        await store.add(_sb("dyn1").model_copy(update={"tenant": "nope"}))
    with pytest.raises(StoreError, match="already registered") as e:
        await store.add(_sb("sb1"))
    assert e.value.status == 409
    assert await store.list() == []


async def test_a_malformed_redis_entry_is_reported_not_served(client: aioredis.Redis) -> None:
    keys = FleetKeys.for_prefix("t:")
    store = RedisSandboxStore(client, keys)
    await store.add(_sb("dyn1"))
    await client.hset(keys.sandboxes, "junk", b"{not json")
    snap = await store.snapshot()
    assert [s.id for s in snap.sandboxes] == ["dyn1"] and snap.invalid == ("junk",)


async def test_a_dead_redis_is_a_503_store_error(redis_server: RedisServer) -> None:
    c = connect(RedisConfig(url=redis_server.url, prefix="t:", timeout_seconds=0.2))
    redis_server.kill()
    store = RedisSandboxStore(c, FleetKeys.for_prefix("t:"))
    for call in (store.list(), store.add(_sb()), store.remove("x")):
        with pytest.raises(StoreError, match="unreachable") as e:
            await call
        assert e.value.status == 503
        assert redis_server.url not in str(e.value)
    await c.aclose()


async def test_publish_reload_and_gateway_versions(redis_server: RedisServer, client: aioredis.Redis) -> None:
    cfg = RedisConfig(url=redis_server.url, prefix="t:")
    keys = FleetKeys.for_prefix("t:")
    assert await publish_reload(cfg) == 1
    assert await publish_reload(cfg) == 2
    await record_gateway(client, keys, "gw-a", fleet_version=2, policy_version="abc", stale=False)
    version, gateways = await gateway_versions(client, keys)
    assert version == 2
    assert [(g.gateway, g.fleet_version, g.policy_version) for g in gateways] == [("gw-a", 2, "abc")]


# -- the file store ----------------------------------------------------------------------------


async def test_file_store_shares_the_protocol(tmp_path: Path) -> None:
    config_path, _ = write_gateway_files(tmp_path, {"t1.yaml": tenant_yaml("t1", [{"hosts": ["api.test"]}])})
    store = FileSandboxStore(load_config(config_path))
    await store.add(_sb("dyn1"))
    await store.add(_sb("dyn1"))
    with pytest.raises(StoreError) as e:
        await store.add(_sb("dyn1", address="10.9.0.2"))
    assert e.value.status == 409
    with pytest.raises(StoreError, match="unknown tenant"):
        await store.add(_sb("dyn2").model_copy(update={"tenant": "nope"}))
    assert [s.id for s in await store.list()] == ["dyn1"]
    assert await store.replace(_sb("dyn9")) is None
    previous = await store.replace(_sb("dyn1", address="10.9.0.2"))
    assert previous == _sb("dyn1")
    assert [s.addresses for s in await store.list()] == [("10.9.0.2",)]
    assert await store.remove("dyn1") is True and await store.remove("dyn1") is False
    assert (tmp_path / "state" / "sandboxes.json").stat().st_mode & 0o777 == 0o600
