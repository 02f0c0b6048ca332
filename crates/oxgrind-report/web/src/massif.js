// The Massif view: summary, heap over time stacked by the top allocation sites, the peak
// snapshot as a flame graph (allocation sites first, as Massif's tree, or callers first),
// and the sites at the peak.

import { el, both, human, pct, stripAddress, table, PALETTE } from './util.js';
import { stackedChart } from './chart.js';
import { flameGraph } from './flame.js';

const UNIT = { i: 'instructions', B: 'bytes allocated/freed', ms: 'milliseconds' };

// Massif's peak tree as flame-graph stacks: every node's own bytes (those not passed on to a
// child) along its path below the root, allocation site first as ms_print shows it, or
// reversed (callers first, main at the top). Iterative: the tree can be deep.
function massifModel(t, callersFirst) {
  const names = [];
  const ids = new Map();
  const id = (label) => {
    const name = stripAddress(label);
    let i = ids.get(name);
    if (i === undefined) { i = names.length; names.push(name); ids.set(name, i); }
    return i;
  };
  const stacks = [];
  const weights = [];
  const todo = t[2].map((c) => [c, []]);
  while (todo.length) {
    const [[label, bytes, kids], path] = todo.pop();
    const here = path.concat([id(label)]);
    const own = bytes - kids.reduce((s, c) => s + c[1], 0);
    if (own > 0) { stacks.push(callersFirst ? here.slice().reverse() : here); weights.push(own); }
    for (const c of kids) todo.push([c, here]);
  }
  return { names, stacks, weights };
}

export function massifView(f) {
  const out = [];
  const peak = f.peak;
  const unit = UNIT[f.time_unit] || f.time_unit;
  out.push(el('h2', null, f.pages_as_heap ? 'Massif (pages as heap)' : 'Massif'));
  out.push(el('p', { class: 'cmd' }, el('code', null, f.cmd), f.desc && f.desc !== '(none)' ? ` (${f.desc})` : ''));
  if (peak) {
    out.push(el('div', { class: 'cards' },
      el('div', { class: 'card' }, el('div', { class: 'label' }, 'peak'),
        el('div', { class: 'big', 'data-test': 'massif-peak', 'data-bytes': peak.total_b }, both(peak.total_b)),
        el('div', { class: 'small' }, `snapshot ${peak.snapshot}, at ${peak.time} ${unit}`)),
      el('div', { class: 'card' }, el('div', { class: 'label' }, f.pages_as_heap ? 'pages' : 'useful heap'),
        el('div', { class: 'big' }, both(peak.heap_b))),
      el('div', { class: 'card' }, el('div', { class: 'label' }, 'extra heap (admin, alignment)'),
        el('div', { class: 'big' }, both(peak.extra_b))),
      f.stacks ? el('div', { class: 'card' }, el('div', { class: 'label' }, 'stacks'),
        el('div', { class: 'big' }, both(peak.stacks_b))) : null));
  } else {
    out.push(el('p', null, 'No snapshots.'));
  }

  // Chart: bands at snapshots with a tree (sites, other sites, extra heap, stacks), the total
  // through every snapshot.
  const snaps = f.snapshots;
  const rows = f.chart;
  const xs = rows.map(([i]) => snaps[i][0]);
  const layers = f.chart_sites.map((name, k) => ({
    name, color: PALETTE[k % PALETTE.length], values: rows.map(([, b]) => b[k]),
  }));
  layers.push({ name: 'other sites', color: '#bbbbbb', values: rows.map(([, b]) => b[b.length - 1]) });
  layers.push({ name: 'extra heap', color: '#dddddd', values: rows.map(([i]) => snaps[i][2]) });
  if (f.stacks) layers.push({ name: 'stacks', color: '#999999', values: rows.map(([i]) => snaps[i][3]) });
  const byIndex = new Map(rows.map(([i, b]) => [i, b]));
  // Trees by snapshot index: the peak's whole, the others with small nodes folded.
  const trees = new Map(f.trees);
  if (f.peak_tree && peak) trees.set(peak.snapshot, f.peak_tree);
  let pick = () => {};
  const chart = stackedChart({
    onPick: (i) => pick(i),
    test: 'massif', xs, layers, xLabel: `time (${f.time_unit})`,
    line: { xs: snaps.map((s) => s[0]), values: snaps.map((s) => s[1] + s[2] + s[3]), name: 'total' },
    marks: snaps.map((s) => s[4]),
    detail: (i) => {
      const b = byIndex.get(i);
      if (!b) return el('div', { class: 'small' }, 'no tree at this snapshot (click: the nearest one)');
      const top = f.chart_sites.map((n, k) => [n, b[k]]).filter(([, v]) => v > 0).slice(0, 5);
      return el('div', null, top.map(([n, v]) => el('div', { class: 'small' }, `${human(v)}  ${n}`)));
    },
  });
  out.push(el('h3', null, 'Memory over time'), chart);

  if (f.peak_tree) {
    let flame;
    let shown = peak.snapshot;
    const title = el('span', { 'data-test': 'massif-flame-title' });
    const back = el('button', { onclick: () => pick(peak.snapshot) }, 'back to the peak');
    const show = () => {
      const t = trees.get(shown);
      title.textContent = shown === peak.snapshot ? `Peak snapshot (${shown}) ` : `Snapshot ${shown} `;
      back.hidden = shown === peak.snapshot;
      flame.redraw(massifModel(t, order.value === 'callers'), t[0]);
    };
    const order = el('select', { 'data-test': 'massif-flame-order', onchange: show },
      el('option', { value: 'sites' }, 'allocation sites first (as ms_print)'),
      el('option', { value: 'callers' }, 'callers first (from main)'));
    flame = flameGraph(massifModel(f.peak_tree, false), { test: 'massif', format: both, rootName: f.peak_tree[0] });
    // A click on the chart shows the nearest snapshot that has a tree.
    pick = (i) => {
      let best = null;
      for (const k of trees.keys()) if (best === null || Math.abs(k - i) < Math.abs(best - i)) best = k;
      if (best !== null) { shown = best; show(); }
    };
    title.textContent = `Peak snapshot (${shown}) `;
    back.hidden = true;
    out.push(el('h3', null, title, order, ' ', back), el('p', { class: 'small' },
      'Click the chart to see another snapshot that has a tree.'), flame);
    out.push(el('h3', null, 'Allocation sites at the peak'));
    const total = peak ? peak.heap_b : 0;
    out.push(table([
      { name: 'bytes at peak', num: true, value: (r) => r[1], text: (r) => both(r[1]) },
      { name: 'share of heap', num: true, value: (r) => r[1], text: (r) => pct(r[1], total) },
      { name: 'site', value: (r) => r[0] },
    ], f.peak_sites, { test: 'massif-sites', sort: 0 }));
    out.redraw = () => flame.redraw();
  }
  const view = el('section', { class: 'view' }, out);
  view.redraw = () => { chart.redraw(); if (out.redraw) out.redraw(); };
  return view;
}
