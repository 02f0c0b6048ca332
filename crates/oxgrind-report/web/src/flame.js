// An icicle flame graph (root at the top) drawn with positioned divs: click a frame to zoom
// into it, click the root or "reset" to zoom out, type in the search box to highlight matching
// frames and see how much of the total they hold.
//
// Frames narrower than half a pixel are not drawn, so the DOM stays small whatever the input
// (a 100,000-site DHAT profile draws a few thousand boxes); search still covers every node.

import { el, pct, PALETTE } from './util.js';

const ROW = 18;

// A tree from weighted stacks. `stacks` yields [frames, weight] with frames listed from the
// tree's root level downwards; equal frames at the same level under the same parent merge.
export function treeFromStacks(rootName, stacks) {
  const root = { name: rootName, value: 0, children: new Map() };
  for (const [frames, w] of stacks) {
    if (!(w > 0)) continue;
    root.value += w;
    let n = root;
    for (const f of frames) {
      let c = n.children.get(f);
      if (!c) { c = { name: f, value: 0, children: new Map() }; n.children.set(f, c); }
      c.value += w;
      n = c;
    }
  }
  return finish(root);
}

// Children as arrays sorted by value, largest first (iterative: stacks can be deep).
function finish(root) {
  const todo = [root];
  while (todo.length) {
    const n = todo.pop();
    n.children = [...n.children.values()].sort((a, b) => b.value - a.value);
    for (const c of n.children) { c.parent = n; todo.push(c); }
  }
  return root;
}

// A tree already in {name, value, children: []} form (Massif's), given parents and order.
export function adoptTree(root) {
  const todo = [root];
  while (todo.length) {
    const n = todo.pop();
    n.children.sort((a, b) => b.value - a.value);
    for (const c of n.children) { c.parent = n; todo.push(c); }
  }
  return root;
}

function colour(name) {
  let h = 0;
  for (let i = 0; i < name.length; i++) h = (h * 31 + name.charCodeAt(i)) | 0;
  return PALETTE[Math.abs(h) % PALETTE.length];
}

// opts: {format(value) -> text, label(name) -> shown text, test: data-test prefix}
export function flameGraph(root, opts) {
  const format = opts.format;
  const label = opts.label || ((n) => n);
  const box = el('div', { class: 'flame', 'data-test': `${opts.test}-flame` });
  const status = el('span', { class: 'flame-status', 'data-test': `${opts.test}-flame-status` });
  const search = el('input', {
    type: 'search', placeholder: 'search frames (regular expression)',
    'data-test': `${opts.test}-flame-search`, oninput: () => draw(),
  });
  let zoom = root;
  let matches = new Set();

  function findMatches() {
    matches = new Set();
    const q = search.value.trim();
    if (!q) return 0;
    let re;
    try { re = new RegExp(q, 'i'); } catch (e) { re = null; }
    const test = re ? (s) => re.test(s) : (s) => s.toLowerCase().includes(q.toLowerCase());
    // Bytes under matching frames, counting a matching frame inside another one once.
    let total = 0;
    const todo = [[root, false]];
    while (todo.length) {
      const [n, inside] = todo.pop();
      const m = n !== root && test(n.name);
      if (m) matches.add(n);
      if (m && !inside) total += n.value;
      for (const c of n.children) todo.push([c, inside || m]);
    }
    return total;
  }

  function draw() {
    const width = box.clientWidth || 960;
    const matched = findMatches();
    const nodes = [];
    // Ancestors of the zoomed frame: full width, above it.
    const chain = [];
    for (let n = zoom; n; n = n.parent) chain.unshift(n);
    chain.forEach((n, depth) => nodes.push([n, 0, width, depth, n !== zoom]));
    const scale = width / Math.max(zoom.value, 1);
    const todo = [[zoom, 0, chain.length - 1]];
    while (todo.length) {
      const [n, x, depth] = todo.pop();
      let cx = x;
      for (const c of n.children) {
        const w = c.value * scale;
        if (w >= 0.5) {
          nodes.push([c, cx, w, depth + 1, false]);
          todo.push([c, cx, depth + 1]);
        }
        cx += w;
      }
    }
    let maxDepth = 0;
    const divs = nodes.map(([n, x, w, depth, ancestor]) => {
      maxDepth = Math.max(maxDepth, depth);
      const cls = ['frame'];
      if (ancestor) cls.push('ancestor');
      if (matches.has(n)) cls.push('match');
      return el('div', {
        class: cls.join(' '),
        style: {
          left: `${x}px`, width: `${Math.max(w - 1, 0.5)}px`, top: `${depth * ROW}px`,
          background: matches.size && !matches.has(n) ? '#ddd' : colour(n.name),
        },
        title: `${n.name}\n${format(n.value)} (${pct(n.value, root.value)} of all)`,
        'data-value': n.value,
        onclick: () => { zoom = n === zoom && n.parent ? n.parent : n; draw(); },
      }, w > 30 ? label(n.name) : '');
    });
    box.style.height = `${(maxDepth + 1) * ROW + 2}px`;
    box.replaceChildren(...divs);
    status.textContent = search.value.trim()
      ? `${matches.size} matching frames: ${format(matched)} (${pct(matched, root.value)})`
      : (zoom === root ? '' : `zoomed to ${label(zoom.name)}: ${format(zoom.value)}`);
  }

  const reset = el('button', { onclick: () => { zoom = root; draw(); } }, 'reset zoom');
  const wrap = el('div', { class: 'flame-wrap' }, el('div', { class: 'toolbar' }, search, reset, status), box);
  wrap.redraw = (newRoot) => { if (newRoot) { root = newRoot; zoom = newRoot; } draw(); };
  // Drawn once the box is in the document (it needs its width).
  requestAnimationFrame(() => draw());
  return wrap;
}
