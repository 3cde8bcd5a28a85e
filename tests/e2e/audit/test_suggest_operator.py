"""`sandgate audit suggest` for private_address denials: the operator-level change (gateway
config and tenant cidr rule), and no suggestion for addresses the guard never opens.

A real gateway records the denials; the real CLI suggests; `policy explain` with the
suggested config and rule shows the suggestion opens exactly what was refused (nothing is
dialled: 10.9.8.7 exists nowhere on this machine).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import yaml
from conftest import SANDGATE, TEST_HOSTS, GatewayFactory, tenant_yaml

HOSTS = {**TEST_HOSTS, "lab.test": ["10.9.8.7", "169.254.169.254"]}


def sandgate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SANDGATE, *args], capture_output=True, text=True, timeout=60)


def uncomment(lines: list[str], start: str) -> str:
    """The YAML commented out under the line that starts with `start` (until the next step)."""
    first = next(i for i, x in enumerate(lines) if x.startswith(start)) + 1
    block: list[str] = []
    for x in lines[first:]:
        if x.startswith("#      ") and not x.startswith("#        ") and not block:
            continue  # the step's second line
        if not x.startswith("#        "):
            break
        block.append(x[len("#        ") :])
    return "\n".join(block)


def test_suggest_names_the_operator_change_for_internal_addresses_and_refuses_the_never_opened(
    start_gateway: GatewayFactory, tmp_path: Path
) -> None:
    rules = [{"id": "lab", "hosts": ["lab.test", "self.test"], "ports": [80]}]
    gw = start_gateway({"t1.yaml": tenant_yaml("t1", rules)}, config={"resolver": {"hosts": HOSTS}})
    with httpx.Client(proxy=gw.proxy(), timeout=10) as c:
        answers = [c.get(url) for url in ["http://lab.test/a", "http://lab.test/b", "http://self.test/c"]]
    assert [r.headers["X-Sandgate-Reason"] for r in answers] == ["private_address"] * 3
    gw.records(3)
    gw.stop()

    result = sandgate("audit", "suggest", "--file", str(gw.audit_path), "--sandbox", "sb1")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    lines = out.splitlines()
    assert yaml.safe_load(out)["allow"] == [], "no allow rule alone fixes a private_address denial"
    assert "# OPERATOR-LEVEL (needs the gateway config, not only the tenant file): the address guard" in lines
    config = yaml.safe_load(uncomment(lines, "#   1. in the gateway config"))
    assert config == {"address_guard": {"tenant_reachable": ["10.9.8.7/32"]}}
    (rule,) = yaml.safe_load(uncomment(lines, "#   2. in tenant t1's file, under `allow:`"))
    assert {k: rule[k] for k in ("id", "cidrs", "ports")} == {
        "id": "suggested-10.9.8.7",
        "cidrs": ["10.9.8.7/32"],
        "ports": [80],
    }
    assert rule["comment"].startswith("2 private_address denials, as lab.test, ")
    assert any(x.startswith("#   Or, to reach lab.test by name only") for x in lines)
    # Never suggested, with why: the metadata address and the gateway's own.
    assert any(
        x.startswith("#   169.254.169.254 (metadata, 2 denial(s), as lab.test): never reachable")
        for x in lines
    )
    assert any(
        x.startswith("#   127.0.0.1 (own, 1 denial(s), as self.test): never reachable")
        and "gateway itself" in x
        for x in lines
    )
    assert "169.254.169.254/32" not in out and "127.0.0.1/32" not in out

    # The suggestion, applied, opens 10.9.8.7 for lab.test (and only it): explain agrees.
    root = tmp_path / "applied"
    (root / "rules" / "tenants").mkdir(parents=True)
    tenant = {"tenant": "t1", "allow": [*rules, rule]}
    (root / "rules" / "tenants" / "t1.yaml").write_text(yaml.safe_dump(tenant))
    (root / "sandgate.yaml").write_text(yaml.safe_dump(config))
    explained = sandgate(
        "policy", "explain", "--rules", str(root / "rules"), "--config", str(root / "sandgate.yaml"),
        "--tenant", "t1", "--resolve", "lab.test=169.254.169.254", "--resolve", "lab.test=10.9.8.7",
        "GET", "http://lab.test/a",
    )  # fmt: skip
    assert explained.returncode == 0, explained.stdout + explained.stderr
    assert explained.stdout.splitlines()[0] == "allow: allowed"
    assert "dials 10.9.8.7" in explained.stdout
