"""Counted grants (`max_uses`) in sandgate.policy: the model (written, stored, read back, refused
when wrong) and decide (each request a counted grant allows takes one use; used up, or the
count out of reach, the request is decided as without the grant). The count here is a real
in-memory GrantUses, as the gateway's is one over redis or the state folder."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from sandgate.policy.address_guard import AddressGuard
from sandgate.policy.decide import decide
from sandgate.policy.decision import Decision, EgressRequest, Identity, Phase
from sandgate.policy.errors import PolicySetError
from sandgate.policy.model.grants import Grant, Grants, GrantsFileEntry, render_grants_file
from sandgate.policy.model.loader import load_policy_dir
from sandgate.policy.model.policyset import PolicySet
from sandgate.policy.reasons import Reason
from sandgate.policy.resolver import StaticResolver

TENANT = """
tenant: asker
allow: []
ask:
  - id: more
    hosts: [api.example.com]
"""
HOSTS = {"api.example.com": ["93.184.216.34"]}
A1 = Identity("asker", "a-1")
ID1, ID2 = "0123456789ab0001", "0123456789ab0002"


class MemoryUses:
    """Counts in a dict; `reachable` False: every take fails, as with redis down."""

    def __init__(self) -> None:
        self.taken: dict[str, int] = {}
        self.reachable = True
        self._spent: set[str] = set()

    def spent(self, grant_id: str) -> bool:
        return grant_id in self._spent

    async def take(self, grant: Grant) -> bool:
        assert grant.max_uses is not None
        if not self.reachable:
            return False
        n = self.taken.get(grant.id, 0)
        if n >= grant.max_uses:
            self._spent.add(grant.id)
            return False
        self.taken[grant.id] = n + 1
        return True


def grant(gid: str = ID1, *, max_uses: int | None = 2, sandbox: str | None = "a-1") -> Grant:
    return Grant(
        id=gid, tenant="asker", sandbox=sandbox, host="api.example.com", port=443, max_uses=max_uses, at=1.0
    )


def policy_at(root: Path, grants_text: str | None = None) -> PolicySet:
    (root / "tenants").mkdir(parents=True, exist_ok=True)
    (root / "tenants" / "asker.yaml").write_text(textwrap.dedent(TENANT))
    if grants_text is not None:
        (root / "tenants" / "asker.grants.yaml").write_text(grants_text)
    return load_policy_dir(root)


def http(path: str = "/v1/items") -> EgressRequest:
    return EgressRequest(Phase.REQUEST, "api.example.com", 443, scheme="https", method="GET", path=path)


async def ask(policy: PolicySet, request: EgressRequest, grants: Grants | None) -> Decision:
    return await decide(policy, A1, request, StaticResolver(HOSTS), AddressGuard(), grants=grants)


def test_max_uses_is_stored_and_read_back_and_makes_the_grant_inspected() -> None:
    counted = grant()
    assert Grant.from_json(counted.as_json(), "redis").max_uses == 2
    assert counted.view()["max_uses"] == 2
    assert counted.rule.inspect, "a counted grant's connection is intercepted: each request is counted"
    assert not grant(max_uses=None).rule.inspect


@pytest.mark.parametrize(
    "entry",
    [
        {"max_uses": 0},
        {"max_uses": -1},
        {"max_uses": "two"},
    ],
    ids=[
        "zero uses is refused",
        "a negative count is refused",
        "a word is refused",
    ],
)
def test_a_grants_file_entry_with_a_wrong_max_uses_is_refused(entry: dict[str, object]) -> None:
    base = {"id": ID1, "host": "api.example.com", "port": 443, "methods": ["*"], "paths": ["*"]}
    with pytest.raises(ValueError, match="max_uses"):
        GrantsFileEntry.model_validate({**base, **entry})


def test_a_grants_file_writes_max_uses_and_reads_it_back(tmp_path: Path) -> None:
    text = render_grants_file(
        "asker", [grant(sandbox=None, max_uses=5), grant(ID2, sandbox=None, max_uses=None)]
    )
    assert "    max_uses: 5\n" in text and "at most 5 uses" in text
    loaded = {g.id: g.max_uses for g in policy_at(tmp_path, text).tenants["asker"].grants}
    assert loaded == {ID1: 5, ID2: None}


def test_a_hand_written_grants_file_with_max_uses_zero_does_not_load(tmp_path: Path) -> None:
    text = textwrap.dedent(
        f"""
        tenant: asker
        grants:
          - id: "{ID1}"
            host: api.example.com
            port: 443
            methods: ["*"]
            paths: ["*"]
            max_uses: 0
        """
    )
    with pytest.raises(PolicySetError, match="max_uses"):
        policy_at(tmp_path, text)


async def test_a_grant_with_two_uses_allows_two_requests_then_asks_again(tmp_path: Path) -> None:
    policy = policy_at(tmp_path)
    uses = MemoryUses()
    grants = Grants([grant()], uses=uses)
    first, second, third = [await ask(policy, http(), grants) for _ in range(3)]
    assert [(d.allowed, d.rule_id) for d in (first, second)] == [(True, f"asker/grant/{ID1}")] * 2
    assert (third.allowed, third.ask, third.reason) == (False, True, Reason.APPROVAL_REQUIRED)
    assert uses.taken == {ID1: 2}
    # Used up and known so: its CONNECT is no longer let through by it either (asked).
    d = await ask(policy, EgressRequest(Phase.CONNECT, "api.example.com", 443), grants)
    assert (d.allowed, d.ask) == (False, True)


async def test_a_connection_takes_no_use(tmp_path: Path) -> None:
    policy = policy_at(tmp_path)
    uses = MemoryUses()
    grants = Grants([grant(max_uses=1)], uses=uses)
    d = await ask(policy, EgressRequest(Phase.CONNECT, "api.example.com", 443), grants)
    assert (d.allowed, d.inspect) == (True, True)
    assert uses.taken == {}
    assert (await ask(policy, http(), grants)).allowed
    assert uses.taken == {ID1: 1}


async def test_a_used_up_grant_gives_way_to_the_next_grant(tmp_path: Path) -> None:
    policy = policy_at(tmp_path)
    uses = MemoryUses()
    grants = Grants([grant(max_uses=1), grant(ID2, max_uses=None)], uses=uses)
    rules = [(await ask(policy, http(), grants)).rule_id for _ in range(3)]
    assert rules == [f"asker/grant/{ID1}", f"asker/grant/{ID2}", f"asker/grant/{ID2}"]


async def test_a_count_out_of_reach_fails_closed_for_counted_grants_only(tmp_path: Path) -> None:
    policy = policy_at(tmp_path)
    uses = MemoryUses()
    uses.reachable = False
    d = await ask(policy, http(), Grants([grant()], uses=uses))
    assert (d.allowed, d.ask) == (False, True), "no count, no use: asked as without the grant"
    d = await ask(policy, http(), Grants([grant(max_uses=None)], uses=uses))
    assert (d.allowed, d.rule_id) == (True, f"asker/grant/{ID1}"), "an uncounted grant is as ever"
    uses.reachable = True
    assert (await ask(policy, http(), Grants([grant()], uses=uses))).allowed, "back: a use is taken"


async def test_a_grants_file_grant_is_counted_by_the_gateways_count(tmp_path: Path) -> None:
    policy = policy_at(tmp_path, render_grants_file("asker", [grant(sandbox=None, max_uses=1)]))
    uses = MemoryUses()
    gateway = Grants((), uses=uses)
    assert (await ask(policy, http(), gateway)).allowed
    d = await ask(policy, http(), gateway)
    assert (d.allowed, d.ask) == (False, True)
    assert uses.taken == {ID1: 1}


async def test_without_a_count_a_counted_grant_is_evaluated_uncounted(tmp_path: Path) -> None:
    """`policy explain` and `policy test` count nothing: they show what the grant allows."""
    policy = policy_at(tmp_path, render_grants_file("asker", [grant(sandbox=None, max_uses=1)]))
    for _ in range(3):
        assert (await ask(policy, http(), None)).allowed
