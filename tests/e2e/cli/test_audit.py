"""`sandgate audit tail|query|stats|suggest` over rotated JSON-lines audit files.

The trail is written the way the gateway writes it: records built by `decision_record`,
their time rendered by `format_time`, one compact JSON object per line, rotated as
`audit.jsonl` (newest), `audit.jsonl.1`, `audit.jsonl.2` (oldest).
"""

from __future__ import annotations

import contextlib
import json
import queue
import signal
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.audit_trail import BASE, DECISIONS, TRAIL, at, decision, line, reload_record  # noqa: F401

from sandgate.policy.decision import Phase
from sandgate.policy.matcher import compile_path_globs
from sandgate.policy.model.tenant import Rule
from sandgate.policy.reasons import Reason
from sandgate.proxy.audit.files import MAX_LINE, JsonlSource
from sandgate.proxy.audit.query import AuditInputError, Query, parse_time
from sandgate.proxy.audit.suggest import collapse_paths
from sandgate.proxy.audit.trail import JsonlFileSink
from sandgate.proxy.cli.main import main

R = Reason


@pytest.fixture
def trail(tmp_path: Path) -> Path:
    """The audit trail above, in three rotated files; returns the path of audit.jsonl."""
    for name, records in TRAIL.items():
        (tmp_path / name).write_text("".join(line(r) for r in records))
    return tmp_path / "audit.jsonl"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run `sandgate audit ...`: exit code, stdout, stderr."""
    code = main(["audit", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def ids(out: str) -> list[str]:
    """The decision ids of JSON-lines output."""
    return [json.loads(x)["decision_id"] for x in out.splitlines()]


def test_query_reads_rotated_files_oldest_first(trail: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "query", "--file", str(trail), "--format", "json")
    assert (code, err) == (0, "")
    assert ids(out) == DECISIONS
    assert json.loads(out.splitlines()[0]) == TRAIL["audit.jsonl.2"][0], "records come out as written"


def test_event_any_selects_every_kind_of_record_and_needs_a_line_format(
    trail: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "query", "--file", str(trail), "--format", "json", "--event", "any")
    assert (code, err) == (0, "")
    written = [
        r["decision_id"] for name in ("audit.jsonl.2", "audit.jsonl.1", "audit.jsonl") for r in TRAIL[name]
    ]
    assert ids(out) == written
    assert "policy_reload" in {json.loads(x)["event"] for x in out.splitlines()}
    code, out, err = run(capsys, "query", "--file", str(trail), "--event", "any")
    assert (code, out) == (2, "")
    assert "--event any needs --format json or ocsf" in err


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--tenant", "t2"], ["r2", "r9"]),
        (["--sandbox", "sb1", "--decision", "deny"], ["r1", "r3", "r4", "r7", "r8", "r11", "r12"]),
        (["--host", "evil.test"], ["r1", "r7"]),
        (["--host", "*.other.test"], ["r9"]),
        (["--host", "*.api.test"], []),
        (["--host", "EVIL.test", "--host", "meta.test"], ["r1", "r7", "r8"]),
        (["--reason", "path_not_allowed", "--reason", "method_not_allowed"], ["r3", "r4", "r11"]),
        (["--decision", "would_deny"], ["r9"]),
        (["--phase", "connect"], ["r1", "r5", "r8", "r9", "r12"]),
        (["--credential", "github"], ["r0", "r10"]),
        (["--credential", "openai", "--tenant", "t2"], []),
        (["--event", "policy_reload"], ["r6"]),
        (["--since", "2026-11-30T10:40:00Z", "--until", "2026-11-30T10:55:00Z"], ["r7", "r8", "r9"]),
        (["--since", "2026-11-30T12:55:00+02:00"], ["r10", "r11", "r12"]),
        (["--until", "2026-11-30 10:05"], ["r0"]),
        (["--limit", "2"], ["r0", "r1"]),
        (["--tenant", "t1", "--decision", "deny", "--limit", "3"], ["r1", "r3", "r4"]),
    ],
    ids=[
        "a tenant's records",
        "filters combine with AND",
        "an exact host",
        "a *.suffix host matches subdomains",
        "a *.suffix host does not match the apex",
        "a repeated filter matches any of its values, hosts case-insensitively",
        "several reasons",
        "report mode would_deny",
        "a phase",
        "records that injected a credential",
        "a credential of another tenant matches nothing",
        "policy reloads instead of decisions",
        "a window includes since and excludes until",
        "an offset time is compared in UTC",
        "a time without offset is UTC",
        "limit stops after N",
        "limit counts matches only",
    ],
)
def test_query_filters(
    trail: Path, capsys: pytest.CaptureFixture[str], argv: list[str], expected: list[str]
) -> None:
    code, out, err = run(capsys, "query", "--file", str(trail), "--format", "json", *argv)
    assert (code, err) == (0, "")
    assert ids(out) == expected


def test_a_window_skips_rotated_files_wholly_outside_it(
    trail: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with trail.with_name("audit.jsonl.2").open("a") as f:
        f.write("garbage that would be counted if this file were read\n")
        f.write(line(decision("late", at(12), R.HOST_NOT_ALLOWED, "evil.test")))
    code, out, err = run(
        capsys, "query", "--file", str(trail), "--format", "json", "--since", "2026-11-30T10:40Z"
    )
    assert (code, ids(out), err) == (0, ["r7", "r8", "r9", "r10", "r11", "r12"], "")
    _, out, err = run(
        capsys, "query", "--file", str(trail), "--format", "json", "--since", "2026-11-30T10:12Z"
    )
    assert ids(out)[:2] == ["late", "r3"], "a rotated file ending inside the window is read"
    assert err == "sandgate audit: skipped 1 malformed line\n", "within 10 minutes of the window: read"


def test_query_table_lists_injections_by_credential(trail: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "query", "--file", str(trail), "--credential", "github")
    assert code == 0
    assert out.splitlines() == [
        "time                  decision    phase    reason              tenant/sandbox  "
        "request                     rule_id",
        "2026-11-30T10:00:00Z  allow       request  allowed             t1/sb1          "
        "GET api.test:443/v1/items?key=REDACTED  t1/allow/api credentials=github",
        "2026-11-30T10:55:00Z  allow       request  allowed             t1/sb1          "
        "POST api.test:443/v1/items  t1/allow/api credentials=github,openai",
    ]


def test_table_shows_policy_reloads_and_missing_values(
    trail: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, out, _ = run(capsys, "query", "--file", str(trail), "--event", "policy_reload")
    assert out.splitlines()[1].split() == [
        "2026-11-30T10:35:00Z", "sighup", "ok", "a4c4c1347d42", "b5d5d2458e53", "-",
    ]  # fmt: skip
    _, out, _ = run(capsys, "query", "--file", str(trail), "--reason", "no_identity")
    assert out.splitlines()[1].split() == [
        "2026-11-30T10:30:00Z", "deny", "connect", "no_identity", "-/-", "api.test:443", "-",
    ]  # fmt: skip


def test_table_tells_a_passed_through_connection_phases_apart_within_120_columns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A TLS connection passed through is two allow records, one per phase: two lines that say
    which is which, each short enough for a terminal (with a short rule id)."""
    path = tmp_path / "audit.jsonl"
    path.write_text(
        "".join(
            line(decision(name, at(0), R.ALLOWED, "pypi.org", phase=phase, rule_id="demo/allow/0"))
            for name, phase in (("c", Phase.CONNECT), ("t", Phase.TLS))
        )
    )
    _, out, _ = run(capsys, "tail", "--file", str(path))
    header, connect, tls = out.splitlines()
    assert header.split()[:3] == ["time", "decision", "phase"]
    assert connect.split() == ["2026-11-30T10:00:00Z", "allow", "connect", "allowed", "t1/sb1", "pypi.org:443", "demo/allow/0"]  # fmt: skip
    assert tls.split() == ["2026-11-30T10:00:00Z", "allow", "tls", "allowed", "t1/sb1", "pypi.org:443", "demo/allow/0"]  # fmt: skip
    assert max(len(x) for x in (header, connect, tls)) <= 120


