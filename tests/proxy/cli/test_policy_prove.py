"""`sandgate policy prove`: exit codes, counter-examples with file:line, JSON, bad input."""

from __future__ import annotations

import json
import re
import shutil
import string
from pathlib import Path

import pytest
from support.ceiling_oracle import gateway_allows

from sandgate.policy.ceiling import CounterExample, effective_rules, load_ceiling
from sandgate.policy.model.loader import load_policy_dir
from sandgate.proxy.cli.main import main

REPO = Path(__file__).resolve().parents[3]

BASE = "deny:\n  - cidrs: [169.254.0.0/16]\n"
PRESET = "preset: web\nallow:\n  - id: docs\n    hosts: ['*.docs.test']\n"
ACME = """\
tenant: acme
include: [web]
allow:
  - id: api
    hosts: [api.test]
    methods: [GET, POST]
    paths: ['/v1/**']
  - id: db
    cidrs: [10.1.2.0/24]
    ports: [5432]
    protocol: tcp
"""
TRIAL = "tenant: trial\nmode: report\nallow:\n  - hosts: [api.test]\n"
CEILING = """\
regions:
  - hosts: [api.test]
    methods: [GET]
  - hosts: [api.test]
    methods: [POST]
    paths: ['/v1', '/v1/*', '/v1/*/**']
  - hosts: ['*.docs.test']
    ports: [443]
  - cidrs: [10.1.2.0/25]
    ports: ['5000-5999']
  - cidrs: [10.1.2.128/25]
    ports: [5432]
"""


