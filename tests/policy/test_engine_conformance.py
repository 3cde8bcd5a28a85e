"""Engine conformance: one table of inputs → decisions, run against both engines; fail-closed.

There is no OPA server binary on these machines (not in Debian, PyPI or npm): the `opa`
engine runs against `support.opa_server.FakeOpaServer`, a small server with OPA's REST API
evaluated by the embedded interpreter. Set SANDGATE_OPA_BIN to an `opa` binary and the same
table also runs against a real OPA server (only that parameter is skipped without it).
The modules reach either server through `OpaEngine.push`, as `sandgate policy push` sends them.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import free_port
from support.opa_server import FakeOpaServer, RealOpa, start_real_opa

from sandgate.policy.decision import EgressRequest, Identity, Phase
from sandgate.policy.model.loader import load_policy_dir
from sandgate.policy.reasons import Reason
from sandgate.policy.rego.compiler import compile_programs
from sandgate.policy.rego.embedded import EmbeddedEngine
from sandgate.policy.rego.input_document import input_document
from sandgate.policy.rego.opa import OpaEngine
from sandgate.policy.rego.program import RegoModule, RegoProgram
from sandgate.policy.rego.protocol import PolicyEngine, RegoQuery, RegoVerdict
from sandgate.policy.rego.source import module_facts

GOOD = Path(__file__).parents[1] / "data" / "rego" / "good"
ACME = Identity("acme", "acme-1")


def req(method: str | None, host: str, path: str | None = "/", **kw: Any) -> EgressRequest:
    phase = Phase.CONNECT if method is None else Phase.REQUEST
    scheme = None if method is None else "https"
    return EgressRequest(phase, host, 443, scheme=scheme, method=method, path=path if method else None, **kw)


def acme_doc(request: EgressRequest, **override: Any) -> dict[str, Any]:
    return input_document(ACME, request, "93.184.215.14") | override


ACME_TABLE: list[tuple[str, dict[str, Any], bool, Reason, str]] = [
    (
        "a read from the GitHub API",
        acme_doc(req("GET", "api.github.com", "/repos/evil/x")),
        True,
        Reason.ALLOWED,
        "",
    ),
    (
        "a write to acme's repository",
        acme_doc(req("POST", "api.github.com", "/repos/acme/x")),
        True,
        Reason.ALLOWED,
        "",
    ),
    (
        "a write elsewhere",
        acme_doc(req("POST", "api.github.com", "/repos/evil/x")),
        False,
        Reason.POLICY_DENIED,
        "acme writes only to its own repositories",
    ),
    (
        "a method the methods example refuses",
        acme_doc(req("PUT", "pypi.org", "/simple/")),
        False,
        Reason.METHOD_NOT_ALLOWED,
        "PUT is not allowed to pypi.org",
    ),
    (
        "a body over the limit",
        acme_doc(req("POST", "upload.pypi.org", "/legacy/", body_size=2_000_000)),
        False,
        Reason.BODY_TOO_LARGE,
        "a 2000000-byte body is over the 1048576-byte limit for upload.pypi.org",
    ),
    (
        "a body of unknown length to a limited host",
        acme_doc(req("POST", "upload.pypi.org", "/legacy/")),
        False,
        Reason.BODY_TOO_LARGE,
        "a body of unknown length to upload.pypi.org (limit 1048576 bytes)",
    ),
    (
        "a header the tenant's rule refuses",
        acme_doc(req("GET", "pypi.org", "/simple/", headers=(("X-Debug-Token", "1"),))),
        False,
        Reason.POLICY_DENIED,
        "the x-debug-token header is not allowed",
    ),
    (
        "two denials: the smallest reason wins",
        acme_doc(req("PUT", "pypi.org", "/simple/", headers=(("X-Debug-Token", "1"),))),
        False,
        Reason.METHOD_NOT_ALLOWED,
        "PUT is not allowed to pypi.org",
    ),
    ("a CONNECT (no request fields yet)", acme_doc(req(None, "api.github.com")), True, Reason.ALLOWED, ""),
    (
        "an input version the module does not know",
        acme_doc(req("GET", "pypi.org"), version=3),
        False,
        Reason.POLICY_DENIED,
        "unsupported input version",
    ),
]

# Operator modules whose decision is odd: the engines must read them the same way.
ODD_DECISIONS: list[tuple[str, str, bool, Reason, bool]] = [
    ("a decision that is a string", 'decision := "allow"', False, Reason.POLICY_ERROR, True),
    (
        "allow with another reason",
        'decision := {"allow": true, "reason": "because"}',
        False,
        Reason.POLICY_ERROR,
        True,
    ),
    ("allow that is not a boolean", 'decision := {"allow": "yes"}', False, Reason.POLICY_ERROR, True),
    ("an undefined decision", "decision := 1 if false", False, Reason.POLICY_DENIED, False),
    (
        "an unknown reason",
        'decision := {"allow": false, "reason": "teapot"}',
        False,
        Reason.POLICY_DENIED,
        False,
    ),
    ("a denial without a reason", 'decision := {"allow": false}', False, Reason.POLICY_DENIED, False),
    ("a plain allow", 'decision := {"allow": true}', True, Reason.ALLOWED, False),
]


# --- the servers and the engines -----------------------------------------------------------


@pytest.fixture(scope="module")
def fake_opa() -> Iterator[FakeOpaServer]:
    with FakeOpaServer() as server:
        yield server


@pytest.fixture(scope="module", params=["embedded", "opa-fake", "opa-real"])
def backend(request: pytest.FixtureRequest) -> Iterator[str | FakeOpaServer | RealOpa]:
    if request.param == "embedded":
        yield "embedded"
    elif request.param == "opa-fake":
        yield request.getfixturevalue("fake_opa")
    else:
        binary = os.environ.get("SANDGATE_OPA_BIN")
        if not binary:
            pytest.skip("SANDGATE_OPA_BIN is not set: no real OPA server to compare with")
        server = start_real_opa(binary)
        yield server
        server.stop()


async def engine_for(backend: str | FakeOpaServer | RealOpa, program: RegoProgram) -> PolicyEngine:
    """An engine that will answer for `program`: embedded, or an OPA server it was pushed to."""
    if isinstance(backend, str):
        return EmbeddedEngine()
    backend.reset()
    engine = OpaEngine(backend.url, timeout=5.0)
    await engine.push(program.modules, {program.tenant: dict(program.data)})
    return engine


@pytest.fixture(scope="module")
def acme() -> RegoProgram:
    program = load_policy_dir(GOOD).tenants["acme"].rego
    assert program is not None
    return program


@pytest.fixture
async def acme_engine(
    backend: str | FakeOpaServer | RealOpa, acme: RegoProgram
) -> AsyncIterator[PolicyEngine]:
    engine = await engine_for(backend, acme)
    yield engine
    await engine.close()


@pytest.mark.parametrize(
    ("doc", "allowed", "reason", "message"),
    [row[1:] for row in ACME_TABLE],
    ids=[row[0] for row in ACME_TABLE],
)
async def test_conformance_acme(
    acme_engine: PolicyEngine,
    acme: RegoProgram,
    doc: dict[str, Any],
    allowed: bool,
    reason: Reason,
    message: str,
) -> None:
    verdict = await acme_engine.evaluate(RegoQuery(acme, doc))
    assert (verdict.allowed, verdict.reason, verdict.message, verdict.fault) == (
        allowed,
        reason,
        message,
        False,
    )


@pytest.mark.parametrize(
    ("rule", "allowed", "reason", "is_fault"),
    [row[1:] for row in ODD_DECISIONS],
    ids=[row[0] for row in ODD_DECISIONS],
)
async def test_conformance_odd_decisions(
    backend: str | FakeOpaServer | RealOpa, rule: str, allowed: bool, reason: Reason, is_fault: bool
) -> None:
    text = f"package sandgate\n\nimport rego.v1\n\n{rule}\n"
    source = RegoProgram(
        "odd", (RegoModule("odd/sandgate.rego", text, module_facts(text), operator=True),), {}
    )
    compiled, problems = compile_programs([source])
    assert problems == {}
    program = compiled["odd"]
    engine = await engine_for(backend, program)
    try:
        verdict = await engine.evaluate(RegoQuery(program, acme_doc(req("GET", "a.example.com"))))
    finally:
        await engine.close()
    assert (verdict.allowed, verdict.reason, verdict.fault) == (allowed, reason, is_fault)


# --- fail closed ---------------------------------------------------------------------------


@pytest.fixture
async def opa_engine(fake_opa: FakeOpaServer, acme: RegoProgram) -> AsyncIterator[OpaEngine]:
    fake_opa.reset()
    # Generous while the server compiles the push and builds its first answer (regopy, in this
    # process, on a loaded machine); a test of a fault sets the short timeout it measures.
    engine = OpaEngine(fake_opa.url, timeout=5.0)
    try:
        await engine.push(acme.modules, {"acme": dict(acme.data)})
        assert (await engine.evaluate(RegoQuery(acme, READ))).allowed
        yield engine
    finally:
        # Closed also when the push failed (a loaded machine): an open session would warn in
        # whichever test the garbage collector next runs in.
        fake_opa.fault = None
        await engine.close()


READ = acme_doc(req("GET", "api.github.com", "/repos/acme/x"))


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("slow", "the OPA server did not answer within 0.3s"),
        ("garbage", "the OPA server failed (ContentTypeError"),
        ("status500", "the OPA server failed (ClientResponseError 500)"),
        ("close", "the OPA server failed (ServerDisconnectedError)"),
        ("not_object", "the OPA server's answer is not an object"),
    ],
    ids=[
        "a server that times out",
        "a body that is not JSON",
        "an HTTP error",
        "a dropped connection",
        "JSON that is not an object",
    ],
)
async def test_opa_faults_are_policy_errors(
    opa_engine: OpaEngine, fake_opa: FakeOpaServer, acme: RegoProgram, fault: str, message: str
) -> None:
    assert (await opa_engine.evaluate(RegoQuery(acme, READ))).allowed
    opa_engine.timeout = 0.3
    fake_opa.fault, fake_opa.delay = fault, 1.0
    start = time.monotonic()
    verdict = await opa_engine.evaluate(RegoQuery(acme, READ))
    assert time.monotonic() - start < 0.9
    assert (verdict.allowed, verdict.reason, verdict.fault) == (False, Reason.POLICY_ERROR, True)
    assert verdict.message.startswith(message)


async def test_an_unreachable_server_is_a_policy_error(acme: RegoProgram) -> None:
    engine = OpaEngine(f"http://127.0.0.1:{free_port()}", timeout=0.5)
    try:
        verdict = await engine.evaluate(RegoQuery(acme, READ))
        assert not await engine.health()
    finally:
        await engine.close()
    assert (verdict.allowed, verdict.reason, verdict.fault) == (False, Reason.POLICY_ERROR, True)
    assert verdict.message.startswith("the OPA server failed (ClientConnectorError")


async def test_connections_to_the_server_are_reused(
    opa_engine: OpaEngine, fake_opa: FakeOpaServer, acme: RegoProgram
) -> None:
    before = fake_opa.connections
    for _ in range(20):
        assert (await opa_engine.evaluate(RegoQuery(acme, READ))).allowed
    assert await opa_engine.health()
    assert fake_opa.connections - before <= 1


async def test_concurrent_calls_share_one_client(fake_opa: FakeOpaServer, acme: RegoProgram) -> None:
    fake_opa.reset()
    engine = OpaEngine(fake_opa.url, timeout=5.0)
    try:
        await engine.push(acme.modules, {"acme": dict(acme.data)})
        client = await engine._session()
        verdicts = await asyncio.gather(*(engine.evaluate(RegoQuery(acme, READ)) for _ in range(30)))
        assert await engine._session() is client
    finally:
        await engine.close()
    assert [v.reason for v in verdicts] == [Reason.ALLOWED] * 30


async def test_the_server_gets_the_whole_redacted_input(
    opa_engine: OpaEngine, fake_opa: FakeOpaServer, acme: RegoProgram, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[Any] = []
    real = fake_opa.query

    def spy(path: list[str], document: Any) -> dict[str, Any]:
        seen.append(document)
        return real(path, document)

    monkeypatch.setattr(fake_opa, "query", spy)
    doc = acme_doc(req("GET", "api.github.com", "/x", headers=(("Authorization", "Bearer s3cr3t"),)))
    await opa_engine.evaluate(RegoQuery(acme, doc))
    assert seen == [doc]
    assert seen[0]["request"]["headers"] == {"authorization": "REDACTED"}


def test_embedded_engine_faults_never_allow(acme: RegoProgram, tmp_path: Path) -> None:
    engine = EmbeddedEngine()
    garbage = tmp_path / "garbage.rbb"
    garbage.write_bytes(b"not a bundle")
    cases = [
        (RegoProgram(acme.tenant, acme.modules, acme.data), "the tenant's policy is not compiled"),
        (acme.compiled(str(tmp_path / "missing.rbb")), "the tenant's compiled policy cannot be loaded"),
        (
            RegoProgram("other", acme.modules, acme.data, str(garbage)),
            "the tenant's compiled policy cannot be loaded",
        ),
    ]
    for program, message in cases:
        verdict: RegoVerdict = engine.evaluate_now(RegoQuery(program, READ))
        assert (verdict.allowed, verdict.reason, verdict.fault, verdict.message) == (
            False,
            Reason.POLICY_ERROR,
            True,
            message,
        )
    assert engine.evaluate_now(RegoQuery(acme, READ)).allowed


def test_embedded_engine_keeps_a_bounded_set_of_bundles(acme: RegoProgram) -> None:
    engine = EmbeddedEngine(max_loaded=1)
    trial = load_policy_dir(GOOD).tenants["trial"].rego
    assert trial is not None
    trial_doc = input_document(Identity("trial", "trial-1"), req("GET", "pypi.org"), "1.2.3.4")
    for _ in range(3):
        assert engine.evaluate_now(RegoQuery(acme, READ)).allowed
        assert engine.evaluate_now(RegoQuery(trial, trial_doc)).allowed
    assert engine.loads == 6
    engine = EmbeddedEngine(max_loaded=2)
    for _ in range(3):
        engine.evaluate_now(RegoQuery(acme, READ))
        engine.evaluate_now(RegoQuery(trial, trial_doc))
    assert engine.loads == 2
