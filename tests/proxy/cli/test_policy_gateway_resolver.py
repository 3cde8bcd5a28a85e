"""`sandgate policy explain|test --config`: names resolve as that gateway resolves them (its
`resolver:` section), not only through its address guard."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.dnsserver import ScriptedDNSServer

from sandgate.proxy.cli.main import main

# `.invalid` names never resolve anywhere but where a gateway config says (RFC 6761).
LAB = {
    "tenant": "lab",
    "allow": [{"id": "mirror", "hosts": ["mirror.invalid", "cache.invalid", "wiki.invalid"], "ports": [80]}],
}


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["policy", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def rules(tmp_path: Path) -> Path:
    root = tmp_path / "rules"
    (root / "tenants").mkdir(parents=True)
    (root / "tenants" / "lab.yaml").write_text(yaml.safe_dump(LAB, sort_keys=False))
    return root


def gateway_config(tmp_path: Path, resolver: dict[str, Any]) -> Path:
    """A gateway config whose guard opens 10.20/16 to names only, with this resolver section."""
    path = tmp_path / "sandgate.yaml"
    guard = {"reachable_by_name": ["10.20.0.0/16"], "own_addresses": ["192.0.2.2"]}
    path.write_text(yaml.safe_dump({"resolver": resolver, "address_guard": guard}))
    return path


def explain(capsys: pytest.CaptureFixture[str], rules: Path, *args: str) -> tuple[int, dict[str, Any]]:
    code, out, err = run(
        capsys, "explain", "--rules", str(rules), "--tenant", "lab", "--format", "json", *args
    )
    assert err == ""
    value: dict[str, Any] = json.loads(out)
    return code, value


def test_explain_resolves_through_the_config_s_static_hosts(
    capsys: pytest.CaptureFixture[str], rules: Path, tmp_path: Path
) -> None:
    config = gateway_config(tmp_path, {"hosts": {"mirror.invalid": ["10.20.0.5"]}})
    code, value = explain(capsys, rules, "--config", str(config), "GET", "http://mirror.invalid/simple/")
    assert (code, value["decision"], value["reason"], value["address"]) == (
        0,
        "allow",
        "allowed",
        "10.20.0.5",
    )


def test_explain_asks_the_config_s_nameservers(
    capsys: pytest.CaptureFixture[str], rules: Path, tmp_path: Path
) -> None:
    with ScriptedDNSServer(records={"cache.invalid": ["10.20.0.7"], "wiki.invalid": ["10.30.0.1"]}) as dns:
        config = gateway_config(tmp_path, {"nameservers": [f"127.0.0.1:{dns.port}"], "ipv6": False})
        code, value = explain(capsys, rules, "--config", str(config), "GET", "http://cache.invalid/")
        assert (code, value["reason"], value["address"]) == (0, "allowed", "10.20.0.7")
        # A private address outside the opened range: the guard refuses what the resolver found.
        code, value = explain(capsys, rules, "--config", str(config), "GET", "http://wiki.invalid/")
        assert (code, value["reason"]) == (1, "private_address")
        assert {q.name for q in dns.queries} == {"cache.invalid", "wiki.invalid"}


def test_resolve_on_the_command_line_comes_before_the_config(
    capsys: pytest.CaptureFixture[str], rules: Path, tmp_path: Path
) -> None:
    config = gateway_config(tmp_path, {"hosts": {"mirror.invalid": ["10.20.0.5"]}})
    code, value = explain(
        capsys,
        rules,
        "--config",
        str(config),
        "--resolve",
        "mirror.invalid=10.20.0.9",
        "GET",
        "http://mirror.invalid/",
    )
    assert (code, value["address"]) == (0, "10.20.0.9")


def test_policy_test_resolves_unlisted_names_through_the_config_s_static_hosts(
    capsys: pytest.CaptureFixture[str], rules: Path, tmp_path: Path
) -> None:
    (rules / "tests").mkdir()
    cases = {
        "cases": [
            {
                "name": "the mirror is reachable by its name",
                "tenant": "lab",
                "request": "GET http://mirror.invalid/simple/",
                "expect": {"decision": "allow"},
            },
            {
                "name": "the wiki resolves into a range the operator did not open",
                "tenant": "lab",
                "request": "GET http://wiki.invalid/",
                "expect": {"decision": "deny", "reason": "private_address"},
            },
        ]
    }
    (rules / "tests" / "lab.yaml").write_text(yaml.safe_dump(cases, sort_keys=False))
    config = gateway_config(
        tmp_path, {"hosts": {"mirror.invalid": ["10.20.0.5"], "wiki.invalid": ["10.30.0.1"]}}
    )
    code, out, err = run(capsys, "test", str(rules), "--config", str(config), "--format", "json")
    assert (code, err) == (0, ""), out
    assert (json.loads(out)["passed"], json.loads(out)["failed"]) == (2, 0)
