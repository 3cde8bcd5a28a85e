"""The overview and the live decisions in chromium: charts rendered on the server from a
seeded trail, the window selector, and the live stream with its filters and pause."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from conftest import GatewayFactory, RunningGateway, curl, tenant_yaml
from selenium import webdriver
from selenium.common.exceptions import NoAlertPresentException, StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.wait import WebDriverWait
from support import RecordingUpstream, free_port
from support.audit_trail import decision, line
from support.browser import screenshot

from sandgate.policy.decision import Phase
from sandgate.policy.reasons import Reason

from .conftest import ConsoleGateway, console_config, log_in, write_token

pytestmark = pytest.mark.slow

R = Reason
MARKUP = "/<img src=x onerror=alert(9)><script>alert(10)</script>"


def seeded(now: float) -> list[str]:
    """Twenty decisions of the last ten minutes, 20 s apart (a 15-minute window's buckets are
    15 s: each in its own): 10 allowed, 10 denied over two tenants."""
    records = []
    for i in range(10):
        records.append(decision(f"a{i}", now - 600 + i * 20, R.ALLOWED, "api.test", method="GET", path="/"))
    for i in range(5):
        records.append(
            decision(f"e{i}", now - 400 + i * 20, R.HOST_NOT_ALLOWED, "evil.test", phase=Phase.CONNECT)
        )
    for i in range(3):
        records.append(
            decision(
                f"p{i}", now - 300 + i * 20, R.PATH_NOT_ALLOWED, "api.test", method="POST", path=f"/u/{i}"
            )
        )
    for i in range(2):
        records.append(
            decision(
                f"t{i}",
                now - 240 + i * 20,
                R.HOST_NOT_ALLOWED,
                "x.other.test",
                tenant="t2",
                sandbox="sb9",
                phase=Phase.CONNECT,
            )
        )
    # An hour ago: outside the 15-minute window, inside the 6-hour one.
    records.append(decision("old", now - 3600, R.HOST_NOT_ALLOWED, "old.test", phase=Phase.CONNECT))
    # Two hours ago, allowed: markup in a trail record (the gateway encodes what it writes; the
    # console must not rely on it).
    records.append(decision("markup", now - 7200, R.ALLOWED, "api.test", method="GET", path=MARKUP))
    records.sort(key=lambda r: r["time"])
    return [line(r) for r in records]


@pytest.fixture(scope="module")
def seeded_console(
    start_module_gateway: GatewayFactory, tmp_path_factory: pytest.TempPathFactory
) -> ConsoleGateway:
    """One seeded gateway for the tests that only read its trail (its console writes none):
    the seed is relative to its start, and the 15-minute window keeps every recent record for
    the five minutes after it, far longer than this module runs."""
    admin_port = free_port()
    token_file = write_token(tmp_path_factory.mktemp("seeded-token"))

    def seed(root: Path) -> None:
        audit = root / "state" / "audit"
        audit.mkdir(parents=True)
        (audit / "audit.jsonl").write_text("".join(seeded(time.time())))

    gw = start_module_gateway(
        {"t1.yaml": tenant_yaml("t1", [])}, config=console_config(token_file, admin_port), prepare=seed
    )
    return ConsoleGateway(gw, admin_port)


def chart_labels(browser: webdriver.Chrome, selector: str) -> list[str]:
    return [t.text for t in browser.find_elements(By.CSS_SELECTOR, f"{selector} svg text")]


def test_the_overview_charts_the_seeded_trail(
    browser: webdriver.Chrome, seeded_console: ConsoleGateway
) -> None:
    log_in(browser, seeded_console)
    browser.get(f"{seeded_console.console}/overview?window=15m")
    assert browser.find_element(By.ID, "records").text == "20"
    assert browser.find_element(By.ID, "waiting").text == "0 waiting for approval"
    allowed = browser.find_elements(By.CSS_SELECTOR, "#rate-chart svg rect.allow")
    denied = browser.find_elements(By.CSS_SELECTOR, "#rate-chart svg rect.deny")
    assert (len(allowed), len(denied)) == (10, 10), "one record per bucket here: each its own column"
    assert chart_labels(browser, "#reasons-chart") == ["host_not_allowed", "7", "path_not_allowed", "3"]
    tenants = [h.text for h in browser.find_elements(By.CSS_SELECTOR, "h3.tenant")]
    assert tenants == ["t1", "t2"]
    charts = browser.find_elements(By.CSS_SELECTOR, ".tenant-chart")
    assert [t.text for t in charts[0].find_elements(By.TAG_NAME, "text")] == [
        "evil.test",
        "5",
        "api.test",
        "3",
    ]
    assert [t.text for t in charts[1].find_elements(By.TAG_NAME, "text")] == ["x.other.test", "2"]
    screenshot(browser, "overview")
    # A wider window takes in the older denial.
    browser.find_element(By.CSS_SELECTOR, "#window option[value='6h']").click()
    browser.find_element(By.CSS_SELECTOR, "form.window button").click()
    # The click loads a new page: an element found on the old one goes stale under the wait.
    WebDriverWait(browser, 10, ignored_exceptions=(StaleElementReferenceException,)).until(
        lambda d: d.find_element(By.ID, "records").text == "22"
    )
    assert "old.test" in browser.find_elements(By.CSS_SELECTOR, ".tenant-chart")[0].text


def test_trail_text_in_the_live_stream_renders_inert(
    browser: webdriver.Chrome, seeded_console: ConsoleGateway
) -> None:
    log_in(browser, seeded_console)
    browser.get(f"{seeded_console.console}/decisions")
    # The stream starts with the newest records: the seeded ones.
    WebDriverWait(browser, 10).until(lambda d: len(rows(d)) == 22)
    [marked] = [
        r for r in browser.find_elements(By.CSS_SELECTOR, "#decision-rows tr") if "alert(9)" in r.text
    ]
    assert MARKUP in marked.text
    assert browser.find_elements(By.CSS_SELECTOR, "main img, main script") == []
    marked.click()
    assert MARKUP in browser.find_element(By.ID, "record").text
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018


def test_an_unknown_window_is_refused(seeded_console: ConsoleGateway) -> None:
    with seeded_console.login() as client:
        answer = client.get("/console/overview", params={"window": "1y"})
    assert answer.status_code == 400


def rows(browser: webdriver.Chrome) -> list[str]:
    return [r.text for r in browser.find_elements(By.CSS_SELECTOR, "#decision-rows tr")]


def test_live_decisions_stream_filtered_and_pause(
    browser: webdriver.Chrome, console_gateway: ConsoleGateway, http_upstream: RecordingUpstream
) -> None:
    gw: RunningGateway = console_gateway.gw
    gw.mark()
    log_in(browser, console_gateway)
    # Only denials of other.test, filtered on the server.
    browser.get(f"{console_gateway.console}/decisions?decision=deny&host=other.test")
    WebDriverWait(browser, 10).until(lambda d: d.find_element(By.ID, "stream-state").text == "live")
    before = len(rows(browser))
    allowed = curl("-x", gw.proxy(), f"http://api.test:{http_upstream.port}/open")
    assert allowed.returncode == 0
    curl("-x", gw.proxy(), "http://other.test/first")
    WebDriverWait(browser, 10).until(lambda d: len(rows(d)) == before + 1)
    assert "other.test" in rows(browser)[0] and "/first" in rows(browser)[0]
    assert all("/open" not in r for r in rows(browser)), "the allowed one was filtered out"
    # Paused: new records wait; resumed: they show.
    browser.find_element(By.ID, "pause").click()
    curl("-x", gw.proxy(), "http://other.test/second")
    WebDriverWait(browser, 10).until(
        lambda d: d.find_element(By.ID, "held-count").text == "1 new while paused"
    )
    assert len(rows(browser)) == before + 1
    screenshot(browser, "decisions-paused")
    browser.find_element(By.ID, "pause").click()
    assert "/second" in rows(browser)[0]
    # A row opens its record.
    browser.find_elements(By.CSS_SELECTOR, "#decision-rows tr")[0].click()
    record = browser.find_element(By.ID, "record").text
    assert '"decision": "deny"' in record and '"path": "/second"' in record
    screenshot(browser, "decisions")


def test_live_streams_are_bounded(start_gateway: GatewayFactory, tmp_path: Path) -> None:
    admin_port = free_port()
    config = console_config(write_token(tmp_path / "token"), admin_port)
    config["console"] = {"enabled": True, "max_stream_clients": 2}
    console = ConsoleGateway(start_gateway({"t1.yaml": tenant_yaml("t1", [])}, config=config), admin_port)
    with console.login() as client:
        url = "/console/decisions/stream"
        with client.stream("GET", url) as one, client.stream("GET", url) as two:
            assert (one.status_code, two.status_code) == (200, 200)
            assert one.headers["content-type"] == "text/event-stream"
            third = client.get(url)
            assert third.status_code == 503
        # Closed streams free their places.
        deadline = time.monotonic() + 5
        while True:
            with client.stream("GET", url) as again:
                if again.status_code == 200:
                    break
            assert time.monotonic() < deadline
            time.sleep(0.1)
    anonymous = httpx.get(f"{console.console}/decisions/stream")
    assert anonymous.status_code == 401
