"""OCSF events of every kind of audit record, built by the gateway's own record builders and
written by the real audit writer, validated against the published OCSF 1.8.0 schema."""

from __future__ import annotations

import copy
import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.ocsf_schema import schema_errors, validate_event

from sandgate.policy.decision import Decision, Identity, Mode, Phase, Refusal
from sandgate.policy.model.grants import Grant
from sandgate.policy.reasons import Reason
from sandgate.proxy.approvals.grants import grant_record
from sandgate.proxy.audit.ocsf.base import OCSF_VERSION
from sandgate.proxy.audit.ocsf.detection_finding import FINDINGS
from sandgate.proxy.audit.ocsf.events import ocsf_events
from sandgate.proxy.audit.records import DecisionContext, decision_record, secret_scrubbed_record
from sandgate.proxy.audit.trail import AuditLog, JsonlFileSink
from sandgate.proxy.refresh.reloader import PolicyReloader
from sandgate.proxy.stores.registry import DynamicSandbox
from sandgate.proxy.stores.registry_change import sandbox_update_record
from sandgate.proxy.version import version_of

ROOT = Path(__file__).resolve().parents[4]
WHO = Identity("acme", "sb-1")
REGULAR = "regular@127.0.0.1:8080"


def _decision(
    phase: Phase,
    reason: Reason,
    *,
    allowed: bool = False,
    method: str | None = None,
    path: str | None = None,
    sni: str | None = None,
    host: str = "api.example.test",
    port: int = 443,
    identity: Identity | None = WHO,
    listener: str = REGULAR,
    **fields: Any,
) -> dict[str, Any]:
    """A decision's record, as the gateway's hooks build it."""
    ctx = DecisionContext(
        phase=phase,
        listener=listener,
        client="10.200.0.2:40000",
        host=host,
        port=port,
        sni=sni,
        method=method,
        path=path,
        identity=identity,
    )
    extra = {k: fields.pop(k) for k in ("report_only", "approval", "refused", "mode") if k in fields}
    decision = Decision(
        allowed=allowed,
        reason=reason,
        rule_id="acme/allow/api" if allowed or reason is not Reason.HOST_NOT_ALLOWED else None,
        policy_version="pv1",
        address="203.0.113.5" if allowed else None,
        **extra,
    )
    return decision_record(ctx, decision, count=False, **fields)


def _held() -> dict[str, Any]:
    """A request held for approval (sandgate.proxy.approvals.holds writes `ask`)."""
    record = _decision(Phase.REQUEST, Reason.APPROVAL_REQUIRED, method="POST", path="/v1/things")
    record.update(decision="ask", approval_id="ar-1")
    return record


def _grant(action: str) -> dict[str, Any]:
    grant = Grant(
        id="ar-1", tenant="acme", sandbox="sb-1", host="api.example.test", port=443, by="alice", at=1.0
    )
    return grant_record(grant, action, where="redis", by="alice" if action != "expired" else None)


def _sandbox_update() -> dict[str, Any]:
    old = DynamicSandbox(id="sb-1", tenant="acme", addresses=("10.200.0.2",))
    new = DynamicSandbox(id="sb-1", tenant="beta", addresses=("10.200.0.2",))
    return sandbox_update_record(old, new, ["tenant"], "pv1", "pv2")


def _scrubbed() -> dict[str, Any]:
    ctx = DecisionContext(
        phase=Phase.REQUEST,
        listener=REGULAR,
        client="10.200.0.2:40000",
        host="echo.example.test",
        port=443,
        method="GET",
        path="/echo?token=abc",
        identity=WHO,
    )
    return secret_scrubbed_record(ctx, {"github": 2}, "response")


