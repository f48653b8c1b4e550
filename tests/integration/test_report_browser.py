"""report.html in a real browser: headless Chromium opens the report of a two-profile run (parts
with requests, a manifest with GPUs and a time scale) and every plot image in it must have
loaded (decoded, non-zero size), the Pareto and CDF plots among them.

Chromium comes from the distribution (`chromium`); as root it is installed when missing, like
the lab's host packages. Under CI a missing browser fails the test; elsewhere it is skipped.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from ansible_collections.servelab.serving.plugins.plugin_utils.report.build import build_report, write_report
from reportrun import make_run  # tests/ (the root conftest puts it on sys.path)

CHECK = """<script>
window.addEventListener("load", function () {
  var images = Array.prototype.slice.call(document.images);
  var loaded = images.filter(function (i) { return i.complete && i.naturalWidth > 0; });
  var names = images.map(function (i) { return i.alt; }).join("|");
  document.body.setAttribute("data-images", loaded.length + "/" + images.length);
  document.body.setAttribute("data-alts", names);
});
</script>"""


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    if os.geteuid() == 0 and shutil.which("apt-get"):
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "update", "-qq"], env=env, check=False, timeout=600)
        subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "chromium"],
                       env=env, check=False, timeout=900)
        if shutil.which("chromium"):
            return shutil.which("chromium")
    if os.environ.get("CI"):
        pytest.fail("chromium missing under CI (apt-get install chromium)", pytrace=False)
    pytest.skip("no chromium (apt-get install chromium)")


def test_every_plot_in_report_html_loads_in_a_browser(tmp_path):
    browser = chromium()
    run = make_run(tmp_path)
    report = build_report(str(run))
    write_report(report)
    html = (run / "report.html").read_text()
    assert "<script" not in html.lower()            # the report itself runs no script
    probe = tmp_path / "probe.html"
    probe.write_text(html.replace("</body>", CHECK + "</body>"))
    done = subprocess.run(
        [browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--user-data-dir=%s" % (tmp_path / "profile"), "--virtual-time-budget=10000",
         "--dump-dom", probe.as_uri()],
        capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    match = re.search(r'data-images="(\d+)/(\d+)"', done.stdout)
    assert match, done.stdout[-2000:]
    loaded, total = int(match.group(1)), int(match.group(2))
    assert total >= 6 and loaded == total, (loaded, total)
    alts = re.search(r'data-alts="([^"]*)"', done.stdout).group(1)
    assert "Pareto" in alts and "TTFT distribution" in alts and "Inter-token" in alts, alts
