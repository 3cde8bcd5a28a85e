"""The console of a gateway with two workers: the lead serves it, lists the requests every
worker holds, and a click releases a request held by the other worker."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import GatewayFactory
from selenium import webdriver
from selenium.webdriver.common.by import By
from support import RecordingUpstream, free_port

from .conftest import ConsoleGateway, asking_tenant, console_config, log_in, write_token
from .test_inbox import finish, inbox_button, open_requests, start_curl, wait_held

pytestmark = pytest.mark.slow


def test_a_request_held_by_another_worker_is_released_from_the_lead(
    browser: webdriver.Chrome, start_gateway: GatewayFactory, http_upstream: RecordingUpstream, tmp_path: Path
) -> None:
    admin_port = free_port()
    config = {**console_config(write_token(tmp_path / "token"), admin_port), "workers": {"count": 2}}
    gw = start_gateway({"t1.yaml": asking_tenant(http_upstream.port)}, config=config)
    console = ConsoleGateway(gw, admin_port)
    # The kernel spreads the proxy's connections over the workers: hold until one is on worker 1.
    curls: list[subprocess.Popen[str]] = []
    for i in range(8):
        curls.append(start_curl(console, f"http://api.test:{http_upstream.port}/w/{i}"))
        wait_held(console, i + 1)
        if any(r.get("worker") == 1 for r in open_requests(console)):
            break
    held = open_requests(console)
    on_peer = [r for r in held if r.get("worker") == 1]
    assert on_peer, f"no request landed on worker 1 in {len(held)} tries"
    other = on_peer[0]
    log_in(browser, console)
    browser.get(f"{console.console}/inbox")
    assert {s.get_attribute("id") for s in browser.find_elements(By.CSS_SELECTOR, "section.request")} == {
        f"request-{r['id']}" for r in held
    }, "every worker's requests, on the lead's page"
    inbox_button(browser, other["id"], "approve-once").click()
    index = int(other["path"].rsplit("/", 1)[1])
    assert finish(curls[index]) == 200
    assert f"/w/{index}" in [r.target for r in http_upstream.wait_for_requests(1)]
    for r in open_requests(console):
        browser.get(f"{console.console}/inbox")
        browser.find_element(By.CSS_SELECTOR, f"#request-{r['id']} [data-action='deny']").click()
    for proc in curls:
        proc.communicate(timeout=30)