# name → (record builder, the classes of its events, in order)
CASES: dict[str, tuple[Any, list[int]]] = {
    "an allowed GET": (
        lambda: _decision(
            Phase.REQUEST,
            Reason.ALLOWED,
            allowed=True,
            method="GET",
            path="/v1/repos?page=2",
            status=200,
            bytes_up=310,
            bytes_down=5120,
            credentials=("github",),
        ),
        [4002],
    ),
    "a denied POST": (
        lambda: _decision(Phase.REQUEST, Reason.PATH_NOT_ALLOWED, method="POST", path="/admin"),
        [4002],
    ),
    "a request in an unlisted method": (
        lambda: _decision(Phase.REQUEST, Reason.METHOD_NOT_ALLOWED, method="PROPFIND", path="/"),
        [4002],
    ),
    "a would-deny in report mode": (
        lambda: _decision(
            Phase.REQUEST,
            Reason.HOST_NOT_ALLOWED,
            allowed=True,
            report_only=True,
            mode=Mode.REPORT,
            method="GET",
            path="/",
            status=200,
        ),
        [4002],
    ),
    "a request held for approval": (_held, [4002]),
    "an approved request": (
        lambda: _decision(
            Phase.REQUEST,
            Reason.ALLOWED,
            allowed=True,
            approval=("ar-1", "alice"),
            method="POST",
            path="/v1/things",
            status=201,
        ),
        [4002],
    ),
    "a rejected request": (
        lambda: _decision(
            Phase.REQUEST,
            Reason.APPROVAL_DENIED,
            approval=("ar-1", "alice"),
            method="POST",
            path="/v1/things",
        ),
        [4002],
    ),
    "an allowed request whose upstream failed": (
        lambda: _decision(
            Phase.REQUEST,
            Reason.UPSTREAM_UNREACHABLE,
            allowed=True,
            method="GET",
            path="/",
            status=502,
            error="upstream unreachable",
        ),
        [4002],
    ),
    "a placeholder sent to the wrong host": (
        lambda: _decision(
            Phase.REQUEST,
            Reason.CREDENTIAL_HOST_MISMATCH,
            method="POST",
            path="/collect",
            credentials=("github",),
        ),
        [4002, 2004],
    ),
    "a forged placeholder": (
        lambda: _decision(Phase.REQUEST, Reason.UNKNOWN_PLACEHOLDER, method="GET", path="/"),
        [4002, 2004],
    ),
    "an allowed CONNECT": (
        lambda: _decision(Phase.CONNECT, Reason.ALLOWED, allowed=True, bytes_up=900, bytes_down=4000),
        [4001],
    ),
    "a denied CONNECT": (lambda: _decision(Phase.CONNECT, Reason.HOST_NOT_ALLOWED), [4001]),
    "an address-guard refusal": (
        lambda: _decision(
            Phase.CONNECT,
            Reason.PRIVATE_ADDRESS,
            host="10.1.5.3",
            refused=(Refusal("10.1.5.3", "10.1.5.3 is a private address", "private"),),
        ),
        [4001, 2004],
    ),
    "a ClientHello whose SNI does not match": (
        lambda: _decision(Phase.TLS, Reason.SNI_MISMATCH, sni="other.example.test"),
        [4001, 2004],
    ),
    "an allowed ClientHello": (
        lambda: _decision(Phase.TLS, Reason.ALLOWED, allowed=True, sni="api.example.test"),
        [4001],
    ),
    "a raw TCP connection on the transparent listener": (
        lambda: _decision(
            Phase.CONNECT,
            Reason.ALLOWED,
            allowed=True,
            host="db.example.test",
            port=5432,
            listener="transparent@8081",
            bytes_up=10,
            bytes_down=20,
        ),
        [4001],
    ),
    "HTTP/2 protocol abuse": (lambda: _decision(Phase.CONNECT, Reason.PROTOCOL_ABUSE), [4001, 2004]),
    "an answered DNS query": (
        lambda: _decision(
            Phase.DNS, Reason.ALLOWED, allowed=True, method="A", port=53, listener="dns@127.0.0.1:5353"
        ),
        [4003],
    ),
    "a refused DNS query": (
        lambda: _decision(Phase.DNS, Reason.DNS_DENIED, method="TXT", port=53, listener="dns@127.0.0.1:5353"),
        [4003, 2004],
    ),
    "a DNS query from an unknown source": (
        lambda: _decision(
            Phase.DNS, Reason.NO_IDENTITY, method="A", port=53, identity=None, listener="dns@127.0.0.1:5353"
        ),
        [4003],
    ),
    "a secret scrubbed from a response": (_scrubbed, [2004]),
    "a policy reload": (lambda: PolicyReloader._record("sighup", "ok", "pv1", "pv2", []), [5019]),
    "a failed policy reload": (
        lambda: PolicyReloader._record("file_change", "error", "pv1", "pv1", ["acme.yaml:3: bad"]),
        [5019],
    ),
    "a grant made": (lambda: _grant("made"), [5019]),
    "a grant revoked": (lambda: _grant("revoked"), [5019]),
    "a grant expired": (lambda: _grant("expired"), [5019]),
    "a sandbox update": (_sandbox_update, [5019]),
}


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Each case's record as the real audit writer wrote it to its JSON-lines file."""
    path = tmp_path_factory.mktemp("trail") / "audit.jsonl"
    audit = AuditLog([JsonlFileSink(path, max_bytes=10_000_000, backups=1)], log_events=False)
    audit.start()
    for build, _ in CASES.values():
        audit.emit_nowait(build())
    audit.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == len(CASES)
    return dict(zip(CASES, lines, strict=True))


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_every_event_validates_against_the_ocsf_schema(case: str, written: dict[str, dict[str, Any]]) -> None:
    events = ocsf_events(written[case])
    assert [e["class_uid"] for e in events] == CASES[case][1]
    for event in events:
        validate_event(event)
        assert event["metadata"]["version"] == OCSF_VERSION == "1.8.0"
        assert event["metadata"]["product"] == {
            "name": "sandgate",
            "vendor_name": "sandgate",
            "version": version_of("sandgate"),
        }
        assert event["type_uid"] == event["class_uid"] * 100 + event["activity_id"]


