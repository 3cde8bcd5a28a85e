"""`sandgate policy explain` and the running gateway decide alike, step by step of the order.

One gateway (`sandgate run`, explicit proxy and DNS listener on loopback, a scripted
nameserver) serves a table of requests that each end at a different step; `policy explain`
is asked the same with the same rules and config. The verdict, reason, rule and refused
addresses of the gateway's audit record, and why (its detail), must be explain's, and explain's steps must show
the step the case is about.

Two cases cannot be reached through a real gateway offline and without an operator: a
request without any identity (explain has no way to say "nobody"), and a request an ask rule
holds (the gateway waits for an operator). They compare the gateway's own
`GatewayContext.decide` with `explain` in process, on the same rules and config.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dns.message
import dns.query
import pytest
import yaml
from conftest import OTHER_TOKEN, OTHER_TOKEN_REF, TOKEN, TOKEN_REF, GatewayFactory, RunningGateway
from support.dnsserver import ScriptedDNSServer
from support.ports import free_port
from support.upstream import RecordingUpstream

from sandgate.policy.address_guard import AddressGuard
from sandgate.policy.decision import EgressRequest, Identity, Phase
from sandgate.policy.explain import explain
from sandgate.policy.model.grants import Grant, render_grants_file
from sandgate.policy.model.loader import load_policy_dir
from sandgate.policy.rego.engine import make_engine
from sandgate.proxy.approvals.reserved import ReservedName
from sandgate.proxy.audit.trail import AuditLog
from sandgate.proxy.cli.main import main
from sandgate.proxy.config import load_config
from sandgate.proxy.context import GatewayContext
from sandgate.proxy.net.host_addresses import own_addresses
from sandgate.proxy.startup.broker_setup import PolicyCredentials
from sandgate.proxy.startup.resolver_setup import build_resolver

REPO_REGO = Path(__file__).resolve().parents[3] / "rules" / "rego" / "sandgate.rego"
# A sandbox known by its source address, for the DNS listener (transparent mode's identity).
DNS_CLIENT = "127.0.0.9"
GRANT_ID = "0123456789ab0001"
BASE = "deny:\n  - id: metadata-name\n    hosts: [base-blocked.test]\n"
ACME_REGO = """package sandgate.tenants.acme

import rego.v1

deny contains "no admin" if input.request.path == "/admin"

# Decided only when the gateway names the credential bound to the host in the input.
deny contains "not with the key" if {
	"cred-key" in input.credentials
	input.request.path == "/no-cred"
}
"""


def acme(port: int) -> dict[str, Any]:
    return {
        "tenant": "acme",
        "sandboxes": [{"id": "sb1", "token": TOKEN_REF}, {"id": "sb-dns", "addresses": [DNS_CLIENT]}],
        "allow": [
            {"id": "api", "hosts": ["api.test"], "ports": [port]},
            {"id": "nowhere", "hosts": ["nowhere.test"], "ports": [port]},
            {"id": "internal", "hosts": ["internal.test"], "ports": [port]},
            {"id": "cred", "hosts": ["cred.test"], "ports": [port]},
        ],
        "deny": [{"id": "blocked", "hosts": ["denied.test"]}],
        # Names the granted host too, as it did when its grant was asked for.
        "ask": [{"id": "more", "hosts": ["asked.test", "granted.test"], "ports": [port]}],
        "credentials": [
            {
                "name": "cred-key",
                "secret": "env:SG_AGREE_KEY",
                "hosts": ["cred.test"],
                "ports": [port],
                "plaintext": True,
                "inject": {"header": "Authorization", "format": "Bearer {secret}"},
            }
        ],
        "rego": ["acme.rego"],
    }


def tenants(port: int) -> dict[str, str]:
    open_tenant = {
        "tenant": "open",
        "sandboxes": [{"id": "sb-open", "token": OTHER_TOKEN_REF}],
        "allow": [{"id": "any", "hosts": ["*"], "ports": [port]}],
    }
    trial = {
        "tenant": "trial",
        "mode": "report",
        "sandboxes": [{"id": "sb-trial", "token": TOKEN_REF}],
        "allow": [{"id": "get", "hosts": ["api.test"], "ports": [port], "methods": ["GET"]}],
    }
    grant = Grant(
        id=GRANT_ID, tenant="acme", sandbox=None, host="granted.test", port=port,
        methods=frozenset({"GET"}), paths=("/g",), by="alice", at=1_790_000_000.0,
    )  # fmt: skip
    return {
        "acme.yaml": yaml.safe_dump(acme(port), sort_keys=False),
        "acme.rego": ACME_REGO,
        "acme.grants.yaml": render_grants_file("acme", [grant]),
        "open.yaml": yaml.safe_dump(open_tenant, sort_keys=False),
        "trial.yaml": yaml.safe_dump(trial, sort_keys=False),
    }


def with_decision_module(root: Path) -> None:
    """The operator's Rego decision module every Rego tenant needs, as shipped."""
    (root / "rules" / "rego").mkdir()
    shutil.copy(REPO_REGO, root / "rules" / "rego" / "sandgate.rego")


