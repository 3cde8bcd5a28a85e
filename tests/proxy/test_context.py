"""proxy.context: ConnectionState, where every change to a connection's facts is one of its transitions."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from sandgate.policy.decision import Decision, Identity, Phase
from sandgate.policy.reasons import Reason
from sandgate.proxy.context import ConnectionState, decision_context

PROXY = Path(__file__).resolve().parents[2] / "proxy"
FIELDS = {f.name for f in dataclasses.fields(ConnectionState)}
ALLOWED = Decision(allowed=True, reason=Reason.ALLOWED, address="127.0.0.2", rule_id="t1/allow/api")


def state() -> ConnectionState:
    return ConnectionState(listener="regular", client="127.0.0.1:40000")


def test_an_approved_tunnel_may_dial_only_the_checked_address() -> None:
    s = state()
    s.tunnel_approved("api.test", 443, ALLOWED)
    assert (s.in_tunnel, s.tunnel_host, s.tunnel_port, s.tunnel_decision) == (True, "api.test", 443, ALLOWED)
    assert s.dial_permits == {("127.0.0.2", 443): "api.test"}


def test_a_tunnel_without_a_checked_address_is_not_approved() -> None:
    s = state()
    with pytest.raises(ValueError, match="checked address"):
        s.tunnel_approved("api.test", 443, Decision(allowed=True, reason=Reason.ALLOWED))
    assert (s.in_tunnel, s.dial_permits) == (False, {})


def test_transitions_set_what_they_name() -> None:
    s = state()
    s.identified(Identity("t1", "sb1"))
    s.arrived(("10.0.0.9", 5432), Identity("t1", "sb2"))
    s.raw_approved("10.0.0.9", 5432, "db.test")
    s.tls_accepted("api.test", passthrough=True)
    s.permit_dial("127.0.0.2", 80, "api.test")
    s.refused(Reason.RATE_LIMITED)
    assert s.identity == Identity("t1", "sb2") and s.original_dst == ("10.0.0.9", 5432)
    assert (s.raw, s.sni, s.passthrough, s.denied) == (True, "api.test", True, Reason.RATE_LIMITED)
    assert s.dial_permits == {("10.0.0.9", 5432): "db.test", ("127.0.0.2", 80): "api.test"}


def test_the_decision_context_names_the_connection_and_its_tunnel() -> None:
    s = state()
    s.identified(Identity("t1", "sb1"))
    s.tunnel_approved("api.test", 443, ALLOWED)
    dctx = decision_context(s, Phase.TLS)
    assert (dctx.phase, dctx.listener, dctx.client) == (Phase.TLS, "regular", "127.0.0.1:40000")
    assert (dctx.host, dctx.port, dctx.sni, dctx.identity) == ("api.test", 443, None, Identity("t1", "sb1"))
    unknown = decision_context(None, Phase.REQUEST, "transparent@8081")
    assert (unknown.listener, unknown.client, unknown.host, unknown.identity) == (
        "transparent@8081",
        "-",
        None,
        None,
    )


def _field_writes(tree: ast.AST) -> list[int]:
    """Lines assigning a ConnectionState field on a name `state` (or an item of its `dial_permits`)."""
    lines: list[int] = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = [
                t
                for target in node.targets
                for t in (target.elts if isinstance(target, ast.Tuple) else [target])
            ]
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        else:
            continue
        for t in targets:
            if isinstance(t, ast.Subscript):
                t = t.value
            if (
                isinstance(t, ast.Attribute)
                and t.attr in FIELDS
                and isinstance(t.value, ast.Name)
                and t.value.id == "state"
            ):
                lines.append(node.lineno)
    return lines


def test_no_module_assigns_a_connection_state_field_directly() -> None:
    writes = {
        str(path.relative_to(PROXY)): found
        for path in sorted(PROXY.rglob("*.py"))
        if path.name != "context.py" and (found := _field_writes(ast.parse(path.read_text())))
    }
    assert writes == {}


def test_the_write_check_sees_a_direct_assignment() -> None:
    assert _field_writes(ast.parse("state.denied = x\nstate.dial_permits[k] = h\nstate.sni, a = 1, 2\n")) == [
        1,
        2,
        3,
    ]
