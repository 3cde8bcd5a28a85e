"""Allow rules that would have permitted a sandbox's repeated denials, as YAML to review.

Only denials a missing allow rule explains are used: host_not_allowed, port_not_allowed,
method_not_allowed and path_not_allowed (`deny` and report mode's `would_deny`).
private_address denials get an operator-level section instead (suggest_operator). They are
grouped by host and by level: connection-level denials (connect, tls) give a rule of hosts and
ports; request-level denials give hosts, ports, methods and paths, where several paths under
one first segment are widened to their longest common prefix (`/v1/**`). Each rule is checked
with the policy's own `Rule` model before it is printed. Nothing here writes a policy file.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import yaml
from pydantic import ValidationError

from sandgate.policy.model.tenant import Rule, check_path_glob
from sandgate.policy.reasons import Reason
from sandgate.proxy.audit.calls import protocol_facts
from sandgate.proxy.audit.format import clean
from sandgate.proxy.audit.query import AuditInputError, Record, dest_host, record_time
from sandgate.proxy.audit.suggest_operator import InternalAddresses, time_span
from sandgate.proxy.audit.suggest_protocols import ProtocolEvidence

__all__ = ["SUGGESTIBLE", "Evidence", "collapse_paths", "collect", "render_suggestions", "suggested_rules"]

SUGGESTIBLE = frozenset(
    {Reason.HOST_NOT_ALLOWED, Reason.PORT_NOT_ALLOWED, Reason.METHOD_NOT_ALLOWED, Reason.PATH_NOT_ALLOWED}
)
DENIED = frozenset({"deny", "would_deny"})

# Why an allow rule would not have changed a denial with this reason.
WHY_NOT: dict[str, str] = {
    Reason.NO_IDENTITY: "the connection had no identity, so no tenant's rules applied",
    Reason.HOST_DENIED: "a deny rule matched, and deny rules win over allow rules",
    Reason.DNS_FAILURE: "the name did not resolve",
    Reason.DNS_DENIED: "name lookups no rule allows; the port is unknown, so list them with "
    "`sandgate audit query --reason dns_denied` and write rules by hand",
    Reason.SNI_MISMATCH: "the TLS name differed from the approved destination (a spoofing guard)",
    Reason.HOST_MISMATCH: "the Host header differed from the approved destination (a spoofing guard)",
    Reason.PROTOCOL_NOT_ALLOWED: "the protocol is refused on that listener, whatever the rules",
    Reason.POLICY_DENIED: "the tenant's Rego policy denied it: change the Rego, not the allow list",
    Reason.POLICY_ERROR: "the policy failed to evaluate",
    Reason.CREDENTIAL_HOST_MISMATCH: "a credential placeholder was sent to a host it is not bound to",
    Reason.RATE_LIMITED: "the sandbox exceeded its request rate",
    Reason.BODY_TOO_LARGE: "the request body exceeded the sandbox's limit",
    Reason.INTERNAL_ERROR: "a gateway fault, not a policy decision",
    Reason.INVALID_REQUEST: "the request could not be parsed into one destination, or a body a "
    "rule's mcp:, jsonrpc: or graphql: section reads could not be read",
    Reason.RESOURCE_NOT_ALLOWED: "an mcp.resources list refused it; the trail does not keep the URI "
    "(only a record's detail may): write the glob by hand",
    Reason.PROMPT_NOT_ALLOWED: "an mcp.prompts list refused it; the trail does not keep the prompt's "
    "name (only a record's detail may): write the glob by hand",
    Reason.APPROVAL_REQUIRED: "an ask rule held it for an operator: approve or deny it instead",
}
_ID_CHARS = re.compile(r"[^a-z0-9._-]")


@dataclass(slots=True)
class Group:
    """The denials of one host at one level (request-level when `requests`)."""

    host: str
    requests: bool
    count: int = 0
    ports: set[int] = field(default_factory=set)
    methods: set[str] = field(default_factory=set)
    paths: set[str] = field(default_factory=set)
    unknown_path: bool = False
    reasons: Counter[str] = field(default_factory=Counter)
    first: datetime | None = None
    last: datetime | None = None

    def add(self, record: Record, reason: str) -> None:
        """Count one denial of this group."""
        self.count += 1
        self.reasons[reason] += 1
        dest, method, path = record.get("dest"), record.get("method"), record.get("path")
        port = dest.get("port") if isinstance(dest, dict) else None
        if isinstance(port, int):
            self.ports.add(port)
        if self.requests and isinstance(method, str):
            self.methods.add(method.upper())
        if self.requests:
            if isinstance(path, str) and path.startswith("/"):
                self.paths.add(path.partition("?")[0])
            else:
                self.unknown_path = True
        moment = record_time(record)
        if moment is not None:
            self.first = moment if self.first is None else min(self.first, moment)
            self.last = moment if self.last is None else max(self.last, moment)


@dataclass(slots=True)
class Evidence:
    """What a sandbox's denials say: groups to suggest from and what was set aside."""

    sandbox: str
    groups: dict[tuple[str, bool], Group] = field(default_factory=dict)
    skipped: Counter[str] = field(default_factory=Counter)
    tenants: set[str] = field(default_factory=set)
    no_host: int = 0
    denials: int = 0
    internal: InternalAddresses = field(default_factory=InternalAddresses)
    protocols: ProtocolEvidence = field(default_factory=ProtocolEvidence)

    def add(self, record: Record) -> None:
        """Take one record into account (allowed ones are ignored)."""
        if self._add_protocol(record):
            return
        if record.get("decision") not in DENIED:
            return
        self._count(record)
        reason = str(record.get("reason"))
        if reason == Reason.PRIVATE_ADDRESS:
            self.internal.add(record)
            return
        if reason not in SUGGESTIBLE:
            self.skipped[reason] += 1
            return
        host = dest_host(record)
        if host is None:
            self.no_host += 1
            return
        key = (host.strip("[]").lower(), record.get("phase") == "request")
        self.groups.setdefault(key, Group(*key)).add(record, reason)

    def _count(self, record: Record) -> None:
        """Count one denial, and its tenant."""
        self.denials += 1
        if isinstance(tenant := record.get("tenant"), str):
            self.tenants.add(tenant)

    def _add_protocol(self, record: Record) -> bool:
        """Take a body an mcp: or jsonrpc: section refused (in report mode too: its record's
        decision is then `allow`); False when the record is no such refusal."""
        found = protocol_facts(record)
        if found is None or found[1].get("verdict") not in DENIED:
            return False
        self._count(record)
        host = dest_host(record)
        if host is None:
            self.no_host += 1
        elif not self.protocols.add(record, host.strip("[]").lower()):
            self.skipped[str(found[1].get("reason"))] += 1
        return True


