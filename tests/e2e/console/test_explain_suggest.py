"""The sandboxes page's suggested rules and the live decisions' explain, in chromium: each is
what the CLI says (`sandgate audit suggest`, `sandgate policy explain`), because it is the
same code, run on the gateway's own trail and the policy in force."""

from __future__ import annotations

import json
import subprocess

import httpx
import pytest
from conftest import SANDGATE, RunningGateway, curl
from selenium import webdriver
from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.wait import WebDriverWait
from support import RecordingUpstream
from support.browser import screenshot

from .conftest import ConsoleGateway, log_in

pytestmark = pytest.mark.slow


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SANDGATE, *args], capture_output=True, text=True, timeout=60, check=False)


def test_suggested_rules_are_audit_suggests_and_the_button_copies_them(
    browser: webdriver.Chrome, console_gateway: ConsoleGateway
) -> None:
    gw: RunningGateway = console_gateway.gw
    gw.mark()
    # Three denials a missing allow rule explains (host_not_allowed), one path markup-shaped.
    for path in ("/v1/a", "/v1/b", "/v1/%3Cscript%3Ealert(1)%3C/script%3E"):
        curl("-x", gw.proxy(), f"http://unlisted.test{path}")
    gw.records(3)
    log_in(browser, console_gateway)
    browser.get(f"{console_gateway.console}/sandboxes")
    browser.find_element(By.CSS_SELECTOR, "#sandbox-sb1 a.suggest").click()
    shown = WebDriverWait(browser, 10).until(lambda d: d.find_element(By.ID, "suggestion")).text
    assert "unlisted.test" in shown and "allow:" in shown, shown
    command = cli("audit", "suggest", "--sandbox", "sb1", "--file", str(gw.audit_path))
    assert command.returncode == 0, command.stderr
    assert shown == command.stdout.rstrip("\n"), "the page says what `audit suggest` says"
    assert browser.find_elements(By.CSS_SELECTOR, "main script, main img") == []
    # The copy button puts the text (not markup) on the clipboard.
    browser.execute_cdp_cmd(
        "Browser.grantPermissions",
        {"origin": console_gateway.base, "permissions": ["clipboardReadWrite", "clipboardSanitizedWrite"]},
    )
    browser.find_element(By.ID, "copy").click()
    WebDriverWait(browser, 5).until(lambda d: d.find_element(By.ID, "copy-state").text == "Copied.")
    copied = browser.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "navigator.clipboard.readText().then(done, (e) => done('refused: ' + e));"
    )
    assert copied.rstrip("\n") == shown
    screenshot(browser, "suggest")


def test_an_unknown_sandbox_has_no_suggestions(console_gateway: ConsoleGateway) -> None:
    with console_gateway.login() as client:
        assert client.get("/console/suggest", params={"sandbox": "nope"}).status_code == 404
    assert httpx.get(f"{console_gateway.console}/suggest?sandbox=sb1").status_code == 303


def explain_cli(gw: RunningGateway, method: str, url: str) -> dict[str, object]:
    command = cli(
        "policy", "explain", "--rules", str(gw.rules_dir), "--config", str(gw.root / "sandgate.yaml"),
        "--sandbox", "sb1", "--format", "json", method, url,
    )  # fmt: skip
    assert command.returncode in (0, 1), command.stderr
    found: dict[str, object] = json.loads(command.stdout)
    return found


def row_with(browser: webdriver.Chrome, text: str) -> WebElement:
    """The first live decision row showing `text`, once it arrives."""

    def found(d: webdriver.Chrome) -> WebElement | None:
        return next(
            (r for r in d.find_elements(By.CSS_SELECTOR, "#decision-rows tr") if text in r.text), None
        )

    row = WebDriverWait(browser, 10).until(found)
    assert row is not None  # until() returns only a truthy answer
    return row


def test_a_live_decision_opens_its_record_and_its_explain(
    browser: webdriver.Chrome, console_gateway: ConsoleGateway, http_upstream: RecordingUpstream
) -> None:
    gw = console_gateway.gw
    log_in(browser, console_gateway)
    browser.get(f"{console_gateway.console}/decisions?host=other.test")
    WebDriverWait(browser, 10).until(lambda d: d.find_element(By.ID, "stream-state").text == "live")
    curl("-x", gw.proxy(), "http://other.test/explained")
    row = row_with(browser, "/explained")
    row.click()
    assert '"path": "/explained"' in browser.find_element(By.ID, "record").text
    WebDriverWait(browser, 10).until(lambda d: d.find_element(By.ID, "explain").text.startswith("deny:"))
    shown = browser.find_element(By.ID, "explain").text
    expected = explain_cli(gw, "GET", "http://other.test:80/explained")
    assert shown.splitlines()[0] == f"deny: {expected['reason']}" == "deny: host_denied"
    assert f"rule     {expected['rule_id']}" in shown and "tenant t1, sandbox sb1" in shown
    steps: list[dict[str, str]] = expected["steps"]  # type: ignore[assignment]
    for step in steps:  # each step as `policy explain` prints it
        assert f"  {step['step']} {step['name']:<13} {step['outcome']:<11} {step['detail']}" in shown, step
    browser.execute_script("arguments[0].scrollIntoView()", browser.find_element(By.ID, "explain"))
    screenshot(browser, "decisions-explain")

    # An allowed request, explained with the gateway's resolver and guard (its pinned address).
    browser.get(f"{console_gateway.console}/decisions?host=api.test&decision=allow")
    curl("-x", gw.proxy(), f"http://api.test:{http_upstream.port}/open")
    row = row_with(browser, "/open")
    row.send_keys("\n")  # the keyboard opens a row too
    WebDriverWait(browser, 10).until(lambda d: d.find_element(By.ID, "explain").text.startswith("allow:"))
    allowed = browser.find_element(By.ID, "explain").text
    assert "rule     t1/allow/open" in allowed and "api.test → 127.0.0.2" in allowed, allowed
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018


def test_explain_needs_a_session_and_a_host(console_gateway: ConsoleGateway) -> None:
    assert httpx.get(f"{console_gateway.console}/explain.json?host=a.test").status_code == 401
    with console_gateway.login() as client:
        answer = client.get("/console/explain.json", params={"phase": "request", "method": "GET"})
        assert answer.status_code == 422 and answer.json() == {"error": "the record names no host"}
        odd = client.get("/console/explain.json", params={"host": "<b>x</b>.test", "phase": "connect"})
        assert odd.status_code == 422 and odd.headers["content-type"].startswith("application/json")
        connect = client.get(
            "/console/explain.json", params={"host": "other.test", "port": "443", "sandbox": "sb1"}
        ).json()
    assert (connect["request"], connect["decision"], connect["reason"]) == (
        "CONNECT other.test:443",
        "deny",
        "host_denied",
    )
