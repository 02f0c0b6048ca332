// An icicle flame graph (root at the top) drawn with positioned divs: click a frame to zoom
// into it, click it again to zoom out, type in the search box to highlight matching frames
// and see how much of the total they hold.
//
// The model is a list of weighted stacks (frame ids, root level first) and the frame names.
// Nodes are built lazily: a node is the set of stacks sharing a path, and its children are
// grouped only when the node is drawn wide enough to show them, so a 100,000-stack DHAT
// profile costs one pass per drawn level, not a tree of every path. Frames narrower than half
// a pixel are drawn as one grey "narrow frames" box per parent, so the DOM stays small. Search
// runs over the stacks: the bytes of every stack with a matching frame, each counted once.

import { el, pct, PALETTE } from './util.js';

const ROW = 18;

// {names, stacks: [[id, ...]], weights: [w, ...]} -> the root node.
function rootOf(model, rootName) {
  const idx = [];
  let value = 0;
  model.stacks.forEach((s, i) => { if (model.weights[i] > 0) { idx.push(i); value += model.weights[i]; } });
  return { id: -1, name: rootName, depth: 0, idx, value, parent: null, kids: null };
}

// The node's children, largest first (computed once).
function children(model, n) {
  if (n.kids) return n.kids;
  const by = new Map();
  for (const i of n.idx) {
    const s = model.stacks[i];
    if (s.length <= n.depth) continue;
    const f = s[n.depth];
    let c = by.get(f);
    if (!c) { c = { id: f, name: model.names[f], depth: n.depth + 1, idx: [], value: 0, parent: n, kids: null }; by.set(f, c); }
    c.idx.push(i);
    c.value += model.weights[i];
  }
  n.kids = [...by.values()].sort((a, b) => b.value - a.value);
  return n.kids;
}

function colour(name) {
  let h = 0;
  for (let i = 0; i < name.length; i++) h = (h * 31 + name.charCodeAt(i)) | 0;
  return PALETTE[Math.abs(h) % PALETTE.length];
}

// opts: {rootName, format(value) -> text, test: data-test prefix}
export function flameGraph(model, opts) {
  const format = opts.format;
  const box = el('div', { class: 'flame', 'data-test': `${opts.test}-flame` });
  const status = el('span', { class: 'flame-status', 'data-test': `${opts.test}-flame-status` });
  const search = el('input', {
    type: 'search', placeholder: 'search frames (regular expression)',
    'data-test': `${opts.test}-flame-search`, oninput: () => draw(),
  });
  let root = rootOf(model, opts.rootName);
  let zoom = root;
  let matchIds = null; // frame id -> matches, while searching

  // Bytes of the stacks with at least one matching frame.
  function findMatches() {
    const q = search.value.trim();
    if (!q) { matchIds = null; return 0; }
    let re;
    try { re = new RegExp(q, 'i'); } catch (e) { re = null; }
    const test = re ? (s) => re.test(s) : (s) => s.toLowerCase().includes(q.toLowerCase());
    matchIds = model.names.map(test);
    let total = 0;
    for (const i of root.idx) if (model.stacks[i].some((f) => matchIds[f])) total += model.weights[i];
    return total;
  }

  function draw() {
    const width = box.clientWidth || 960;
    const matched = findMatches();
    const boxes = [];
    let maxDepth = 0;
    const add = (n, x, w, depth, cls) => {
      maxDepth = Math.max(maxDepth, depth);
      const isMatch = matchIds && n.id >= 0 && matchIds[n.id];
      boxes.push(el('div', {
        class: `frame ${cls}${isMatch ? ' match' : ''}`,
        style: {
          left: `${x}px`, width: `${Math.max(w - 1, 0.5)}px`, top: `${depth * ROW}px`,
          background: matchIds && !isMatch ? '#ddd' : colour(n.name),
        },
        title: `${n.name}\n${format(n.value)} (${pct(n.value, root.value)} of all)`,
        'data-value': n.value,
        onclick: () => { zoom = n === zoom && n.parent ? n.parent : n; draw(); },
      }, w > 30 ? n.name : ''));
    };
    // Ancestors of the zoomed frame: full width, above it.
    const chain = [];
    for (let n = zoom; n; n = n.parent) chain.unshift(n);
    chain.forEach((n, depth) => add(n, 0, width, depth, n === zoom ? '' : 'ancestor'));
    const scale = width / Math.max(zoom.value, 1);
    const todo = [[zoom, 0]];
    while (todo.length) {
      const [n, x] = todo.pop();
      const depth = chain.length - 1 + (n.depth - zoom.depth) + 1;
      let cx = x;
      let narrow = 0;
      let narrowValue = 0;
      for (const c of children(model, n)) {
        const w = c.value * scale;
        if (w >= 0.5) {
          add(c, cx, w, depth, '');
          todo.push([c, cx]);
          cx += w;
        } else {
          narrow++;
          narrowValue += c.value;
        }
      }
      if (narrow && narrowValue * scale >= 0.5) {
        maxDepth = Math.max(maxDepth, depth);
        boxes.push(el('div', {
          class: 'frame narrow',
          style: { left: `${cx}px`, width: `${Math.max(narrowValue * scale - 1, 0.5)}px`, top: `${depth * ROW}px` },
          title: `${narrow} frames too narrow to draw: ${format(narrowValue)} (${pct(narrowValue, root.value)} of all)`,
        }, narrowValue * scale > 30 ? `${narrow} narrow frames` : ''));
      }
    }
    box.style.height = `${(maxDepth + 1) * ROW + 2}px`;
    box.replaceChildren(...boxes);
    status.textContent = matchIds
      ? `${matchIds.filter(Boolean).length} matching frames: ${format(matched)} (${pct(matched, root.value)})`
      : (zoom === root ? '' : `zoomed to ${zoom.name}: ${format(zoom.value)}`);
  }

  const reset = el('button', { onclick: () => { zoom = root; draw(); } }, 'reset zoom');
  const wrap = el('div', { class: 'flame-wrap' }, el('div', { class: 'toolbar' }, search, reset, status), box);
  wrap.redraw = (newModel, rootName) => {
    if (newModel) { model = newModel; root = rootOf(model, rootName || opts.rootName); zoom = root; }
    draw();
  };
  requestAnimationFrame(() => draw());
  return wrap;
}
