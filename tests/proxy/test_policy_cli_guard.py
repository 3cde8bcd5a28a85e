"""`sandgate policy check|explain` and the address guard: what a tenant rule can never open."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from sandgate.proxy.cli.main import main

BROAD = {
    "tenant": "t",
    "allow": [{"id": "internet", "cidrs": ["0.0.0.0/0", "::/0"], "ports": [80, 443]}],
}
LAB = {
    "tenant": "lab",
    "allow": [{"id": "lab", "cidrs": ["10.1.5.0/24"], "ports": [80]}],
}
ANY = {
    "tenant": "any",
    "allow": [{"id": "everything", "hosts": ["*"]}, {"id": "mirror", "hosts": ["mirror.example.com"]}],
}


@pytest.fixture
def rules(tmp_path: Path) -> Path:
    root = tmp_path / "rules"
    (root / "tenants").mkdir(parents=True)
    for doc in (BROAD, LAB, ANY):
        (root / "tenants" / f"{doc['tenant']}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return root


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "sandgate.yaml"
    guard = {
        "tenant_reachable": ["10.1.5.0/24"],
        "reachable_by_name": ["10.20.0.0/16"],
        "own_addresses": ["192.0.2.2"],
    }
    path.write_text(yaml.safe_dump({"address_guard": guard}))
    return path


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["policy", *args])
    out, err = capsys.readouterr()
    return code, out, err


BROAD_TARGETS = [
    ("http://169.254.169.254/latest/", "the metadata address"),
    ("http://127.0.0.1/", "loopback"),
    ("http://0.0.0.0/", "the unspecified address"),
    ("http://[::1]/", "ipv6 loopback"),
    ("http://[::ffff:127.0.0.1]/", "ipv4-mapped loopback"),
    ("http://[64:ff9b::a9fe:a9fe]/", "the nat64 metadata address"),
    ("http://[2002:7f00:1::]/", "6to4 loopback"),
    ("http://10.1.5.3/", "a private address the operator opens only to cidrs naming it"),
    ("http://100.64.0.1/", "cgnat"),
    ("http://[fd00::1]/", "ula"),
    ("http://192.0.2.2/", "the gateway's own address"),
    ("http://2130706433/", "loopback spelt as one number"),
    ("http://0x7f.1/", "loopback spelt in hex"),
]


@pytest.mark.parametrize(
    "url",
    [c[0] for c in BROAD_TARGETS],
    ids=[f"explain says cidr 0.0.0.0/0 never opens {c[1]}" for c in BROAD_TARGETS],
)
def test_explain_a_broad_cidr(
    capsys: pytest.CaptureFixture[str], rules: Path, config: Path, url: str
) -> None:
    code, out, err = run(
        capsys,
        "explain",
        "--rules",
        str(rules),
        "--config",
        str(config),
        "--tenant",
        "t",
        "--format",
        "json",
        "GET",
        url,
    )
    value = json.loads(out)
    assert (code, err, value["decision"], value["reason"]) == (1, "", "deny", "private_address")
    assert [s["outcome"] for s in value["steps"][:2]] == ["ok", "deny"]


def test_explain_the_issue_example_without_a_config(capsys: pytest.CaptureFixture[str], rules: Path) -> None:
    code, out, _ = run(
        capsys, "explain", "--rules", str(rules), "--tenant", "t", "GET", "http://169.254.169.254/latest/"
    )
    assert code == 1
    assert out.splitlines()[0] == "deny: private_address"
    assert "2 address guard deny        169.254.169.254 is a metadata address, never reachable" in out


def test_explain_an_opened_range_the_tenant_names(
    capsys: pytest.CaptureFixture[str], rules: Path, config: Path
) -> None:
    code, out, _ = run(
        capsys,
        "explain",
        "--rules",
        str(rules),
        "--config",
        str(config),
        "--tenant",
        "lab",
        "GET",
        "http://10.1.5.3/",
    )
    assert (code, out.splitlines()[0]) == (0, "allow: allowed")
    code, out, _ = run(capsys, "explain", "--rules", str(rules), "--tenant", "lab", "GET", "http://10.1.5.3/")
    assert (code, out.splitlines()[0]) == (1, "deny: private_address"), (
        "without the operator's range it stays shut"
    )


@pytest.mark.parametrize(
    ("host", "address", "reason"),
    [
        ("www.example.com", "93.184.216.34", "allowed"),
        ("www.example.com", "10.20.0.5", "private_address"),
        ("mirror.example.com", "10.20.0.5", "allowed"),
        ("www.example.com", "127.0.0.1", "private_address"),
        ("93.184.216.34", None, "host_not_allowed"),
    ],
    ids=[
        "hosts star allows a name at a public address",
        "hosts star does not reach a range the operator opens by name",
        "a rule naming the host does reach it",
        "hosts star does not reach loopback",
        "hosts star does not cover an ip literal",
    ],
)
def test_explain_hosts_star(
    capsys: pytest.CaptureFixture[str], rules: Path, config: Path, host: str, address: str | None, reason: str
) -> None:
    resolve = ["--resolve", f"{host}={address}"] if address else []
    _, out, _ = run(
        capsys,
        "explain",
        "--rules",
        str(rules),
        "--config",
        str(config),
        *resolve,
        "--tenant",
        "any",
        "--format",
        "json",
        "GET",
        f"https://{host}/",
    )
    assert json.loads(out)["reason"] == reason


def test_check_warns_about_what_a_cidr_never_reaches(capsys: pytest.CaptureFixture[str], rules: Path) -> None:
    code, out, err = run(capsys, "check", str(rules))
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].startswith("ok: 3 files, 3 tenants")
    tenants = rules / "tenants"
    assert any(
        line.startswith(
            f"{tenants}/t.yaml:3: warning: t/allow/internet: 0.0.0.0/0 reaches public addresses only: the metadata, unspecified, loopback, private"
        )
        for line in lines
    ), out
    assert any(
        line.startswith(f"{tenants}/t.yaml:3: warning: t/allow/internet: ::/0 reaches public addresses only")
        for line in lines
    ), out
    assert (
        f"{tenants}/lab.yaml:3: warning: lab/allow/lab: 10.1.5.0/24 is not public: reachable only inside the gateway's address_guard.tenant_reachable (check with --config)"
        in lines
    )
    assert any(
        line.startswith(f"{tenants}/any.yaml:3: note: any/allow/everything: hosts ['*'] allows any name")
        for line in lines
    ), out


def test_check_with_the_gateway_config_knows_what_the_operator_opens(
    capsys: pytest.CaptureFixture[str], rules: Path, config: Path, tmp_path: Path
) -> None:
    code, out, _ = run(capsys, "check", str(rules), "--config", str(config), "--format", "json")
    notes = json.loads(out)["notes"]
    assert code == 0
    assert not [n for n in notes if n["rule_id"] == "lab/allow/lab"], "10.1.5.0/24 is opened: nothing to warn"
    (rules / "tenants" / "lab.yaml").write_text(
        yaml.safe_dump({**LAB, "allow": [{"cidrs": ["10.1.0.0/16", "169.254.0.0/16"]}]})
    )
    code, out, _ = run(capsys, "check", str(rules), "--config", str(config), "--format", "json")
    texts = [n["text"] for n in json.loads(out)["notes"] if n["rule_id"] == "lab/allow/0"]
    assert code == 0
    assert texts == [
        "10.1.0.0/16 is not wholly inside address_guard.tenant_reachable: the rest is never reachable",
        "169.254.0.0/16 holds metadata addresses: never reachable",
        "169.254.0.0/16 is not wholly inside address_guard.tenant_reachable: the rest is never reachable",
    ]


def test_check_with_a_broken_config_is_invalid_input(
    capsys: pytest.CaptureFixture[str], rules: Path, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("address_guard:\n  tenant_reachable: [10.1.5.1/24]\n")
    code, _, err = run(capsys, "check", str(rules), "--config", str(bad))
    assert code == 2
    assert "has host bits set; use 10.1.5.0/24 instead" in err


def test_policy_test_applies_the_gateway_config_guard(
    capsys: pytest.CaptureFixture[str], rules: Path, config: Path
) -> None:
    cases = rules / "tests" / "lab.yaml"
    cases.parent.mkdir()
    cases.write_text(
        yaml.safe_dump(
            {
                "cases": [
                    {
                        "name": "the lab",
                        "tenant": "lab",
                        "request": "GET http://10.1.5.3/",
                        "expect": {"decision": "allow"},
                    }
                ]
            }
        )
    )
    code, out, _ = run(capsys, "test", str(cases))
    assert code == 1, "the default guard opens no range: the case fails"
    assert "private_address" in out
    code, _, _ = run(capsys, "test", str(cases), "--config", str(config))
    assert code == 0