def collect(records: Iterable[Record], sandbox: str) -> Evidence:
    """The evidence of one sandbox's denials."""
    evidence = Evidence(sandbox)
    for record in records:
        if record.get("sandbox") == sandbox:
            evidence.add(record)
    if len(evidence.tenants) > 1:
        names = ", ".join(sorted(evidence.tenants))
        raise AuditInputError(f"sandbox {sandbox!r} appears under tenants {names}: add --tenant")
    return evidence


def _common_prefix(paths: list[list[str]]) -> list[str]:
    """The leading segments all paths share."""
    common: list[str] = []
    for segments in zip(*paths, strict=False):
        if len(set(segments)) != 1:
            break
        common.append(segments[0])
    return common


def collapse_paths(paths: Iterable[str]) -> list[str]:
    """Path globs: two or more paths under one first segment become `/<common prefix>/**`."""
    by_first: dict[str, list[list[str]]] = {}
    for path in set(paths):
        segments = path.split("/")[1:]
        by_first.setdefault(segments[0], []).append(segments)
    out: list[str] = []
    for group in by_first.values():
        common = _common_prefix(group)
        below = [s for s in group if len(s) > len(common)]
        exact = [s for s in group if len(s) == len(common)]
        if len(below) >= 2:
            out.append("/" + "/".join([*common, "**"]))
        else:
            exact += below
        out += ["/" + "/".join(s) for s in exact]
    return sorted(out)


def _rule_id(group: Group) -> str:
    """`suggested-<host>[-requests]`, shortened with a hash to fit a rule id."""
    suffix = "-requests" if group.requests else ""
    base = "suggested-" + _ID_CHARS.sub("-", group.host)
    if len(base + suffix) > 63:
        digest = hashlib.sha256(group.host.encode()).hexdigest()[:8]
        base = f"{base[: 63 - len(suffix) - 9]}-{digest}"
    return base + suffix


