"""Policy tests: Rego `test_` rules, and YAML cases (a request → the expected decision).

A case file (rules/tests/*.yaml):

    rules: ..                    # the rules directory, relative to this file (default: the
                                 # folder above tests/)
    resolve:                     # name → addresses for this file's cases; other names resolve
      api.github.com: [140.82.112.6]   # as the gateway config's resolver.hosts (with --config),
                                       # else to 93.184.215.14 (nothing is ever dialled)
    cases:
      - name: reads from the API are allowed
        tenant: acme             # or sandbox: acme-1 (its tenant is looked up)
        request: GET https://api.github.com/repos/acme/tools   # or: CONNECT api.github.com:443
        headers: {accept: application/json}
        body_size: 0
        expect: {decision: allow}                # allow | deny | would_deny
      - name: writes elsewhere are not
        tenant: acme
        request: POST https://api.github.com/repos/evil/tools/issues
        expect: {decision: deny, reason: policy_denied}
      - name: issues only in the tenant's repositories
        tenant: acme
        request: POST https://mcp.github.example/mcp
        body: {jsonrpc: "2.0", id: 1, method: tools/call,
               params: {name: create_issue, arguments: {repo: evil/x}}}
        expect: {decision: deny, reason: policy_denied}

Cases are decided by `decide` with the embedded engine and no cache, exactly as the gateway
would, except for the resolver. A case with a `body` (a JSON value, or a string sent as is)
goes on as the gateway's body goes on when the allow rule has an `mcp:`, `jsonrpc:` or
`graphql:` section: the section decides the body (a refusal's reason is the protocol's,
`tool_denied`, `argument_not_allowed` ...), then, when the tenant's Rego reads `input.mcp`,
`input.jsonrpc` or `input.graphql`, Rego decides each message (phase "message",
sandgate.policy.rego.messages). Without such a section the body is not read. The body sets
`body_size` when the case does not. Rego tests run in a compiler process (`rego.compiler`).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field

from sandgate.policy.address_guard import AddressGuard
from sandgate.policy.decide import decide
from sandgate.policy.decision import Decision, EgressRequest, Identity, Mode, Phase
from sandgate.policy.errors import HostError, PolicyLoadError, SourceLocation
from sandgate.policy.hosts import normalise_host
from sandgate.policy.matcher import UNPARSEABLE_PATH
from sandgate.policy.model.loader import load_policy_dir
from sandgate.policy.model.policyset import PolicySet
from sandgate.policy.model.tenant import NAME_PATTERN
from sandgate.policy.model.yamlsource import load_yaml, validate
from sandgate.policy.overrides import decide_readings
from sandgate.policy.paths import normalise_path
from sandgate.policy.protocols.decide import (
    BodyVerdict,
    decide_graphql_body,
    decide_jsonrpc_body,
    decide_mcp_body,
)
from sandgate.policy.protocols.json_strict import loads_strict
from sandgate.policy.protocols.reasons import ProtocolReason
from sandgate.policy.protocols.rules import GraphqlSection, JsonRpcSection, McpSection
from sandgate.policy.reasons import Reason
from sandgate.policy.rego.compiler import RegoTestResult, run_rego_tests
from sandgate.policy.rego.engine import make_engine
from sandgate.policy.rego.message_input import graphql_variables
from sandgate.policy.rego.messages import (
    ReadMessages,
    decide_messages,
    message_inputs,
    protocol_of,
    reads_messages,
)
from sandgate.policy.rego.program import RegoModule
from sandgate.policy.rego.protocol import PolicyEngine
from sandgate.policy.rego.source import module_facts, ref_text
from sandgate.policy.resolver import Resolution, StaticResolver
from sandgate.policy.upgrade import requested_upgrade

__all__ = [
    "UNLISTED_ADDRESS",
    "CaseFile",
    "TestOutcome",
    "TestReport",
    "parse_request",
    "rego_test_modules",
    "run_case_file",
    "run_rego_dir",
]

# rego-cpp mis-evaluates (or cannot compile) `with input as {...}` over rules that read other rules.
WHOLE_INPUT_HINT = (
    "rego-cpp cannot replace the whole input under nested rules: use `with input.x as` per field"
)
_WHOLE_INPUT = re.compile(r"\bwith\s+input\s+as\b")

# Where names a case file does not list resolve to: public, so the address guard lets it be.
UNLISTED_ADDRESS = "93.184.215.14"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Expect(_Strict):
    """The expected decision, and the reason when given."""

    decision: Literal["allow", "deny", "would_deny"] = Field(
        description="the verdict the case needs (would_deny: a report-mode tenant's refusal)"
    )
    reason: Reason | ProtocolReason | None = Field(
        default=None,
        description="the reason code it needs too (a protocol one, tool_denied, for a body); unset: any",
    )


class Case(_Strict):
    """One request and what the policy must answer."""

    name: str = Field(description="what the case checks, shown in the report")
    tenant: Annotated[str, Field(pattern=NAME_PATTERN)] | None = Field(
        default=None,
        description="the tenant whose policy decides (as a sandbox named `test`); or give sandbox",
    )
    sandbox: Annotated[str, Field(pattern=NAME_PATTERN)] | None = Field(
        default=None,
        description=(
            "a sandbox of the rules directory; its tenant decides (a tenant given too must be that one)"
        ),
    )
    request: str = Field(description="'METHOD URL', or 'CONNECT host:port'")
    headers: dict[str, str] = Field(
        default_factory=dict,
        description="request headers, name → value; method overrides among them are decided too",
    )
    body_size: Annotated[int, Field(ge=0)] | None = Field(
        default=None, description="the declared body length in bytes (Rego's input.request.body_size)"
    )
    client: str | None = Field(default=None, description="the guest's address (Rego's input.client)")
    credentials: list[str] = Field(
        default_factory=list, description="credential names the broker would use (Rego's input.credentials)"
    )
    body: Any = Field(
        default=None,
        description=(
            "the request body: a JSON value (sent as JSON) or a string (sent as is); decided by the allow "
            "rule's mcp:, jsonrpc: or graphql: section, then message by message by the tenant's Rego when it "
            "reads input.mcp, input.jsonrpc or input.graphql"
        ),
    )
    expect: Expect


class CaseFile(_Strict):
    """A file of cases against one rules directory."""

    rules: str | None = Field(
        default=None,
        description="the rules directory, relative to this file; unset: the folder above this file's folder",
    )
    resolve: dict[str, list[str]] = Field(
        default_factory=dict,
        description=(
            "name → addresses for this file's cases; other names as the gateway config's resolver.hosts "
            "(with --config), else a fixed public address. Nothing is looked up or dialled"
        ),
    )
    cases: list[Case] = Field(default_factory=list)


@dataclass(frozen=True, slots=True)
class TestOutcome:
    """One test: its name, pass/fail/error, and what went wrong."""

    name: str
    result: str
    detail: str = ""


@dataclass(frozen=True, slots=True)
class TestReport:
    """The tests of one source (a case file or a Rego test module)."""

    source: str
    outcomes: tuple[TestOutcome, ...]


def parse_request(
    text: str, *, headers: Iterable[tuple[str, str]] = (), body_size: int | None = None
) -> EgressRequest:
    """'GET https://host/path?q' or 'CONNECT host:port' → an EgressRequest (host and path normalised)."""
    method, _, target = text.strip().partition(" ")
    method, target = method.upper(), target.strip()
    pairs = tuple(headers)
    if not method or not target:
        raise ValueError("a request is 'METHOD URL' or 'CONNECT host:port'")
    if method == "CONNECT":
        host, port = _authority(target.removeprefix("//"), 443)
        return EgressRequest(Phase.CONNECT, host, port)
    parts = urlsplit(target)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"{target!r}: the URL needs http:// or https:// and a host")
    host, port = _authority(parts.netloc, 443 if parts.scheme == "https" else 80)
    try:
        path = normalise_path(parts.path or "/")
    except HostError:
        path = UNPARSEABLE_PATH
    return EgressRequest(
        Phase.REQUEST,
        host,
        port,
        scheme=parts.scheme,
        method=method,
        path=path,
        sni=host if parts.scheme == "https" else None,
        query=parts.query or None,
        headers=pairs,
        body_size=body_size,
        upgrade=requested_upgrade(pairs),
    )


def _authority(text: str, default_port: int) -> tuple[str, int]:
    host, port = text, default_port
    if text.startswith("["):
        end = text.find("]")
        host, rest = text[: end + 1], text[end + 1 :]
        port = int(rest[1:]) if rest.startswith(":") else default_port
    elif text.count(":") == 1:
        host, _, p = text.partition(":")
        port = int(p)
    try:
        return normalise_host(host), port
    except HostError as e:
        raise ValueError(str(e)) from None


class _TestResolver:
    """Names the case file lists resolve as listed, then the gateway's static names; any other
    name to UNLISTED_ADDRESS."""

    def __init__(
        self, hosts: Mapping[str, Sequence[str]], gateway_hosts: Mapping[str, Sequence[str]]
    ) -> None:
        self._static = (StaticResolver(hosts), StaticResolver(gateway_hosts))

    async def resolve(self, host: str) -> Resolution:
        for static in self._static:
            if static.knows(host):
                return await static.resolve(host)
        return Resolution((UNLISTED_ADDRESS,), 300.0)


def run_case_file(
    path: Path,
    *,
    policies: dict[Path, PolicySet] | None = None,
    guard: AddressGuard | None = None,
    hosts: Mapping[str, Sequence[str]] | None = None,
) -> TestReport:
    """Run the cases of one file; a file (or its rules) that does not load raises PolicyLoadError.

    `guard`: the operator's address guard (a gateway config's); default: one that opens no range.
    `hosts`: the gateway's static names (a gateway config's resolver.hosts), for names the file
    does not list. Nothing is ever looked up: nameservers are never asked."""
    doc = load_yaml(path)
    spec = validate(CaseFile, doc)
    rules_dir = (path.parent / spec.rules).resolve() if spec.rules else path.resolve().parent.parent
    cache = policies if policies is not None else {}
    policy = cache.get(rules_dir)
    if policy is None:
        policy = cache[rules_dir] = load_policy_dir(rules_dir)
    where = [doc.locate(("cases", i)) for i in range(len(spec.cases))]
    outcomes = asyncio.run(_run_cases(spec, policy, where, guard or AddressGuard(), hosts or {}))
    return TestReport(str(path), tuple(outcomes))


async def _run_cases(
    spec: CaseFile,
    policy: PolicySet,
    where: list[SourceLocation],
    guard: AddressGuard,
    gateway_hosts: Mapping[str, Sequence[str]],
) -> list[TestOutcome]:
    resolver = _TestResolver(spec.resolve, gateway_hosts)
    engine = make_engine("embedded", cache_size=0)
    return [
        await _run_case(case, policy, resolver, engine, guard, at)
        for case, at in zip(spec.cases, where, strict=True)
    ]


@dataclass(frozen=True, slots=True)
class _Answer:
    """What the policy answered a case: verdict, reason, the rule that decided, its detail."""

    verdict: str
    reason: Reason | ProtocolReason
    rule: str | None = None
    detail: str = ""


async def _run_case(
    case: Case,
    policy: PolicySet,
    resolver: _TestResolver,
    engine: PolicyEngine,
    guard: AddressGuard,
    where: SourceLocation,
) -> TestOutcome:
    identity = _identity(case, policy)
    if isinstance(identity, str):
        return TestOutcome(case.name, "error", f"{where}: {identity}")
    data = _body_bytes(case.body)
    body_size = case.body_size if case.body_size is not None or data is None else len(data)
    try:
        request = parse_request(case.request, headers=case.headers.items(), body_size=body_size)
    except ValueError as e:
        return TestOutcome(case.name, "error", f"{where}: {e}")
    if case.client or case.credentials:
        request = replace(request, client=case.client, credentials=tuple(case.credentials))

    async def decide_one(who: Identity, req: EgressRequest, *, address: str | None = None) -> Decision:
        return await decide(policy, who, req, resolver, guard, address=address, engine=engine)

    decision = await decide_one(identity, request)
    if decision.allowed:
        decision = await decide_readings(decide_one, identity, request, decision)
    got = _Answer(decision.verdict, decision.reason, decision.rule_id, decision.detail)
    if data is not None and decision.allowed and decision.messages is not None:
        got = await _body_answer(data, policy, identity, request, decision, engine) or got
    want = case.expect
    if got.verdict == want.decision and (want.reason is None or got.reason == want.reason):
        return TestOutcome(case.name, "pass")
    expected = want.decision + (f" {want.reason.value}" if want.reason else "")
    rule = f", rule {got.rule}" if got.rule else ""
    detail = f"expected {expected}, got {got.verdict} {got.reason.value}{rule}"
    if got.detail:
        detail += f" ({got.detail})"
    return TestOutcome(case.name, "fail", f"{where}: {detail}")


def _body_bytes(body: Any) -> bytes | None:
    """A case's body as sent: a string as is, any other value as JSON; None without one."""
    if body is None:
        return None
    if isinstance(body, str):
        return body.encode()
    return json.dumps(body, separators=(",", ":")).encode()