def test_the_same_record_always_gives_the_same_uids(written: dict[str, dict[str, Any]]) -> None:
    uids = []
    for record in written.values():
        first = [e["metadata"]["uid"] for e in ocsf_events(record)]
        assert first == [e["metadata"]["uid"] for e in ocsf_events(copy.deepcopy(record))]
        uids += first
    assert len(uids) == len(set(uids))


def test_a_finding_has_its_own_uid_beside_the_activity_it_is_joined_to(
    written: dict[str, dict[str, Any]],
) -> None:
    record = written["a placeholder sent to the wrong host"]
    activity, finding = ocsf_events(record)
    assert activity["metadata"]["uid"] == record["decision_id"]
    assert finding["metadata"]["uid"] == finding["finding_info"]["uid"] == f"{record['decision_id']}:finding"
    assert (
        finding["metadata"]["correlation_uid"]
        == activity["metadata"]["correlation_uid"]
        == record["decision_id"]
    )
    assert finding["finding_info"]["types"] == ["credential_misuse"]
    assert finding["severity_id"] == 4
    assert finding["status_detail"] == "credential_host_mismatch"
    assert finding["evidences"][0]["dst_endpoint"]["hostname"] == "api.example.test"


def test_an_allowed_request_carries_its_endpoints_rule_bytes_and_url(
    written: dict[str, dict[str, Any]],
) -> None:
    record = written["an allowed GET"]
    (event,) = ocsf_events(record)
    assert event["activity_id"] == 3 and event["activity_name"] == "Get"
    assert event["time"] == round(datetime.fromisoformat(record["time"]).timestamp() * 1000)
    assert event["src_endpoint"] == {"ip": "10.200.0.2", "port": 40000, "name": "sb-1"}
    assert event["dst_endpoint"] == {"hostname": "api.example.test", "ip": "203.0.113.5", "port": 443}
    assert event["proxy_endpoint"] == {
        "name": REGULAR,
        "svc_name": "regular",
        "ip": "127.0.0.1",
        "port": 8080,
    }
    assert event["http_request"] == {
        "http_method": "GET",
        "url": {
            "path": "/v1/repos",
            "query_string": "page=REDACTED",
            "hostname": "api.example.test",
            "port": 443,
        },
    }
    assert event["http_response"] == {"code": 200}
    assert event["traffic"] == {"bytes_out": 310, "bytes_in": 5120, "bytes": 5430}
    assert event["firewall_rule"] == {
        "uid": "acme/allow/api",
        "name": "acme/allow/api",
        "version": "pv1",
        "category": "acme",
    }
    assert event["actor"]["user"]["uid"] == "sb-1" and event["actor"]["user"]["org"]["uid"] == "acme"
    assert (event["action_id"], event["disposition_id"], event["status_detail"]) == (1, 1, "allowed")
    assert event["unmapped"]["credentials"] == ["github"]


