"""The chat page at ``/`` in a real headless browser (Debian's chromium, driven by selenium):
send a message, see the reply stream in, the statistics update and the tokens coloured by where
they came from (accepted draft vs verifier-sampled); a screenshot is taken.

The test installs Debian's ``chromium`` and ``chromium-driver`` when they are missing (as root,
with apt-get), so the README's test command needs nothing else.
"""
from __future__ import annotations

import os

import pytest

from support.system_packages import apt_install

from support.tiny_gguf import CHAT_TEMPLATE, EOS, write_llama
from support.server import LiveServer

pytestmark = pytest.mark.browser  # drives Debian's chromium (apt-get when missing)

CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


def _ensure_chromium() -> None:
    if os.path.exists(CHROMIUM) and os.path.exists(DRIVER):
        return
    apt_install("the page test", ["chromium", "chromium-driver"])


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    _ensure_chromium()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--window-size=1200,800",
                 f"--user-data-dir={tmp_path_factory.mktemp('chromium')}"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
    yield driver
    driver.quit()


def test_the_chat_page_streams_colours_and_shows_statistics(browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    ver = write_llama(tmp_path / "ver.gguf", seed=11, zero_output_rows=[EOS],
                      chat_template=CHAT_TEMPLATE)
    dft = write_llama(tmp_path / "dft.gguf", seed=11, zero_output_rows=[EOS], noise=0.1,
                      noise_seed=12, chat_template=CHAT_TEMPLATE)
    with LiveServer(ver, dft, "-t", "1", "-k", "4") as s:
        browser.get(s.url + "/")
        wait = WebDriverWait(browser, 60)
        wait.until(lambda d: d.find_element(By.ID, "model").text == "ver")
        browser.find_element(By.ID, "max_tokens").clear()
        browser.find_element(By.ID, "max_tokens").send_keys("60")
        browser.find_element(By.ID, "input").send_keys("hello there")
        browser.find_element(By.ID, "send").click()
        wait.until(lambda d: d.find_element(By.ID, "s-al").text not in ("–", ""))
        user = browser.find_elements(By.CSS_SELECTOR, ".msg.user")
        reply = browser.find_elements(By.CSS_SELECTOR, ".msg.assistant")
        assert [u.text for u in user] == ["hello there"] and len(reply) == 1
        spans = reply[0].find_elements(By.CSS_SELECTOR, "span")
        sources = {sp.get_attribute("data-source") for sp in spans}
        assert "draft" in sources and sources & {"residual", "bonus"}, sources
        colours = {sp.value_of_css_property("color") for sp in spans}
        assert len(colours) == 2  # accepted drafts and verifier tokens look different
        assert float(browser.find_element(By.ID, "s-tps").text) > 0
        assert 0 <= float(browser.find_element(By.ID, "s-al").text) <= 4
        assert browser.find_element(By.ID, "s-acc").text.endswith("%")
        # the conversation goes on: a second turn reuses the first one's prefix
        browser.find_element(By.ID, "input").send_keys("and again")
        browser.find_element(By.ID, "send").click()
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".msg.assistant")) == 2
                   and d.find_element(By.ID, "send").is_enabled())
        assert int(browser.find_element(By.ID, "s-reused").text) > 0
        shot = tmp_path / "page.png"
        assert browser.save_screenshot(str(shot))
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