async def _body_answer(
    data: bytes,
    policy: PolicySet,
    identity: Identity,
    request: EgressRequest,
    decision: Decision,
    engine: PolicyEngine,
) -> _Answer | None:
    """The refusal of an allowed request's body, as the gateway's agent-protocol addons give it:
    the rule's section first, then the tenant's Rego per message; None when both allow."""
    section = decision.messages
    assert section is not None
    verdict, read = _decide_section(section, data)
    report = decision.mode is Mode.REPORT
    if not verdict.allowed or read is None:
        return _Answer("would_deny" if report else "deny", verdict.reason, verdict.rule, verdict.detail)
    tenant = policy.tenant(identity.tenant)
    program = tenant.rego if tenant is not None else None
    if program is None or not reads_messages(program, protocol_of(section)):
        return None
    session = next((v for k, v in request.headers if k.lower() == "mcp-session-id"), None)
    variables = graphql_variables(loads_strict(data)) if isinstance(section, GraphqlSection) else ()
    inputs = message_inputs(read, session_id=session, variables=variables)
    batch = len(read) > 1 if isinstance(read, tuple) else read.batch
    said = await decide_messages(engine, program, identity, request, decision.address, inputs, batch=batch)
    if said.allowed:
        return None
    body = said.body
    verdict_text = "would_deny" if report and not said.fault else "deny"
    return _Answer(verdict_text, body.reason, body.rule, body.detail)


