"""The dataset report in a real browser: Debian's headless Chromium driven by selenium.

Checks that the page loads with no console errors, that every contact-sheet image decoded, that
the counts shown equal ``dataset.json``'s, and that the leakage pair planted in the sample set
is listed. A screenshot is saved in the test's output directory (``tmp_path``, also named in
the JUnit XML as the ``screenshot`` property).
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from dataset_tools.inspect import __main__ as inspect_cli

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1280,1600",
)


@pytest.fixture()
def browser(tmp_path):
    if not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)):
        pytest.fail(
            f"the browser test needs {CHROMIUM} and {CHROMEDRIVER}: apt-get install chromium "
            "chromium-driver (scripts/test.sh installs them), or set CHROMIUM / CHROMEDRIVER"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'chrome-profile'}")  # a fresh profile
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(
        options=options,
        service=Service(CHROMEDRIVER, log_output=str(tmp_path / "chromedriver.log")),
    )
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.mark.slow
def test_report_in_chromium(tmp_path, browser, record_property, sample_datasets):
    images, dataset = sample_datasets.images, sample_datasets.report.path
    report_dir = tmp_path / "report"
    assert inspect_cli.main([str(dataset), "--out", str(report_dir), "--per_class", "5"]) == 0
    manifest = json.loads((dataset / "dataset.json").read_text(encoding="utf-8"))

    browser.get((report_dir / "index.html").as_uri())
    ready = browser.execute_script("return document.readyState")
    assert ready == "complete"

    errors = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    assert errors == []

    sizes = browser.execute_script(
        "return Array.from(document.querySelectorAll('img.sample'))"
        ".map(img => [img.complete, img.naturalWidth, img.naturalHeight]);"
    )
    assert len(sizes) == 5 * len(manifest["label_names"])
    assert all(complete and w > 0 and h > 0 for complete, w, h in sizes), sizes

    shown = browser.execute_script(
        "const out = {};"
        "document.querySelectorAll('[data-count]').forEach(e => {"
        "  out[e.dataset.count] = Number(e.textContent.replace(/,/g, '')); });"
        "document.querySelectorAll('[data-split-examples]').forEach(e => {"
        "  out['split:' + e.dataset.splitExamples] = Number(e.textContent.replace(/,/g, '')); });"
        "return out;"
    )
    for name, value in manifest["counts"].items():
        assert shown[name] == value, name
    for name, split in manifest["splits"].items():
        assert shown[f"split:{name}"] == split["num_examples"], name
    assert shown["shards"] == sum(s["num_shards"] for s in manifest["splits"].values())

    (reencoded,) = images.rglob("*_reencoded.JPEG")
    original = reencoded.with_name(reencoded.name.replace("_reencoded", ""))
    pairs = browser.execute_script(
        "return Array.from(document.querySelectorAll('.pair.leakage'))"
        ".map(p => [p.dataset.aUri, p.dataset.bUri, p.querySelectorAll('img').length,"
        " Array.from(p.querySelectorAll('img')).every(i => i.naturalWidth > 0)]);"
    )
    assert len(pairs) == 1
    a, b, image_count, loaded = pairs[0]
    assert {a, b} == {str(original), str(reencoded)}
    assert image_count == 2 and loaded
    assert browser.find_element("id", "leakage-verdict").text.startswith("1 train–validation")

    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.set_window_size(1280, min(int(height), 12000))
    screenshot = tmp_path / "report-screenshot.png"
    assert browser.save_screenshot(str(screenshot))
    record_property("screenshot", str(screenshot))
    print(f"screenshot: {screenshot}")
