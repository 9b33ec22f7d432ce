"""`GET /dashboard` in a real headless Chromium (Debian `chromium`, driven by Playwright).

Loads the page against a real server (the tiny model), sends traffic that hits the prefix cache,
and checks that the figures the page shows change; saves a screenshot (to $KVSTRATA_SCREENSHOT_DIR
when set, else the test's tmp dir).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import httpx
import pytest

from kvstrata.engine.async_engine import AsyncEngine
from kvstrata.serving.dashboard import dashboard_html
from serving_support import make_state, serve

CHROMIUM = "/usr/bin/chromium"
PREFIX = "You are a helpful assistant. " * 20


def test_page_is_self_contained() -> None:
    html = dashboard_html()
    assert "<canvas" in html and 'fetch("metrics"' in html
    assert "http://" not in html and "https://" not in html and "<script src" not in html  # no CDN


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} not installed (apt-get install chromium)")
def test_dashboard_shows_live_figures(engine: AsyncEngine, tmp_path: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (no browser download needed)")
    shot = Path(os.environ.get("KVSTRATA_SCREENSHOT_DIR") or tmp_path) / "dashboard.png"
    with serve(make_state(engine)) as srv, sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 640})
            page.goto(f"{srv.base_url}/dashboard")
            page.wait_for_function("Number(document.getElementById('polls').textContent) >= 1", timeout=15000)
            text = lambda id_: page.locator(f"#{id_}").inner_text()  # noqa: E731
            before = {k: text(k) for k in ("requests-total", "hit-device", "ttft-p50", "kv-usage")}
            assert text("error") == ""
            with httpx.Client(base_url=srv.base_url, timeout=60) as http:
                for i in range(4):  # same long prefix: later requests hit the prefix cache
                    body = {"messages": [{"role": "system", "content": PREFIX},
                                         {"role": "user", "content": f"question {i}"}], "max_tokens": 4}
                    assert http.post("/v1/chat/completions", json=body).status_code == 200
            total = int(before["requests-total"]) + 4 if before["requests-total"].isdigit() else 4
            page.wait_for_function(
                f"Number(document.getElementById('requests-total').textContent) >= {total}", timeout=15000
            )
            page.wait_for_timeout(1500)  # one more poll so the charts have an interval to draw
            after = {k: text(k) for k in before}
            assert after["requests-total"] != before["requests-total"]
            assert after["hit-device"].endswith("%") and float(after["hit-device"][:-1]) > 0, after
            assert after["ttft-p50"].endswith("ms") and after["ttft-p50"] != before["ttft-p50"], after
            assert after["kv-usage"].endswith("%")
            assert text("running") == "0" and text("waiting") == "0"
            assert text("goodput").endswith("%") and text("ttft-slack").endswith("ms"), text("goodput")
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert shot.stat().st_size > 10_000
    if os.environ.get("KVSTRATA_SCREENSHOT_DIR") is None:
        shutil.rmtree(tmp_path, ignore_errors=True)
