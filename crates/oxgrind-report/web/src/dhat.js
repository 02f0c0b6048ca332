// The DHAT view: totals, dh_view's tree (allocation point first, splitting where call stacks
// diverge) sortable by each metric, and a flame graph weighted by total bytes, bytes at the
// global peak (t-gmax) or accesses.

import { el, both, commify, pct, stripAddress } from './util.js';
import { flameGraph } from './flame.js';

// Counter positions in each pps row (f.pp_fields, checked below).
const F = { tb: 0, tbk: 1, tl: 2, mb: 3, mbk: 4, gb: 5, gbk: 6, eb: 7, ebk: 8, rb: 9, wb: 10 };
const N = 11;

const METRICS = [
  { key: 'tb', name: 'total bytes', bytes: true, v: (s) => s[F.tb] },
  { key: 'tbk', name: 'total blocks', v: (s) => s[F.tbk] },
  { key: 'mb', name: 'max bytes live', bytes: true, v: (s) => s[F.mb] },
  { key: 'gb', name: 'bytes at t-gmax', bytes: true, v: (s) => s[F.gb] },
  { key: 'eb', name: 'bytes at t-end', bytes: true, v: (s) => s[F.eb] },
  { key: 'rb', name: 'bytes read', bytes: true, v: (s) => s[F.rb] },
  { key: 'wb', name: 'bytes written', bytes: true, v: (s) => s[F.wb] },
  { key: 'acc', name: 'reads + writes', bytes: true, v: (s) => s[F.rb] + s[F.wb] },
  { key: 'tl', name: 'average lifetime', v: (s) => (s[F.tbk] ? s[F.tl] / s[F.tbk] : 0), instrs: true },
];

// dh_view's tree, built lazily: a node is the PPs sharing its frames (innermost first); its
// children are grouped by the next frame only when it is opened.
function node(f, frame, depth, idx) {
  const sums = new Float64Array(N);
  for (const i of idx) { const row = f.pps[i]; for (let k = 0; k < N; k++) sums[k] += row[k]; }
  return { frame, depth, idx, sums, count: idx.length, kids: null };
}

function kidsOf(f, n) {
  if (n.kids) return n.kids;
  const by = new Map();
  for (const i of n.idx) {
    const fs = f.pps[i][N];
    if (fs.length <= n.depth) continue;
    const fr = fs[n.depth];
    if (!by.has(fr)) by.set(fr, []);
    by.get(fr).push(i);
  }
  n.kids = [...by].map(([fr, idx]) => node(f, fr, n.depth + 1, idx));
  return n.kids;
}

