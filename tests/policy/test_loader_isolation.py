"""Isolated loading: a broken tenant file takes only its own tenant, never the others'.

The gateway loads with `isolate=True`; `policy check` and `sandgate run --strict` stay
all-or-nothing (the default). The operator's files (base.yaml, operator Rego) are never
isolated: without the operator's deny rules no tenant may be decided.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from sandgate.policy.decision import Identity
from sandgate.policy.errors import PolicySetError
from sandgate.policy.model.loader import load_policy_dir
from sandgate.policy.reasons import Reason

TOKEN_A = "token-of-sandbox-a-0123456789"
TOKEN_B = "token-of-sandbox-b-0123456789"


def sha(token: str) -> str:
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


def tenant(name: str, sandbox: str, token: str, hosts: str = "api.example.com", extra: str = "") -> str:
    return (
        f"tenant: {name}\n"
        f"sandboxes:\n  - id: {sandbox}\n    token: {sha(token)}\n"
        f"allow:\n  - hosts: [{hosts}]\n{extra}"
    )


BROKEN_TENANT = "tenant: a\nallow:\n  - hosts: [API.Example.com]\n"  # not normalised: an error


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.fixture
def rules(tmp_path: Path) -> Path:
    return write(
        tmp_path / "rules",
        {
            "base.yaml": "deny:\n  - hosts: [blocked.example.com]\n",
            "tenants/a.yaml": tenant("a", "sb-a", TOKEN_A),
            "tenants/b.yaml": tenant("b", "sb-b", TOKEN_B),
        },
    )


def test_a_broken_tenant_file_at_start_takes_only_its_own_tenant(rules: Path) -> None:
    (rules / "tenants" / "a.yaml").write_text(BROKEN_TENANT)
    policy = load_policy_dir(rules, isolate=True)
    assert sorted(policy.tenants) == ["b"]
    assert policy.authenticate("sb-b", TOKEN_B) is not None
    assert policy.authenticate("sb-a", TOKEN_A) is None  # no policy: no_identity
    (problem,) = policy.problems
    assert problem.file == str(rules / "tenants" / "a.yaml")
    assert problem.tenant == "a"
    assert problem.kept_last_good is False
    assert "a.yaml:3" in problem.errors[0] and "use 'api.example.com' instead" in problem.errors[0]


def test_strict_loading_still_refuses_the_whole_directory(rules: Path) -> None:
    (rules / "tenants" / "a.yaml").write_text(BROKEN_TENANT)
    with pytest.raises(PolicySetError, match=r"a\.yaml:3"):
        load_policy_dir(rules)


def test_a_tenant_broken_at_reload_keeps_its_last_good_version_and_others_change(rules: Path) -> None:
    first = load_policy_dir(rules, isolate=True)
    (rules / "tenants" / "a.yaml").write_text(BROKEN_TENANT)
    (rules / "tenants" / "b.yaml").write_text(tenant("b", "sb-b", TOKEN_B, hosts="new.example.com"))
    (rules / "base.yaml").write_text("deny:\n  - hosts: [api.example.com]\n")
    second = load_policy_dir(rules, previous=first, isolate=True)
    kept = second.tenant("a")
    assert kept is not None and kept.allow is first.tenants["a"].allow
    assert second.authenticate("sb-a", TOKEN_A) is not None
    assert (
        second.tenants["b"]
        .allow.match("new.example.com", None, 443, "GET", "/", no_match=Reason.HOST_NOT_ALLOWED)
        .rule
        is not None
    )
    (problem,) = second.problems
    assert problem.kept_last_good is True and problem.tenant == "a"
    # The kept tenant is decided under today's base rules, not those of its last good load.
    assert kept.base_deny is second.tenants["b"].base_deny
    assert kept.base_deny.deny_match("api.example.com", None, 443, "GET", "/") is not None
    assert second.version != first.version


def test_the_version_only_changes_with_what_is_served(rules: Path) -> None:
    first = load_policy_dir(rules, isolate=True)
    assert load_policy_dir(rules, previous=first, isolate=True).version == first.version
    assert load_policy_dir(rules).version == first.version
    (rules / "tenants" / "a.yaml").write_text(BROKEN_TENANT)
    kept = load_policy_dir(rules, previous=first, isolate=True)
    assert kept.version == first.version  # a is served as it was, b unchanged


def test_a_broken_base_file_is_never_isolated(rules: Path) -> None:
    (rules / "base.yaml").write_text("deny:\n  - hots: [x.example.com]\n")
    with pytest.raises(PolicySetError, match=r"base\.yaml:2"):
        load_policy_dir(rules, isolate=True)


def test_a_broken_preset_takes_only_the_tenants_that_include_it(rules: Path) -> None:
    write(
        rules,
        {
            "presets/p.yaml": "preset: p\nallow:\n  - hosts: [Bad.Example.com]\n",
            "tenants/a.yaml": tenant("a", "sb-a", TOKEN_A) + "include: [p]\n",
        },
    )
    policy = load_policy_dir(rules, isolate=True)
    assert sorted(policy.tenants) == ["b"]
    files = sorted(Path(p.file).name for p in policy.problems)
    assert files == ["a.yaml", "p.yaml"]
    (a_problem,) = [p for p in policy.problems if p.tenant == "a"]
    assert "preset 'p' did not load" in a_problem.errors[0]


def test_a_sandbox_id_taken_by_another_tenant_breaks_only_the_later_file(rules: Path) -> None:
    (rules / "tenants" / "b.yaml").write_text(tenant("b", "sb-a", TOKEN_B))
    policy = load_policy_dir(rules, isolate=True)
    assert sorted(policy.tenants) == ["a"]
    assert policy.authenticate("sb-a", TOKEN_A) is not None
    assert policy.authenticate("sb-a", TOKEN_B) is None
    (problem,) = policy.problems
    assert problem.tenant == "b" and "'sb-a' is also defined in " in problem.errors[0]
    assert "a.yaml:3:5 (tenant 'a')" in problem.errors[0]


def test_a_kept_tenant_whose_sandbox_was_taken_meanwhile_is_not_kept(rules: Path) -> None:
    first = load_policy_dir(rules, isolate=True)
    (rules / "tenants" / "a.yaml").write_text(BROKEN_TENANT)
    (rules / "tenants" / "b.yaml").write_text(
        tenant("b", "sb-b", TOKEN_B).replace(
            "sandboxes:\n", f"sandboxes:\n  - id: sb-a\n    token: {sha(TOKEN_B)}\n"
        )
    )
    second = load_policy_dir(rules, previous=first, isolate=True)
    assert "a" not in second.tenants
    assert second.authenticate("sb-a", TOKEN_B) == Identity("b", "sb-a")
    (problem,) = second.problems
    assert problem.kept_last_good is False


def test_a_missing_token_file_turns_only_that_sandbox_off_with_a_notice(tmp_path: Path) -> None:
    rules = write(
        tmp_path / "rules",
        {
            "tenants/demo.yaml": (
                "tenant: demo\nsandboxes:\n  - id: demo-1\n    token: file:demo-1.token\n"
                f"  - id: demo-2\n    token: {sha(TOKEN_A)}\n"
                "allow:\n  - hosts: [api.example.com]\n"
            ),
        },
    )
    for isolate in (False, True):
        policy = load_policy_dir(rules, isolate=isolate)
        assert "demo-1" not in policy.sandboxes
        assert policy.authenticate("demo-2", TOKEN_A) is not None
        (notice,) = map(str, policy.notices)
        assert "demo.yaml:4" in notice and "does not exist yet" in notice and "'demo-1' is off" in notice
        assert policy.token_files == (
            str(rules / "tenants" / "demo-1.token"),
        )  # watched: creating it loads it
    token_file = rules / "tenants" / "demo-1.token"
    fd = os.open(token_file, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, TOKEN_B.encode())
    os.close(fd)
    policy = load_policy_dir(rules)
    assert policy.authenticate("demo-1", TOKEN_B) is not None and policy.notices == ()


def test_a_token_file_readable_by_others_is_still_an_error(tmp_path: Path) -> None:
    rules = write(
        tmp_path / "rules",
        {"tenants/t.yaml": "tenant: t\nsandboxes:\n  - id: s\n    token: file:s.token\nallow: []\n"},
    )
    (rules / "tenants" / "s.token").write_text(TOKEN_A)
    os.chmod(rules / "tenants" / "s.token", 0o644)
    with pytest.raises(PolicySetError, match="accessible by group or others"):
        load_policy_dir(rules)


def test_a_broken_rego_module_takes_only_its_tenant(rules: Path) -> None:
    shipped = Path(__file__).parents[2] / "rules" / "rego" / "sandgate.rego"
    write(
        rules,
        {
            "rego/sandgate.rego": shipped.read_text(),
            "tenants/a.yaml": tenant("a", "sb-a", TOKEN_A) + "rego: [a.rego]\n",
            "tenants/a.rego": "package sandgate.tenants.a\nimport rego.v1\ndeny contains x if {\n",
            "tenants/b.yaml": tenant("b", "sb-b", TOKEN_B) + "rego: [b.rego]\n",
            "tenants/b.rego": (
                "package sandgate.tenants.b\nimport rego.v1\n"
                'deny contains "no posts" if input.request.method == "POST"\n'
            ),
        },
    )
    policy = load_policy_dir(rules, isolate=True)
    assert sorted(policy.tenants) == ["b"]
    assert policy.tenants["b"].rego is not None  # compiled on its own, without a's module
    (problem,) = policy.problems
    assert problem.tenant == "a" and any("a.rego" in e for e in problem.errors)