@pytest.mark.parametrize(
    ("case", "action_id", "disposition_id"),
    [
        ("an allowed GET", 1, 1),
        ("a denied POST", 2, 2),
        ("a would-deny in report mode", 3, 15),
        ("a request held for approval", 99, 14),
        ("an approved request", 1, 8),
        ("a rejected request", 2, 25),
    ],
    ids=[
        "allow is allowed",
        "deny is blocked",
        "would-deny is observed, detected",
        "ask is held, delayed",
        "approved",
        "rejected",
    ],
)
def test_verdicts_and_approvals_map_to_action_and_disposition(
    case: str, action_id: int, disposition_id: int, written: dict[str, dict[str, Any]]
) -> None:
    event = ocsf_events(written[case])[0]
    assert (event["action_id"], event["disposition_id"]) == (action_id, disposition_id)


@pytest.mark.parametrize(
    "case", ["a request held for approval", "an approved request", "a rejected request", "a grant made"]
)
def test_an_approval_chain_stays_joinable_by_its_id(case: str, written: dict[str, dict[str, Any]]) -> None:
    event = ocsf_events(written[case])[0]
    assert event["metadata"]["correlation_uid"] == "ar-1"
    unmapped = event["unmapped"]
    assert unmapped.get("approval_id") == "ar-1" or unmapped.get("approval", {}).get("id") == "ar-1"


def test_a_clienthello_carries_its_sni(written: dict[str, dict[str, Any]]) -> None:
    event = ocsf_events(written["a ClientHello whose SNI does not match"])[0]
    assert event["tls"]["sni"] == "other.example.test"
    assert event["activity_name"] == "Refuse"


@pytest.mark.parametrize(
    ("case", "rcode"),
    [
        ("an answered DNS query", "NoError"),
        ("a refused DNS query", "NXDomain"),
        ("a DNS query from an unknown source", "Refused"),
    ],
    ids=["answered", "refused name", "unknown source"],
)
def test_dns_events_carry_the_query_and_the_listener_s_answer(
    case: str, rcode: str, written: dict[str, dict[str, Any]]
) -> None:
    event = ocsf_events(written[case])[0]
    assert event["rcode"] == rcode
    assert event["query"]["hostname"] == "api.example.test"
    assert event["dst_endpoint"] == {"ip": "127.0.0.1", "port": 5353}


def test_a_scrubbed_secret_is_a_finding_tied_to_its_exchange(written: dict[str, dict[str, Any]]) -> None:
    record = written["a secret scrubbed from a response"]
    (event,) = ocsf_events(record)
    assert event["finding_info"]["types"] == ["secret_scrubbed"]
    assert event["metadata"]["uid"] == record["decision_id"] != record["of"]
    assert event["metadata"]["correlation_uid"] == record["of"]
    assert event["unmapped"]["credentials"] == ["github"] and event["unmapped"]["count"] == 2
    assert event["unmapped"]["path"] == "/echo?token=REDACTED"


def test_a_failed_reload_is_a_failure(written: dict[str, dict[str, Any]]) -> None:
    event = ocsf_events(written["a failed policy reload"])[0]
    assert (event["status_id"], event["severity_id"]) == (2, 3)
    assert event["unmapped"]["errors"] == ["acme.yaml:3: bad"]


@pytest.mark.parametrize(
    "line",
    [
        {"event": "checkpoint", "seq": 1, "hash": "0" * 64, "count": 3, "time": "2026-12-03T00:00:00.000Z"},
        {"event": "chain_restart", "reason": "unreadable end", "prev": "0" * 64},
    ],
    ids=["a checkpoint", "a chain restart"],
)
def test_the_trail_s_own_lines_are_no_events(line: dict[str, Any]) -> None:
    assert ocsf_events(line) == []


def test_every_finding_reason_is_a_reason_code() -> None:
    assert set(FINDINGS) <= {r.value for r in Reason}


def test_every_record_kind_the_gateway_writes_is_mapped() -> None:
    """A new `"event": ...` record in the source must be given a mapping (or be listed as none)."""
    kinds = set()
    for path in (ROOT / "proxy").rglob("*.py"):
        kinds |= set(re.findall(r'"event": "([a-z_.]+)"', path.read_text()))
    # The webhook's body is no trail record; the chain's lines are no events.
    assert kinds - {"access_request.opened", "checkpoint", "chain_restart"} == {
        "decision",
        "finding",
        "grant",
        "policy_reload",
        "sandbox_update",
    }


# -- the schema validation can fail --------------------------------------------------------------


