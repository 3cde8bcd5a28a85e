"""The console of any gateway of a fleet answers for the whole fleet: two gateways on one real
redis-server, a denial on one seen live and counted on the other's console, whose health page
names both gateways and redis."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import GatewayFactory, curl
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.wait import WebDriverWait
from support import RecordingUpstream, RedisServer, free_port
from support.browser import screenshot

from .conftest import ConsoleGateway, asking_tenant, console_config, log_in, write_token

pytestmark = pytest.mark.slow


def fleet_member(
    start_gateway: GatewayFactory, upstream: RecordingUpstream, server: RedisServer, folder: Path, name: str
) -> ConsoleGateway:
    admin_port = free_port()
    config = {
        **console_config(write_token(folder / name), admin_port),
        "redis": {"url": server.url},
        "audit": {"gateway_name": name},
    }
    return ConsoleGateway(start_gateway({"t1.yaml": asking_tenant(upstream.port)}, config=config), admin_port)


def until_reloaded(browser: webdriver.Chrome, condition: Callable[[], bool], timeout: float = 15) -> None:
    """Reload the page until `condition` holds (a server-rendered page does not change itself)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the page never showed it"
        time.sleep(0.2)
        browser.refresh()


def test_one_gateways_console_shows_the_fleets_decisions(
    browser: webdriver.Chrome,
    start_gateway: GatewayFactory,
    http_upstream: RecordingUpstream,
    redis_server: RedisServer,
    tmp_path: Path,
) -> None:
    a = fleet_member(start_gateway, http_upstream, redis_server, tmp_path, "gw-a")
    b = fleet_member(start_gateway, http_upstream, redis_server, tmp_path, "gw-b")
    log_in(browser, a)
    browser.get(f"{a.console}/decisions?host=other.test")
    WebDriverWait(browser, 10).until(lambda d: d.find_element(By.ID, "stream-state").text == "live")
    assert "Every gateway of the fleet" in browser.find_element(By.ID, "trail-scope").text
    # Denied on gateway b: the page of gateway a shows it live.
    assert (
        "403"
        in curl(
            "-s", "-o", "/dev/null", "-w", "%{http_code}", "-x", b.gw.proxy(), "http://other.test/on-b"
        ).stdout
    )
    WebDriverWait(browser, 15).until(
        lambda d: any("/on-b" in r.text for r in d.find_elements(By.CSS_SELECTOR, "#decision-rows tr"))
    )
    assert not (a.gw.audit_path.exists() and "/on-b" in a.gw.audit_path.read_text()), "not in a's own file"
    screenshot(browser, "fleet-decisions")

    # a's overview counts b's denial; its health page names both gateways and redis.
    browser.get(f"{a.console}/overview?window=5m")
    assert "fleet" in browser.find_element(By.ID, "trail-scope").text
    assert int(browser.find_element(By.ID, "records").text) >= 1
    assert "other.test" in browser.find_element(By.CSS_SELECTOR, ".tenant-chart").text
    curl("-x", a.gw.proxy(), "http://other.test/on-a")
    browser.get(f"{a.console}/health")
    assert browser.find_element(By.ID, "redis").text.startswith("reachable")
    until_reloaded(
        browser,
        lambda: (
            [r.text.split()[0] for r in browser.find_elements(By.CSS_SELECTOR, "#members tbody tr")]
            == ["gw-a", "gw-b"]
        ),
    )
    assert "sandgate:audit" in browser.find_element(By.ID, "trail").text
    screenshot(browser, "fleet-health")

    # redis gone: the health page says so, and the pages still answer.
    redis_server.kill()
    browser.get(f"{a.console}/health")
    until_reloaded(browser, lambda: browser.find_element(By.ID, "redis").text.startswith("down since"))
    assert browser.find_element(By.ID, "members-error").text.startswith("the audit stream at 127.0.0.1:")
    browser.get(f"{a.console}/overview")
    assert browser.find_element(By.ID, "records").text == "0"
    assert "cannot read the audit stream" in browser.find_element(By.ID, "unread").text, "said, not hidden"
