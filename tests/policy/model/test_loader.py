"""Tests for sandgate.policy.model.loader: rules directories, good and broken, into a PolicySet."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from sandgate.policy.decision import Identity, Mode
from sandgate.policy.errors import PolicyLoadError, PolicySetError
from sandgate.policy.model.loader import load_policy_dir, policy_files
from sandgate.policy.model.policyset import PolicySet
from sandgate.policy.model.sandbox_tokens import new_token
from sandgate.policy.reasons import Reason

DATA = Path(__file__).parents[2] / "data" / "rules"
GOOD = DATA / "good"
BROKEN = DATA / "broken"
REPO_RULES = Path(__file__).parents[3] / "rules"

ALPHA_TOKEN = "alpha-1-token-0123456789"  # its sha256 is in good/tenants/alpha.yaml
BETA_TOKEN = "beta-1-token-0123456789"
MISSING_ENV = "SANDGATE_TEST_TOKEN_THAT_IS_NOT_SET"


def load_errors(rules_dir: Path) -> list[PolicyLoadError]:
    """The errors loading a rules directory reports; fails the test if it loads."""
    with pytest.raises(PolicySetError) as info:
        load_policy_dir(rules_dir)
    return list(info.value.errors)


def where(error: PolicyLoadError, rules_dir: Path) -> tuple[str, int | None, str]:
    """(file relative to the rules dir, line, field) of an error."""
    return Path(error.location.file).relative_to(rules_dir).as_posix(), error.location.line, error.field


def write_rules(root: Path, files: dict[str, str]) -> Path:
    """A rules directory under `root` from {relative path: text}."""
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.fixture(autouse=True)
def _no_token_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MISSING_ENV, raising=False)


# --- broken directories ------------------------------------------------------------------

BROKEN_CASES = [
    (
        "unknown-key",
        "tenants/t.yaml",
        2,
        "alow",
        "unknown key (did you mean 'allow'?)",
        "a misspelt key is refused with a suggestion",
    ),
    (
        "bare-star",
        "tenants/t.yaml",
        4,
        "deny.0.hosts.0",
        "'*' is for allow rules; to deny everywhere use cidrs: [0.0.0.0/0, ::/0]",
        "a bare star host in a deny rule is refused",
    ),
    (
        "wildcard-middle",
        "tenants/t.yaml",
        3,
        "allow.0.hosts.0",
        "'api.*.example.com': a wildcard is only allowed as a leading '*.'",
        "a star in the middle of a host is refused",
    ),
    (
        "not-normalised",
        "tenants/t.yaml",
        5,
        "allow.0.hosts.1",
        "'API.Example.com' is not in normal form: use 'api.example.com' instead",
        "an upper case host is refused with its normal form",
    ),
    (
        "cidr-host-bits",
        "tenants/t.yaml",
        3,
        "allow.0.cidrs.0",
        "'10.0.0.1/8' has host bits set; use 10.0.0.0/8 instead",
        "a network with host bits set is refused with the network",
    ),
    (
        "methods-without-inspect",
        "tenants/t.yaml",
        3,
        "allow.0",
        "'methods' and 'paths' can only be checked with 'inspect: true'",
        "methods with inspect false are refused",
    ),
    (
        "yaml-tab",
        "tenants/t.yaml",
        3,
        "",
        "invalid YAML: found character '\\t' that cannot start any token",
        "a tab in indentation is invalid yaml on its line",
    ),
    (
        "yaml-unclosed",
        "tenants/t.yaml",
        4,
        "",
        "invalid YAML: expected ',' or ']'",
        "an unclosed bracket is invalid yaml where the parser gives up",
    ),
    (
        "duplicate-key",
        "tenants/t.yaml",
        5,
        "allow.0.hosts",
        "duplicate key",
        "a key given twice is refused at the second",
    ),
    (
        "duplicate-tenant",
        "tenants/b.yaml",
        2,
        "tenant",
        "tenant 't' is defined twice (also in ",
        "a tenant defined in two files is refused in the second",
    ),
    (
        "unknown-preset",
        "tenants/t.yaml",
        2,
        "include.1",
        "unknown preset 'webb' (known: web)",
        "an unknown preset is refused with the known ones",
    ),
    (
        "tld-wildcard",
        "tenants/t.yaml",
        3,
        "allow.0.hosts.1",
        "'*.com' would allow a whole top-level domain; name the domains instead",
        "a top level wildcard in an allow rule is refused and in a deny rule is not",
    ),
    (
        "env-token-missing",
        "tenants/t.yaml",
        4,
        "sandboxes.0.token",
        f"environment variable {MISSING_ENV} is not set",
        "a token from an unset environment variable is refused",
    ),
    (
        "ip-host",
        "tenants/t.yaml",
        3,
        "allow.0.hosts.1",
        "'10.1.2.3' is an address: use cidrs: [10.1.2.3/32] instead",
        "an address in hosts is refused with the cidr to use",
    ),
    (
        "duplicate-preset",
        "presets/b.yaml",
        2,
        "preset",
        "preset 'web' is also defined in ",
        "a preset name defined in two files is refused in the second",
    ),
]


@pytest.mark.parametrize(
    ("variant", "file", "line", "field", "problem"),
    [c[:5] for c in BROKEN_CASES],
    ids=[c[5] for c in BROKEN_CASES],
)
def test_a_broken_directory_reports_file_line_field_and_problem(
    variant: str, file: str, line: int, field: str, problem: str
) -> None:
    rules_dir = BROKEN / variant
    errors = load_errors(rules_dir)
    assert len(errors) == 1, [str(e) for e in errors]
    (error,) = errors
    assert where(error, rules_dir) == (file, line, field)
    assert problem in error.problem
    prefix = f"{error.location}: {field}: " if field else f"{error.location}: "
    assert str(error) == prefix + error.problem


EXACT_CASES = [
    (
        "tld-wildcard",
        "tenants/t.yaml:3:30: allow.0.hosts.1: "
        "'*.com' would allow a whole top-level domain; name the domains instead",
        "a top level wildcard is rendered with the column of the entry",
    ),
    (
        "unknown-preset",
        "tenants/t.yaml:2:16: include.1: unknown preset 'webb' (known: web)",
        "an unknown preset is rendered with the column of the name",
    ),
    (
        "duplicate-key",
        "tenants/t.yaml:5:5: allow.0.hosts: duplicate key",
        "a duplicate key is rendered with the column of the second key",
    ),
    (
        "yaml-tab",
        "tenants/t.yaml:3:1: invalid YAML: found character '\\t' that cannot start any token",
        "invalid yaml is rendered without a field",
    ),
    (
        "env-token-missing",
        f"tenants/t.yaml:4:5: sandboxes.0.token: environment variable {MISSING_ENV} is not set",
        "a missing token is rendered at its token key",
    ),
    (
        "unknown-key",
        "tenants/t.yaml:2:1: alow: unknown key (did you mean 'allow'?)",
        "a misspelt key is rendered where the key is written",
    ),
    (
        "not-normalised",
        "tenants/t.yaml:5:9: allow.0.hosts.1: 'API.Example.com' is not in normal form: use 'api.example.com' instead",
        "a host that is not in normal form is rendered at its own entry",
    ),
    (
        "ip-host",
        "tenants/t.yaml:3:30: allow.0.hosts.1: '10.1.2.3' is an address: use cidrs: [10.1.2.3/32] instead",
        "an address in hosts is rendered at its own entry",
    ),
    (
        "cidr-host-bits",
        "tenants/t.yaml:3:13: allow.0.cidrs.0: '10.0.0.1/8' has host bits set; use 10.0.0.0/8 instead",
        "a network with host bits is rendered at its own entry",
    ),
]


@pytest.mark.parametrize(
    ("variant", "text"),
    [c[:2] for c in EXACT_CASES],
    ids=[c[2] for c in EXACT_CASES],
)
def test_the_exact_rendering_of_an_error(variant: str, text: str) -> None:
    with pytest.raises(PolicySetError) as info:
        load_policy_dir(BROKEN / variant)
    assert str(info.value) == f"{BROKEN / variant}/{text}"


def test_the_duplicate_tenant_error_names_the_first_file() -> None:
    (error,) = load_errors(BROKEN / "duplicate-tenant")
    assert (
        error.problem == f"tenant 't' is defined twice (also in {BROKEN / 'duplicate-tenant/tenants/a.yaml'})"
    )


def test_the_duplicate_preset_error_names_the_first_file() -> None:
    (error,) = load_errors(BROKEN / "duplicate-preset")
    assert error.problem == f"preset 'web' is also defined in {BROKEN / 'duplicate-preset/presets/a.yaml'}"
    assert error.location.column == 1


def test_every_error_in_every_file_is_reported() -> None:
    rules_dir = BROKEN / "many-errors"
    with pytest.raises(PolicySetError) as info:
        load_policy_dir(rules_dir)
    found = sorted(where(e, rules_dir) for e in info.value.errors)
    assert found == [
        ("base.yaml", 3, "deny.0.hots"),
        ("presets/p.yaml", 3, "allow.0.hosts.0"),
        ("tenants/a.yaml", 3, "allow.0.cidrs.0"),
        ("tenants/b.yaml", 4, "allow.0.hosts.0"),
        ("tenants/b.yaml", 6, "allow.2.hosts.0"),
    ]
    lines = str(info.value).splitlines()
    assert len(lines) == len(info.value.errors)
    assert lines == [str(e) for e in info.value.errors]
    first = info.value.errors[0]
    assert (info.value.location, info.value.field, info.value.problem) == (
        first.location,
        first.field,
        first.problem,
    )


def test_every_error_of_one_file_is_reported(tmp_path: Path) -> None:
    tenant = (
        "tenant: t\n"
        "mode: audit\n"
        "allow:\n"
        "  - hosts: [API.example.com, 10.0.0.1]\n"
        "    ports: []\n"
        "deny:\n"
        "  - hots: [x.example.com]\n"
    )
    write_rules(tmp_path, {"tenants/t.yaml": tenant})
    errors = load_errors(tmp_path)
    assert sorted((e.location.line, e.location.column, e.field, e.problem) for e in errors) == [
        (2, 1, "mode", "Input should be 'enforce' or 'report'"),
        (4, 13, "allow.0.hosts.0", "'API.example.com' is not in normal form: use 'api.example.com' instead"),
        (4, 30, "allow.0.hosts.1", "'10.0.0.1' is an address: use cidrs: [10.0.0.1/32] instead"),
        (5, 5, "allow.0.ports", "List should have at least 1 item after validation, not 0"),
        (7, 5, "deny.0.hots", "unknown key (did you mean 'hosts'?)"),
    ]
    assert {e.location.file for e in errors} == {str(tmp_path / "tenants/t.yaml")}


def test_a_preset_no_tenant_includes_is_still_checked(tmp_path: Path) -> None:
    write_rules(
        tmp_path,
        {"presets/p.yaml": "preset: p\nallow:\n  - hosts: ['*.org']\n", "tenants/t.yaml": "tenant: t\n"},
    )
    (error,) = load_errors(tmp_path)
    assert where(error, tmp_path) == ("presets/p.yaml", 3, "allow.0.hosts.0")
    assert error.problem == "'*.org' would allow a whole top-level domain; name the domains instead"


def test_a_preset_included_by_several_tenants_is_reported_once(tmp_path: Path) -> None:
    write_rules(
        tmp_path,
        {
            "presets/p.yaml": "preset: p\nallow:\n  - hosts: ['*.org']\n",
            "tenants/a.yaml": "tenant: a\ninclude: [p]\n",
            "tenants/b.yaml": "tenant: b\ninclude: [p]\n",
            "tenants/c.yaml": "tenant: c\ninclude: [p]\n",
        },
    )
    (error,) = load_errors(tmp_path)
    assert where(error, tmp_path) == ("presets/p.yaml", 3, "allow.0.hosts.0")


def test_a_preset_is_compiled_once_and_shared_by_the_tenants_that_include_it(tmp_path: Path) -> None:
    write_rules(
        tmp_path,
        {
            "presets/p.yaml": "preset: p\nallow:\n  - id: docs\n    hosts: [docs.example.com]\n",
            "tenants/a.yaml": "tenant: a\ninclude: [p]\n",
            "tenants/b.yaml": "tenant: b\ninclude: [p]\n",
        },
    )
    policy = load_policy_dir(tmp_path)
    (a_rule,) = policy.tenants["a"].allow.rules
    (b_rule,) = policy.tenants["b"].allow.rules
    assert a_rule.rule_id == "preset:p/allow/docs"
    assert a_rule is b_rule


def test_a_missing_rules_directory_is_an_error(tmp_path: Path) -> None:
    (error,) = load_errors(tmp_path / "nope")
    assert error.problem == "rules directory not found"
    assert error.location.file == str(tmp_path / "nope")


# --- tokens at load ------------------------------------------------------------------------

TOKEN_TENANT = "tenant: t\nsandboxes:\n  - id: t-1\n    token: file:t-1.token\n"


def test_a_world_readable_token_file_is_refused(tmp_path: Path) -> None:
    write_rules(tmp_path, {"tenants/t.yaml": TOKEN_TENANT, "tenants/t-1.token": new_token()})
    (tmp_path / "tenants/t-1.token").chmod(0o644)
    (error,) = load_errors(tmp_path)
    assert where(error, tmp_path) == ("tenants/t.yaml", 4, "sandboxes.0.token")
    assert error.location.column == 5
    assert "(mode 644)" in error.problem
    assert "chmod 600" in error.problem


def test_a_private_token_file_loads_and_authenticates(tmp_path: Path) -> None:
    token = new_token()
    write_rules(tmp_path, {"tenants/t.yaml": TOKEN_TENANT, "tenants/t-1.token": token + "\n"})
    (tmp_path / "tenants/t-1.token").chmod(0o600)
    policy = load_policy_dir(tmp_path)
    assert policy.authenticate("t-1", token) == Identity("t", "t-1")
    assert policy.authenticate("t-1", token + "x") is None


def test_a_token_file_is_listed_and_rotating_it_changes_the_version(tmp_path: Path) -> None:
    token_file = tmp_path / "tenants/t-1.token"
    write_rules(tmp_path, {"tenants/t.yaml": TOKEN_TENANT, "tenants/t-1.token": new_token()})
    token_file.chmod(0o600)
    before = load_policy_dir(tmp_path)
    assert before.token_files == (str(token_file),)
    assert before.files == (str(tmp_path / "tenants/t.yaml"),)
    rotated = new_token()
    token_file.write_text(rotated)
    after = load_policy_dir(tmp_path)
    assert after.version != before.version
    assert after.authenticate("t-1", rotated) == Identity("t", "t-1")
    assert load_policy_dir(tmp_path).version == after.version


def test_a_directory_without_token_files_lists_none(good: PolicySet) -> None:
    assert good.token_files == ()


def test_rotating_an_environment_token_changes_the_version(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MISSING_ENV, new_token())
    before = load_policy_dir(BROKEN / "env-token-missing")
    monkeypatch.setenv(MISSING_ENV, new_token())
    after = load_policy_dir(BROKEN / "env-token-missing")
    assert after.version != before.version
    assert after.token_files == ()


def test_a_token_from_the_environment_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    token = new_token()
    monkeypatch.setenv(MISSING_ENV, token)
    policy = load_policy_dir(BROKEN / "env-token-missing")
    assert policy.authenticate("t-1", token) == Identity("t", "t-1")


def test_a_token_error_never_echoes_the_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MISSING_ENV, "short-secret")
    (error,) = load_errors(BROKEN / "env-token-missing")
    assert "shorter than 16 characters" in error.problem
    assert "short-secret" not in str(error)


# --- the good directory --------------------------------------------------------------------


@pytest.fixture(scope="module")
def good() -> PolicySet:
    return load_policy_dir(GOOD)


def test_the_good_directory_loads_every_file(good: PolicySet) -> None:
    assert good.files == tuple(
        str(GOOD / f) for f in ("base.yaml", "presets/web.yaml", "tenants/alpha.yaml", "tenants/beta.yaml")
    )
    assert sorted(good.tenants) == ["alpha", "beta"]
    assert good.tenants["alpha"].mode is Mode.ENFORCE
    assert good.tenants["beta"].mode is Mode.REPORT
    assert good.tenants["alpha"].source == str(GOOD / "tenants/alpha.yaml")


def test_rules_get_ids_from_owner_kind_and_id_or_position(good: PolicySet) -> None:
    alpha, beta = good.tenants["alpha"], good.tenants["beta"]
    assert [r.rule_id for r in alpha.allow.rules] == [
        "alpha/allow/api",
        "alpha/allow/wild",
        "alpha/allow/lab",
        "preset:web/allow/docs",
    ]
    assert [r.rule_id for r in alpha.deny.rules] == ["alpha/deny/no-admin"]
    assert [r.rule_id for r in beta.allow.rules] == ["beta/allow/0"]
    assert beta.deny.rules == ()
    assert [r.rule_id for r in alpha.base_deny.rules] == ["base/deny/metadata", "base/deny/internal-names"]


def test_the_base_deny_rules_are_kept_apart_and_shared_by_every_tenant(good: PolicySet) -> None:
    alpha, beta = good.tenants["alpha"], good.tenants["beta"]
    assert alpha.base_deny is beta.base_deny
    assert alpha.deny.deny_match("metadata.google.internal", None, 80, None, None) is None
    hit = alpha.base_deny.deny_match("metadata.google.internal", None, 80, None, None)
    assert hit is not None and hit.rule_id == "base/deny/metadata"
    assert hit.origin == f"{GOOD / 'base.yaml'}:4"


def test_rules_remember_where_they_were_written(good: PolicySet) -> None:
    origins = {r.rule_id: r.origin for r in good.tenants["alpha"].allow.rules}
    assert origins["alpha/allow/api"] == f"{GOOD / 'tenants/alpha.yaml'}:10"
    assert origins["preset:web/allow/docs"] == f"{GOOD / 'presets/web.yaml'}:4"


def test_rules_compile_ports_methods_paths_and_inspection(good: PolicySet) -> None:
    api, wild, lab, docs = good.tenants["alpha"].allow.rules
    assert (api.ports, api.methods, api.inspect) == (frozenset({443}), frozenset({"GET"}), True)
    assert api.paths is not None and api.paths.fullmatch("/v1/a/b")
    assert (wild.ports, wild.methods, wild.paths, wild.inspect) == (frozenset({443, 8443}), None, None, False)
    assert lab.cidrs == ("10.1.2.0/24",) and lab.ports == frozenset({443})
    assert docs.hosts == ("docs.example.com",)
    no_admin = good.tenants["alpha"].deny.rules[-1]
    assert no_admin.ports == frozenset(), "a deny rule without ports covers every port"


def test_deny_path_globs_fold_case_and_allow_globs_do_not(tmp_path: Path) -> None:
    tenant = (
        "tenant: t\n"
        "allow:\n"
        "  - hosts: [api.example.com]\n"
        "    paths: ['/v1/**']\n"
        "deny:\n"
        "  - hosts: [api.example.com]\n"
        "    paths: ['/admin/**']\n"
    )
    policy = load_policy_dir(write_rules(tmp_path, {"tenants/t.yaml": tenant}))
    (allow,), (deny,) = policy.tenants["t"].allow.rules, policy.tenants["t"].deny.rules
    assert deny.paths is not None and allow.paths is not None
    assert [bool(deny.paths.fullmatch(p)) for p in ("/admin", "/ADMIN/x", "/Admin/", "/adminx")] == [
        True,
        True,
        True,
        False,
    ]
    assert [bool(allow.paths.fullmatch(p)) for p in ("/v1", "/v1/x", "/V1/x")] == [True, True, False]


def test_a_path_glob_that_can_never_match_is_an_error_with_the_form_to_use(tmp_path: Path) -> None:
    tenant = (
        "tenant: t\nallow:\n  - hosts: [api.example.com]\n    paths: ['/v1/**', '/%7Euser/**', '/a//b']\n"
    )
    errors = load_errors(write_rules(tmp_path, {"tenants/t.yaml": tenant}))
    assert sorted((e.location.line, e.field, e.problem) for e in errors) == [
        (
            4,
            "allow.0.paths.1",
            "'/%7Euser/**': use '/~user/**' instead (paths are matched in their normal form)",
        ),
        (
            4,
            "allow.0.paths.2",
            "'/a//b': an ambiguous path (';', '//', double encoding) never matches: the glob never does",
        ),
    ]


def test_deny_wildcards_below_a_tld_are_accepted(good: PolicySet) -> None:
    base_deny = good.tenants["beta"].base_deny
    hit = base_deny.deny_match("db.corp.internal", None, 5432, None, None)
    assert hit is not None and hit.rule_id == "base/deny/internal-names"


def test_sandboxes_are_registered_by_token_and_address(good: PolicySet) -> None:
    assert good.authenticate("alpha-1", ALPHA_TOKEN) == Identity("alpha", "alpha-1")
    assert good.authenticate("beta-1", BETA_TOKEN) == Identity("beta", "beta-1")
    assert good.authenticate("alpha-1", BETA_TOKEN) is None
    assert good.authenticate("nobody", ALPHA_TOKEN) is None
    assert good.identify_address("10.200.0.2") == Identity("alpha", "alpha-1")
    assert good.identify_address("10.200.0.3") is None


def test_a_preset_applies_to_the_tenant_that_includes_it(good: PolicySet) -> None:
    alpha, beta = good.tenants["alpha"], good.tenants["beta"]
    assert alpha.allow.match("docs.example.com", None, 443, None, None, no_match=Reason.HOST_NOT_ALLOWED).rule
    assert (
        beta.allow.match("docs.example.com", None, 443, None, None, no_match=Reason.HOST_NOT_ALLOWED).reason
        is Reason.HOST_NOT_ALLOWED
    )


def test_the_version_is_stable_across_loads(good: PolicySet) -> None:
    again = load_policy_dir(GOOD)
    assert again.version == good.version
    assert len(good.version) == 12
    assert again is not good


def test_the_version_changes_when_a_file_changes(tmp_path: Path) -> None:
    rules_dir = tmp_path / "rules"
    shutil.copytree(GOOD, rules_dir)
    before = load_policy_dir(rules_dir).version
    alpha = rules_dir / "tenants/alpha.yaml"
    alpha.write_text(alpha.read_text() + "# a comment is a change too\n")
    after = load_policy_dir(rules_dir).version
    assert after != before
    (rules_dir / "presets/web.yaml").unlink()
    alpha.write_text(alpha.read_text().replace("include: [web]", "include: []"))
    assert load_policy_dir(rules_dir).version not in (before, after)


def test_the_version_does_not_depend_on_where_the_directory_lives(good: PolicySet, tmp_path: Path) -> None:
    shutil.copytree(GOOD, tmp_path / "elsewhere")
    assert load_policy_dir(tmp_path / "elsewhere").version == good.version


def test_the_version_ignores_timestamps(tmp_path: Path) -> None:
    rules_dir = tmp_path / "rules"
    shutil.copytree(GOOD, rules_dir)
    before = load_policy_dir(rules_dir).version
    os.utime(rules_dir / "base.yaml", (0, 0))
    assert load_policy_dir(rules_dir).version == before


# --- layout --------------------------------------------------------------------------------


def test_policy_files_are_base_then_sorted_presets_then_sorted_tenants(tmp_path: Path) -> None:
    write_rules(
        tmp_path,
        {
            "base.yaml": "deny: []\n",
            "presets/b.yml": "preset: b\n",
            "presets/a.yaml": "preset: a\n",
            "presets/README.md": "not policy\n",
            "tenants/z.yaml": "tenant: z\n",
            "tenants/m.yaml": "tenant: m\n",
            "tenants/m.token": "x" * 20,
            "other/x.yaml": "tenant: x\n",
        },
    )
    assert [p.relative_to(tmp_path).as_posix() for p in policy_files(tmp_path)] == [
        "base.yaml",
        "presets/a.yaml",
        "presets/b.yml",
        "tenants/m.yaml",
        "tenants/z.yaml",
    ]


def test_a_directory_without_a_base_loads(tmp_path: Path) -> None:
    write_rules(tmp_path, {"tenants/t.yaml": "tenant: t\nallow:\n  - hosts: [a.example.com]\n"})
    policy = load_policy_dir(tmp_path)
    assert policy.tenants["t"].deny.rules == ()
    assert policy.tenant("t") is policy.tenants["t"]
    assert policy.tenant("u") is None


def test_source_addresses_are_canonical_and_unique(tmp_path: Path) -> None:
    write_rules(
        tmp_path,
        {
            "tenants/a.yaml": "tenant: a\nsandboxes:\n  - id: a-1\n    addresses: ['fd00:0::1', 10.0.0.1]\n",
            "tenants/b.yaml": "tenant: b\nsandboxes:\n  - id: b-1\n    addresses: [10.0.0.1, nope]\n",
        },
    )
    errors = load_errors(tmp_path)
    assert sorted((where(e, tmp_path), e.problem) for e in errors) == [
        (
            ("tenants/b.yaml", 4, "sandboxes.0.addresses.0"),
            "address 10.0.0.1 already belongs to sandbox 'a-1'",
        ),
        (("tenants/b.yaml", 4, "sandboxes.0.addresses.1"), "'nope' is not an IP address"),
    ]
    (tmp_path / "tenants/b.yaml").unlink()
    policy = load_policy_dir(tmp_path)
    assert policy.files == (str(tmp_path / "tenants/a.yaml"),)
    assert policy.identify_address("fd00::1") == Identity("a", "a-1")
    assert policy.sandboxes["a-1"].addresses == ("fd00::1", "10.0.0.1")
    assert policy.sandboxes["a-1"].token_digest is None
    assert policy.authenticate("a-1", "") is None


def test_a_duplicate_address_after_an_invalid_one_names_its_own_index(tmp_path: Path) -> None:
    write_rules(
        tmp_path,
        {
            "tenants/a.yaml": (
                "tenant: a\nsandboxes:\n  - id: a-1\n    addresses: [nope, 10.0.0.1]\n"
                "  - id: a-2\n    addresses: [bad, worse, '10.0.0.1']\n"
            ),
        },
    )
    errors = load_errors(tmp_path)
    assert [(where(e, tmp_path)[1:], e.location.column, e.problem) for e in errors] == [
        ((4, "sandboxes.0.addresses.0"), 17, "'nope' is not an IP address"),
        ((6, "sandboxes.1.addresses.0"), 17, "'bad' is not an IP address"),
        ((6, "sandboxes.1.addresses.1"), 22, "'worse' is not an IP address"),
        ((6, "sandboxes.1.addresses.2"), 29, "address 10.0.0.1 already belongs to sandbox 'a-1'"),
    ]


# --- the repository's own rules ------------------------------------------------------------


def test_the_repository_rules_load_with_a_private_token(tmp_path: Path) -> None:
    rules_dir = tmp_path / "rules"
    shutil.copytree(REPO_RULES, rules_dir)
    token = new_token()
    token_file = rules_dir / "tenants/demo-1.token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    policy = load_policy_dir(rules_dir)
    demo = policy.tenants["demo"]
    assert demo.mode is Mode.ENFORCE
    assert policy.authenticate("demo-1", token) == Identity("demo", "demo-1")
    assert demo.allow.match("pypi.org", None, 443, None, None, no_match=Reason.HOST_NOT_ALLOWED).rule
    assert demo.allow.match(
        "registry.npmjs.org", None, 443, None, None, no_match=Reason.HOST_NOT_ALLOWED
    ).rule
    assert (
        demo.allow.match("pypi.org", None, 80, None, None, no_match=Reason.HOST_NOT_ALLOWED).reason
        is Reason.PORT_NOT_ALLOWED
    )
    assert demo.base_deny.deny_match("metadata.google.internal", None, 80, None, None) is not None
    assert demo.base_deny.deny_match("printer.local", None, 631, None, None) is not None
    assert demo.base_deny.deny_match("localhost", None, 80, None, None) is not None
    assert demo.base_deny.deny_match("pypi.org", None, 443, None, None) is None
    assert demo.deny.deny_match("pypi.org", None, 443, None, None) is None
    assert policy.token_files == (str(token_file),)


@pytest.mark.parametrize(
    ("rule", "line", "field", "problem"),
    [
        (
            "  - hosts: [mcp.example.com]\n    mcp:\n      tools: {allow: ['bad name']}\n",
            5,
            "allow.0.mcp.tools.allow.0",
            "'bad name' is not a tool name glob",
        ),
        (
            "  - hosts: [mcp.example.com]\n    mcp: {}\n    jsonrpc: {}\n",
            3,
            "allow.0",
            "at most one of 'mcp', 'jsonrpc' and 'graphql'",
        ),
        (
            "  - hosts: [mcp.example.com]\n    inspect: false\n    jsonrpc: {}\n",
            3,
            "allow.0",
            "not with 'inspect: false'",
        ),
    ],
    ids=[
        "a tool glob outside the tool-name charset names its entry",
        "a rule with both mcp and jsonrpc",
        "a protocol section on a rule that does not inspect",
    ],
)
def test_a_protocol_section_error_names_file_line_and_field(
    tmp_path: Path, rule: str, line: int, field: str, problem: str
) -> None:
    errors = load_errors(write_rules(tmp_path, {"tenants/t.yaml": f"tenant: t\nallow:\n{rule}"}))
    (error,) = errors
    assert where(error, tmp_path)[1:] == (line, field)
    assert problem in error.problem


def test_a_protocol_section_is_an_allow_rule_field(tmp_path: Path) -> None:
    tenant = "tenant: t\ndeny:\n  - hosts: [mcp.example.com]\n    mcp: {}\n"
    (error,) = load_errors(write_rules(tmp_path, {"tenants/t.yaml": tenant}))
    assert where(error, tmp_path) == ("tenants/t.yaml", 4, "deny.0.mcp")
    assert error.problem == "'mcp' is an allow-rule field"


def test_a_protocol_section_rides_on_the_rule_and_forces_inspection(tmp_path: Path) -> None:
    tenant = "tenant: t\nallow:\n  - hosts: [mcp.example.com]\n    mcp: {tools: {allow: [search]}}\n"
    policy = load_policy_dir(write_rules(tmp_path, {"tenants/t.yaml": tenant}))
    (rule,) = policy.tenants["t"].allow.rules
    assert rule.inspect and rule.messages is not None
    assert policy.tenants["t"].allow.needs_inspection("mcp.example.com", None, 443)