def _decide_section(
    section: McpSection | JsonRpcSection | GraphqlSection, data: bytes
) -> tuple[BodyVerdict, ReadMessages | None]:
    """The section's verdict on a body, and the body as its reader read it (None: unread)."""
    if isinstance(section, McpSection):
        return decide_mcp_body(data, section)
    if isinstance(section, GraphqlSection):
        verdict, requests = decide_graphql_body(data, section)
        return verdict, requests or None
    return decide_jsonrpc_body(data, section)


def _identity(case: Case, policy: PolicySet) -> Identity | str:
    if case.sandbox:
        record = policy.sandboxes.get(case.sandbox)
        if record is None:
            return f"sandbox {case.sandbox!r} is not registered"
        if case.tenant and case.tenant != record.tenant:
            return f"sandbox {case.sandbox!r} belongs to tenant {record.tenant!r}"
        return Identity(record.tenant, record.sandbox)
    if case.tenant:
        return Identity(case.tenant, "test")
    return "a case names a tenant or a sandbox"


def rego_test_modules(paths: Sequence[Path]) -> list[RegoModule]:
    """Every .rego file under `paths` (files or folders), read and scanned."""
    files: list[Path] = []
    for p in paths:
        files += sorted(p.rglob("*.rego")) if p.is_dir() else [p]
    out = []
    for f in dict.fromkeys(files):
        try:
            text = f.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise PolicyLoadError(SourceLocation(str(f)), "", f"cannot read: {e}") from e
        out.append(RegoModule(str(f), text, module_facts(text)))
    return out


