"""The test harness's gateway start: a gateway is taken as started only once it is the one
that serves its port (two test workers once drew the same port, and one's tests talked to the
other's gateway)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import conftest
import pytest
from conftest import Gateways, tenant_yaml
from support import TestPKI, free_port


def test_a_gateway_whose_port_was_taken_starts_again_on_another(
    tmp_path: Path, pki: TestPKI, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken = free_port()
    drawn = iter([taken])
    monkeypatch.setattr(conftest, "free_port", lambda: next(drawn, None) or free_port())
    gateways = Gateways(tmp_path, pki)
    with socket.create_server(("127.0.0.1", taken)):  # the other process: it answers the port
        try:
            gw = gateways.start({"t.yaml": tenant_yaml("t", [{"host": "api.test"}])})
            first, started = gateways.started
            assert started is gw and gw.port != taken
            assert f"port {taken} is in use" in first.log() and first.proc.poll() is not None
            status = json.loads((gw.root / "state" / "gateway.json").read_text())
            assert status["pid"] == gw.proc.pid
            assert status["listeners"] == [f"127.0.0.1:{gw.port}"]
        finally:
            gateways.close()


def test_a_gateway_that_never_gets_its_port_is_reported_with_its_log(
    tmp_path: Path, pki: TestPKI, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken = free_port()
    monkeypatch.setattr(conftest, "free_port", lambda: taken)
    gateways = Gateways(tmp_path, pki)
    with socket.create_server(("127.0.0.1", taken)):
        try:
            with pytest.raises(AssertionError, match=f"did not start:\n(.|\n)*port {taken} is in use"):
                gateways.start({"t.yaml": tenant_yaml("t", [{"host": "api.test"}])})
            assert len(gateways.started) == 3
        finally:
            gateways.close()
