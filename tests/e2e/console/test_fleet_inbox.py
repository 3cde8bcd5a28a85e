"""The approval inbox of one gateway answers for the fleet: in chromium, gateway a's inbox lists
a request held on gateway b (a real curl through b's explicit proxy, an `ask` rule; the page
notices it by polling requests.json), and a click on "Approve once" on a releases it on b."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import GatewayFactory
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.wait import WebDriverWait
from support import RecordingUpstream, RedisServer, free_port
from support.browser import screenshot

from .conftest import ADMIN_TOKEN, ConsoleGateway, asking_tenant, console_config, log_in, write_token

pytestmark = pytest.mark.slow


def fleet_member(
    start_gateway: GatewayFactory, upstream: RecordingUpstream, server: RedisServer, folder: Path, name: str
) -> ConsoleGateway:
    """A gateway of the fleet on `server`, named `name` there, with its console on."""
    admin_port = free_port()
    config = {
        **console_config(write_token(folder / name), admin_port),
        "redis": {"url": server.url, "gateway_id": name},
    }
    return ConsoleGateway(start_gateway({"t1.yaml": asking_tenant(upstream.port)}, config=config), admin_port)


def held_elsewhere(console: ConsoleGateway, timeout: float = 15.0) -> dict[str, Any]:
    """The one request `console`'s gateway lists as held by another gateway of its fleet."""
    own = httpx.get(f"{console.base}/v1/status", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).json()
    deadline = time.monotonic() + timeout
    while True:
        listed = httpx.get(
            f"{console.base}/v1/access-requests", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
        ).json()["requests"]
        found = [r for r in listed if r["gateway"] != own["gateway_id"] and r["state"] == "held"]
        if found:
            [request] = found
            held: dict[str, Any] = request
            return held
        assert time.monotonic() < deadline, f"nothing held elsewhere: {listed}"
        time.sleep(0.1)


def test_as_inbox_lists_bs_held_request_and_approve_once_releases_it_on_b(
    browser: webdriver.Chrome,
    start_gateway: GatewayFactory,
    http_upstream: RecordingUpstream,
    redis_server: RedisServer,
    tmp_path: Path,
) -> None:
    a = fleet_member(start_gateway, http_upstream, redis_server, tmp_path, "gw-a")
    b = fleet_member(start_gateway, http_upstream, redis_server, tmp_path, "gw-b")
    log_in(browser, a)
    browser.get(f"{a.console}/inbox")
    assert browser.find_elements(By.ID, "empty"), "nothing waits yet"

    curl = subprocess.Popen(
        ["curl", "-sS", "-m", "30", "-x", b.gw.proxy(), "-o", "/dev/null", "-w", "%{http_code}"]
        + [f"http://api.test:{http_upstream.port}/held-on-b"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    held = held_elsewhere(a)
    # The open page notices the new request by itself (it polls requests.json) and shows b as its holder.
    section = WebDriverWait(browser, 15).until(
        expected_conditions.presence_of_element_located((By.ID, f"request-{held['id']}"))
    )
    assert section.find_element(By.CSS_SELECTOR, ".gateway").text == held["gateway"] == "gw-b"
    assert section.find_element(By.CSS_SELECTOR, ".path").text == "/held-on-b"
    screenshot(browser, "fleet-inbox")

    WebDriverWait(browser, 10).until(
        expected_conditions.element_to_be_clickable(
            (By.CSS_SELECTOR, f"#request-{held['id']} [data-action='approve-once']")
        )
    ).click()
    out, _ = curl.communicate(timeout=40)
    assert out == "200", "released on b"
    assert [r.target for r in http_upstream.wait_for_requests(1)] == ["/held-on-b"]
    WebDriverWait(browser, 10).until(lambda d: d.find_elements(By.ID, "done"))
    assert "approved" in browser.find_element(By.ID, "done").text
    assert b.gw.records_until(lambda rs: any(r.get("approval") for r in rs)), "b recorded the release"