def run_rego_dir(modules: Sequence[RegoModule], data: dict[str, object]) -> list[TestReport]:
    """Run every `test_` rule in `modules` with `data`. Each test module (`*_test.rego`) runs
    apart, with every other module: rego-cpp compiles a set of modules as a whole, and one test
    module it cannot compile must not take the others' tests with it."""
    shared = [m for m in modules if not m.path.endswith("_test.rego")]
    groups: list[tuple[RegoModule, list[tuple[str, str, str]]]] = []
    for m in modules:
        pkg = m.facts.package
        if pkg is None or not m.facts.tests:
            continue
        tests = [
            (f"data.{ref_text(pkg)}.{name}", f"{m.path}\0{name}", "/".join((*pkg, name)))
            for name in m.facts.tests
        ]
        groups.append((m, tests))
    # A module with tests that is not a *_test.rego is shared; it is not sent twice.
    results: list[RegoTestResult] = run_rego_tests(shared, groups, data) if groups else []
    by_module: dict[str, list[TestOutcome]] = {}
    for r in results:
        source, name = r.name.split("\0", 1)
        detail = r.detail
        if r.result != "pass" and _WHOLE_INPUT.search(_text_of(modules, source)):
            detail += f" ({WHOLE_INPUT_HINT})"
        by_module.setdefault(source, []).append(TestOutcome(name, r.result, detail))
    return [TestReport(source, tuple(outcomes)) for source, outcomes in by_module.items()]


def _text_of(modules: Sequence[RegoModule], path: str) -> str:
    return next((m.text for m in modules if m.path == path), "")
