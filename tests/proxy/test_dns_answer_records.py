"""The DNS listener answers an allowed name only with its record queued: in process (a real
trail and policy, a static resolver), an answer whose record finds no place is SERVFAIL."""

from __future__ import annotations

from pathlib import Path

import dns.message
import dns.rcode
import yaml
from support.inprocess import in_process

from sandgate.proxy.dns.listener import DnsListener

GUEST = "127.0.0.9"
TENANT = yaml.safe_dump(
    {
        "tenant": "t1",
        "sandboxes": [{"id": "sb1", "addresses": [GUEST]}],
        "allow": [{"id": "api", "hosts": ["api.test"], "ports": [443]}],
    }
)


async def test_an_answer_goes_only_with_its_record(tmp_path: Path) -> None:
    with in_process(tmp_path, {"t1.yaml": TENANT}, {"api.test": ["127.0.0.2"]}, ()) as gw:
        listener = DnsListener(gw.ctx, gw.ctx.bindings, "127.0.0.1", 0)

        async def ask() -> dns.message.Message:
            wire = await listener.answer(dns.message.make_query("api.test", "A").to_wire(), (GUEST, 5353))
            assert wire is not None
            return dns.message.from_wire(wire)

        answered = await ask()
        assert answered.rcode() == dns.rcode.NOERROR
        assert [item.address for rrset in answered.answer for item in rrset] == ["127.0.0.2"]
        records = gw.records()  # closes the trail: it takes nothing more
        assert [(r["phase"], r["dest"]["host"], r["decision"]) for r in records] == [
            ("dns", "api.test", "allow")
        ]
        refused = await ask()
        assert refused.rcode() == dns.rcode.SERVFAIL and not refused.answer
