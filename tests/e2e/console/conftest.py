"""A real gateway with the console on, an admin token, a tenant whose `ask` rule holds
requests, and a headless chromium logged in (or not) to its console."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml
from conftest import TOKEN_REF, GatewayFactory, RunningGateway
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.wait import WebDriverWait
from support import RecordingUpstream, free_port
from support.browser import open_chromium

ADMIN_TOKEN = "console-admin-token-0123456789abcdef"


@dataclass(frozen=True)
class ConsoleGateway:
    """A running gateway and where its console answers."""

    gw: RunningGateway
    admin_port: int

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    @property
    def console(self) -> str:
        return f"{self.base}/console"

    @contextlib.contextmanager
    def login(self) -> Iterator[httpx.Client]:
        """An httpx client holding a console session (its cookie)."""
        with httpx.Client(base_url=self.base, timeout=10, follow_redirects=False) as client:
            answer = client.post("/console/login", data={"token": ADMIN_TOKEN})
            assert answer.status_code == 303, answer.text
            yield client


def csrf_of(client: httpx.Client) -> str:
    """The session's CSRF token, as its pages carry it."""
    found = re.search(r'name="_csrf" value="([^"]+)"', client.get("/console/inbox").text)
    assert found is not None
    return found.group(1)


def asking_tenant(port: int) -> str:
    """Tenant t1 (sandbox sb1): GET /open on api.test allowed, anything else there asked about,
    other.test denied."""
    return yaml.safe_dump(
        {
            "tenant": "t1",
            "sandboxes": [{"id": "sb1", "token": TOKEN_REF}],
            "allow": [{"id": "open", "hosts": ["api.test"], "ports": [port], "paths": ["/open"]}],
            "ask": [{"id": "api", "hosts": ["api.test"], "ports": [port]}],
            "deny": [{"id": "other", "hosts": ["other.test"]}],
        },
        sort_keys=False,
    )


def console_config(token_file: Path, admin_port: int) -> dict[str, object]:
    return {
        "admin": {"listen": f"127.0.0.1:{admin_port}", "token": f"file:{token_file}"},
        "console": {"enabled": True},
        "approvals": {"max_held_per_sandbox": 10, "ask_timeout_seconds": 60},
        # One worker: its held requests and the console's lead are one process.
        "workers": {"count": 1},
    }


def write_token(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "admin.token"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(ADMIN_TOKEN + "\n")
    return path


@pytest.fixture(scope="module")
def console_gateway(
    start_module_gateway: GatewayFactory,
    http_upstream: RecordingUpstream,
    tmp_path_factory: pytest.TempPathFactory,
) -> ConsoleGateway:
    admin_port = free_port()
    token_file = write_token(tmp_path_factory.mktemp("console-token"))
    gw = start_module_gateway(
        {"t1.yaml": asking_tenant(http_upstream.port)}, config=console_config(token_file, admin_port)
    )
    return ConsoleGateway(gw, admin_port)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[webdriver.Chrome]:
    driver = open_chromium(tmp_path / "chromium")
    try:
        yield driver
    finally:
        driver.quit()


def log_in(driver: webdriver.Chrome, console: ConsoleGateway) -> None:
    """Log in through the form, as a person would."""
    driver.get(f"{console.console}/login")
    driver.find_element(By.ID, "token").send_keys(ADMIN_TOKEN)
    driver.find_element(By.ID, "login").click()
    WebDriverWait(driver, 10).until(expected_conditions.url_contains("/console/overview"))
