"""The addresses the address guard refused, shown where an operator or agent looks: `policy
explain` lists every resolved address (refused with why, dialled, not checked), and a
`private_address` denial carries them in its audit record and its 403 body.

A real gateway and the real CLI; nothing is dialled (every address here is refused or only
explained).
"""

from __future__ import annotations

import base64
import json
import socket
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml
from conftest import SANDGATE, TEST_HOSTS, TOKEN, GatewayFactory, tenant_yaml

LAB = ["10.9.8.7", "169.254.169.254"]
HOSTS = {**TEST_HOSTS, "lab.test": LAB}


def explain(rules: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SANDGATE, "policy", "explain", "--rules", str(rules), "--tenant", "lab", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def rules(tmp_path: Path) -> Path:
    root = tmp_path / "rules"
    (root / "tenants").mkdir(parents=True)
    tenant = {
        "tenant": "lab",
        "allow": [
            {"id": "lab-name", "hosts": ["lab.test", "mixed.test"], "ports": [80]},
            {"id": "lab-net", "cidrs": ["10.9.8.0/24"], "ports": [80]},
        ],
    }
    (root / "tenants" / "lab.yaml").write_text(yaml.safe_dump(tenant, sort_keys=False))
    return root


def test_explain_lists_each_resolved_address_and_why_it_was_refused(rules: Path) -> None:
    result = explain(
        rules, "GET", "http://lab.test/", *(a for ip in LAB for a in ("--resolve", f"lab.test={ip}"))
    )
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "deny: private_address"
    step5 = lines.index(next(x for x in lines if x.startswith("  5 resolve")))
    assert lines[step5].split(None, 3)[3] == (
        "lab.test → 10.9.8.7, 169.254.169.254: private_address, no address may be dialled"
    )
    assert [x.split(None, 2) for x in lines[step5 + 1 : step5 + 3]] == [
        ["10.9.8.7", "refused:", "10.9.8.7 is a private address the operator does not open to this request"],
        ["169.254.169.254", "refused:", "169.254.169.254 is a metadata address, never reachable"],
    ]


def test_explain_says_which_address_it_dials_and_which_it_never_checked(rules: Path, tmp_path: Path) -> None:
    config = tmp_path / "sandgate.yaml"
    config.write_text(yaml.safe_dump({"address_guard": {"tenant_reachable": ["10.9.8.0/24"]}}))
    resolve: tuple[str, ...] = ("--resolve", "mixed.test=127.0.0.9", "--resolve", "mixed.test=10.9.8.7")
    resolve += ("--resolve", "mixed.test=93.184.216.34")
    result = explain(
        rules, "GET", "http://mixed.test/", *resolve, "--config", str(config), "--format", "json"
    )
    assert result.returncode == 0, result.stderr
    value = json.loads(result.stdout)
    assert (value["decision"], value["address"]) == ("allow", "10.9.8.7")
    assert value["refused"] == [
        {
            "address": "127.0.0.9",
            "kind": "loopback",
            "why": "127.0.0.9 is a loopback address the operator does not open to this request",
        }
    ]
    (step5,) = [s for s in value["steps"] if s["step"] == 5]
    assert step5["detail"] == "mixed.test → 127.0.0.9, 10.9.8.7, 93.184.216.34: dials 10.9.8.7"
    assert [(a["address"], a["result"]) for a in step5["addresses"]] == [
        ("127.0.0.9", "refused"),
        ("10.9.8.7", "dial"),
        ("93.184.216.34", "not checked"),
    ]


def test_explain_of_an_address_literal_shows_the_guard_refusal(rules: Path) -> None:
    result = explain(rules, "GET", "http://10.9.8.7/", "--format", "json")
    assert result.returncode == 1
    value = json.loads(result.stdout)
    assert value["reason"] == "private_address"
    assert [r["address"] for r in value["refused"]] == ["10.9.8.7"]
    (step2,) = [s for s in value["steps"] if s["step"] == 2]
    assert step2["addresses"] == [
        {
            "address": "10.9.8.7",
            "result": "refused",
            "why": "10.9.8.7 is a private address the operator does not open to this request",
        }
    ]


def _connect(port: int, target: str) -> tuple[str, dict[str, object]]:
    """A raw CONNECT through the explicit proxy: the status line and the JSON body."""
    auth = base64.b64encode(f"sb1:{TOKEN}".encode()).decode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(
            f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: Basic {auth}\r\n\r\n".encode()
        )
        data = b""
        while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, body = data.decode().partition("\r\n\r\n")
    return head.splitlines()[0], json.loads(body)


def test_a_private_address_denial_names_the_refused_addresses_in_its_body_and_record(
    start_gateway: GatewayFactory,
) -> None:
    rules = [
        {"id": "lab-name", "hosts": ["lab.test"], "ports": [80, 443]},
        {"id": "lab-net", "cidrs": ["10.9.8.0/24"], "ports": [80]},
    ]
    gw = start_gateway({"t1.yaml": tenant_yaml("t1", rules)}, config={"resolver": {"hosts": HOSTS}})
    refused_lab = [
        {
            "address": "10.9.8.7",
            "kind": "private",
            "why": "10.9.8.7 is a private address the operator does not open to this request",
        },
        {
            "address": "169.254.169.254",
            "kind": "metadata",
            "why": "169.254.169.254 is a metadata address, never reachable",
        },
    ]
    with httpx.Client(proxy=gw.proxy(), timeout=10) as c:
        by_name = c.get("http://lab.test/x")
        literal = c.get("http://10.9.8.7/y")
        public_denied = c.get("http://api.test/z")
    assert (by_name.status_code, by_name.headers["X-Sandgate-Reason"]) == (403, "private_address")
    body = by_name.json()
    assert (body["error"], body["reason"], body["host"]) == ("egress denied", "private_address", "lab.test")
    assert body["refused"] == refused_lab
    record = gw.record(body["decision_id"])
    assert record["refused"] == refused_lab
    assert record["detail"] == "every resolved address is refused: " + "; ".join(
        r["why"] for r in refused_lab
    )

    assert literal.json()["refused"] == refused_lab[:1]
    assert gw.record(literal.json()["decision_id"])["refused"] == refused_lab[:1]
    # Another reason's body carries no addresses.
    assert public_denied.headers["X-Sandgate-Reason"] == "host_not_allowed"
    assert "refused" not in public_denied.json()

    status, connect_body = _connect(gw.port, "lab.test:443")
    assert status.split(" ", 2)[1] == "403"
    assert connect_body["refused"] == refused_lab
    assert gw.record(str(connect_body["decision_id"]))["refused"] == refused_lab
