"""Automatic approval (`approvals.auto: within_ceiling`): whether what an access request asks
for may be approved without a person.

Only when it adds nothing outside the operator's ceiling (every request it would allow is one
a ceiling region allows, as `sandgate policy prove` decides it) and names no host the
operator keeps for people (`approvals.always_human`, and every host a tenant's credentials
are bound to: a real secret goes there), nor any a `protocols` entry bounds (its requests are
decided by the tenant's protocol sections, which only `policy prove` reads). Anything else, an
unprovable one too, waits.
"""

from __future__ import annotations

from collections.abc import Iterable

from sandgate.policy.ceiling.model import Ceiling
from sandgate.policy.ceiling.prove import excess, lookup_excess, overlap
from sandgate.policy.ceiling.shape import RuleShape, ports_of
from sandgate.policy.hosts import parse_ip_literal

__all__ = ["asked_shape", "needs_a_person"]


def asked_shape(
    host: str, port: int, methods: Iterable[str] | None, paths: Iterable[str] | None, rule_id: str = ""
) -> RuleShape:
    """What an access request asks for, as a rule: one host (or address) and port, its methods
    and path globs (None: every method, every path, as a released CONNECT allows)."""
    ip = parse_ip_literal(host)
    return RuleShape(
        hosts=() if ip is not None else (host,),
        cidrs=(f"{ip}/{ip.max_prefixlen}",) if ip is not None else (),
        ports=ports_of([port]),
        methods=frozenset(m.upper() for m in methods) if methods is not None else None,
        paths=tuple(paths) if paths is not None else None,
        rule_id=rule_id,
    )


def needs_a_person(shape: RuleShape, ceiling: Ceiling, credential_hosts: Iterable[str] = ()) -> str | None:
    """Why `shape` must wait for a person (one line), or None: it may be approved automatically.
    `credential_hosts`: host patterns a tenant's credentials are bound to (always for people)."""
    bound = tuple(credential_hosts)
    if bound:
        found = overlap(shape, [RuleShape(hosts=bound, rule_id="credential hosts")])
        if found is not None:
            return f"{found[1].host} is a credential's host: kept for people"
    try:
        human = overlap(shape, ceiling)
        outside = excess(shape, ceiling)
        name = lookup_excess(shape, ceiling)
    except Exception as e:  # ProofTooLarge or any other: not proved inside, so not automatic
        return f"the ceiling could not be proved for it ({type(e).__name__})"
    for bounded in ceiling.protocols:
        if overlap(shape, [bounded.shape]) is not None:
            # Whether the tenant's sections hold the entry's bounds is `policy prove`'s question,
            # on the tenant's rules: not this one's.
            return f"a host the ceiling's {bounded.shape.rule_id} bounds by protocol: kept for people"
    if human is not None:
        entry, example = human
        return f"always_human ({entry.origin or entry.rule_id}) covers {example.url}"
    if outside is not None:
        method = "" if outside.raw_tcp else f" {outside.method}"
        return f"outside the ceiling:{method} {outside.url}"
    if name is not None:
        return f"outside the ceiling: a lookup of {name}"
    return None
