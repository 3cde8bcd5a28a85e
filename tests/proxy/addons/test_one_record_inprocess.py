"""One exchange, one audit record, on the whole pipeline in process: when more than one addon
could refuse (a head cap, the policy, a tenant limit, the credential broker, the upgrade
guard), the guest gets one answer and the trail one record, never a second allow or deny."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import yaml
from conftest import TOKEN, tenant_yaml
from mitmproxy import http
from mitmproxy.proxy.layers.http._hooks import (
    HttpRequestHeadersHook,
    HttpRequestHook,
    HttpResponseHeadersHook,
    HttpResponseHook,
)
from mitmproxy.test import tflow
from support.inprocess import proxy_flow
from support.whole_pipeline import Pipeline, whole_pipeline

from sandgate.brokers import Broker, Secret
from sandgate.policy.reasons import Reason
from sandgate.proxy.addons.heads import HeadRefusal, SandgateHeadRefusedHook, refused_response

PORT = 8080
HOSTS = {"api.test": ["127.0.0.2"], "other.test": ["127.0.0.3"]}
SECRET = "sk-real-0123456789abcdef0123"


def tenant(**limits: int) -> str:
    rules = [
        {"id": "api", "hosts": ["api.test"], "ports": [PORT]},
        {"id": "other", "hosts": ["other.test"], "ports": [PORT]},
    ]
    doc = yaml.safe_load(tenant_yaml("t1", rules))
    if limits:
        doc["limits"] = limits
    # A credential bound to api.test only: its placeholder anywhere else is refused.
    doc["credentials"] = [
        {
            "name": "apikey",
            "secret": "file:apikey.secret",
            "hosts": ["api.test"],
            "ports": [PORT],
            "plaintext": True,
            "inject": {"header": "Authorization", "format": "Bearer {secret}"},
        }
    ]
    return yaml.safe_dump(doc, sort_keys=False)


@pytest.fixture
async def broker() -> AsyncIterator[Broker]:
    broker = Broker(placeholder_key=Secret(b"test-placeholder-key-0123456789abcdef"))
    yield broker
    await broker.aclose()


@pytest.fixture
def limits() -> dict[str, int]:
    """The tenant's limits (none unless a test names some)."""
    return {}


@pytest.fixture
def gw(tmp_path: Path, broker: Broker, limits: dict[str, int]) -> Iterator[Pipeline]:
    with whole_pipeline(
        tmp_path,
        {"t1.yaml": tenant(**limits)},
        HOSTS,
        broker=broker,
        files={"tenants/apikey.secret": SECRET},
    ) as running:
        yield running


async def request(gw: Pipeline, url: str, **kwargs: object) -> http.HTTPFlow:
    """A new connection's proxy request, through the request hooks (head, then body)."""
    client = tflow.tclient_conn()
    await gw.connect(client)
    flow = proxy_flow(client, url, sandbox="sb1", token=TOKEN, **kwargs)  # type: ignore[arg-type]
    await gw.hook(HttpRequestHeadersHook(flow))
    if flow.response is None:
        await gw.hook(HttpRequestHook(flow))
    return flow


async def answered(gw: Pipeline, flow: http.HTTPFlow, upstream: http.Response | None = None) -> http.Response:
    """The exchange ends (the upstream's answer when there was none, through the response
    hooks); the response the guest gets."""
    if flow.response is None:
        flow.response = upstream or http.Response.make(200, b"ok")
        await gw.hook(HttpResponseHeadersHook(flow))
    await gw.hook(HttpResponseHook(flow))
    assert flow.response is not None
    return flow.response


async def test_a_request_head_over_the_cap_is_one_header_too_large_record(gw: Pipeline) -> None:
    # The HTTP/1 layer refuses the head before any flow exists: nothing decides its host.
    client = tflow.tclient_conn()
    await gw.connect(client)
    refusal = HeadRefusal(
        client, Reason.HEADER_TOO_LARGE, 431, "d0000000000000000000000001", "over 100 lines"
    )
    await gw.hook(SandgateHeadRefusedHook(refusal))
    (record,) = gw.records()
    assert (record["decision"], record["reason"], record["status"]) == ("deny", "header_too_large", 431)
    assert record["decision_id"] == "d0000000000000000000000001"


async def test_a_response_head_over_the_cap_is_one_deny_record_not_also_an_allow(gw: Pipeline) -> None:
    flow = await request(gw, f"http://api.test:{PORT}/chat")
    assert flow.response is None
    response = await answered(gw, flow, refused_response(502, Reason.HEADER_TOO_LARGE, None, "max_lines"))
    assert response.status_code == 502
    (record,) = gw.records()
    assert (record["decision"], record["reason"], record["status"]) == ("deny", "header_too_large", 502)
    assert record["rule_id"] == "t1/allow/api"  # the allowing rule is kept
    assert record["decision_id"] == response.headers["X-Sandgate-Decision-Id"]


