"""`approvals.auto: within_ceiling` end to end: a real gateway approves, without a person, only
what the operator's ceiling proves harmless; everything else waits for one. Real upstream on
loopback counting what reaches it, real httpx guests through the proxy."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from conftest import TOKEN, TOKEN_REF, GatewayFactory, RunningGateway
from pydantic import ValidationError
from support import RecordingUpstream

from sandgate.proxy.config import GatewayConfig

pytestmark = pytest.mark.slow

ENDPOINT = "http://sandgate.internal/v1/access-requests"


def ceiling(port: int) -> str:
    return yaml.safe_dump(
        {
            "regions": [
                {
                    "id": "reads",
                    "hosts": ["api.test"],
                    "ports": [port],
                    "methods": ["GET"],
                    "paths": ["/auto/**"],
                }
            ],
            "always_human": [{"hosts": ["api.test"], "paths": ["/auto/people/**"]}],
        }
    )


def tenant(port: int) -> str:
    return yaml.safe_dump(
        {
            "tenant": "t1",
            "sandboxes": [{"id": "sb1", "token": TOKEN_REF}],
            "ask": [{"id": "api", "hosts": ["api.test"], "ports": [port]}],
        },
        sort_keys=False,
    )


@pytest.fixture(scope="module")
def shared(
    start_module_gateway: GatewayFactory, http_upstream: RecordingUpstream, tmp_path_factory: Any
) -> RunningGateway:
    path: Path = tmp_path_factory.mktemp("ceiling") / "ceiling.yaml"
    path.write_text(ceiling(http_upstream.port))
    return start_module_gateway(
        {"t1.yaml": tenant(http_upstream.port)},
        config={"approvals": {"auto": "within_ceiling", "ceiling": str(path)}, "workers": {"count": 1}},
    )


@pytest.fixture
def gw(shared: RunningGateway, http_upstream: RecordingUpstream) -> RunningGateway:
    shared.mark()
    http_upstream.reset()
    return shared


@pytest.fixture
def guest(gw: RunningGateway) -> Iterator[httpx.Client]:
    with httpx.Client(proxy=gw.proxy("sb1", TOKEN), timeout=20) as client:
        yield client


def admin(gw: RunningGateway, method: str, path: str, **kwargs: Any) -> httpx.Response:
    transport = httpx.HTTPTransport(uds=str(gw.root / "state" / "admin.sock"))
    with httpx.Client(transport=transport, base_url="http://sandgate", timeout=10) as c:
        return c.request(method, path, **kwargs)


def open_requests(gw: RunningGateway) -> list[dict[str, Any]]:
    return list(admin(gw, "GET", "/v1/access-requests").json()["requests"])


def test_a_request_inside_the_ceiling_is_released_without_a_person(
    gw: RunningGateway, guest: httpx.Client, http_upstream: RecordingUpstream
) -> None:
    answer = guest.get(f"http://api.test:{http_upstream.port}/auto/readme")
    assert answer.status_code == 200, answer.text
    assert [r.target for r in http_upstream.requests] == ["/auto/readme"]
    records = gw.records_until(lambda rs: any(r.get("approval") for r in rs))
    (asked,) = [r for r in records if r["decision"] == "ask"]
    (released,) = [r for r in records if r.get("approval")]
    assert released["approval"]["id"] == asked["approval_id"]
    assert released["approval"]["by"] == "auto:within_ceiling"
    assert (released["decision"], released["status"]) == ("allow", 200)


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/auto/readme"), ("GET", "/elsewhere"), ("GET", "/auto/people/x")],
    ids=["a method outside the ceiling", "a path outside it", "an always-human path inside it"],
)
def test_anything_else_waits_for_a_person(
    gw: RunningGateway, guest: httpx.Client, http_upstream: RecordingUpstream, method: str, path: str
) -> None:
    answers: list[httpx.Response] = []
    sender = threading.Thread(
        target=lambda: answers.append(guest.request(method, f"http://api.test:{http_upstream.port}{path}"))
    )
    sender.start()
    deadline = time.monotonic() + 10
    while not (found := [r for r in open_requests(gw) if r["path"] == path]):
        assert time.monotonic() < deadline, "the request was never held"
        time.sleep(0.05)
    time.sleep(1.0)  # time enough for an automatic approval, had there been one
    (request,) = [r for r in open_requests(gw) if r["path"] == path]
    assert request["state"] == "held" and http_upstream.requests == []
    assert (
        admin(gw, "POST", f"/v1/access-requests/{found[0]['id']}/deny", json={"by": "alice"}).status_code
        == 200
    )
    sender.join(20)
    assert [a.status_code for a in answers] == [403]
    assert answers[0].headers["X-Sandgate-Reason"] == "approval_denied"
    assert "auto:within_ceiling" not in json.dumps(gw.records())


def test_a_proposal_inside_the_ceiling_becomes_a_grant_at_once(
    gw: RunningGateway, guest: httpx.Client, http_upstream: RecordingUpstream
) -> None:
    proposal = {"host": "api.test", "port": http_upstream.port, "methods": ["GET"], "paths": ["/auto/pkg/**"]}
    answer = guest.post(ENDPOINT, json=proposal)
    assert answer.status_code == 202, answer.text
    poll = answer.json()["poll"]
    deadline = time.monotonic() + 10
    while (state := guest.get(poll).json()["state"]) == "pending":
        assert time.monotonic() < deadline, "the proposal was never approved"
        time.sleep(0.05)
    assert state == "approved"
    # The grant is the sandbox's now: no request of it is asked about again.
    assert guest.get(f"http://api.test:{http_upstream.port}/auto/pkg/a/b").status_code == 200
    assert [r.target for r in http_upstream.requests] == ["/auto/pkg/a/b"]
    grants = admin(gw, "GET", "/v1/grants").json()["grants"]
    (grant,) = [g for g in grants if g["id"] == answer.json()["id"]]
    assert (grant["sandbox"], grant["by"]) == ("sb1", "auto:within_ceiling")
    assert grant["expires"], "a sandbox grant has the default TTL"


def test_the_gateway_config_refuses_auto_approval_without_the_admin_api() -> None:
    """It approves through the admin API: a config that turns that off says so at load."""
    GatewayConfig.model_validate({"approvals": {"auto": "within_ceiling"}})
    with pytest.raises(ValidationError, match=r"approvals\.auto approves through the admin API"):
        GatewayConfig.model_validate({"approvals": {"auto": "within_ceiling"}, "admin": {"enabled": False}})