def test_table_escapes_control_characters_from_the_sandbox(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "audit.jsonl"
    path.write_text(
        line(decision("r0", at(0), R.PATH_NOT_ALLOWED, "api.test", method="GET", path="/\x1b[2J"))
    )
    _, out, _ = run(capsys, "query", "--file", str(path))
    assert "\x1b" not in out
    assert "/\\x1b[2J" in out


def test_relative_times_count_back_from_now(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    now = datetime.now(UTC).timestamp()
    path = tmp_path / "audit.jsonl"
    path.write_text(
        "".join(
            line(decision(name, now - ago, R.HOST_NOT_ALLOWED, "evil.test"))
            for name, ago in (("3h", 3 * 3600), ("30m", 1800), ("5m", 300))
        )
    )
    _, out, _ = run(capsys, "query", "--file", str(path), "--format", "json", "--since", "1h")
    assert ids(out) == ["30m", "5m"]
    _, out, _ = run(
        capsys, "query", "--file", str(path), "--format", "json", "--since", "1d", "--until", "10m"
    )
    assert ids(out) == ["3h", "30m"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("15m", BASE - timedelta(minutes=15)),
        ("2h", BASE - timedelta(hours=2)),
        ("1d", BASE - timedelta(days=1)),
        ("90s", BASE - timedelta(seconds=90)),
        ("1w", BASE - timedelta(weeks=1)),
        ("2026-11-30T01:04:41.856Z", datetime(2026, 11, 30, 1, 4, 41, 856000, tzinfo=UTC)),
        ("2026-11-30T03:04:41+02:00", datetime(2026, 11, 30, 1, 4, 41, tzinfo=UTC)),
        ("2026-11-30", datetime(2026, 11, 30, tzinfo=UTC)),
    ],
    ids=["minutes ago", "hours ago", "days ago", "seconds ago", "weeks ago", "RFC 3339 in UTC",
         "RFC 3339 with an offset", "a date is midnight UTC"],
)  # fmt: skip
def test_parse_time(text: str, expected: datetime) -> None:
    assert parse_time(text, BASE) == expected


@pytest.mark.parametrize("text", ["yesterday", "15", "-1h", "1y", "2026-13-01"])
def test_parse_time_refuses_what_is_not_a_time(text: str) -> None:
    with pytest.raises(AuditInputError, match="is not a time"):
        parse_time(text, BASE)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["query", "--since", "yesterday"], "'yesterday' is not a time"),
        (["query", "--until", "3 hours"], "'3 hours' is not a time"),
        (["query", "--file", "{missing}"], "no audit file at"),
        (["tail", "--file", "{missing}"], "no audit file at"),
        (["stats", "--file", "{missing}"], "no audit file at"),
        (["suggest", "--sandbox", "sb1", "--file", "{missing}"], "no audit file at"),
        (["suggest", "--sandbox", "sb1", "--sandbox", "sb2"], "exactly one --sandbox"),
    ],
    ids=["a bad since", "a bad until", "query of a missing file", "tail of a missing file",
         "stats of a missing file", "suggest of a missing file", "suggest for two sandboxes"],
)  # fmt: skip
def test_invalid_input_exits_2(
    trail: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    argv = [a.replace("{missing}", str(trail.with_name("nothing.jsonl"))) for a in argv]
    if "--file" not in argv:
        argv += ["--file", str(trail)]
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert out == ""
    assert message in err


@pytest.mark.parametrize(
    "argv",
    [["query", "--reason", "no_such_reason"], ["query", "--decision", "maybe"], ["query", "--limit", "0"],
     ["tail", "-n", "-1"], ["stats", "--top", "x"], ["suggest"], ["stats", "--event", "policy_reload"]],
    ids=["an unknown reason", "an unknown decision", "a zero limit", "a negative count", "a top that is no "
         "number", "suggest without a sandbox", "stats counts decisions only"],
)  # fmt: skip
def test_usage_errors_exit_2(trail: Path, capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["audit", *argv, "--file", str(trail)])
    assert e.value.code == 2
    assert "usage: sandgate" in capsys.readouterr().err


def test_nothing_matched_is_not_an_error(trail: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "query", "--file", str(trail), "--tenant", "nobody", "--format", "json") == (0, "", "")
    assert run(capsys, "tail", "--file", str(trail), "--tenant", "nobody", "--format", "json") == (0, "", "")


def test_the_config_names_the_audit_file(trail: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = trail.with_name("sandgate.yaml")
    config.write_text(f"state_dir: {trail.parent / 'state'}\naudit:\n  path: {trail}\n")
    code, out, _ = run(capsys, "tail", "--config", str(config), "-n", "1", "--format", "json")
    assert (code, ids(out)) == (0, ["r12"])


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["-n", "3"], ["r10", "r11", "r12"]),
        (["-n", "8"], ["r2", "r3", "r4", "r5", "r7", "r8", "r9", "r10", "r11", "r12"][-8:]),
        (["-n", "100"], DECISIONS),
        (["-n", "0"], []),
        (["-n", "3", "--tenant", "t2"], ["r2", "r9"]),
        (["-n", "2", "--host", "evil.test"], ["r1", "r7"]),
        (["-n", "1", "--event", "policy_reload"], ["r6"]),
    ],
    ids=["the last records of the live file", "across rotated files", "all there is",
         "none", "filtered", "filtered across files", "policy reloads"],
)  # fmt: skip
def test_tail_reads_backwards_across_rotated_files(
    trail: Path, capsys: pytest.CaptureFixture[str], argv: list[str], expected: list[str]
) -> None:
    code, out, err = run(capsys, "tail", "--file", str(trail), "--format", "json", *argv)
    assert (code, err) == (0, "")
    assert ids(out) == expected


