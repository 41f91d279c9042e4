"""kvsim run --report in a real browser (issue 18): every built-in scenario's page (and a
2,048-block, 500-step one) loads in headless Chromium without a script error, holds the expected
elements at the first and the last step, and recolours its blocks as the replay's own JSON says
when the slider moves; a screenshot of each is saved. Structure, not pixels.

Run by CTest (tests/CMakeLists.txt, label `report`) as
  /usr/bin/python3 -m pytest tests/report --kvsim BUILD/bin/kvsim
Skips, saying so, when no chromium is installed (scripts/setup.sh installs Debian's).
"""

import html
import json
import os
import pathlib
import re
import subprocess

import pytest

import cdp

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
FREE, CACHED, RESERVED = -1, -2, -3
# Test scenarios beside the built-in ones: a 2,048-block, 530-step replay (large pages stay
# usable) and TensorRT-LLM VSWA placed per_layer (one grid per layer of each of its two pools).
EXTRA = ["large_pool", "vswa_per_layer"]


def replay_json(page_path):
    """The replay's data, read from the page's <script id="replay"> without any JavaScript."""
    text = page_path.read_text()
    m = re.search(r'<script type="application/json" id="replay">(.*?)</script>', text, re.S)
    assert m, f"{page_path}: no replay data"
    return json.loads(m.group(1))


def owners_at(doc, frame):
    """Every primary block's owner after `frame`, {(pool, block): owner}, by applying the recorded
    changes in order."""
    owner = {(p, b): FREE for p in range(doc["pools"]) for b in range(doc["scenario"]["primary_blocks"])}
    for p, b, o, _ in doc["initial"]:
        owner[p, b] = o
    for f in doc["frames"][: frame + 1]:
        for p, b, o, _ in f["p"]:
            owner[p, b] = o
    return owner


def tables_at(doc, frame):
    tables = {}
    for f in doc["frames"][: frame + 1]:
        for r, g, length, changes in f["t"]:
            key = f"{r}:{g}"
            if length < 0:
                tables.pop(key, None)
                continue
            t = (tables.get(key, []) + [-1] * length)[:length]
            for p, b in changes:
                t[p] = b
            tables[key] = t
    return tables


@pytest.fixture(scope="session")
def browser():
    exe = cdp.find_chromium()
    if not exe:
        pytest.skip("chromium not installed: the report's browser test needs Debian's chromium "
                    "(scripts/setup.sh installs it)")
    b = cdp.Browser(exe)
    yield b
    b.close()


