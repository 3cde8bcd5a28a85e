"""Debian's chromium, headless, driven by selenium through Debian's chromedriver: for the
console's browser tests. Nothing is downloaded (both binaries are given by path, so selenium
manager is never asked), no proxy from the environment is used, and each browser gets its
own profile folder. `screenshot` saves a PNG under tests/artifacts/console/."""

from __future__ import annotations

from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

__all__ = ["ARTIFACTS", "CHROMEDRIVER", "CHROMIUM", "open_chromium", "screenshot"]

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts" / "console"


def open_chromium(profile: Path, *, width: int = 1100, height: int = 900) -> webdriver.Chrome:
    """A headless chromium with a fresh profile in `profile`; quit it when done."""
    profile.mkdir(parents=True, exist_ok=True)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",  # tests run as root, where chromium's sandbox refuses to start
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-proxy-server",
        "--no-first-run",
        "--disable-extensions",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        f"--window-size={width},{height}",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    service = Service(executable_path=CHROMEDRIVER, log_output=str(profile / "chromedriver.log"))
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_page_load_timeout(20)
    return driver


def screenshot(driver: webdriver.Chrome, name: str) -> Path:
    """Save what the browser shows as tests/artifacts/console/`name`.png."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    driver.save_screenshot(str(path))
    return path