@dataclass
class Lab:
    gateway: RunningGateway
    upstream_port: int
    dns_port: int

    @property
    def config(self) -> Path:
        return self.gateway.root / "sandgate.yaml"


@pytest.fixture(scope="module")
def lab(start_module_gateway: GatewayFactory, http_upstream: RecordingUpstream) -> Iterator[Lab]:
    port = http_upstream.port
    names = {
        "api.test": ["127.0.0.2"],
        "granted.test": ["127.0.0.2"],
        "asked.test": ["127.0.0.2"],
        "cred.test": ["127.0.0.2"],
        "denied.test": ["127.0.0.2"],
        "base-blocked.test": ["127.0.0.2"],
        "anything.test": ["127.0.0.2"],
        "internal.test": ["10.77.0.1"],
    }
    # Names it does not know (nowhere.test) are NXDOMAIN: a dns_failure, never a lookup outside.
    with ScriptedDNSServer(records=names) as nameserver:
        dns_port = free_port()
        config = {
            "resolver": {"hosts": {}, "nameservers": [f"127.0.0.1:{nameserver.port}"], "ipv6": False},
            "dns": {"host": "127.0.0.1", "port": dns_port},
        }
        gateway = start_module_gateway(
            tenants(port),
            base=BASE,
            config=config,
            env={"SG_AGREE_KEY": "agree-secret-value"},
            prepare=with_decision_module,
        )
        yield Lab(gateway, port, dns_port)


@dataclass(frozen=True)
class Case:
    why: str
    method: str
    url: str
    sandbox: str
    # A step explain must show for it: (step name, outcome).
    step: tuple[str, str]

    @property
    def host(self) -> str:
        if self.method in ("CONNECT", "DNS"):
            return self.url.partition(":")[0]
        return self.url.split("/")[2].partition(":")[0]


P = "{port}"  # the upstream's port, filled in per run
CASES = [
    Case("the guard refuses a literal", "GET", "http://169.254.169.254/latest", "sb1", ("address guard", "deny")),
    Case("a base deny rule", "GET", f"http://base-blocked.test:{P}/", "sb1", ("deny rules", "deny")),
    Case("a tenant deny rule", "GET", f"http://denied.test:{P}/", "sb1", ("deny rules", "deny")),
    Case("an allow rule", "GET", f"http://api.test:{P}/ok", "sb1", ("allow rules", "ok")),
    Case('hosts ["*"], its address refused', "GET", f"http://anything.test:{P}/", "sb-open", ("resolve", "deny")),
    Case("a grant", "GET", f"http://granted.test:{P}/g", "sb1", ("allow rules", "ok")),
    Case("dns_failure: a name that does not resolve", "GET", f"http://nowhere.test:{P}/", "sb1", ("resolve", "deny")),
    Case("a resolved address refused", "GET", f"http://internal.test:{P}/", "sb1", ("resolve", "deny")),
    Case("Rego denies", "GET", f"http://api.test:{P}/admin", "sb1", ("rego", "deny")),
    Case("report mode would deny", "POST", f"http://api.test:{P}/ok", "sb-trial", ("allow rules", "would deny")),
    Case("the reserved name", "CONNECT", "sandgate.internal:443", "sb1", ("reserved name", "deny")),
    Case("a credential bound host: Rego sees it", "GET", f"http://cred.test:{P}/no-cred", "sb1", ("rego", "deny")),
    Case("a credential bound host, allowed", "GET", f"http://cred.test:{P}/ok", "sb1", ("credentials", "ok")),
    Case("DNS: an allowed name", "DNS", "api.test", "sb-dns", ("dns name", "ok")),
    Case("DNS: a name a deny rule refuses", "DNS", "denied.test", "sb-dns", ("dns name", "deny")),
    Case("DNS: a name no rule names", "DNS", "unnamed.test", "sb-dns", ("dns name", "deny")),
]  # fmt: skip


