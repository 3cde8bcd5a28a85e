"""A policy that crashes, on the whole pipeline in process: the request is refused (403, one
deny record), never let through and never dialled."""

from __future__ import annotations

from pathlib import Path

import yaml
from conftest import REPO, TOKEN, TOKEN_REF, tenant_yaml
from mitmproxy import connection, http
from mitmproxy.proxy.layers.http._hooks import HttpConnectHook, HttpRequestHeadersHook
from mitmproxy.test import tflow
from support.inprocess import connect_flow, proxy_flow
from support.whole_pipeline import Pipeline, whole_pipeline

from sandgate.policy.rego.protocol import RegoQuery, RegoVerdict
from sandgate.policy.resolver import Resolution

PORT = 8080
HOSTS = {"api.test": ["127.0.0.2"]}
# The decision module every tenant's Rego runs under, as shipped.
LIBRARY = REPO / "rules" / "rego" / "sandgate.rego"
TENANT = tenant_yaml("t1", [{"id": "api", "hosts": ["api.test"], "ports": [PORT]}])


class CrashingResolver:
    """A Resolver whose lookups fail with an error no resolver is expected to raise."""

    async def resolve(self, host: str) -> Resolution:
        raise RuntimeError("the resolver crashed")


class CrashingEngine:
    """A PolicyEngine that breaks its promise never to raise."""

    name = "crashing"

    async def evaluate(self, query: RegoQuery) -> RegoVerdict:
        raise RuntimeError("the engine crashed")

    async def health(self) -> bool:
        return False

    async def close(self) -> None:
        return None


async def request(gw: Pipeline) -> http.HTTPFlow:
    client = tflow.tclient_conn()
    await gw.connect(client)
    flow = proxy_flow(client, f"http://api.test:{PORT}/v1", sandbox="sb1", token=TOKEN)
    await gw.hook(HttpRequestHeadersHook(flow))
    return flow


async def connect(gw: Pipeline) -> tuple[connection.Client, http.HTTPFlow]:
    client = tflow.tclient_conn()
    await gw.connect(client)
    flow = connect_flow(client, "api.test", PORT, sandbox="sb1", token=TOKEN)
    await gw.hook(HttpConnectHook(flow))
    return client, flow


async def test_a_crashing_resolver_refuses_the_request_internal_error(tmp_path: Path) -> None:
    with whole_pipeline(tmp_path, {"t1.yaml": TENANT}, HOSTS, resolver=CrashingResolver()) as gw:
        flow = await request(gw)
        assert flow.response is not None and flow.response.status_code == 403
        assert flow.response.headers["X-Sandgate-Reason"] == "internal_error"
        assert await gw.dial(flow.client_conn, ("127.0.0.2", PORT)) is not None
        (record,) = gw.records()
    assert (record["decision"], record["reason"]) == ("deny", "internal_error")
    assert record["decision_id"] == flow.response.headers["X-Sandgate-Decision-Id"]


async def test_a_crashing_resolver_refuses_the_connect_and_every_dial(tmp_path: Path) -> None:
    with whole_pipeline(tmp_path, {"t1.yaml": TENANT}, HOSTS, resolver=CrashingResolver()) as gw:
        client, flow = await connect(gw)
        assert flow.response is not None and flow.response.status_code == 403
        assert flow.response.headers["X-Sandgate-Reason"] == "internal_error"
        assert await gw.dial(client, ("127.0.0.2", PORT)) == "sandgate: internal_error"
        (record,) = gw.records()
    assert (record["phase"], record["decision"], record["reason"]) == ("connect", "deny", "internal_error")


async def test_a_crashing_policy_engine_refuses_the_request_policy_error(tmp_path: Path) -> None:
    tenant = yaml.safe_dump(
        {
            "tenant": "t1",
            "sandboxes": [{"id": "sb1", "token": TOKEN_REF}],
            "allow": [{"id": "api", "hosts": ["api.test"], "ports": [PORT]}],
            "rego": ["t1.rego"],
        }
    )
    module = "package sandgate.tenants.t1\n\nimport rego.v1\n\ndeny contains {} if { false }\n"
    with whole_pipeline(
        tmp_path,
        {"t1.yaml": tenant},
        HOSTS,
        engine=CrashingEngine(),
        files={"tenants/t1.rego": module, "rego/sandgate.rego": LIBRARY.read_text()},
    ) as gw:
        flow = await request(gw)
        assert flow.response is not None and flow.response.status_code == 403
        assert flow.response.headers["X-Sandgate-Reason"] == "policy_error"
        assert await gw.dial(flow.client_conn, ("127.0.0.2", PORT)) is not None
        (record,) = gw.records()
    assert (record["decision"], record["reason"], record["rule_id"]) == ("deny", "policy_error", "t1/rego")