def _broken(event: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(event)
    *parents, leaf = path.split(".")
    node = out
    for key in parents:
        node = node[key]
    if value is _DROP:
        del node[leaf]
    else:
        node[leaf] = value
    return out


_DROP = object()


@pytest.mark.parametrize(
    ("case", "path", "value", "error"),
    [
        ("an allowed GET", "class_uid", 4001, "type_uid"),
        ("an allowed GET", "metadata.version", _DROP, "metadata"),
        ("an allowed GET", "time", "yesterday", "time"),
        ("an allowed GET", "disposition_id", 42, "disposition_id"),
        ("an allowed GET", "http_request.url.colour", "red", "url"),
        ("an allowed CONNECT", "activity_id", 9, "activity_id"),
        ("an allowed ClientHello", "tls.version", _DROP, "tls"),
        ("an answered DNS query", "query.hostname", _DROP, "query"),
        ("a secret scrubbed from a response", "finding_info", _DROP, "finding_info"),
        ("a policy reload", "device", _DROP, "device"),
        ("a denied CONNECT", "dst_endpoint.port", 70000, "port"),
    ],
    ids=[
        "a wrong class uid",
        "metadata without its version",
        "a time that is no number",
        "a disposition OCSF does not define",
        "a url field OCSF does not define",
        "an activity the class does not define",
        "tls without its version",
        "a DNS query without its name",
        "a finding without finding_info",
        "a config change without its device",
        "a port out of range",
    ],
)
def test_the_schema_rejects_a_broken_event(
    case: str, path: str, value: Any, error: str, written: dict[str, dict[str, Any]]
) -> None:
    event = ocsf_events(written[case])[0]
    assert schema_errors(event) == []
    errors = schema_errors(_broken(event, path, value))
    assert errors and any(error in e for e in errors), errors


def test_the_events_are_json_and_hold_nothing_the_record_does_not(written: dict[str, dict[str, Any]]) -> None:
    for record in written.values():
        for event in ocsf_events(record):
            assert json.loads(json.dumps(event)) == event
    # A record's placeholder-shaped or secret-looking values never appear: records hold none.
    assert "sgph_" not in json.dumps([ocsf_events(r) for r in written.values()])


def test_a_record_without_a_decision_id_gets_a_digest_uid() -> None:
    ctx = DecisionContext(phase=Phase.CONNECT, listener=REGULAR, client="-", host="denied.test", port=443)
    line = decision_record(ctx, Decision(reason=Reason.HOST_NOT_ALLOWED), count=False)
    line.pop("decision_id")
    line["time"] = "2026-12-03T00:00:00.000Z"
    (event,) = ocsf_events(line)
    assert re.fullmatch(r"[0-9a-f]{32}", event["metadata"]["uid"])
    assert ocsf_events(dict(line))[0]["metadata"]["uid"] == event["metadata"]["uid"]


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.sampled_from([float("inf"), 10**30, "2026-12-03T00:00:00Z", "01a23ab046370177", "[::1]:8", "x@1:2"])
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
_KEYS = st.sampled_from(
    ["time", "decision_id", "tenant", "sandbox", "phase", "listener", "client", "dest", "method", "path"]
    + ["decision", "reason", "rule_id", "status", "bytes", "duration_ms", "approval", "approval_id", "detail"]
    + ["kind", "of", "changed", "result", "by", "action", "credentials", "sni", "port", "host", "ip"]
)


@settings(max_examples=200, deadline=None)
@given(
    kind=st.sampled_from(
        ["decision", "finding", "grant", "policy_reload", "sandbox_update", "checkpoint", "x"]
    ),
    fields=st.dictionaries(_KEYS, _JSON, max_size=12),
    dest=st.dictionaries(st.sampled_from(["host", "ip", "port", "sni"]), _JSON, max_size=4),
)
def test_a_damaged_record_never_makes_the_mapping_raise(
    kind: str, fields: dict[str, Any], dest: dict[str, Any]
) -> None:
    """A line damaged by hand still maps (a sink's delivery thread must never stop on one)."""
    record = {**fields, "event": kind, "dest": dest}
    if kind == "finding":
        record["kind"] = "secret_scrubbed"
    events = ocsf_events(record)
    assert events == ocsf_events(copy.deepcopy(record))
    assert all(isinstance(e["time"], int) for e in events)
