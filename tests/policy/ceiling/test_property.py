"""Property: the prover agrees with the gateway's matcher on every concrete request.

For random rules and ceilings over small alphabets of hosts, networks, ports, methods and
globs chosen to overlap: when the prover calls a rule inside, every request of a pool that
the rule allows (by the gateway's RuleIndex) the ceiling allows or a deny rule refuses;
when it prints a counter-example, the rule allows it, no deny rule refuses it and the
ceiling does not allow it.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import product

from hypothesis import given, settings
from hypothesis import strategies as st
from support.ceiling_oracle import GatewayMatcher, gateway_allows, readable

from sandgate.policy.ceiling import RAW_TCP, CounterExample, RuleShape, excess, overlap, ports_of

HOSTS = ["a.com", "*.a.com", "b.a.com", "*.b.a.com", "c.com", "*"]
CIDRS = [
    "10.0.0.0/8",
    "10.1.0.0/16",
    "10.1.2.0/24",
    "10.1.2.0/25",
    "10.1.2.128/25",
    "::ffff:10.1.0.0/112",
    "2001:db8::/32",
    "0.0.0.0/0",
]
PORTS: list[int | tuple[int, int]] = [80, 443, 8080, (1, 442), (444, 9000)]
METHODS = ["GET", "POST", "PUT"]
GLOBS = [
    "/v1/**",
    "/v1/*",
    "/v1/x/**",
    "/v1",
    "/**",
    "/*/x",
    "/v?/x",
    "/a!b",
    "/a%21b",
    "/a*",
    "/a**",
    "/V1/*",
]

POOL_HOSTS = [
    "a.com",
    "b.a.com",
    "x.a.com",
    "q.b.a.com",
    "c.com",
    "other.invalid",
    "10.1.2.5",
    "10.1.2.200",
    "10.1.3.1",
    "::ffff:10.1.2.5",
    "2001:db8::1",
    "11.0.0.1",
]
POOL_PORTS = [80, 443, 8080, 22]
POOL_METHODS = ["GET", "POST", "PUT", "DELETE", RAW_TCP]
POOL_PATHS = [
    "/",
    "/v1",
    "/v1/",
    "/v1/x",
    "/V1/x",
    "/v1/x/y",
    "/v1/y",
    "/v2/x",
    "/a!b",
    "/A%21b",
    "/a%21b",
    "/ax",
    "/a/b",
    "//",
    "*",
]


def shapes(*, region: bool, deny: bool = False) -> st.SearchStrategy[RuleShape]:
    @st.composite
    def build(draw: st.DrawFn) -> RuleShape:
        names = [h for h in HOSTS if h != "*"] if deny else HOSTS  # '*' is for allow rules
        hosts = draw(st.lists(st.sampled_from(names), max_size=2, unique=True))
        cidrs = draw(st.lists(st.sampled_from(CIDRS), max_size=2, unique=True))
        if not hosts and not cidrs:
            hosts = [draw(st.sampled_from(names))]
        ports = draw(st.one_of(st.none(), st.lists(st.sampled_from(PORTS), min_size=1, max_size=2)))
        raw = not region and draw(st.booleans()) and draw(st.booleans())
        methods = None if raw else draw(st.one_of(st.none(), st.sets(st.sampled_from(METHODS), min_size=1)))
        paths = (
            None
            if raw
            else draw(st.one_of(st.none(), st.lists(st.sampled_from(GLOBS), min_size=1, max_size=2)))
        )
        return RuleShape(
            hosts=tuple(hosts),
            cidrs=tuple(cidrs),
            ports=ports_of(ports),
            methods=frozenset(methods) if methods is not None else None,
            paths=tuple(paths) if paths is not None else None,
            raw_tcp=raw,
            deny=deny,
        )

    return build()


def pool() -> list[CounterExample]:
    out = []
    for host, port, method in product(POOL_HOSTS, POOL_PORTS, POOL_METHODS):
        if method == RAW_TCP:
            out.append(CounterExample(method, host, port, None))
        else:
            out += [CounterExample(method, host, port, path) for path in POOL_PATHS]
    return out


POOL = pool()


@settings(max_examples=200, deadline=None)
@given(
    rule=shapes(region=False),
    regions=st.lists(shapes(region=True), max_size=3),
    denies=st.lists(shapes(region=True, deny=True), max_size=2),
)
def test_the_prover_agrees_with_the_gateway_matcher(
    rule: RuleShape, regions: list[RuleShape], denies: list[RuleShape]
) -> None:
    """Deny rules are taken away as the report does: as more cover."""
    regions = regions + denies
    found = excess(rule, regions)
    if found is None:
        tenant, ceiling = GatewayMatcher([rule], region=False), GatewayMatcher(regions, region=True)
        for request in POOL:
            if tenant.allows(request):
                assert ceiling.allows(request), request
    else:
        assert gateway_allows([rule], found, region=False), found
        assert not gateway_allows(regions, found, region=True), found
        if found.path is not None and not found.unreadable_path:
            assert readable(found.path), found


@settings(max_examples=80, deadline=None)
@given(rule=shapes(region=False), human=st.lists(shapes(region=True), max_size=2))
def test_overlap_agrees_with_the_gateway_matcher(rule: RuleShape, human: list[RuleShape]) -> None:
    # An always-human entry is matched as a deny rule is (folded case, unreadable paths).
    as_deny = [replace(h, deny=True) for h in human]
    hit = overlap(rule, human)
    if hit is None:
        tenant, always = GatewayMatcher([rule], region=False), GatewayMatcher(as_deny, region=True)
        for request in POOL:
            if tenant.allows(request):
                assert not always.allows(request), request
    else:
        entry, request = hit
        assert gateway_allows([rule], request, region=False)
        assert gateway_allows([replace(entry, deny=True)], request, region=True)
