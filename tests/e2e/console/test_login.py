"""The console's own security, in chromium and with httpx: login with the admin token, the
session cookie's attributes, the headers on every page, CSRF on every state change, the
login rate limit, and the refusal to start without the admin TCP listener."""

from __future__ import annotations

import httpx
import pytest
from conftest import GatewayFactory, tenant_yaml
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait
from support import free_port
from support.browser import screenshot

from .conftest import ADMIN_TOKEN, ConsoleGateway, log_in, write_token

pytestmark = pytest.mark.slow

CSP = "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"


def test_login_exchanges_the_token_for_a_session(
    browser: webdriver.Chrome, console_gateway: ConsoleGateway
) -> None:
    browser.get(f"{console_gateway.console}/inbox")
    assert browser.current_url.endswith("/console/login"), "no session: to the login page"
    browser.find_element(By.ID, "token").send_keys("not-the-token-at-all-0123")
    browser.find_element(By.ID, "login").click()
    # The form's answer is a new page: wait for it (a click may return before it loads).
    refused = WebDriverWait(browser, 10).until(
        expected_conditions.presence_of_element_located((By.CSS_SELECTOR, ".error"))
    )
    assert "wrong token" in refused.text
    screenshot(browser, "login")
    log_in(browser, console_gateway)
    cookie = browser.get_cookie("sandgate_console")
    assert cookie is not None
    assert (cookie["httpOnly"], cookie["sameSite"], cookie["path"], cookie["secure"]) == (
        True,
        "Strict",
        "/console",
        False,  # plain HTTP on loopback: Secure only when served over TLS
    )
    assert ADMIN_TOKEN not in cookie["value"]
    assert browser.execute_script("return document.cookie") == "", "script cannot read the session"
    assert ADMIN_TOKEN not in console_gateway.gw.log()
    assert cookie["value"] not in console_gateway.gw.log()


@pytest.mark.parametrize("page", ["login", "overview", "inbox", "grants", "decisions"])
def test_every_page_carries_the_security_headers(console_gateway: ConsoleGateway, page: str) -> None:
    with console_gateway.login() as client:
        answer = client.get(f"/console/{page}")
    assert answer.status_code == 200
    assert answer.headers["Content-Security-Policy"] == CSP
    assert answer.headers["X-Content-Type-Options"] == "nosniff"
    assert answer.headers["Referrer-Policy"] == "no-referrer"
    assert "<script>" not in answer.text and "style=" not in answer.text, "nothing inline"
    assert 'src="/console/static/console.js"' in answer.text


def test_a_state_change_without_the_csrf_token_is_refused(console_gateway: ConsoleGateway) -> None:
    with console_gateway.login() as client:
        fake = "0123456789abcdef0123"
        for data in ({}, {"_csrf": "wrong"}):
            answer = client.post(f"/console/requests/{fake}/approve", data={**data, "scope": "once"})
            assert answer.status_code == 403, answer.text
            assert client.post(f"/console/grants/{fake}/revoke", data=data).status_code == 403
        # Another site's page posting with the session cookie (were it sent) is refused too.
        foreign = client.post("/console/logout", data={"_csrf": "x"}, headers={"Origin": "http://evil.test"})
        assert foreign.status_code == 403
    # No session at all: 401 for a POST, whatever it carries.
    anonymous = httpx.post(f"{console_gateway.console}/requests/{fake}/deny", data={"_csrf": "x"})
    assert anonymous.status_code == 401


def test_the_api_token_still_guards_the_api_and_a_session_is_not_a_bearer(
    console_gateway: ConsoleGateway,
) -> None:
    with console_gateway.login() as client:
        assert client.get("/v1/status").status_code == 401, "the console's cookie opens no API route"
    ok = httpx.get(f"{console_gateway.base}/v1/status", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert ok.status_code == 200


def test_failed_logins_are_limited(
    start_gateway: GatewayFactory, tmp_path_factory: pytest.TempPathFactory
) -> None:
    port = free_port()
    token_file = write_token(tmp_path_factory.mktemp("limited"))
    start_gateway(
        {"t1.yaml": tenant_yaml("t1", [])},
        config={
            "admin": {"listen": f"127.0.0.1:{port}", "token": f"file:{token_file}"},
            "console": {"enabled": True, "login_attempts_per_minute": 3},
        },
    )
    url = f"http://127.0.0.1:{port}/console/login"
    codes = [httpx.post(url, data={"token": f"guess-{i}"}).status_code for i in range(4)]
    assert codes == [401, 401, 401, 429]
    assert httpx.post(url, data={"token": ADMIN_TOKEN}).status_code == 429, "even the right one, for a minute"


def test_the_console_without_the_admin_listener_refuses_to_start(start_gateway: GatewayFactory) -> None:
    gw = start_gateway(
        {"t1.yaml": tenant_yaml("t1", [])}, config={"console": {"enabled": True}}, expect_exit=True
    )
    assert gw.proc.returncode != 0
    config_file = str(gw.root / "sandgate.yaml")
    assert config_file in gw.log()
    assert "console.enabled needs admin.listen and admin.token" in gw.log()


def test_the_console_is_off_by_default(
    start_gateway: GatewayFactory, tmp_path_factory: pytest.TempPathFactory
) -> None:
    port = free_port()
    token_file = write_token(tmp_path_factory.mktemp("off"))
    start_gateway(
        {"t1.yaml": tenant_yaml("t1", [])},
        config={"admin": {"listen": f"127.0.0.1:{port}", "token": f"file:{token_file}"}},
    )
    answer = httpx.get(f"http://127.0.0.1:{port}/console/login")
    assert answer.status_code == 401 and answer.json()["error"] == "missing or wrong bearer token"