@pytest.fixture(scope="session")
def report_dir(request, tmp_path_factory):
    kvsim = request.config.getoption("--kvsim")
    out = tmp_path_factory.mktemp("report")
    scenarios = sorted(str(p) for p in (ROOT / "scenarios").glob("*.toml")) + [str(HERE / f"{n}.toml") for n in EXTRA]
    run = subprocess.run([kvsim, "run", "--report", str(out)] + scenarios, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    return out


def screenshot_dir(request):
    d = pathlib.Path(request.config.getoption("--screenshots"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def scenario_names():
    return sorted(p.stem for p in (ROOT / "scenarios").glob("*.toml")) + EXTRA


def dom_state(page):
    """What the page shows now: each primary block's owner and fill (first layer's grid), the
    legend's colour per owner, the tables, the invariant rows, the ring and the frame."""
    return page.evaluate("""(() => {
      const blocks = [...document.querySelectorAll('rect.block.primary[data-first="1"]')]
        .map(r => [+r.dataset.pool, +r.dataset.block, +r.dataset.owner, r.getAttribute('fill')]);
      const legend = {};
      for (const s of document.querySelectorAll('#legend rect.swatch')) legend[s.dataset.owner] = s.getAttribute('fill');
      const tables = {};
      for (const t of document.querySelectorAll('#tables .table'))
        tables[t.dataset.request + ':' + t.dataset.group] = [...t.querySelectorAll('span.entry')].map(e => +e.dataset.block);
      const invariants = [...document.querySelectorAll('#invariants tr.invariant')]
        .map(r => [r.dataset.invariant, r.querySelector('td.status').textContent]);
      const byGrid = new Map();
      for (const r of document.querySelectorAll('rect.block.primary')) {
        if (!byGrid.has(r.dataset.grid)) byGrid.set(r.dataset.grid, [+r.dataset.grid, +r.dataset.pool, []]);
        byGrid.get(r.dataset.grid)[2].push(+r.dataset.owner);
      }
      const grids = [...byGrid.values()];
      return {blocks, legend, tables, invariants, grids, frame: +document.body.dataset.frame,
              secondary: document.querySelectorAll('rect.block.secondary').length,
              rings: document.querySelectorAll('#window svg.ring').length,
              nodes: document.querySelectorAll('#tree circle.node').length,
              paths: [...document.querySelectorAll('#paths svg.path')].map(s => s.querySelectorAll('g.stage').length),
              slider_max: +document.getElementById('frame').max};
    })()""")


def expected_grids(doc):
    """Grids per primary pool: placed per_layer, one per pool layer (layer i of every KV cache group
    of that pool), unless that would draw more than 8192 blocks; else one."""
    sc, pools = doc["scenario"], doc["pools"]
    def layers_of(p):
        users = [g for g in doc["groups"] if g["pool"] == p and g["layers"]]
        return max(len(g["layers"]) for g in users) if users else (sc["layers"] if p == 0 else 1)
    per_pool = {p: layers_of(p) if sc["placement"] == "per_layer" else 1 for p in range(pools)}
    total = sum(per_pool.values())
    if total > pools and sc["primary_blocks"] * total <= 8192:
        return per_pool
    return {p: 1 for p in range(pools)}


def check_frame(doc, state, frame):
    assert state["frame"] == frame
    grids = {}
    for grid, pool, owners in state["grids"]:
        grids.setdefault(pool, []).append(owners)
    assert {p: len(g) for p, g in grids.items()} == expected_grids(doc), "one grid per pool layer (per_layer)"
    for pool, gs in grids.items():
        assert all(g == gs[0] for g in gs), f"pool {pool}: every layer's grid shows the same owners"
    want = owners_at(doc, frame)
    assert len(state["blocks"]) == len(want), "one rect per primary block of every pool"
    for pool, block, owner, fill in state["blocks"]:
        assert owner == want[pool, block], \
            f"pool {pool} block {block} at frame {frame}: page says owner {owner}, JSON {want[pool, block]}"
        assert fill == state["legend"][str(owner)], f"block {block}: fill {fill} is not its owner's legend colour"
    want_tables = tables_at(doc, frame)
    assert set(state["tables"]) == set(want_tables)
    for key, entries in state["tables"].items():
        assert entries == want_tables[key], f"request:group {key}'s table at frame {frame}"


def select_frame(page, frame):
    """Moves the slider as a person would: sets its value and fires the input event."""
    page.evaluate(f"(() => {{ const s = document.getElementById('frame'); s.value = {frame};"
                  f" s.dispatchEvent(new Event('input', {{bubbles: true}})); }})()")


@pytest.mark.parametrize("name", scenario_names())
def test_report_page(name, browser, report_dir, request):
    path = report_dir / f"{name}.html"
    doc = replay_json(path)
    frames = len(doc["frames"])
    page = browser.new_page()
    try:
        page.navigate(path.as_uri())
        assert page.errors() == []
        if frames == 0:  # an op rejected a fault's input before the first step finished
            state = dom_state(page)
            assert any(status == "caught" for _, status in state["invariants"])
            assert len(state["blocks"]) == doc["pools"] * doc["scenario"]["primary_blocks"]
            assert all(owner in (FREE, RESERVED) for _, _, owner, _ in state["blocks"])
            page.screenshot(str(screenshot_dir(request) / f"{name}.png"))
            return

        first = dom_state(page)
        check_frame(doc, first, 0)
        assert first["slider_max"] == frames - 1
        assert first["secondary"] == doc["scenario"]["secondary_blocks"]
        assert first["invariants"] == [[i["name"], i["status"]] for i in doc["invariants"]]
        assert len(first["paths"]) == len(doc["paths"])
        assert all(n == 7 for n in first["paths"]), "token, slot, page, entry, block, element, byte"

        # The slider: to the frame whose owners differ most from the first frame's, then the last.
        owners0 = owners_at(doc, 0)
        moved = max(range(frames), key=lambda k: sum(o != owners0[at] for at, o in owners_at(doc, k).items()))
        select_frame(page, moved)
        state = dom_state(page)
        check_frame(doc, state, moved)
        if owners_at(doc, moved) != owners0:
            assert [b[2] for b in state["blocks"]] != [b[2] for b in first["blocks"]], "the colouring moved"
        select_frame(page, frames - 1)
        last = dom_state(page)
        check_frame(doc, last, frames - 1)
        assert last["invariants"] == first["invariants"]
        if any(g["mode"] != "none" for g in doc["groups"]):
            assert last["rings"] + first["rings"] > 0, "a window scenario draws its ring"
        if doc["scenario"]["reuse"] and any(f["tree"]["add"] for f in doc["frames"]):
            assert max(first["nodes"], state["nodes"], last["nodes"]) > 0, "a reuse scenario draws its tree"
        assert page.errors() == []
        select_frame(page, moved)  # the busiest step makes the most telling picture
        page.screenshot(str(screenshot_dir(request) / f"{name}.png"))
    finally:
        page.close()


def test_fault_pages_draw_paths(report_dir):
    """A caught fault whose finding names a request and position is drawn as its path."""
    drawn = {p.stem for p in report_dir.glob("fault_*.html") if replay_json(p)["paths"]}
    assert {"fault_k_scale_for_v", "fault_past_len_zero", "fault_reused_block_mismatch", "fault_stale_bad_page",
            "fault_v_tail_not_zeroed", "fault_window_mismatch"} <= drawn


def test_index_lists_every_scenario(report_dir, browser):
    page = browser.new_page()
    try:
        page.navigate((report_dir / "index.html").as_uri())
        assert page.errors() == []
        rows = page.evaluate("[...document.querySelectorAll('tr.scenario a')].map(a => a.getAttribute('href'))")
        assert sorted(rows) == sorted(f"{n}.html" for n in scenario_names())
    finally:
        page.close()