def rules_dir(tmp_path: Path, *, trial: bool = False, ceiling: str = CEILING) -> Path:
    rules = tmp_path / "rules"
    (rules / "presets").mkdir(parents=True)
    (rules / "tenants").mkdir()
    (rules / "base.yaml").write_text(BASE)
    (rules / "presets" / "web.yaml").write_text(PRESET)
    (rules / "tenants" / "acme.yaml").write_text(ACME)
    if trial:
        (rules / "tenants" / "trial.yaml").write_text(TRIAL)
    (rules / "ceiling.yaml").write_text(ceiling)
    return rules


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["policy", "prove", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_everything_inside_exits_0(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rules = rules_dir(tmp_path)
    code, out, err = run(capsys, str(rules))
    assert (code, err) == (0, "")
    assert out == f"inside: 3 rules of 1 tenant in {rules} stay inside {rules}/ceiling.yaml\n"


def test_an_excess_names_the_rule_and_a_request(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # POST /v1 itself: /v1/** matches it, /v1/* does not.
    rules = rules_dir(tmp_path, ceiling=CEILING.replace("'/v1', '/v1/*'", "'/v1/*'"))
    code, out, err = run(capsys, str(rules))
    assert (code, err) == (1, "")
    assert out.splitlines() == [
        f"{rules}/tenants/acme.yaml:4: tenant acme: acme/allow/api allows requests outside the ceiling: "
        "e.g. POST https://api.test/v1",
        f"outside: 1 of 3 rules of 1 tenant in {rules} go outside {rules}/ceiling.yaml",
    ]


def test_a_preset_rule_is_named_at_the_preset(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rules = rules_dir(
        tmp_path, ceiling=CEILING.replace("ports: [443]\n", "ports: [443]\n    methods: [GET]\n")
    )
    code, out, _ = run(capsys, str(rules))
    assert code == 1
    assert out.startswith(
        f"{rules}/presets/web.yaml:3: tenant acme: preset:web/allow/docs allows requests outside the "
        "ceiling: e.g. POST https://x.docs.test/\n"
    )


def test_raw_tcp_split_across_networks_and_ports(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # The /24 is covered by two /25 regions only if both take port 5432 as raw TCP.
    rules = rules_dir(
        tmp_path, ceiling=CEILING.replace("    ports: [5432]\n", "    ports: [5432]\n    paths: ['/**']\n")
    )
    code, out, _ = run(capsys, str(rules))
    assert code == 1
    assert (
        f"{rules}/tenants/acme.yaml:8: tenant acme: acme/allow/db allows requests outside the ceiling: "
        "e.g. tcp://10.1.2.128:5432" in out
    )


def test_report_mode_is_checked_as_allowing_everything(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    rules = rules_dir(tmp_path, trial=True)
    code, out, _ = run(capsys, str(rules))
    assert code == 1
    assert (
        f"{rules}/tenants/trial.yaml:2: tenant trial: trial/mode allows requests outside the ceiling: "
        "e.g. GET https://docs.test/\n  report mode allows what the rules would deny\n"
    ) in out


def test_a_deny_rule_takes_its_part_away(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rules = rules_dir(
        tmp_path, ceiling=CEILING.replace("  - cidrs: [10.1.2.128/25]\n    ports: [5432]\n", "")
    )
    assert run(capsys, str(rules))[0] == 1
    (rules / "tenants" / "acme.yaml").write_text(ACME + "deny:\n  - cidrs: [10.1.2.128/25]\n")
    code, out, _ = run(capsys, str(rules))
    assert code == 0, out


def test_a_deny_rule_with_paths_takes_its_part_away(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    rules = rules_dir(tmp_path, ceiling=CEILING.replace("'/v1', '/v1/*'", "'/v1/*'"))
    assert run(capsys, str(rules))[0] == 1  # POST /v1
    deny = "deny:\n  - hosts: [api.test]\n    methods: [POST]\n    paths: ['/V1']\n"
    (rules / "tenants" / "acme.yaml").write_text(ACME + deny)
    code, out, _ = run(capsys, str(rules))
    assert code == 0, out  # deny globs fold case, as the gateway matches them


def test_json_output_and_the_counter_example_checks_out(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    rules = rules_dir(
        tmp_path, ceiling=CEILING.replace("methods: [GET]\n", "methods: [GET]\n    ports: [8443]\n")
    )
    code, out, err = run(capsys, "--json", str(rules))
    assert (code, err) == (1, "")
    doc = json.loads(out)
    assert doc["ok"] is False and doc["tenants"] == 1 and doc["rules"] == 3
    (found,) = doc["excesses"]
    assert found["rule_id"] == "acme/allow/api" and found["origin"] == f"{rules}/tenants/acme.yaml:4"
    request = found["request"]
    assert request == {
        "method": "GET",
        "raw_tcp": False,
        "scheme": "https",
        "host": "api.test",
        "port": 443,
        "path": "/v1",
        "url": "https://api.test/v1",
    }
    # The gateway's matcher agrees: the tenant rule allows it, the ceiling's regions do not.
    policy = load_policy_dir(rules)
    (tenant,) = effective_rules(policy)
    example = CounterExample(request["method"], request["host"], request["port"], request["path"])
    api = next(r for r in tenant.rules if r.rule_id == "acme/allow/api")
    assert gateway_allows([api], example, region=False)
    assert not gateway_allows(load_ceiling(rules / "ceiling.yaml").regions, example, region=True)


def test_ceiling_option_and_default_location(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rules = rules_dir(tmp_path)
    other = tmp_path / "narrow.yaml"
    other.write_text("regions: []\n")
    code, out, _ = run(capsys, "--ceiling", str(other), str(rules))
    assert code == 1 and out.endswith(f"outside: 3 of 3 rules of 1 tenant in {rules} go outside {other}\n")


def test_a_missing_ceiling_is_bad_input(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rules = rules_dir(tmp_path)
    (rules / "ceiling.yaml").unlink()
    code, out, err = run(capsys, str(rules))
    assert (code, out) == (2, "")
    assert (
        err
        == f"sandgate: no ceiling at {rules}/ceiling.yaml: see rules/ceiling.example.yaml, or give --ceiling\n"
    )


def test_a_broken_ceiling_is_bad_input_with_its_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    rules = rules_dir(tmp_path, ceiling="regions:\n  - hosts: [api.test]\n    method: [GET]\n")
    code, out, err = run(capsys, str(rules))
    assert (code, out) == (2, "")
    assert (
        err
        == f"sandgate: {rules}/ceiling.yaml:3:5: regions.0.method: unknown key (did you mean 'methods'?)\n"
    )


def test_a_broken_policy_is_bad_input_with_its_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    rules = rules_dir(tmp_path)
    (rules / "tenants" / "acme.yaml").write_text(ACME.replace("ports: [5432]", "ports: [0]"))
    code, out, err = run(capsys, "--json", str(rules))
    assert code == 2
    doc = json.loads(out)
    assert doc["ok"] is False
    assert re.match(
        rf"^{re.escape(str(rules))}/tenants/acme\.yaml:10:\d+: allow\.1\.ports\.0: ", doc["errors"][0]
    )
    assert err == ""


def test_rego_tenants_are_proved_on_their_rules(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rules = tmp_path / "good"
    shutil.copytree(REPO / "tests" / "data" / "rego" / "good", rules)
    (rules / "ceiling.yaml").write_text("regions:\n  - hosts: ['*']\n")
    code, out, _ = run(capsys, str(rules))
    assert "note: tenant acme: Rego can only refuse what its rules allow: proved on the rules" in out
    assert code in (0, 1)


def test_the_shipped_rules_are_inside_the_example_ceiling(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(
        capsys, "--ceiling", str(REPO / "rules" / "ceiling.example.yaml"), str(REPO / "rules")
    )
    assert (code, err) == (0, ""), out


def test_with_a_config_and_no_path_the_config_rules_are_proved(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    rules = rules_dir(tmp_path)
    config = tmp_path / "sandgate.yaml"
    config.write_text("rules_dir: rules\n")
    code, out, err = run(capsys, "--config", str(config))
    assert (code, err) == (0, "")
    assert out == f"inside: 3 rules of 1 tenant in {rules} stay inside {rules}/ceiling.yaml\n"
    config.write_text("rules_dir: [\n")
    code, out, err = run(capsys, "--config", str(config))
    assert (code, out) == (2, "") and err.startswith(f"sandgate: {config}")


def test_a_rule_its_deny_rules_cancel_still_looks_names_up(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Every request of `exfil` is denied, but the gateway resolves the names an allow rule
    # names (its DNS listener answers them; a deny rule with methods skips CONNECT): a lookup
    # of <secret>.evil.test reaches evil.test's nameservers, outside the ceiling.
    rules = rules_dir(tmp_path)
    cancelled = "  - id: exfil\n    hosts: ['*.evil.test']\n    methods: [GET]\ndeny:\n"
    cancelled += "  - hosts: ['*.evil.test']\n    methods: [GET]\n"
    (rules / "tenants" / "acme.yaml").write_text(ACME + cancelled)
    code, out, _ = run(capsys, str(rules))
    assert code == 1, out
    assert "acme/allow/exfil" in out and "e.g. a DNS lookup of x.evil.test" in out


def test_globs_no_character_is_left_for_are_not_decided(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    every = "/" + string.ascii_letters + string.digits + "-_"
    rules = rules_dir(tmp_path)
    (rules / "tenants" / "acme.yaml").write_text(ACME.replace("'/v1/**'", f"'{every}'"))
    code, out, _ = run(capsys, str(rules))
    assert code == 1, out
    assert "acme/allow/api allows requests outside the ceiling: not decided" in out


def test_ask_rules_allow_nothing_to_prove(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rules = rules_dir(tmp_path)
    asking = ACME + "ask:\n  - hosts: [evil.test, '*']\n    ports: [443, 8443]\nunmatched: ask\n"
    (rules / "tenants" / "acme.yaml").write_text(asking)
    code, out, err = run(capsys, str(rules))
    assert (code, err) == (0, "")
    assert out == f"inside: 3 rules of 1 tenant in {rules} stay inside {rules}/ceiling.yaml\n"
