"""The pictures of docs/report.md, taken from a real `accel report` page by headless Chromium.

It runs the quickstart study (10 trials) in a scratch folder, verifies it (`accel verify --top 2
--seeds 3`), writes its page with `accel report`, opens the page offline in headless Chromium
(tests/chromium.py: its own session, stopped whole at the end) and saves two parts of it: the
question, the answer and how sure (img/report-top.png), and the first figures
(img/report-figures.png). It fails if a figure is not drawn or the console reports an error.

    .venv/bin/python docs/report_example.py [--out docs/img]

Needs Chromium (Debian: `apt-get install chromium`); about two minutes on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import io
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STUDY = "quickstart-report"


def accel(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "accel", *args], cwd=ROOT, text=True,
                          capture_output=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"accel {' '.join(args[:2])} failed:\n{proc.stderr[-3000:]}")
    return proc.stdout


def main() -> None:
    from PIL import Image

    sys.path.insert(0, str(ROOT))
    from tests import chromium

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "img"))
    args = ap.parse_args()
    if chromium.find() is None:
        raise SystemExit("no Chromium: apt-get install chromium")
    with tempfile.TemporaryDirectory(prefix="accel-report-example-") as tmp:
        where = ["--storage", f"{tmp}/optuna.journal", "--tracking-uri",
                 f"sqlite:///{tmp}/mlruns/mlflow.db"]
        accel("tune", "experiments/quickstart.yaml", "--study", STUDY, *where)
        accel("verify", "--study", STUDY, "--top", "2", "--seeds", "3", *where)
        page = Path(re.search(r"^report: (.+)$", accel("report", "--study", STUDY, *where),
                              re.M).group(1))
        seen = chromium.visit(page, width=1100)
    if not all(f["drawn"] for f in seen.figures) or seen.errors:
        raise SystemExit(f"the page did not render: {seen.figures} {seen.errors}")
    shot = Image.open(io.BytesIO(seen.png))
    s = seen.sections  # where each section begins, px from the page's top
    parts = {"report-top.png": (0, s["importances"]),
             "report-figures.png": (s["importances"], s["curves"])}
    for name, (y0, y1) in parts.items():
        path = Path(args.out) / name
        shot.crop((0, y0, shot.width, y1)).convert("RGB").save(path, optimize=True)
        print(f"{path}  ({shot.width}x{y1 - y0} px of a {shot.width}x{shot.height} page)")


if __name__ == "__main__":
    main()
