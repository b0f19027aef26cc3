"""The web dashboard in a real browser (Debian's headless chromium through selenium) against a
daemon on a simulated node over TCP, with jobs busy on its GPUs: what a person sees, and that the
page follows a job's end without being reloaded."""

from __future__ import annotations

import os
import shutil
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait
from tests.agent.conftest import _kill_jobs
from tests.agent.daemon_support import CUDA_JOB, Daemon

pytestmark = pytest.mark.serial  # a headless browser beside many processes can fail to start

TOKEN = "dashboard-secret"
MISSING = "headless chromium is needed: apt-get install -y chromium chromium-driver"


def _installable() -> bool:
    """Whether `make browser` (run by `make test`) can install chromium here: root with apt-get."""
    return os.geteuid() == 0 and shutil.which("apt-get") is not None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Daemon, str]]:
    (tmp_path / "token").write_text(TOKEN + "\n")
    (tmp_path / "token").chmod(0o600)
    listen = f"127.0.0.1:{_free_port()}"
    extra = ("--listen", listen, "--token-file", str(tmp_path / "token"))
    daemon = Daemon(tmp_path, "2xA100-40GB", extra).start()
    yield daemon, f"http://{listen}"
    daemon.stop()
    _kill_jobs(daemon)


@pytest.fixture
def chromium() -> tuple[str, str]:
    """Chromium and its driver, checked before the daemon starts; skipped where not installable."""
    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if binary and driver:
        return binary, driver
    # where `make test` could have installed them (CI, as root), their absence is an error
    if _installable():
        pytest.fail(f"{MISSING} (or make browser)")
    why = "not root" if os.geteuid() != 0 else "no apt-get"
    pytest.skip(f"no headless chromium, and it cannot be installed here ({why}): {MISSING}")


@pytest.fixture
def browser(chromium: tuple[str, str]) -> Iterator[WebDriver]:
    binary, driver = chromium
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(flag)
    options.add_argument("--window-size=1280,1000")
    chrome = webdriver.Chrome(service=Service(driver), options=options)
    yield chrome
    chrome.quit()


# Read in one script, not element by element: the page swaps its sections every 2 s, and an
# element found before a swap is stale after it.
_TEXTS = "return Array.from(document.querySelectorAll(arguments[0])).map(e => e.innerText);"
_ROWS = (
    "return Array.from(document.querySelectorAll('table.jobs tbody tr'))"
    ".map(e => [e.getAttribute('data-job'), e.innerText]);"
)


def _text(browser: WebDriver, css: str) -> str:
    return "\n".join(browser.execute_script(_TEXTS, css))


@pytest.mark.usefixtures("chromium")  # before `served`: no daemon is started to be skipped
def test_a_person_sees_the_gpus_jobs_and_events_live(
    served: tuple[Daemon, str], browser: WebDriver, tmp_path: Path
) -> None:
    daemon, base = served
    trainer = daemon.submit(
        [sys.executable, CUDA_JOB, "120", "512"], memory="4Gi", compute=40, name="trainer"
    )
    tuner = daemon.submit(
        [sys.executable, CUDA_JOB, "120", "256"], memory="2Gi", compute=20, name="tuner<b>"
    )
    waiting = daemon.submit(["sleep", "60"], gpus=2, compute=90, name="big-eval")
    wait = WebDriverWait(browser, 30, poll_frequency=0.2)

    browser.get(f"{base}/?token={TOKEN}")  # sets the cookie and drops the token from the URL
    assert browser.current_url == f"{base}/"
    browser.execute_script("window.notReloaded = true;")

    # each job's share as a segment of its GPU's bars, filled as the sampler sees it work
    # the name as typed, escaped, not markup
    labels = ("trainer 512MiB/4GiB", "tuner<b> 256MiB/2GiB")
    wait.until(lambda b: all(x in _text(b, '[data-gpu="0"] .seg-label') for x in labels))
    gpu0 = _text(browser, '[data-gpu="0"]')
    assert "A100-40GB" in gpu0 and "60% shared" in gpu0

    # the jobs table: one row per job, the queued one waiting for both GPUs
    rows = dict(browser.execute_script(_ROWS))
    assert set(rows) == {str(trainer), str(tuner), str(waiting)}
    assert "trainer" in rows[str(trainer)] and "running" in rows[str(trainer)]
    assert "4GiB" in rows[str(trainer)] and "40%" in rows[str(trainer)]
    assert "big-eval" in rows[str(waiting)] and "queued" in rows[str(waiting)]

    # events, newest first, and the utilisation chart with a line per GPU
    events = _text(browser, "#events")
    assert f"job {trainer}\nstarted" in events or f"job {trainer} started" in events
    wait.until(lambda b: len(b.find_elements(By.CSS_SELECTOR, "#history polyline")) == 2)
    browser.save_screenshot(str(tmp_path / "dashboard.png"))

    # a job ends: the page follows without a reload
    daemon.call("POST", f"/v1/jobs/{tuner}/cancel", json={})
    wait.until(lambda b: not b.find_elements(By.CSS_SELECTOR, f'tr[data-job="{tuner}"]'))
    wait.until(lambda b: "cancelled" in _text(b, "#events"))
    assert "tuner" not in _text(browser, '[data-gpu="0"]')
    assert browser.execute_script("return window.notReloaded === true;")

    # a job's own page, from the table's link
    browser.find_element(By.CSS_SELECTOR, f'tr[data-job="{trainer}"] a').click()
    wait.until(lambda b: b.current_url == f"{base}/jobs/{trainer}")
    assert "placed" in browser.find_element(By.CSS_SELECTOR, ".events").text


def test_over_tcp_the_dashboard_needs_the_token_and_a_missing_job_is_404_json(
    served: tuple[Daemon, str],
) -> None:
    _, base = served
    with httpx.Client(base_url=base) as anonymous:
        assert anonymous.get("/").status_code == 401
        assert anonymous.get("/v1/dashboard").status_code == 401
        assert anonymous.get("/?token=wrong").status_code == 401
        moved = anonymous.get(f"/?token={TOKEN}")
        assert moved.status_code == 303 and moved.headers["location"] == "/"
        assert "httponly" in moved.headers["set-cookie"].lower()
        # the cookie opens the dashboard only, never the API that changes things
        assert anonymous.get("/v1/dashboard").status_code == 200
        assert anonymous.get("/v1/jobs").status_code == 401
        missing = anonymous.get("/jobs/999")
    assert missing.status_code == 404
    assert missing.json() == {"error": "NotFound", "message": "no job 999"}
