"""The health and sandboxes pages in chromium: what `sandgate status` knows, shown, with a
tenant file that does not load named with its file and line."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
import yaml
from conftest import OTHER_TOKEN_REF, GatewayFactory, tenant_yaml
from selenium import webdriver
from selenium.webdriver.common.by import By
from support import RecordingUpstream, free_port
from support.browser import screenshot

from .conftest import ADMIN_TOKEN, ConsoleGateway, console_config, log_in, write_token

pytestmark = pytest.mark.slow


def test_health_and_sandboxes_show_the_gateway(
    browser: webdriver.Chrome, start_gateway: GatewayFactory, tmp_path: Path
) -> None:
    admin_port = free_port()
    gw = start_gateway(
        {
            "t1.yaml": tenant_yaml("t1", []),
            "t2.yaml": tenant_yaml("t2", [], sandbox="sb2", token_ref=OTHER_TOKEN_REF),
        },
        config=console_config(write_token(tmp_path / "token"), admin_port),
    )
    console = ConsoleGateway(gw, admin_port)
    status = httpx.get(f"{console.base}/v1/status", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).json()
    log_in(browser, console)
    browser.get(f"{console.console}/health")
    assert browser.find_element(By.ID, "ready").text == "Ready"
    checks = browser.find_element(By.ID, "checks").text
    assert "policy loaded ok" in checks and "listeners bound ok" in checks
    assert browser.find_element(By.ID, "policy-version").text == status["policy_version"]
    assert browser.find_element(By.ID, "audit-queue").text.startswith("0 records")
    assert browser.find_element(By.ID, "streams").text.startswith("0 of 20 open")
    # One gateway without redis: its own file, no redis line, no fleet members.
    assert browser.find_element(By.ID, "trail").text.startswith("this gateway's file")
    assert browser.find_elements(By.CSS_SELECTOR, "#redis, #members") == []
    screenshot(browser, "health")

    # A tenant file that does not load: named, with its line, and its tenant not served.
    gw.write_tenant("t3.yaml", "tenant: t3\nsandboxes: []\nallow: []\nnot_a_key: 1\n")
    deadline = time.monotonic() + 10
    while True:
        browser.get(f"{console.console}/sandboxes")
        problems = browser.find_elements(By.CSS_SELECTOR, "section.problem")
        if problems or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert problems, "the broken file was never shown"
    text = problems[0].text
    assert "t3.yaml:4:" in text and "not served" in text, text
    assert [li.text for li in browser.find_elements(By.CSS_SELECTOR, "#tenants li")] == ["t1", "t2"]
    rows = [r.text for r in browser.find_elements(By.CSS_SELECTOR, "#sandboxes tbody tr")]
    assert [r.split()[:2] for r in rows] == [["sb1", "t1"], ["sb2", "t2"]]
    assert "sha256:" not in browser.find_element(By.TAG_NAME, "main").text, "no token reference shown"
    screenshot(browser, "sandboxes")


def test_the_sandboxes_page_shows_each_limit_and_how_much_is_used(
    browser: webdriver.Chrome, start_gateway: GatewayFactory, http_upstream: RecordingUpstream, tmp_path: Path
) -> None:
    admin_port = free_port()
    doc = yaml.safe_load(tenant_yaml("t1", [{"hosts": ["api.test"], "ports": [http_upstream.port]}]))
    doc["limits"] = {"requests_per_minute": 10, "tenant_requests_per_minute": 40}
    gw = start_gateway(
        {
            "t1.yaml": yaml.safe_dump(doc),
            "t2.yaml": tenant_yaml("t2", [], sandbox="sb2", token_ref=OTHER_TOKEN_REF),
        },
        config=console_config(write_token(tmp_path / "token"), admin_port),
    )
    with httpx.Client(proxy=gw.proxy(), timeout=10) as c:
        for i in range(3):
            assert c.get(f"{http_upstream.url_for('api.test')}/r{i}").status_code == 200
    console = ConsoleGateway(gw, admin_port)
    log_in(browser, console)
    browser.get(f"{console.console}/sandboxes")
    rows = [r.text.split() for r in browser.find_elements(By.CSS_SELECTOR, "#limits tbody tr")]
    # The sandbox's own limit, then its tenant's (all its sandboxes); t2 sets none.
    assert rows == [
        ["t1", "sb1", "requests_per_minute", "3", "10"],
        ["t1", "all", "(the", "tenant)", "tenant_requests_per_minute", "3", "40"],
    ]
    screenshot(browser, "sandboxes-limits")
