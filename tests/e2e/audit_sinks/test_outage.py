"""The outage test: a gateway with all four SIEM sinks under steady load, every receiver
gone for 60 s (one shared window), then back: each receiver ends up with every event of the
trail, and any repeat is one the event id shows (the same id, the same event)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from conftest import GatewayFactory, tenant_yaml
from support import RecordingUpstream
from support.siem_gateway import HEC_TOKEN, Load, Receivers, expected_ids, sink_metrics
from support.siem_lines import wait_for

pytestmark = pytest.mark.slow

OUTAGE_SECONDS = 60.0


def test_every_event_reaches_every_sink_after_a_minute_long_outage(
    start_gateway: GatewayFactory, http_upstream: RecordingUpstream, tmp_path: Path
) -> None:
    rx = Receivers.start(tmp_path / "receivers")
    try:
        gw = start_gateway(
            {"t1.yaml": tenant_yaml("t1", [{"hosts": ["api.test"], "ports": [http_upstream.port]}])},
            config={"audit": {"sinks": rx.sinks(tmp_path / "hec.token")}, "reload": {"watch": False}},
        )
        load = Load(gw.proxy(), f"{http_upstream.url_for('api.test')}/x", pause=0.01).start()
        time.sleep(3)
        rx.stop_all()
        before = dict(load.answers)
        time.sleep(OUTAGE_SECONDS)
        during = load.answers[200] - before.get(200, 0)
        rx.start_all()
        time.sleep(3)
        answers = load.stop()
        assert during > 100, f"the load stalled during the outage: {during} answers"
        assert set(answers) == {200} and load.errors == 0
        admin = gw.root / "state" / "admin.sock"
        wait_for(
            lambda: all(v == 0 for (n, _), v in sink_metrics(admin).items() if n.endswith("_queue_bytes")),
            "every sink to catch up",
            timeout=60,
        )
        metrics = sink_metrics(admin)
        assert gw.stop() == 0
        got = rx.received()
        for name, fmt in rx.formats().items():
            wanted = expected_ids(gw.audit_path, fmt)
            assert len(wanted) >= answers[200]
            assert set(got[name]) == set(wanted), name  # nothing lost, nothing unknown
        assert got["bulk"] == list(dict.fromkeys(got["bulk"]))  # a resend is a 409, never a copy
        for events in (
            [(r.uid, r.body) for r in rx.otlp.received],
            [(r.uid, r.body) for r in rx.hec.received],
            [(params["id"], body) for params, body in rx.rsyslog.events()],
        ):
            bodies: dict[str, object] = {}
            for uid, body in events:
                assert bodies.setdefault(uid, body) == body  # a repeat is the same event
        for name in rx.formats():
            assert metrics[("sandgate_audit_sink_retried_total", name)] > 0, name
            assert metrics[("sandgate_audit_sink_dropped_total", f"{name}/full")] == 0
        assert HEC_TOKEN not in gw.log()
    finally:
        rx.stop_all()