STATS = {
    "records": 12,
    "tenants": [
        {
            "tenant": "t1",
            "records": 9,
            "decisions": {"deny": 7, "allow": 2},
            "reasons": {
                "allowed": 2,
                "host_not_allowed": 2,
                "path_not_allowed": 2,
                "method_not_allowed": 1,
                "port_not_allowed": 1,
                "private_address": 1,
            },
            "top_denied_hosts": [{"host": "api.test", "count": 3}, {"host": "evil.test", "count": 2}],
            "top_reasons": [
                {"reason": "host_not_allowed", "count": 2},
                {"reason": "path_not_allowed", "count": 2},
            ],
        },
        {
            "tenant": "t2",
            "records": 2,
            "decisions": {"allow": 1, "would_deny": 1},
            "reasons": {"allowed": 1, "host_not_allowed": 1},
            "top_denied_hosts": [{"host": "x.other.test", "count": 1}],
            "top_reasons": [{"reason": "host_not_allowed", "count": 1}],
        },
        {
            "tenant": None,
            "records": 1,
            "decisions": {"deny": 1},
            "reasons": {"no_identity": 1},
            "top_denied_hosts": [{"host": "api.test", "count": 1}],
            "top_reasons": [{"reason": "no_identity", "count": 1}],
        },
    ],
    "approvals": [],
}