def explain_cli(capsys: pytest.CaptureFixture[str], lab: Lab, case: Case, url: str) -> dict[str, Any]:
    """`sandgate policy explain --format json` for the case, with the gateway's rules and config."""
    rules = str(lab.gateway.rules_dir)
    argv = ["policy", "explain", "--rules", rules, "--config", str(lab.config), "--sandbox", case.sandbox]
    main([*argv, "--format", "json", case.method, url])
    out, err = capsys.readouterr()
    assert err == ""
    value: dict[str, Any] = json.loads(out)
    return value


def ask_gateway(lab: Lab, case: Case, url: str) -> None:
    """Send the case to the gateway: a DNS query from the sandbox's address, or curl through
    the explicit proxy as the case's sandbox."""
    if case.method == "DNS":
        query = dns.message.make_query(url, "A")
        dns.query.udp(query, "127.0.0.1", port=lab.dns_port, source=DNS_CLIENT, timeout=5)
        return
    token = OTHER_TOKEN if case.sandbox == "sb-open" else TOKEN
    proxy = lab.gateway.proxy(case.sandbox, token)
    # A CONNECT is what curl sends for an https:// URL through a proxy.
    how = ["-k", f"https://{url}/"] if case.method == "CONNECT" else ["-X", case.method, url]
    subprocess.run(
        ["curl", "-sS", "-m", "10", "-o", "/dev/null", "-x", proxy, *how], capture_output=True, timeout=30
    )


def the_record(gateway: RunningGateway, host: str) -> dict[str, Any]:
    found = gateway.records_until(lambda rs: any(r["dest"]["host"] == host for r in rs))
    mine = [r for r in found if r["dest"]["host"] == host]
    assert len(mine) == 1, mine
    return mine[0]


@pytest.mark.parametrize("case", CASES, ids=[f"explain and the gateway agree: {c.why}" for c in CASES])
def test_explain_and_the_gateway_decide_alike(
    capsys: pytest.CaptureFixture[str], lab: Lab, case: Case
) -> None:
    url = case.url.replace(P, str(lab.upstream_port))
    lab.gateway.mark()
    ask_gateway(lab, case, url)
    record = the_record(lab.gateway, case.host)
    explained = explain_cli(capsys, lab, case, url)
    got = (
        record["decision"],
        record["reason"],
        record["rule_id"],
        record["detail"] or "",
        record.get("refused", []),
    )
    want = (
        explained["decision"],
        explained["reason"],
        explained["rule_id"],
        explained["detail"],
        explained["refused"],
    )
    assert got == want
    shown = [(s["name"], s["outcome"]) for s in explained["steps"]]
    assert case.step in shown, shown


async def test_the_held_and_the_unidentified_are_decided_alike_in_process(lab: Lab) -> None:
    """An ask rule's hold and a request with no identity: the gateway's own `decide` and
    `explain`, on the gateway's rules and config."""
    config = load_config(lab.config)
    policy = load_policy_dir(lab.gateway.rules_dir)
    resolver = build_resolver(config.resolver)
    guard = AddressGuard(
        config.address_guard.reachable_by_name, own_addresses(), config.address_guard.tenant_reachable
    )
    ctx = GatewayContext(policy, resolver, guard, AuditLog([]), engine=make_engine("embedded", cache_size=0))
    assert config.approvals.endpoint_name is not None
    ctx.reserved = ReservedName(config.approvals.endpoint_name, config.approvals.endpoint_address)
    port = lab.upstream_port
    held = EgressRequest(Phase.REQUEST, "asked.test", port, scheme="http", method="GET", path="/")
    for identity, request, want in [
        (Identity("acme", "sb1"), held, ("deny", "approval_required", "acme/ask/more")),
        (None, held, ("deny", "no_identity", None)),
    ]:
        gateway = await ctx.decide(identity, request)
        explained = await explain(
            policy, identity, request, resolver, guard, make_engine("embedded", cache_size=0),
            reserved=ctx.reserved.name, bindings=PolicyCredentials(policy),
        )  # fmt: skip
        assert explained.decision == gateway
        assert (gateway.verdict, gateway.reason.value, gateway.rule_id) == want
        assert gateway.ask is (want[1] == "approval_required")
