"""The analysis report as a person sees it: open `index.html` in headless Chromium (Debian's `chromium`),
save a screenshot, and check what the browser rendered: every image loaded (none broken), every figure
drawn at a readable width, every table's text at a readable size and no table wider than the window.

    .venv/bin/python -m analysis report results/incremental --out report
    .venv/bin/python benchmarks/report_view.py report --screenshot report-screenshot.png

Prints one line per check and exits 1 if one fails (2 without Chromium).
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

WINDOW = (1280, 900)  # a laptop's browser window, CSS pixels
MIN_FIGURE_WIDTH = 300  # CSS pixels: narrower, a figure's labels are too small to read
MIN_TEXT_PX = 11  # computed font size of table text
MAX_HEIGHT = 30000  # CSS pixels of page the screenshot holds

# Run in the page once it has loaded; what it finds is written into the DOM, which Chromium then dumps.
PROBE = """<script>
window.addEventListener("load", () => {
  const images = [...document.images].map(i => ({src: i.getAttribute("src"), width: i.getBoundingClientRect().width,
                                                 loaded: i.complete && i.naturalWidth > 0}));
  const tables = [...document.querySelectorAll("table")].map(t => ({
    width: t.getBoundingClientRect().width,
    font: parseFloat(getComputedStyle(t.querySelector("td, th") || t).fontSize),
    cells: t.querySelectorAll("td").length}));
  const seen = {images, tables, window: window.innerWidth, page: document.documentElement.scrollWidth,
                height: document.documentElement.scrollHeight};
  document.body.setAttribute("data-seen", JSON.stringify(seen));
});
</script>"""


def chromium() -> str | None:
    return next((shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome")
                 if shutil.which(name)), None)


def run_chromium(browser: str, page: Path, *flags: str) -> str:
    command = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               f"--window-size={WINDOW[0]},{WINDOW[1]}", "--virtual-time-budget=10000", *flags, page.as_uri()]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180)
    if done.returncode != 0:
        raise RuntimeError(f"chromium exited {done.returncode}: {done.stderr[-2000:]}")
    return done.stdout


def seen_in(report: Path, browser: str) -> dict:
    """What the browser rendered of `report/index.html`: a copy with PROBE, beside it so relative links hold."""
    page = report / "index.html"
    probed = page.read_text().replace("</body>", PROBE + "</body>")
    with tempfile.NamedTemporaryFile("w", suffix=".html", dir=report, prefix=".probe-", delete=False) as copy:
        copy.write(probed)
    try:
        dom = run_chromium(browser, Path(copy.name), "--dump-dom")
    finally:
        Path(copy.name).unlink()
    found = re.search(r'data-seen="([^"]*)"', dom)
    if found is None:
        raise RuntimeError("the page never finished loading (no probe result in the DOM)")
    return json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))


def problems(seen: dict, figures: int) -> list[str]:
    """The checks; each problem names what a reader would meet."""
    found = []
    broken = [i["src"] for i in seen["images"] if not i["loaded"]]
    if broken:
        found.append(f"broken images: {', '.join(broken)}")
    if len(seen["images"]) < figures:
        found.append(f"{len(seen['images'])} images on the page for {figures} figure files")
    narrow = [i["src"] for i in seen["images"] if i["width"] < MIN_FIGURE_WIDTH]
    if narrow:
        found.append(f"figures drawn under {MIN_FIGURE_WIDTH}px wide: {', '.join(narrow)}")
    small = [t for t in seen["tables"] if t["font"] < MIN_TEXT_PX]
    if small:
        found.append(f"{len(small)} tables with text under {MIN_TEXT_PX}px")
    if not seen["tables"] or not any(t["cells"] for t in seen["tables"]):
        found.append("no table with cells on the page")
    if seen["page"] > seen["window"]:
        found.append(f"the page is {seen['page']}px wide in a {seen['window']}px window: tables overflow")
    return found


def check(report: Path, screenshot: Path, browser: str) -> list[str]:
    """Screenshot the whole page, then every check's problems (empty: the report reads well)."""
    seen = seen_in(report, browser)
    # The whole page: a window as tall as the page (the later --window-size wins).
    run_chromium(browser, report / "index.html", f"--screenshot={screenshot.resolve()}",
                 f"--window-size={WINDOW[0]},{min(seen['height'], MAX_HEIGHT)}")
    figures = len(list((report / "figures").glob("*.png")))
    print(f"{len(seen['images'])} images ({figures} figure files), {len(seen['tables'])} tables; page "
          f"{seen['page']}px wide in a {seen['window']}px window; screenshot {screenshot}")
    return problems(seen, figures)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("report", type=Path, help="a folder written by `python -m analysis report`")
    p.add_argument("--screenshot", type=Path, default=Path("report-screenshot.png"))
    args = p.parse_args(argv)
    browser = chromium()
    if browser is None:
        print("no Chromium: `apt-get install -y chromium` (Debian's package)", file=sys.stderr)
        return 2
    found = check(args.report, args.screenshot, browser)
    for problem in found:
        print(f"problem: {problem}")
    print("the report reads well" if not found else f"{len(found)} problems")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