export function dhatView(f) {
  if (f.pp_fields.join() !== Object.keys(F).join()) throw new Error(`unexpected pp_fields ${f.pp_fields}`);
  const t = f.totals;
  const heap = f.mode === 'heap';
  const names = f.ftbl.map(stripAddress);
  const frame = (i) => names[i];
  const out = [el('h2', null, `DHAT (${f.mode} mode)`), el('p', { class: 'cmd' }, el('code', null, f.cmd), ` pid ${f.pid}`)];
  out.push(el('div', { class: 'cards' },
    el('div', { class: 'card' }, el('div', { class: 'label' }, heap ? 'total allocated' : 'total'),
      el('div', { class: 'big', 'data-test': 'dhat-total', 'data-bytes': t.tb }, both(t.tb)),
      el('div', { class: 'small' }, `${commify(t.tbk)} ${heap ? 'blocks' : 'events'} at ${commify(f.pps.length)} program points`)),
    heap ? el('div', { class: 'card' }, el('div', { class: 'label' }, 'live at t-gmax (global peak)'),
      el('div', { class: 'big', 'data-test': 'dhat-gmax' }, both(t.gb)),
      el('div', { class: 'small' }, `${commify(t.gbk)} blocks, at ${commify(f.tg)} instructions`)) : null,
    heap ? el('div', { class: 'card' }, el('div', { class: 'label' }, 'live at t-end'),
      el('div', { class: 'big' }, both(t.eb)), el('div', { class: 'small' }, `${commify(t.ebk)} blocks`)) : null,
    heap ? el('div', { class: 'card' }, el('div', { class: 'label' }, 'read / written'),
      el('div', { class: 'big' }, `${both(t.rb)} / ${both(t.wb)}`)) : null));

  const metrics = heap ? METRICS : METRICS.filter((m) => m.key === 'tb' || m.key === 'tbk');
  const root = node(f, 0, 0, f.pps.map((_, i) => i));
  let metric = metrics[0];
  const fmt = (m, s) => (m.bytes ? both(m.v(s)) : m.instrs ? `${commify(Math.round(m.v(s)))} instrs` : commify(m.v(s)));
  const treeBox = el('div', { class: 'tree', 'data-test': 'dhat-tree' });

  // All of a node's figures, as dh_view lists them for a program point.
  function details(n) {
    const v = n.sums;
    const avg = (a, b) => (b ? commify(Math.round(a / b)) : '0');
    const lines = [`total: ${both(v[F.tb])} in ${commify(v[F.tbk])} blocks (avg size ${avg(v[F.tb], v[F.tbk])} B)`];
    if (heap) {
      lines.push(`avg lifetime: ${avg(v[F.tl], v[F.tbk])} instrs (${pct(v[F.tl] / Math.max(v[F.tbk], 1), f.te)} of the run)`,
        `max: ${both(v[F.mb])} in ${commify(v[F.mbk])} blocks`,
        `at t-gmax: ${both(v[F.gb])} in ${commify(v[F.gbk])} blocks`,
        `at t-end: ${both(v[F.eb])} in ${commify(v[F.ebk])} blocks`,
        `reads: ${both(v[F.rb])} (${(v[F.tb] ? v[F.rb] / v[F.tb] : 0).toFixed(2)}/byte), writes: ${both(v[F.wb])} (${(v[F.tb] ? v[F.wb] / v[F.tb] : 0).toFixed(2)}/byte)`);
    }
    lines.push(`${commify(n.count)} program point${n.count === 1 ? '' : 's'}`);
    return el('div', { class: 'details small' }, lines.map((l) => el('div', null, l)));
  }

  function nodeRow(n) {
    const kids = kidsOf(f, n);
    const children = el('div', { class: 'children', hidden: true });
    let open = false;
    const twisty = el('span', { class: 'twisty' }, '\u25B8');
    const toggle = () => {
      open = !open;
      twisty.textContent = open ? '\u25BE' : '\u25B8';
      children.hidden = !open;
      if (open && !children.firstChild) {
        children.appendChild(details(n));
        const rest = el('div');
        children.appendChild(rest);
        fill(rest, kids);
      }
    };
    const row = el('div', { class: 'node', onclick: (e) => { e.stopPropagation(); toggle(); } },
      twisty,
      el('span', { class: 'metric' }, `${fmt(metric, n.sums)} ${metric.key === 'tl' ? '' : pct(metric.v(n.sums), metric.v(root.sums))}`),
      el('span', { class: 'fr', title: `${n.count} program points; total ${both(n.sums[F.tb])}, ${commify(n.sums[F.tbk])} blocks` }, frame(n.frame)));
    const wrap = el('div', null, row, children);
    // dh_view shows a single chain of frames open.
    wrap.open = () => { if (!open) toggle(); };
    if (kids.length === 1) requestAnimationFrame(() => wrap.open());
    return wrap;
  }

  function fill(box, kids) {
    const sorted = kids.slice().sort((a, b) => metric.v(b.sums) - metric.v(a.sums));
    let shown = 0;
    const more = el('button', { class: 'more', onclick: (e) => { e.stopPropagation(); page(); } });
    function page() {
      const next = sorted.slice(shown, shown + 50);
      shown += next.length;
      more.before(...next.map(nodeRow));
      more.textContent = `show more (${sorted.length - shown} left)`;
      more.hidden = shown >= sorted.length;
    }
    box.replaceChildren(more);
    page();
  }

  const sortSel = el('select', {
    'data-test': 'dhat-sort',
    onchange: () => { metric = metrics[sortSel.selectedIndex]; fill(treeBox, kidsOf(f, root)); },
  }, metrics.map((m) => el('option', null, m.name)));
  out.push(el('h3', null, 'Allocation points (as dh_view), sorted by ', sortSel), treeBox);
  fill(treeBox, kidsOf(f, root));

  // Flame graph: callers first (main at the top), weighted by the chosen metric.
  const flameMetrics = heap ? [metrics[0], METRICS[3], METRICS[7]] : [metrics[0]];
  const stacks = f.pps.map((row) => row[N].slice().reverse());
  const flameModel = (m) => ({ names, stacks, weights: f.pps.map((row) => m.v(row)) });
  const flame = flameGraph(flameModel(flameMetrics[0]), { test: 'dhat', format: both, rootName: flameMetrics[0].name });
  const flameSel = el('select', {
    'data-test': 'dhat-flame-metric',
    onchange: () => {
      const m = flameMetrics[flameSel.selectedIndex];
      flame.redraw(flameModel(m), m.name);
    },
  }, flameMetrics.map((m) => el('option', null, m.name)));
  out.push(el('h3', null, 'Flame graph by ', flameSel), flame);
  const view = el('section', { class: 'view' }, out);
  view.redraw = () => flame.redraw();
  return view;
}
