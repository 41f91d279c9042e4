// kvsim replay report: draws the recording in #replay (report/include/kvsim/report/recorder.hpp
// describes its fields) at the step the slider picks. Plain JavaScript, nothing fetched.
(function () {
  'use strict';
  const SVGNS = 'http://www.w3.org/2000/svg';
  const doc = JSON.parse(document.getElementById('replay').textContent);
  const frames = doc.frames;
  const sc = doc.scenario;
  const reqs = doc.requests;
  const NB = sc.primary_blocks, NS = sc.secondary_blocks;  // NB blocks in each primary pool
  const NP = doc.pools, groups = doc.groups;
  const FREE = -1, CACHED = -2, RESERVED = -3;
  const KEYFRAME_EVERY = 16;  // the page keeps a full state every 16 steps and replays the changes in between

  function el(tag, attrs, parent, text) {
    const e = tag === 'div' || tag === 'span' || tag === 'a' || tag === 'tr' || tag === 'td' || tag === 'p'
      ? document.createElement(tag) : document.createElementNS(SVGNS, tag);
    for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }
  function ownerColour(o) {
    if (o === FREE) return '#ffffff';
    if (o === CACHED) return '#9aa0a6';
    if (o === RESERVED) return '#222222';
    return 'hsl(' + ((o * 137.508 + 200) % 360).toFixed(1) + ',65%,' + (o % 2 ? 48 : 62) + '%)';
  }
  function ownerName(o) {
    if (o === FREE) return 'free';
    if (o === CACHED) return 'cached (reusable)';
    if (o === RESERVED) return 'null block (reserved)';
    return 'request ' + reqs[o].id;
  }

  // ---------------------------------------------------------------- state at frame k
  // Tables and rings are keyed "request:group" (one page table per KV cache group).
  function initialState() {
    const st = { owner: [], holders: [], sec: new Int8Array(NS), tables: new Map(), lens: new Map(), nodes: new Map(),
      ring: new Map() };
    for (let p = 0; p < NP; ++p) { st.owner.push(new Int32Array(NB).fill(FREE)); st.holders.push(new Int32Array(NB)); }
    for (const [p, b, o, h] of doc.initial) { st.owner[p][b] = o; st.holders[p][b] = h; }
    return st;
  }
  function clone(st) {
    return { owner: st.owner.map((a) => a.slice()), holders: st.holders.map((a) => a.slice()), sec: st.sec.slice(),
      tables: new Map(st.tables), lens: new Map(st.lens), nodes: new Map(st.nodes), ring: new Map(st.ring) };
  }
  function apply(st, f) {
    for (const [p, b, o, h] of f.p) { st.owner[p][b] = o; st.holders[p][b] = h; }
    for (const [b, c] of f.s) st.sec[b] = c;
    for (const [r, g, len, changes] of f.t) {
      const key = r + ':' + g;
      if (len < 0) { st.tables.delete(key); continue; }
      const t = (st.tables.get(key) || []).slice(0, len);  // a new array: keyframes share the old one
      while (t.length < len) t.push(-1);
      for (const [p, b] of changes) t[p] = b;
      st.tables.set(key, t);
    }
    for (const [r, c, ph] of f.r) st.lens.set(r, [c, ph]);
    for (const [id, parent, kind, block, group, pool] of f.tree.add) st.nodes.set(id, [parent, kind, block, group, pool]);
    for (const id of f.tree.del) st.nodes.delete(id);
    for (const [r, g, pos, slot] of f.ring) st.ring.set(r + ':' + g, [pos, slot]);
  }
  function groupText(g) {
    const G = groups[g];
    return 'group ' + g + ' (layers ' + G.layers.join(',') + ', ' + (G.mode === 'none' ? 'full attention' :
      G.mode + ' W=' + G.window + (G.sinks ? ' S=' + G.sinks : '')) + ', pool ' + G.pool + ')';
  }
  const keyframes = [];
  (function build() {
    const st = initialState();
    for (let i = 0; i < frames.length; ++i) {
      apply(st, frames[i]);
      if (i % KEYFRAME_EVERY === 0) keyframes.push(clone(st));
    }
  })();
  function stateAt(k) {
    const base = Math.floor(k / KEYFRAME_EVERY);
    const st = clone(keyframes[base]);
    for (let i = base * KEYFRAME_EVERY + 1; i <= k; ++i) apply(st, frames[i]);
    return st;
  }

  // ---------------------------------------------------------------- header
  document.getElementById('title').textContent = sc.name;
  document.getElementById('description').textContent = sc.description;
  const outcome = document.getElementById('outcome');
  const c = doc.outcome.counters;
  el('span', { class: doc.outcome.ok ? 'ok' : 'notok' }, outcome, doc.outcome.ok ? 'ok' : 'NOT OK');
  outcome.appendChild(document.createTextNode(' ' + c.steps + ' steps, ' + c.prefill_tokens + ' prefilled, ' +
    c.decode_tokens + ' decoded, ' + c.reuse_hit_tokens + ' reused (' + c.partial_reuse_tokens + ' by partial copy), ' +
    c.evicted_blocks + ' evicted, ' + c.offloaded_blocks + ' offloaded, ' + c.onboarded_blocks + ' onboarded, ' +
    c.preemptions + ' preemptions' + (sc.faults.length ? '; faults on: ' + sc.faults.join(', ') : '')));
  document.getElementById('geometry').textContent = 'pool: ' + NB + ' primary + ' + NS + ' secondary blocks of ' +
    sc.page_size + ' tokens; ' + sc.layers + ' layers (' + sc.placement + '), ' + sc.kv_heads + ' KV heads x ' +
    sc.head_dim + ', ' + sc.dtype + ' ' + sc.layout;

  // ---------------------------------------------------------------- pools
  // One grid per primary pool; placed per_layer, one grid per layer of each pool (each pool layer
  // has its own region of the pool; the block ids, hence the owners, are the same in every layer).
  // Pool layer i serves layer i of every KV cache group drawing from that pool (vLLM's hybrid
  // manager: one pool shared by the groups; TensorRT-LLM VSWA: a pool per window size). Beyond
  // 8192 drawn blocks the layers of a pool share one grid, its label listing them (aggregated).
  function poolLayers(p) {
    const users = groups.map((G, g) => [G, g]).filter(([G]) => G.pool === p && G.layers.length);
    if (!users.length) return [...Array(p === 0 ? sc.layers : 1).keys()].map((l) => 'layer ' + l);
    const n = Math.max(...users.map(([G]) => G.layers.length));
    return [...Array(n).keys()].map((i) => users.filter(([G]) => i < G.layers.length)
      .map(([G, g]) => 'layer ' + G.layers[i] + (users.length > 1 ? ' (group ' + g + ')' : '')).join(', '));
  }
  const layerGrids = sc.placement === 'per_layer' ? [...Array(NP).keys()].reduce((n, p) => n + poolLayers(p).length, 0) : NP;
  const perLayer = sc.placement === 'per_layer' && layerGrids > NP && NB * layerGrids <= 8192;
  const cols = Math.min(64, Math.max(8, Math.ceil(Math.sqrt(NB * 2))));
  const cell = NB <= 128 ? 22 : NB <= 1024 ? 14 : 10;
  const grids = [];  // {pool, rects}; the first grid of each pool is the one blockRect() names
  const firstGrid = [];
  const secRects = [];
  (function () {
    const specs = [];
    if (perLayer) for (let p = 0; p < NP; ++p) poolLayers(p).forEach((served, i) =>
      specs.push([p, (NP > 1 ? 'primary pool ' + p : 'primary pool') + ', pool layer ' + i + ': ' + served +
        ' (per_layer placement)']));
    else for (let p = 0; p < NP; ++p) {
      const users = groups.map((G, g) => [G, g]).filter(([G]) => G.pool === p).map(([, g]) => groupText(g));
      const shared = sc.placement === 'per_layer' && poolLayers(p).length > 1
        ? '; its ' + poolLayers(p).length + ' per_layer layers share this grid (same owners in each)' : '';
      specs.push([p, (NP > 1 ? 'primary pool ' + p : 'primary pool') + (groups.length > 1 ? ': ' + users.join('; ') :
        sc.layers > 1 ? ' (' + sc.placement + ')' : '') + shared]);
    }
    const rowsP = Math.ceil(NB / cols), rowsS = NS ? Math.ceil(NS / cols) : 0;
    const gridH = rowsP * cell + 22;
    const height = specs.length * gridH + (NS ? rowsS * cell + 30 : 0) + 6;
    const svg = el('svg', { width: Math.max(cols * cell + 12, 520), height: height, id: 'pools-svg' }, document.getElementById('pools'));
    const defs = el('defs', {}, svg);
    const m = el('marker', { id: 'head', viewBox: '0 0 10 10', refX: 9, refY: 5, markerWidth: 6, markerHeight: 6, orient: 'auto' }, defs);
    el('path', { d: 'M0,0 L10,5 L0,10 z', fill: '#333' }, m);
    specs.forEach(([pool, label], i) => {
      const y0 = i * gridH;
      el('text', { x: 2, y: y0 + 14, class: 'small' }, svg, label);
      const first = firstGrid[pool] === undefined;
      const rects = [];
      for (let b = 0; b < NB; ++b) {
        const r = el('rect', { x: 2 + (b % cols) * cell, y: y0 + 20 + Math.floor(b / cols) * cell, width: cell - 2,
          height: cell - 2, class: 'block primary', 'data-pool': pool, 'data-block': b, 'data-grid': i,
          'data-first': first ? 1 : 0, 'data-owner': FREE, fill: ownerColour(FREE) }, svg);
        el('title', {}, r, '');
        if (cell >= 20) el('text', { x: 4 + (b % cols) * cell, y: y0 + 32 + Math.floor(b / cols) * cell, class: 'small', 'pointer-events': 'none' }, svg, b);
        rects.push(r);
      }
      if (first) firstGrid[pool] = rects;
      grids.push({ pool: pool, rects: rects });
    });
    if (NS) {
      const y0 = specs.length * gridH;
      el('text', { x: 2, y: y0 + 14, class: 'small' }, svg, 'secondary pool (offloaded cached blocks)');
      for (let b = 0; b < NS; ++b)
        secRects.push(el('rect', { x: 2 + (b % cols) * cell, y: y0 + 20 + Math.floor(b / cols) * cell, width: cell - 2,
          height: cell - 2, class: 'block secondary', 'data-block': b, 'data-state': 0, fill: '#ffffff' }, svg));
    }
    el('g', { id: 'arrows' }, svg);
  })();
  function centre(r) {
    return [+r.getAttribute('x') + (cell - 2) / 2, +r.getAttribute('y') + (cell - 2) / 2];
  }

  function drawLegend(st) {
    const legend = document.getElementById('legend');
    legend.textContent = '';
    const owners = new Set([FREE, CACHED]);
    for (let p = 0; p < NP; ++p) for (let b = 0; b < NB; ++b) owners.add(st.owner[p][b]);
    for (const o of [...owners].sort((a, b) => a - b)) {
      const k = el('span', { class: 'key' }, legend);
      const s = el('svg', { width: 14, height: 14 }, k);
      el('rect', { x: 1, y: 1, width: 12, height: 12, class: 'swatch', 'data-owner': o, fill: ownerColour(o), stroke: '#888' }, s);
      k.appendChild(document.createTextNode(ownerName(o)));
    }
    if (NS) {
      const k = el('span', { class: 'key' }, legend);
      const s = el('svg', { width: 14, height: 14 }, k);
      el('rect', { x: 1, y: 1, width: 12, height: 12, fill: '#d7bde2', stroke: '#888' }, s);
      k.appendChild(document.createTextNode('secondary: holds an offloaded block'));
    }
  }

  function drawPools(st, f) {
    for (const grid of grids)
      for (let b = 0; b < NB; ++b) {
        const r = grid.rects[b], o = st.owner[grid.pool][b], h = st.holders[grid.pool][b];
        r.setAttribute('data-owner', o);
        r.setAttribute('fill', ownerColour(o));
        r.setAttribute('class', 'block primary' + (h > 1 ? ' shared' : ''));
        r.firstChild.textContent = 'block ' + b + ': ' + ownerName(o) + (h > 1 ? ', shared by ' + h + ' table entries' : '');
      }
    for (let b = 0; b < NS; ++b) {
      secRects[b].setAttribute('data-state', st.sec[b]);
      secRects[b].setAttribute('fill', st.sec[b] ? '#d7bde2' : '#ffffff');
    }
    const arrows = document.getElementById('arrows');
    arrows.textContent = '';
    for (const [kind, , block, secondary, source, , pool] of f.ev) {
      const rects = firstGrid[pool] || [];
      let from = null, to = null;
      if (kind === 'partial_copy') { from = rects[source]; to = rects[block]; }
      if (kind === 'onboard' && NS) { from = secRects[secondary]; to = rects[block]; }
      if (kind === 'offload' && NS) { from = rects[block]; to = secRects[secondary]; }
      if (!from || !to) continue;
      const [x1, y1] = centre(from), [x2, y2] = centre(to);
      el('line', { x1: x1, y1: y1, x2: x2, y2: y2, class: 'arrow ' + kind, 'marker-end': 'url(#head)' }, arrows);
    }
  }

  // ---------------------------------------------------------------- page tables
  function drawTables(st) {
    const box = document.getElementById('tables');
    box.textContent = '';
    const keys = [...st.tables.keys()].sort((a, b) => { const [ra, ga] = a.split(':').map(Number), [rb, gb] = b.split(':').map(Number); return ra - rb || ga - gb; });
    if (!keys.length) el('p', { class: 'muted' }, box, 'no request holds a table after this step');
    for (const key of keys) {
      const [r, g] = key.split(':').map(Number);
      const pool = groups[g].pool;
      const t = st.tables.get(key);
      const len = st.lens.get(r);
      const row = el('div', { class: 'table', 'data-request': r, 'data-group': g }, box);
      el('span', { class: 'rid' }, row, reqs[r].id + (groups.length > 1 ? ', ' + groupText(g) : '') + ' (' +
        (len ? len[0] : 0) + ' tokens, ' + t.length + ' pages)');
      t.forEach((b, p) => {
        const isNull = b === 0 && st.owner[pool][0] === RESERVED;
        const cls = b === -1 ? 'entry bad' : isNull ? 'entry null' : 'entry';
        const e = el('span', { class: cls, 'data-pool': pool, 'data-block': b, 'data-page': p, title: 'page ' + p + ' -> ' +
          (b === -1 ? 'BAD_PAGE (-1)' : isNull ? 'the null block (left the window)' : 'block ' + b) }, row,
          b === -1 ? '\u22121' : isNull ? '\u2205' : String(b));
        if (b >= 0 && !isNull) e.style.background = ownerColour(st.owner[pool][b]);
      });
    }
  }
  // Hover: an entry lights its block and the block every entry that holds it.
  function light(pool, block, on) {
    for (const grid of grids) if (grid.pool === pool && grid.rects[block]) grid.rects[block].classList.toggle('lit', on);
    for (const e of document.querySelectorAll('span.entry[data-pool="' + pool + '"][data-block="' + block + '"]')) e.classList.toggle('lit', on);
  }
  for (const [id, sel] of [['tables', 'span.entry'], ['pools', 'rect.block.primary']]) {
    const box = document.getElementById(id);
    const at = (t, on) => light(+t.getAttribute('data-pool'), +t.getAttribute('data-block'), on);
    box.addEventListener('mouseover', (ev) => { const t = ev.target.closest(sel); if (t) at(t, true); });
    box.addEventListener('mouseout', (ev) => { const t = ev.target.closest(sel); if (t) at(t, false); });
  }

  // ---------------------------------------------------------------- window ring
  function drawWindow(st) {
    const box = document.getElementById('window');
    box.textContent = '';
    const windowed = groups.map((G, g) => [G, g]).filter(([G]) => G.mode !== 'none');
    if (!windowed.length) { el('p', { class: 'muted' }, box, 'no sliding window in this scenario'); return; }
    for (const [w, g] of windowed) {
      el('p', { class: 'ring-label' }, box, (groups.length > 1 ? groupText(g) + ': ' : '') + w.mode + ' window W = ' +
        w.window + ', sinks S = ' + w.sinks + (w.mode === 'sliding' ? '; slot = position, the window picks the keys and ' +
        'releases the pages before it' : ', bubble = ' + w.bubble + ', ring of cyclic_len = ' + w.cyclic_len + ' slots' +
        (w.one_more_block ? ' (one more block)' : '')) + (groups.length === 1 ? '; one window for every layer (' + sc.layers + ' layers)' : ''));
      for (const key of [...st.ring.keys()].filter((k) => k.endsWith(':' + g)).sort((a, b) => parseInt(a) - parseInt(b))) {
        if (!st.tables.has(key)) continue;
        const r = parseInt(key);
        const [pos, slot] = st.ring.get(key);
        (w.mode === 'sliding' ? drawStrip : drawRing)(box, w, r, g, pos, slot);
      }
    }
  }
  function drawRing(box, w, r, g, pos, slot) {
    const len = pos + 1;
    const R = 70, cx = 240, cy = 98;
    const svg = el('svg', { width: 340, height: 186, class: 'ring', 'data-request': r, 'data-group': g, 'data-newest-slot': slot }, box);
    el('text', { x: 2, y: 12, class: 'small' }, svg, reqs[r].id + ': newest token ' + pos + ' -> slot ' + slot);
    // sinks and the bubble: a strip of slots before the ring
    const pre = w.sinks + w.bubble, sw = Math.max(3, Math.min(12, 140 / Math.max(pre, 1)));
    for (let i = 0; i < pre; ++i)
      el('rect', { x: 2 + i * sw, y: 24, width: sw - 1, height: 14, class: i < w.sinks ? 'sink' : 'bubble',
        fill: i < w.sinks ? (i < len ? '#27ae60' : '#d5f5e3') : '#eeeeee', stroke: slot === i ? '#c0392b' : '#999',
        'stroke-width': slot === i ? 3 : 0.5 }, svg);
    if (pre) el('text', { x: 2, y: 52, class: 'small' }, svg, w.sinks + ' sinks' + (w.bubble ? ' + ' + w.bubble + ' bubble' : ''));
    // the ring: at most 256 segments; beyond that each segment stands for several slots
    const n = w.cyclic_len, segs = Math.min(n, 256), per = n / segs;
    const written = Math.min(Math.max(len - w.sinks, 0), n);
    const ringSlot = slot - pre;
    for (let s = 0; s < segs; ++s) {
      const a0 = (s / segs) * 2 * Math.PI - Math.PI / 2, a1 = ((s + 1) / segs) * 2 * Math.PI - Math.PI / 2;
      const first = Math.floor(s * per), last = Math.floor((s + 1) * per) - 1;
      const newest = ringSlot >= first && ringSlot <= last;
      const filled = first < written;
      el('path', { d: 'M' + (cx + R * Math.cos(a0)) + ',' + (cy + R * Math.sin(a0)) + ' A' + R + ',' + R + ' 0 0,1 ' +
        (cx + R * Math.cos(a1)) + ',' + (cy + R * Math.sin(a1)), fill: 'none',
        stroke: newest ? '#c0392b' : filled ? '#2980b9' : '#d6eaf8', 'stroke-width': newest ? 16 : 11,
        class: 'ring-slot' + (newest ? ' newest' : '') }, svg);
    }
    el('text', { x: cx - 34, y: cy + 4, class: 'small' }, svg, 'ring ' + written + '/' + n);
  }
  // vLLM's sliding window: slots are positions; the sinks and the last W - S tokens are attended.
  function drawStrip(box, w, r, g, pos, slot) {
    const len = pos + 1, width = 600, x = (t) => 2 + (t / Math.max(len, 1)) * width;
    const svg = el('svg', { width: width + 10, height: 52, class: 'ring strip', 'data-request': r, 'data-group': g, 'data-newest-slot': slot }, box);
    el('text', { x: 2, y: 12, class: 'small' }, svg, reqs[r].id + ': newest token ' + pos + ' -> slot ' + slot +
      '; attended: sinks [0, ' + w.sinks + ') and [' + Math.max(w.sinks, len - (w.window - w.sinks)) + ', ' + len + ')');
    el('rect', { x: 2, y: 20, width: width, height: 14, fill: '#eeeeee', stroke: '#999' }, svg);
    if (w.sinks) el('rect', { x: 2, y: 20, width: x(Math.min(w.sinks, len)) - 2, height: 14, fill: '#27ae60' }, svg);
    const from = Math.max(w.sinks, len - (w.window - w.sinks));
    el('rect', { x: x(from), y: 20, width: x(len) - x(from), height: 14, fill: '#2980b9' }, svg);
    el('rect', { x: x(pos), y: 18, width: Math.max(2, x(len) - x(pos)), height: 18, fill: '#c0392b', class: 'ring-slot newest' }, svg);
  }

  // ---------------------------------------------------------------- prefix tree
  function drawTree(st, f) {
    const box = document.getElementById('tree');
    box.textContent = '';
    if (!sc.reuse) { el('p', { class: 'muted' }, box, 'prefix reuse is off in this scenario'); return; }
    const nodes = st.nodes;
    const hits = new Set(), onboarded = new Set();  // "pool:block"
    const copies = [];
    for (const [kind, , block, , source, tokens, pool] of f.ev) {
      if (kind === 'hit') hits.add(pool + ':' + block);
      if (kind === 'onboard') onboarded.add(pool + ':' + block);
      if (kind === 'partial_copy') copies.push([pool + ':' + source, block, tokens]);
    }
    const children = new Map();
    for (const [id, [parent]] of nodes) {
      const p = nodes.has(parent) ? parent : -1;
      if (!children.has(p)) children.set(p, []);
      children.get(p).push(id);
    }
    const pos = new Map();
    let leaf = 0, depthMax = 0;
    (function place(id, depth) {  // iterative would be kinder to deep chains; prompts stay short
      const kids = (children.get(id) || []).sort((a, b) => a - b);
      if (id !== -1) {
        if (!kids.length) pos.set(id, [leaf++, depth]);
        depthMax = Math.max(depthMax, depth);
      }
      const xs = [];
      for (const k of kids) { place(k, depth + 1); xs.push(pos.get(k)[0]); }
      if (id !== -1 && kids.length) pos.set(id, [(Math.min(...xs) + Math.max(...xs)) / 2, depth]);
    })(-1, 0);
    el('p', { class: 'muted' }, box, nodes.size + ' cached blocks in the tree; ' + hits.size + ' hit this step' +
      (copies.length ? ', ' + copies.length + ' partial copies' : '') + (onboarded.size ? ', ' + onboarded.size + ' onboarded' : ''));
    // Depth runs left to right (a prompt's blocks in order), one row per leaf.
    const dy = nodes.size > 200 ? 8 : 26, dx = nodes.size > 200 ? 14 : 40;
    const svg = el('svg', { width: depthMax * dx + 200, height: Math.max(40, leaf * dy + 20), id: 'tree-svg' }, box);
    const defs = el('defs', {}, svg);
    const m = el('marker', { id: 'thead', viewBox: '0 0 10 10', refX: 9, refY: 5, markerWidth: 6, markerHeight: 6, orient: 'auto' }, defs);
    el('path', { d: 'M0,0 L10,5 L0,10 z', fill: '#d35400' }, m);
    const xy = (id) => { const [row, d] = pos.get(id); return [d * dx - dx / 2 + 4, 14 + row * dy]; };
    for (const [id, [parent]] of nodes)
      if (nodes.has(parent)) {
        const [x1, y1] = xy(parent), [x2, y2] = xy(id);
        el('line', { x1: x1, y1: y1, x2: x2, y2: y2, stroke: '#999' }, svg);
      }
    const byBlock = new Map();
    for (const [id, [, kind, block, group, pool]] of nodes) {
      const [x, y] = xy(id);
      const at = pool + ':' + block, primary = kind === 0;
      if (primary) byBlock.set(at, [x, y]);
      const cls = 'node' + (primary ? '' : ' secondary') + (primary && hits.has(at) ? ' hit' : '') +
        (primary && onboarded.has(at) ? ' onboarded' : '');
      const n = el('circle', { cx: x, cy: y, r: dy > 20 ? 11 : 3, class: cls, 'data-node': id, 'data-block': block,
        'data-kind': kind, 'data-group': group }, svg);
      el('title', {}, n, (primary ? 'primary block ' + block + (NP > 1 ? ' of pool ' + pool : '') : 'secondary block ' + block) +
        (groups.length > 1 ? ', ' + groupText(group) : '') + (primary && hits.has(at) ? ': hit this step' : ''));
      if (dy > 20) el('text', { x: x - 7, y: y + 4, class: 'small', 'pointer-events': 'none' }, svg, (primary ? '' : 's') + block);
    }
    copies.forEach(([src, dst, tokens], i) => {
      const at = byBlock.get(src);
      if (!at) return;
      const x2 = at[0] + 50, y2 = at[1] + 18 + i * 6;
      el('line', { x1: at[0] + 8, y1: at[1] + 8, x2: x2, y2: y2, stroke: '#d35400', 'stroke-width': 2, 'marker-end': 'url(#thead)', class: 'copy-arrow' }, svg);
      el('text', { x: x2 + 4, y: y2 + 4, class: 'small' }, svg, 'copy ' + tokens + ' tok -> block ' + dst);
    });
  }

  // ---------------------------------------------------------------- timeline
  const EVENT_ROWS = ['hit', 'partial_copy', 'evict', 'offload', 'onboard', 'release', 'preempt'];
  const timeline = (function () {
    const box = document.getElementById('timeline');
    const n = frames.length, w = Math.max(2, Math.min(24, Math.floor(900 / Math.max(n, 1))));
    let maxTok = 1;
    const tok = frames.map((f) => {
      const p = f.prefill.reduce((a, x) => a + x[2], 0), d = f.decode.length;
      maxTok = Math.max(maxTok, p + d);
      return [p, d];
    });
    const barH = 80, rowH = 12, left = 90;
    const svg = el('svg', { width: left + n * w + 10, height: barH + 20 + EVENT_ROWS.length * rowH + 16, id: 'timeline-svg' }, box);
    el('text', { x: 2, y: 12, class: 'small' }, svg, 'tokens (max ' + maxTok + ')');
    el('text', { x: 2, y: 26, class: 'small', fill: '#2e86c1' }, svg, '\u25a0 prefilled');
    el('text', { x: 2, y: 40, class: 'small', fill: '#28b463' }, svg, '\u25a0 decoded');
    const cursor = el('rect', { x: left, y: 0, width: w, height: barH + 20 + EVENT_ROWS.length * rowH, class: 'cursor' }, svg);
    tok.forEach(([p, d], i) => {
      const hp = (p / maxTok) * barH, hd = (d / maxTok) * barH;
      el('rect', { x: left + i * w, y: barH - hp - hd + 4, width: Math.max(1, w - 1), height: hp, fill: '#2e86c1', 'data-frame': i }, svg);
      el('rect', { x: left + i * w, y: barH - hd + 4, width: Math.max(1, w - 1), height: hd, fill: '#28b463', 'data-frame': i }, svg);
    });
    EVENT_ROWS.forEach((kind, j) => {
      const y = barH + 20 + j * rowH;
      el('text', { x: 2, y: y + 9, class: 'small' }, svg, kind);
      frames.forEach((f, i) => {
        const count = f.ev.filter((e) => e[0] === kind).length;
        if (count) {
          const m = el('rect', { x: left + i * w, y: y + 1, width: Math.max(1, w - 1), height: rowH - 2, fill: '#e67e22',
            'fill-opacity': Math.min(1, 0.35 + count / 8), class: 'event ' + kind, 'data-frame': i }, svg);
          el('title', {}, m, 'step ' + f.step + ': ' + count + ' ' + kind);
        }
      });
    });
    svg.addEventListener('click', (ev) => {
      const x = ev.clientX - svg.getBoundingClientRect().left - left;
      if (x >= 0) setFrame(Math.min(n - 1, Math.floor(x / w)));
    });
    return { move: (k) => cursor.setAttribute('x', left + k * w) };
  })();

  // ---------------------------------------------------------------- invariants and paths
  (function () {
    const body = document.querySelector('#invariants tbody');
    for (const inv of doc.invariants) {
      const tr = el('tr', { class: 'invariant ' + inv.status, 'data-invariant': inv.name, 'data-frame': inv.frame }, body);
      el('td', { title: inv.checks }, tr, inv.name);  // what it checks, from sim's invariant table
      el('td', { class: 'status' }, tr, inv.status);
      const td = el('td', {}, tr);
      if (inv.frame >= 0 && inv.frame < frames.length) {
        const a = el('a', { class: 'goto', 'data-frame': inv.frame }, td, 'step ' + frames[inv.frame].step);
        a.addEventListener('click', () => setFrame(inv.frame));
      }
      el('td', {}, tr, inv.detail);
    }
    const ex = document.getElementById('expectations');
    for (const e of doc.outcome.expectation_failures) el('p', { class: 'notok' }, ex, e);
    const paths = document.getElementById('paths');
    if (!doc.paths.length) el('p', { class: 'muted' }, paths, 'nothing failed or differed: no path to draw');
    for (const p of doc.paths) {
      const div = el('div', { class: 'path-block', 'data-invariant': p.invariant }, paths);
      if (p.frame >= 0 && p.frame < frames.length) {
        const a = el('a', { class: 'goto', 'data-frame': p.frame }, div, 'show step ' + frames[p.frame].step);
        a.addEventListener('click', () => setFrame(p.frame));
      }
      const holder = el('div', {}, div);
      holder.innerHTML = p.svg;
    }
  })();

  // ---------------------------------------------------------------- the slider
  const slider = document.getElementById('frame');
  slider.max = Math.max(0, frames.length - 1);
  let current = -1;
  function setFrame(k) {
    if (!frames.length) {  // the run stopped before its first step finished (an op rejected a fault's input)
      const st = initialState();
      document.getElementById('frame-label').textContent = 'no step finished: the pools as the run started';
      drawLegend(st);
      drawPools(st, { ev: [] });
      drawTables(st);
      drawWindow(st);
      drawTree(st, { ev: [] });
      current = 0;
      document.body.setAttribute('data-frame', 0);
      return;
    }
    k = Math.max(0, Math.min(frames.length - 1, k | 0));
    const st = stateAt(k), f = frames[k];
    slider.value = k;
    document.getElementById('frame-label').textContent = 'step ' + f.step + ' (' + (k + 1) + ' of ' + frames.length + ')';
    const [free, ref, cached, sec] = f.counts;
    document.getElementById('counts').textContent = 'primary: ' + free + ' free, ' + ref + ' referenced, ' + cached +
      ' cached' + (NS ? '; secondary: ' + sec + ' held' : '') + (f.cons ? '; CONSERVATION: ' + f.cons : '');
    drawLegend(st);
    drawPools(st, f);
    drawTables(st);
    drawWindow(st);
    drawTree(st, f);
    timeline.move(k);
    current = k;
    document.body.setAttribute('data-frame', k);
  }
  slider.addEventListener('input', () => setFrame(+slider.value));
  document.getElementById('prev').addEventListener('click', () => setFrame(current - 1));
  document.getElementById('next').addEventListener('click', () => setFrame(current + 1));
  document.addEventListener('keydown', (ev) => {
    if (ev.target === slider) return;  // the range input moves itself and fires 'input'
    if (ev.key === 'ArrowLeft') setFrame(current - 1);
    if (ev.key === 'ArrowRight') setFrame(current + 1);
  });
  // For tests and for people with a console: kvsimReport.setFrame(k).
  window.kvsimReport = { frames: frames.length, setFrame: setFrame, frame: () => current, ownerColour: ownerColour };
  setFrame(0);
})();