def _destination(host: str) -> dict[str, list[str]]:
    """`hosts: [name]`, or `cidrs: [ip/32]` for an address (rules name addresses as networks)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return {"hosts": [host]}
    return {"cidrs": [str(ipaddress.ip_network(address))]}


def _rule(group: Group) -> tuple[dict[str, Any], list[str]]:
    """The rule suggested by one group, and the paths it had to leave out."""
    rule: dict[str, Any] = {"id": _rule_id(group), **_destination(group.host)}
    if group.ports:
        rule["ports"] = sorted(group.ports)
    left_out: list[str] = []
    if group.requests and group.methods:
        rule["methods"] = sorted(group.methods)
    if group.requests and not group.unknown_path:
        usable = []
        for path in group.paths:
            try:
                usable.append(check_path_glob(path))
            except ValueError:
                left_out.append(path)
        if usable:
            rule["paths"] = collapse_paths(usable)
    reasons = ", ".join(f"{r} {n}" for r, n in sorted(group.reasons.items(), key=lambda kv: (-kv[1], kv[0])))
    rule["comment"] = f"{group.count} denials ({reasons}), {time_span(group.first, group.last)}"
    return rule, left_out


def suggested_rules(evidence: Evidence, min_count: int) -> tuple[list[dict[str, Any]], list[str]]:
    """The rules to suggest, most denied first, and notes on what was left out."""
    rules: list[dict[str, Any]] = []
    notes: list[str] = []
    for group in sorted(evidence.groups.values(), key=lambda g: (-g.count, g.host, g.requests)):
        level = "requests" if group.requests else "connections"
        if group.count < min_count:
            notes.append(
                f"{group.host} ({level}): {group.count} denial(s), fewer than --min-count {min_count}"
            )
            continue
        rule, left_out = _rule(group)
        try:
            Rule.model_validate(rule)
        except ValidationError as e:
            notes.append(f"{group.host} ({level}): no valid rule: {e.errors()[0]['msg']}")
            continue
        if left_out:
            notes.append(f"{group.host}: paths a rule cannot name, left out: {', '.join(sorted(left_out))}")
        rules.append(rule)
    return rules, notes


def _header(evidence: Evidence) -> list[str]:
    """The comment lines that open the suggestions."""
    tenant = next(iter(evidence.tenants), None)
    where = f"the `allow:` list of tenant {clean(tenant)}'s file" if tenant else "the tenant's `allow:` list"
    return [
        f"# Suggested allow rules for sandbox {clean(evidence.sandbox)}, "
        f"from {evidence.denials} denials in the audit trail.",
        "# SUGGESTIONS TO REVIEW: sandgate never applies them automatically. Copy the ones you want",
        f"# into {where}, then run `sandgate policy check`.",
        "# Several paths under one prefix are widened to `/prefix/**`: narrow them if that is too much.",
    ]


def _skipped_lines(evidence: Evidence, notes: list[str]) -> list[str]:
    """Comment lines on the denials no rule is suggested for, and why."""
    lines: list[str] = []
    if evidence.skipped:
        lines.append("# Not suggested: an allow rule would not change these denials:")
        for reason, n in sorted(evidence.skipped.items(), key=lambda kv: (-kv[1], kv[0])):
            why = WHY_NOT.get(reason, "an allow rule would not change this decision")
            lines.append(f"#   {n} {clean(reason)}: {why}")
    if evidence.no_host:
        lines.append(f"# Not suggested: {evidence.no_host} denials without a destination host.")
    if notes:
        lines.append("# Not suggested or narrowed:")
        lines += [f"#   {clean(n)}" for n in notes]
    return lines


def render_suggestions(evidence: Evidence, min_count: int) -> str:
    """The suggestions as a commented YAML document with one `allow:` list."""
    rules, notes = suggested_rules(evidence, min_count)
    body = yaml.safe_dump({"allow": rules}, sort_keys=False, default_flow_style=None, width=1 << 16)
    tenant = next(iter(evidence.tenants), None)
    operator = evidence.internal.lines(tenant, min_count)
    protocols = evidence.protocols.lines(tenant, min_count)
    parts = [*_header(evidence), *_skipped_lines(evidence, notes), *operator, *protocols, body.rstrip("\n")]
    return "\n".join(parts) + "\n"