@pytest.mark.parametrize("limits", [{"requests_per_minute": 1}], ids=["one request a minute"])
async def test_a_request_over_the_rate_limit_is_one_429_record_and_its_upstream_is_never_dialled(
    gw: Pipeline,
) -> None:
    limited = gw
    first = await request(limited, f"http://api.test:{PORT}/a")
    await answered(limited, first)
    second = await request(limited, f"http://api.test:{PORT}/b")
    assert second.response is not None and second.response.status_code == 429
    assert second.response.headers["X-Sandgate-Reason"] == "rate_limited"
    # The policy allowed it, the limit refused it: its connection may dial nothing for it.
    assert await limited.dial(second.client_conn, ("127.0.0.2", PORT)) is not None
    await answered(limited, second)
    allowed, denied = limited.records()
    assert (allowed["decision"], allowed["path"]) == ("allow", "/a")
    assert (denied["decision"], denied["reason"], denied["path"]) == ("deny", "rate_limited", "/b")
    assert denied["rule_id"] == "t1/allow/api"
    assert denied["decision_id"] == second.response.headers["X-Sandgate-Decision-Id"]


@pytest.mark.parametrize(
    "where",
    ["header", "query"],
    ids=["in a header", "in the query string"],
)
async def test_a_placeholder_sent_to_a_host_its_credential_is_not_bound_to_is_one_403_record(
    gw: Pipeline, broker: Broker, where: str
) -> None:
    placeholder = broker.placeholder("t1", "sb1", "apikey")
    assert placeholder is not None
    url = f"http://other.test:{PORT}/v1"
    if where == "header":
        flow = await request(gw, url, headers={"X-Api-Key": placeholder})
    else:
        flow = await request(gw, f"{url}?key={placeholder}")
    assert flow.response is not None and flow.response.status_code == 403
    assert flow.response.headers["X-Sandgate-Reason"] == "credential_host_mismatch"
    await answered(gw, flow)
    (record,) = gw.records()
    assert (record["decision"], record["reason"]) == ("deny", "credential_host_mismatch")
    assert (record["dest"]["host"], record["detail"]) == ("other.test", "unbound_host")
    assert record["broker"]["where"] == (["header:x-api-key"] if where == "header" else ["query:key"])
    assert record["decision_id"] == flow.response.headers["X-Sandgate-Decision-Id"]
    assert placeholder not in str(record) and SECRET not in str(record)


async def test_the_placeholder_on_its_bound_host_is_replaced_and_recorded_once_as_allowed(
    gw: Pipeline, broker: Broker
) -> None:
    # The counterpart of the refusal above: the same placeholder where it is bound goes on.
    placeholder = broker.placeholder("t1", "sb1", "apikey")
    assert placeholder is not None
    flow = await request(gw, f"http://api.test:{PORT}/v1", headers={"Authorization": f"Bearer {placeholder}"})
    assert flow.response is None
    assert flow.request.headers["Authorization"] == f"Bearer {SECRET}"
    await answered(gw, flow)
    (record,) = gw.records()
    assert (record["decision"], record["reason"], record["credentials"]) == ("allow", "allowed", ["apikey"])


async def test_an_unapproved_101_is_one_403_record_not_also_an_allow(gw: Pipeline) -> None:
    flow = await request(gw, f"http://api.test:{PORT}/chat")
    assert flow.response is None
    switched = http.Response.make(101, b"", {"Upgrade": "foo", "Connection": "upgrade"})
    response = await answered(gw, flow, switched)
    assert response.status_code == 403
    assert response.headers["X-Sandgate-Reason"] == "upgrade_not_allowed"
    (record,) = gw.records()
    assert (record["decision"], record["reason"], record["status"]) == ("deny", "upgrade_not_allowed", 403)
    assert record["rule_id"] == "t1/allow/api"


async def test_an_upgrade_no_rule_allows_is_refused_before_the_upstream_with_one_record(gw: Pipeline) -> None:
    headers = {"Upgrade": "websocket", "Connection": "upgrade", "Sec-WebSocket-Version": "13"}
    flow = await request(gw, f"http://api.test:{PORT}/ws", headers=headers)
    assert flow.response is not None and flow.response.status_code == 403
    assert flow.response.headers["X-Sandgate-Reason"] == "upgrade_not_allowed"
    assert await gw.dial(flow.client_conn, ("127.0.0.2", PORT)) is not None
    await answered(gw, flow)
    (record,) = gw.records()
    assert (record["decision"], record["reason"]) == ("deny", "upgrade_not_allowed")
