"""The README's pictures of `cyto review`: the page and the report's review figure.

    python docs/review_screenshots.py demo_out/scores docs/

Builds a review of the scored folder in a temporary folder, lets two simulated reviewers mark the
cells (ann marks every planted abnormal cell and two normal ones; bob misses every third planted
cell), photographs ann's page in the system Chromium (through playwright, nothing downloaded) and
writes the report, whose figure of the first case is copied next to the screenshot.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from PIL import Image

from cyto.review.report import write_report
from cyto.review.session import build_session
from cyto.review.store import MarkStore


def main(scored: Path, out: Path) -> None:
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        sys.exit("needs the system Chromium (apt install chromium)")
    tmp = Path(tempfile.mkdtemp())
    session = build_session([scored], tmp / "review", echo=lambda _: None)
    store = MarkStore(session.root)
    for case in session.case_ids():
        cells = session.key["cases"][case]["cells"]
        abnormal = [c["position"] for c in cells if c["label"] == 1]
        normal = [c["position"] for c in cells if c["label"] == 0]
        for p in abnormal + normal[:2]:
            store.mark("ann", case, p, True, "malignant" if p in abnormal[:2] else "")
        for p in abnormal[::3][1:] + abnormal[1::3] + normal[2:3]:
            store.mark("bob", case, p, True)
        for who in ("ann", "bob"):  # finished: their cases enter kappa and precision
            store.set_done(who, case, True)
    store.close()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cyto",
            "review",
            str(session.root),
            "--reviewer",
            "ann",
            "--port",
            "0",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        url = next(line.split()[1] for line in proc.stdout if line.startswith("open http://"))
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1440, "height": 900})
            page.goto(url)
            page.locator("#grid .cell").first.wait_for()
            page.wait_for_load_state("networkidle")
            page.keyboard.press("ArrowRight")
            page.screenshot(path=str(out / "review_page.jpg"), type="jpeg", quality=85)
            browser.close()
    finally:
        proc.kill()
    report = write_report(session.root)
    Image.open(report["figures"][0]).convert("RGB").save(out / "review_figure.jpg", quality=85)
    print(Path(report["files"]["expert_table_md"]).read_text())
    shutil.rmtree(tmp)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
