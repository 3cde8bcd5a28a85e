"""The automatic approver in one worker: a held request is released in the worker's own store
(no other process is asked), a proposal goes to the gateway's admin API for its grant, and an
approval that does not go through leaves the request waiting for a person, counted."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml

from sandgate.policy.model.loader import load_policy_dir
from sandgate.proxy.approvals import AccessRequest, Approvals, State
from sandgate.proxy.approvals.auto import AUTO_BY, AutoApprover
from sandgate.proxy.metrics import METRICS

CEILING = {"regions": [{"id": "reads", "hosts": ["api.test"], "ports": [443], "methods": ["GET"]}]}
TENANT = {"tenant": "t1", "ask": [{"id": "api", "hosts": ["api.test"], "ports": [443]}]}


class Grants:
    """The admin API's side of a proposal's approval: what was asked, or a failure."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.calls: list[tuple[str, str]] = []

    async def __call__(self, request_id: str, scope: str, reason: str) -> None:
        self.calls.append((request_id, scope))
        if self.fail:
            raise RuntimeError("the admin API answered 503: nothing was approved")


def approver(tmp_path: Path, store: Approvals, grants: Grants) -> AutoApprover:
    (tmp_path / "rules" / "tenants").mkdir(parents=True)
    (tmp_path / "rules" / "tenants" / "t1.yaml").write_text(yaml.safe_dump(TENANT))
    (tmp_path / "ceiling.yaml").write_text(yaml.safe_dump(CEILING))
    policy = load_policy_dir(tmp_path / "rules")
    auto = AutoApprover(tmp_path / "ceiling.yaml", lambda: policy, store, grants)
    store.on_opened.append(auto.opened)
    return auto


def hold(store: Approvals, method: str = "GET") -> AccessRequest:
    return store.hold(
        tenant="t1",
        sandbox="sb1",
        phase="request",
        host="api.test",
        port=443,
        method=method,
        path="/v1/x",
        rule_id="api",
    )


def count(result: str) -> float:
    return METRICS.registry.get_sample_value("sandgate_approval_auto_total", {"result": result}) or 0.0


async def settle() -> None:
    """Let the spawned approval task run."""
    for _ in range(5):
        await asyncio.sleep(0)


@pytest.mark.asyncio
async def test_a_held_request_is_released_in_the_worker_s_own_store(tmp_path: Path) -> None:
    store, grants = Approvals(timeout=30, max_held=8), Grants()
    approver(tmp_path, store, grants)
    before = count("approved")
    request = hold(store)
    await settle()
    assert (request.state, request.by) == (State.APPROVED, AUTO_BY)
    assert grants.calls == [], "no other process is asked to release what this worker holds"
    assert count("approved") == before + 1


@pytest.mark.asyncio
async def test_a_held_request_outside_the_ceiling_waits_and_is_counted(tmp_path: Path) -> None:
    store = Approvals(timeout=30, max_held=8)
    approver(tmp_path, store, Grants())
    before = count("declined")
    request = hold(store, method="POST")
    await settle()
    assert request.state is State.HELD
    assert count("declined") == before + 1


@pytest.mark.asyncio
async def test_a_proposal_goes_to_the_admin_api_and_waits_when_that_fails(tmp_path: Path) -> None:
    store, grants = Approvals(timeout=30, max_held=8), Grants(fail=True)
    approver(tmp_path, store, grants)
    before = count("not_applied")
    proposal = store.propose(
        tenant="t1", sandbox="sb1", host="api.test", port=443, methods=("GET",), paths=("/v1/*",), note=None
    )
    await settle()
    assert grants.calls == [(proposal.id, "sandbox")]
    assert proposal.state is State.PENDING, "not approved: it waits for a person"
    assert count("not_applied") == before + 1


@pytest.mark.asyncio
async def test_a_request_an_operator_decided_first_stays_as_decided(tmp_path: Path) -> None:
    store = Approvals(timeout=30, max_held=8)
    approver(tmp_path, store, Grants())
    before = count("not_applied")
    request = hold(store)
    # The operator's denial lands before the approval task runs.
    store.settle(request.id, approve=False, by="alice", reason=None)
    await settle()
    assert (request.state, request.by) == (State.DENIED, "alice")
    assert count("not_applied") == before + 1
