"""The report as a reader meets it: its figures' PDFs embed TrueType fonts (no Type 3), and in headless
Chromium (benchmarks/report_view.py) every image loads, figures and tables are drawn at readable sizes,
and a screenshot is saved. The browser checks skip only where Debian's `chromium` is not installed."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import pytest


ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "report_view.py"


@pytest.fixture(scope="module")
def report(demo_report) -> Path:
    return demo_report.folder


def test_pdf_figures_embed_truetype_fonts_and_no_type3(report):
    pdfs = sorted((report / "figures").glob("*.pdf"))
    assert pdfs
    for pdf in pdfs:
        data = pdf.read_bytes()  # matplotlib writes font dictionaries uncompressed
        assert b"/Subtype /Type3" not in data, pdf.name
        assert b"/FontFile2" in data, f"{pdf.name}: no embedded TrueType font"


def view(report: Path, screenshot: Path) -> subprocess.CompletedProcess:
    if shutil.which("chromium") is None:
        pytest.skip("Debian's chromium is not installed (apt-get install -y chromium)")
    return subprocess.run([sys.executable, str(SCRIPT), str(report), "--screenshot", str(screenshot)],
                          capture_output=True, text=True, timeout=600)


def test_the_report_in_a_browser_loads_every_image_and_reads_well(report, tmp_path):
    shot = tmp_path / "report.png"
    done = view(report, shot)
    assert done.returncode == 0 and "the report reads well" in done.stdout, done.stdout + done.stderr
    figures = len(list((report / "figures").glob("*.png")))
    assert f"{figures} images ({figures} figure files)" in done.stdout
    pixels = matplotlib.image.imread(shot)
    assert pixels.shape[1] == 1280 and pixels.shape[0] > 2000, "the whole page, not the first screen"
    assert (pixels[..., :3].std(axis=(0, 1)) > 0.05).all(), "the screenshot shows something besides white"


def test_a_missing_figure_is_reported_as_a_broken_image(report, tmp_path):
    damaged = tmp_path / "damaged"
    shutil.copytree(report, damaged)
    lost = sorted((damaged / "figures").glob("*.png"))[0]
    lost.unlink()
    done = view(damaged, tmp_path / "damaged.png")
    assert done.returncode == 1 and f"problem: broken images: figures/{lost.name}" in done.stdout, done.stdout