def test_stats_json_counts_per_tenant(trail: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "stats", "--file", str(trail), "--format", "json", "--top", "2")
    assert code == 0
    assert json.loads(out) == STATS


def test_stats_table(trail: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "stats", "--file", str(trail), "--top", "2", "--tenant", "t2")
    assert code == 0
    assert out == (
        "2 decision records\n"
        "\n"
        "tenant t2: 2 records\n"
        "  decisions: allow 1, would_deny 1\n"
        "  reasons: allowed 1, host_not_allowed 1\n"
        "  top denied hosts:\n"
        "    1  x.other.test\n"
        "  top denial reasons:\n"
        "    1  host_not_allowed\n"
    )


def test_stats_honour_the_window(trail: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(capsys, "stats", "--file", str(trail), "--format", "json", "--since", "2026-11-30T10:58Z")
    document = json.loads(out)
    assert document["records"] == 2
    assert document["tenants"][0]["reasons"] == {"method_not_allowed": 1, "port_not_allowed": 1}


def suggestions(
    capsys: pytest.CaptureFixture[str], trail: Path, *argv: str
) -> tuple[str, list[dict[str, Any]]]:
    """Run `audit suggest`; its text and its rules, each validated by the policy's Rule model."""
    code, out, err = run(capsys, "suggest", "--file", str(trail), *argv)
    assert (code, err) == (0, "")
    rules = yaml.safe_load(out)["allow"]
    for rule in rules:
        Rule.model_validate(rule)
    return out, rules


def test_suggest_turns_repeated_denials_into_rules_to_review(
    trail: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, rules = suggestions(capsys, trail, "--sandbox", "sb1")
    assert rules == [
        {
            "id": "suggested-api.test-requests",
            "hosts": ["api.test"],
            "ports": [443],
            "methods": ["DELETE", "POST"],
            "paths": ["/v1/**"],
            "comment": "3 denials (path_not_allowed 2, method_not_allowed 1), "
            "2026-11-30T10:20:00Z .. 2026-11-30T11:00:00Z",
        },
        {
            "id": "suggested-evil.test",
            "hosts": ["evil.test"],
            "ports": [443, 8443],
            "comment": "2 denials (host_not_allowed 2), 2026-11-30T10:05:00Z .. 2026-11-30T10:40:00Z",
        },
    ]
    comments = [x for x in out.splitlines() if x.startswith("#")]
    assert comments[1].startswith("# SUGGESTIONS TO REVIEW: sandgate never applies them automatically.")
    assert "tenant t1's file" in comments[2]
    assert "#   1 denials whose records name no refused address" in out
    assert "#   once.test (connections): 1 denial(s), fewer than --min-count 2" in out


def test_suggest_with_min_count_1_and_a_window(trail: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, rules = suggestions(
        capsys, trail, "--sandbox", "sb1", "--min-count", "1", "--since", "2026-11-30T10:58Z"
    )
    assert [(r["id"], r.get("ports"), r.get("methods"), r.get("paths")) for r in rules] == [
        ("suggested-api.test-requests", [443], ["DELETE"], ["/v1/items/7"]),
        ("suggested-once.test", [22], None, None),
    ]


def test_suggest_uses_report_mode_would_deny_and_skips_what_no_rule_fixes(
    trail: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, rules = suggestions(capsys, trail, "--sandbox", "sb9", "--min-count", "1")
    assert [r["hosts"] for r in rules] == [["x.other.test"]]
    out, rules = suggestions(capsys, trail, "--sandbox", "nobody")
    assert rules == []
    assert "from 0 denials" in out


def test_suggest_names_addresses_as_networks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "audit.jsonl"
    path.write_text(
        "".join(line(decision(f"r{i}", at(i), R.HOST_NOT_ALLOWED, h)) for i, h in enumerate(["203.0.113.7", "2001:db8::1"] * 2))
    )  # fmt: skip
    _, rules = suggestions(capsys, path, "--sandbox", "sb1")
    assert sorted(r["cidrs"][0] for r in rules) == ["2001:db8::1/128", "203.0.113.7/32"]
    assert all(r["id"].startswith("suggested-") for r in rules)


def test_suggest_refuses_a_sandbox_id_shared_by_tenants(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "audit.jsonl"
    path.write_text(
        "".join(line(decision(f"r{t}", at(0), R.HOST_NOT_ALLOWED, "a.test", tenant=t)) for t in ("t1", "t2"))
    )
    code, _, err = run(capsys, "suggest", "--file", str(path), "--sandbox", "sb1")
    assert code == 2
    assert "appears under tenants t1, t2: add --tenant" in err
    assert run(capsys, "suggest", "--file", str(path), "--sandbox", "sb1", "--tenant", "t1")[0] == 0


@pytest.mark.parametrize(
    ("paths", "expected"),
    [
        (["/v1/items", "/v1/users/42"], ["/v1/**"]),
        (["/v1/users/1", "/v1/users/2"], ["/v1/users/**"]),
        (["/a", "/b"], ["/a", "/b"]),
        (["/v1", "/v1/a", "/v1/b"], ["/v1", "/v1/**"]),
        (["/v1/a", "/v1/a/b"], ["/v1/a", "/v1/a/b"]),
        (["/v1/x", "/v2/y", "/v2/z/1"], ["/v1/x", "/v2/**"]),
        (["/only", "/only"], ["/only"]),
        (["/"], ["/"]),
    ],
    ids=["two paths under /v1 collapse to /v1/**", "the longest common prefix is kept",
         "different first segments stay exact", "the prefix itself stays exact next to its glob",
         "one path below a prefix is not worth a glob", "each first segment on its own",
         "duplicates count once", "the root"],
)  # fmt: skip
def test_collapse_paths(paths: list[str], expected: list[str]) -> None:
    assert collapse_paths(paths) == expected
    pattern = compile_path_globs(expected)
    assert all(pattern.fullmatch(p) for p in paths), "the globs permit every path they came from"


def test_malformed_lines_are_skipped_and_counted(trail: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with (trail.with_name("audit.jsonl.1")).open("a") as f:
        f.write("not json\n")
        f.write('{"event":"decision","tenant":"t1","dest":{"host"\n')  # a truncated write
        f.write("\n")  # blank: not a record, not counted
        f.write("[1, 2]\n")
        f.write('{"event":"decision","x":' + "[" * 100_000 + "\n")  # too deep to decode
        f.write('{"event":"decision","pad":"' + "x" * (MAX_LINE + 10) + '"}\n')  # longer than MAX_LINE
    with trail.open("a") as f:
        f.write('{"event":"decision","tenant":"t1"')  # the live file's last line, still being written
    code, out, err = run(capsys, "query", "--file", str(trail), "--format", "json")
    assert code == 0
    assert ids(out) == DECISIONS
    assert err == "sandgate audit: skipped 5 malformed lines\n"
    code, out, err = run(capsys, "query", "--file", str(trail), "--format", "json", "--tenant", "t2")
    assert (code, ids(out)) == (0, ["r2", "r9"])
    assert err == "sandgate audit: skipped 5 malformed lines\n", "the count does not depend on the filters"
    code, out, err = run(capsys, "tail", "--file", str(trail), "--format", "json", "-n", "6")
    assert ids(out) == ["r7", "r8", "r9", "r10", "r11", "r12"]
    assert err == "", "the live file's unfinished last line is left to --follow, not counted"
    code, out, err = run(capsys, "tail", "--file", str(trail), "--format", "json", "-n", "7")
    assert ids(out) == ["r5", "r7", "r8", "r9", "r10", "r11", "r12"]
    assert err == "sandgate audit: skipped 5 malformed lines\n", "met reading .1 backwards"


class Follower:
    """`sandgate audit tail --follow` in a subprocess, its output lines in a queue.

    `ignore_sigint` starts it the way a background job of a non-interactive shell does: with
    SIGINT inherited as ignored."""

    def __init__(self, path: Path, *argv: str, ignore_sigint: bool = False) -> None:
        command = [
            sys.executable,
            "-m",
            "sandgate.proxy.cli.main",
            "audit",
            "tail",
            "--follow",
            "--file",
            str(path),
        ]
        self.proc = subprocess.Popen(
            [*command, "--format", "json", *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignore_sigint else None,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for text in self.proc.stdout:
            self.lines.put(text)

    def next_ids(self, n: int) -> list[str]:
        """The decision ids of the next n records printed (waits up to 15 s for each)."""
        return [json.loads(self.lines.get(timeout=15))["decision_id"] for _ in range(n)]

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> tuple[int, str]:
        """Stop it with `sig`: its exit code and stderr. A follower that does not stop in 15 s
        is killed (never left behind) and the test fails."""
        self.proc.send_signal(sig)
        try:
            _, err = self.proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate(timeout=15)
            raise AssertionError(f"the follower ignored {sig.name}") from None
        return self.proc.returncode, err


def test_follow_picks_up_appended_lines_and_rotations(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    records = [line(decision(f"f{i}", at(i), R.HOST_NOT_ALLOWED, "evil.test")) for i in range(14)]
    # The gateway's own writer, rotating after every third record (batches of three).
    sink = JsonlFileSink(path, max_bytes=3 * len(records[0]) - 1, backups=10)
    sink.write(records[0:2])
    follower = Follower(path, "-n", "1")
    try:
        assert follower.next_ids(1) == ["f1"]
        sink.write(records[2:3])  # the third record: rotates
        assert follower.next_ids(1) == ["f2"]
        assert path.with_name("audit.jsonl.1").exists()
        with path.open("a") as f:  # one record arriving in two writes comes out once, whole
            f.write(records[3][:100])
            f.flush()
            assert follower.lines.empty()
            f.write(records[3][100:])
        assert follower.next_ids(1) == ["f3"]
        sink.write(records[4:7])  # rotates
        sink.write(records[7:10])  # into the new file, and rotates again
        assert follower.next_ids(6) == ["f4", "f5", "f6", "f7", "f8", "f9"]
        for i in range(10, 14):  # and one at a time
            sink.write(records[i : i + 1])
            assert follower.next_ids(1) == [f"f{i}"]
    finally:
        code, err = follower.stop()
    sink.close()
    assert (code, err) == (0, "")
    assert follower.lines.empty(), "nothing printed twice"
    assert len(list(tmp_path.glob("audit.jsonl.*"))) >= 3


def test_follow_applies_the_filters(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    path.write_text(line(decision("g0", at(0), R.HOST_NOT_ALLOWED, "a.test", tenant="t2")))
    follower = Follower(path, "-n", "1", "--tenant", "t2")
    try:
        assert follower.next_ids(1) == ["g0"], "the follower is reading"
        with path.open("a") as f:
            for i, tenant in enumerate(["t1", "t2", "t1", "t2"], 1):
                f.write(line(decision(f"g{i}", at(i), R.HOST_NOT_ALLOWED, "a.test", tenant=tenant)))
        assert follower.next_ids(2) == ["g2", "g4"]
    finally:
        code, _ = follower.stop()
    assert code == 0


@pytest.mark.parametrize(
    ("sig", "ignore_sigint"),
    [(signal.SIGINT, False), (signal.SIGINT, True), (signal.SIGTERM, False), (signal.SIGTERM, True)],
    ids=[
        "Ctrl-C ends it",
        "SIGINT ends it even when inherited as ignored (a background job)",
        "SIGTERM ends it cleanly",
        "SIGTERM ends it cleanly in a background job",
    ],
)
def test_follow_ends_cleanly_on_sigint_and_sigterm(
    tmp_path: Path, sig: signal.Signals, ignore_sigint: bool
) -> None:
    path = tmp_path / "audit.jsonl"
    path.write_text(line(decision("s0", at(0), R.HOST_NOT_ALLOWED, "a.test")))
    follower = Follower(path, "-n", "1", ignore_sigint=ignore_sigint)
    try:
        assert follower.next_ids(1) == ["s0"], "the follower is reading"
    finally:
        code, err = follower.stop(sig)
    assert (code, err) == (0, ""), "a stopped follower exits 0 without a traceback"


def take(source: JsonlSource, n: int) -> list[str]:
    """The ids of the next n records `follow` yields; gives up (stops following) after 10 s."""
    stop = threading.Event()
    timer = threading.Timer(10, stop.set)
    timer.start()
    try:
        with contextlib.closing(source.follow(Query(), stop)) as follow:
            return [r["decision_id"] for _, r in zip(range(n), follow, strict=False)]
    finally:
        timer.cancel()


def records_named(*names: str) -> list[str]:
    """Encoded decision records with these ids."""
    return [line(decision(name, at(i), R.HOST_NOT_ALLOWED, "evil.test")) for i, name in enumerate(names)]


def test_follow_reads_every_file_rotated_while_it_was_not_looking(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    first = records_named("a0", "a1")
    sink = JsonlFileSink(path, max_bytes=3 * len(first[0]) - 1, backups=5)
    sink.write(first)
    source = JsonlSource(path, poll_seconds=0.01)
    assert [r["decision_id"] for r in source.latest(Query(), 1)] == ["a1"]
    sink.write(records_named("a2"))  # rotates: the file `latest` read is now audit.jsonl.2 …
    sink.write(records_named("b0", "b1", "b2"))  # … and this one audit.jsonl.1, never live while followed
    sink.write(records_named("c0"))
    sink.close()
    assert take(source, 5) == ["a2", "b0", "b1", "b2", "c0"]
    assert (source.gaps, source.malformed) == (0, 0)


def test_follow_finds_the_file_it_stopped_in_when_a_rotation_renames_it_during_the_listing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The follower lists the audit files, then opens them: a rotation between the two renames
    the file `latest` stopped in out of the listing. Seen under load as a follower that never
    printed the record the rotation carried."""
    from sandgate.proxy.audit import files

    path = tmp_path / "audit.jsonl"
    a0, a1, a2 = records_named("a0", "a1", "a2")
    sink = JsonlFileSink(path, max_bytes=3 * len(a0) - 1, backups=5)
    sink.write([a0, a1])
    source = JsonlSource(path, poll_seconds=0.01)
    assert [r["decision_id"] for r in source.latest(Query(), 1)] == ["a1"]
    sink.write([a2])  # rotates: the file `latest` stopped in is audit.jsonl.1 now
    sink.close()
    listings = [[path]]  # the first listing, made before the rename: the new live file only
    real = files.audit_files
    monkeypatch.setattr(files, "audit_files", lambda p: listings.pop() if listings else real(p))
    assert take(source, 1) == ["a2"]
    assert source.gaps == 0


def test_follow_counts_a_gap_when_rotation_outran_it(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    a0, a1, a2, a3 = records_named("a0", "a1", "a2", "a3")
    sink = JsonlFileSink(path, max_bytes=1, backups=1)  # every write rotates
    sink.write([a0])
    source = JsonlSource(path, poll_seconds=0.01)
    assert [r["decision_id"] for r in source.latest(Query(), 5)] == ["a0"]
    # Held open so its inode number is not reused by a new file once rotation deletes it.
    with path.open("rb"):
        sink.write([a1])
        sink.write([a2])  # the file `latest` stopped in is deleted: a1 is lost to the follower
        sink.close()
        with path.open("a") as f:
            f.write(a3)
        assert take(source, 1) == ["a3"]
    assert source.gaps == 1


def test_follow_starts_over_when_the_file_is_truncated(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    path.write_text("".join(records_named("a0", "a1", "a2")))
    source = JsonlSource(path, poll_seconds=0.01)
    source.latest(Query(), 0)
    path.write_text("".join(records_named("b0")))  # truncated in place (copytruncate), shorter
    assert take(source, 1) == ["b0"]


@pytest.mark.slow
def test_a_large_file_is_read_in_bounded_memory(tmp_path: Path) -> None:
    """200 MB, with a 64 MB line in the middle: peak RSS grows by far less than either."""
    big = tmp_path / "big" / "audit.jsonl"
    big.parent.mkdir()
    one = line(decision("r", at(0), R.HOST_NOT_ALLOWED, "evil.test", tenant="t1")).encode()
    other = line(decision("r", at(1), R.ALLOWED, "api.test", tenant="t2")).encode()
    block = (one * 9 + other) * 1000
    blocks = 68 * 1024 * 1024 // len(block)
    with big.open("wb") as f:
        for _ in range(blocks):
            f.write(block)
        f.write(b'{"event":"decision","x":"' + b"y" * (64 << 20) + b'"}\n')
        for _ in range(blocks):
            f.write(block)
    assert big.stat().st_size > 190_000_000
    warm = tmp_path / "warm" / "audit.jsonl"
    warm.parent.mkdir()
    warm.write_bytes(block)
    script = """
import contextlib, io, json, resource, sys
from sandgate.proxy.cli.main import main

def run(*argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["audit", *argv])
    return out.getvalue()

for path in (sys.argv[2], sys.argv[1]):  # a small file first: imports and code paths warmed up
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    stats = json.loads(run("stats", "--format", "json", "--file", path))
    query = run("query", "--tenant", "t2", "--limit", "3", "--format", "json", "--file", path)
print(json.dumps({"grew_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before,
                  "records": stats["records"], "query": len(query.splitlines())}))
"""
    done = subprocess.run(
        [sys.executable, "-c", script, str(big), str(warm)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result = json.loads(done.stdout)
    assert result["grew_kib"] < 32 * 1024, f"peak RSS grew by {result['grew_kib'] // 1024} MiB"
    assert (result["records"], result["query"]) == (2 * blocks * 10_000, 3)
    assert done.stderr.count("sandgate audit: skipped 1 malformed line\n") == 1
