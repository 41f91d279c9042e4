#!/usr/bin/python3
"""Regenerates the report pictures in docs/pictures/ from real reports, so the docs stay true.

    scripts/report-pictures.py [BUILD_DIR]      (default: build; needs BUILD_DIR/bin/kvsim and chromium)

Runs `kvsim run --report` on a few built-in scenarios and `kvsim explain --svg` on the example of
docs/index-arithmetic.md, opens them in headless chromium (tests/report/cdp.py, standard library
only), moves each page's slider to the step worth showing (picked from the page's own JSON) and
screenshots the views the docs embed (README.md, docs/scenarios.md, docs/index-arithmetic.md,
docs/report.md).
"""

import json
import pathlib
import re
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "report"))
import cdp  # noqa: E402

OUT = ROOT / "docs" / "pictures"
# The doc example of docs/index-arithmetic.md ("Sliding window" section).
EXPLAIN = ["explain", "--page-size", "16", "--window", "64", "--sinks", "4", "--block-table", "0,1,2,3,4,5",
           "--token", "90"]


def replay_json(page):
    text = page.read_text()
    return json.loads(re.search(r'<script type="application/json" id="replay">(.*?)</script>', text, re.S).group(1))


def first_frame_with(doc, kind):
    for i, f in enumerate(doc["frames"]):
        if any(e[0] == kind for e in f["ev"]):
            return i
    raise SystemExit(f"{doc['scenario']['name']}: no step with a {kind} event")


def union_clip(page, selectors):
    """Screenshot parameters for the box that holds every selector's element."""
    return page.evaluate(
        "(() => { const rs = %s.map(s => document.querySelector(s).getBoundingClientRect());"
        " const x = Math.min(...rs.map(r => r.left)), y = Math.min(...rs.map(r => r.top));"
        " const w = Math.max(...rs.map(r => r.right)) - x, h = Math.max(...rs.map(r => r.bottom)) - y;"
        " return {x: x + scrollX, y: y + scrollY, width: Math.min(w, 1280), height: h, scale: 1}; })()"
        % json.dumps(selectors))


def shoot(browser, url, out, selectors, frame=None):
    page = browser.new_page()
    try:
        page.navigate(url)
        if frame is not None:
            page.evaluate(f"kvsimReport.setFrame({frame})")
        errors = page.errors()
        if errors:
            raise SystemExit(f"{url}: script errors: {errors}")
        clip = union_clip(page, selectors)
        data = browser.send("Page.captureScreenshot", {"format": "png", "clip": clip, "captureBeyondViewport": True},
                            session=page.session)["data"]
        import base64
        out.write_bytes(base64.b64decode(data))
        print(f"{out.relative_to(ROOT)}: {url.rsplit('/', 1)[-1]}" + (f" at frame {frame}" if frame is not None else ""))
    finally:
        page.close()


def main():
    build = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "build")
    kvsim = str(build / "bin" / "kvsim")
    exe = cdp.find_chromium()
    if not exe:
        raise SystemExit("chromium not installed (scripts/setup.sh installs it)")
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        names = ["prefix_reuse_partial_copy", "prefix_reuse_offload_onboard", "window_cyclic_sinks_bubble",
                 "fault_window_mismatch"]
        subprocess.run([kvsim, "run", "--report", str(tmp)] + [str(ROOT / "scenarios" / f"{n}.toml") for n in names],
                       check=True, stdout=subprocess.DEVNULL)
        subprocess.run([kvsim] + EXPLAIN + ["--svg", str(tmp / "explain.svg")], check=True, stdout=subprocess.DEVNULL)
        (tmp / "explain.html").write_text("<!DOCTYPE html><html><body style='margin:0;background:#fff'>" +
                                          (tmp / "explain.svg").read_text().split("\n", 1)[1] + "</body></html>")
        page = lambda n: (tmp / f"{n}.html").as_uri()  # noqa: E731
        b = cdp.Browser(exe)
        try:
            doc = replay_json(tmp / "prefix_reuse_partial_copy.html")
            shoot(b, page("prefix_reuse_partial_copy"), OUT / "report-prefix-reuse.png",
                  ["#controls", "#pools-view", "#tables-view", "#tree-view"], first_frame_with(doc, "partial_copy"))
            doc = replay_json(tmp / "prefix_reuse_offload_onboard.html")
            shoot(b, page("prefix_reuse_offload_onboard"), OUT / "report-offload-onboard.png",
                  ["#controls", "#pools-view", "#tables-view"], first_frame_with(doc, "onboard"))
            doc = replay_json(tmp / "window_cyclic_sinks_bubble.html")
            shoot(b, page("window_cyclic_sinks_bubble"), OUT / "report-window-ring.png",
                  ["#controls", "#tables-view", "#window-view"], len(doc["frames"]) // 2)
            shoot(b, page("fault_window_mismatch"), OUT / "report-invariant-path.png",
                  ["#invariants-view", "#paths-view"])
            shoot(b, (tmp / "explain.html").as_uri(), OUT / "explain-path.png", ["svg"])
        finally:
            b.close()


if __name__ == "__main__":
    main()
