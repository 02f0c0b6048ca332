// Memory over time: stacked areas (one band per layer, at the x positions where the split is
// known) under a total line drawn through every point, as massif-visualizer shows Massif's
// detailed and plain snapshots. Hovering shows the values at the nearest point.

import { el, human, both } from './util.js';

const H = 300;
let clips = 0;
const PAD = { l: 70, r: 10, t: 10, b: 30 };

// About n round tick values from 0 to max, in steps of 1, 2 or 5 times a power of ten of the
// binary unit max is shown in (so a KiB axis reads 200 KiB, 400 KiB, not 195.3 KiB).
function ticks(max, n, binary) {
  if (max <= 0) return [0];
  let unit = 1;
  if (binary) while (max / unit >= 1024) unit *= 1024;
  const raw = max / unit / n;
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = ([1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw) || raw) * unit;
  const out = [];
  for (let v = 0; v <= max * 1.0001; v += step) out.push(v);
  return out;
}

// opts: {xs: [], layers: [{name, color, values: [] (at xs)}], line: {xs, values, name},
//        marks, detail(index) -> tooltip node, xLabel, test, onPick(index into line.xs) on click}
export function stackedChart(opts) {
  const svg = el('svg:svg', { class: 'chart', height: H, 'data-test': `${opts.test}-chart` });
  const tip = el('div', { class: 'chart-tip' });
  const legend = el('div', { class: 'legend', 'data-test': `${opts.test}-legend` },
    opts.layers.map((l) => el('span', { class: 'key' },
      el('i', { style: { background: l.color } }), l.name)));
  const wrap = el('div', { class: 'chart-wrap' }, svg, tip, legend);

  function draw() {
    const W = svg.clientWidth || wrap.clientWidth || 960;
    svg.setAttribute('width', W);
    const lx = opts.line.xs;
    // Loops, not Math.min(...xs): spreading a long array overflows the call stack.
    let xmin = Infinity, xmax = -Infinity, ymax = 1;
    for (const x of lx.concat(opts.xs)) { xmin = Math.min(xmin, x); xmax = Math.max(xmax, x); }
    if (xmin > xmax) { xmin = 0; xmax = 1; }
    for (const y of opts.line.values) ymax = Math.max(ymax, y);
    opts.xs.forEach((_, i) => { ymax = Math.max(ymax, opts.layers.reduce((s, l) => s + l.values[i], 0)); });
    const yt = ticks(ymax, 5, true);
    const top = Math.max(ymax, yt[yt.length - 1]);
    const X = (x) => PAD.l + (xmax > xmin ? (x - xmin) / (xmax - xmin) : 0.5) * (W - PAD.l - PAD.r);
    const Y = (y) => H - PAD.b - (y / top) * (H - PAD.t - PAD.b);
    const parts = [];
    for (const v of yt) {
      parts.push(el('svg:line', { x1: PAD.l, x2: W - PAD.r, y1: Y(v), y2: Y(v), class: 'grid' }));
      parts.push(el('svg:text', { x: PAD.l - 6, y: Y(v) + 4, 'text-anchor': 'end', class: 'axis' }, human(v).replace('.0 ', ' ')));
    }
    for (const v of ticks(xmax - xmin, 6, false)) {
      const x = xmin + v;
      parts.push(el('svg:text', { x: X(x), y: H - PAD.b + 16, 'text-anchor': 'middle', class: 'axis' },
        Number.isInteger(x) && x > 99999 ? x.toExponential(2) : String(Math.round(x * 100) / 100)));
    }
    parts.push(el('svg:text', { x: W - PAD.r, y: H - 2, 'text-anchor': 'end', class: 'axis' }, opts.xLabel));
    // Bands, bottom layer first, clipped to the area under the total line: between two
    // snapshots with a tree the split is interpolated, and where the total dipped in between
    // the bands must not rise above what was measured.
    const clipId = `clip-${++clips}`;
    if (lx.length > 0) {
      let d = `M${X(lx[0])},${Y(0)}`;
      lx.forEach((x, i) => { d += `L${X(x)},${Y(opts.line.values[i])}`; });
      d += `L${X(lx[lx.length - 1])},${Y(0)}Z`;
      parts.push(el('svg:clipPath', { id: clipId }, el('svg:path', { d })));
    }
    const bands = el('svg:g', { 'clip-path': lx.length > 0 ? `url(#${clipId})` : null });
    parts.push(bands);
    const base = opts.xs.map(() => 0);
    opts.layers.forEach((l, li) => {
      const upper = base.map((b, i) => b + l.values[i]);
      if (opts.xs.length > 0 && upper.some((u, i) => u !== base[i])) {
        let d = `M${X(opts.xs[0])},${Y(upper[0])}`;
        for (let i = 1; i < opts.xs.length; i++) d += `L${X(opts.xs[i])},${Y(upper[i])}`;
        for (let i = opts.xs.length - 1; i >= 0; i--) d += `L${X(opts.xs[i])},${Y(base[i])}`;
        bands.appendChild(el('svg:path', { d: `${d}Z`, fill: l.color, class: 'band', 'data-layer': li },
          el('svg:title', null, l.name)));
      }
      upper.forEach((u, i) => { base[i] = u; });
    });
    if (lx.length > 0) {
      let d = `M${X(lx[0])},${Y(opts.line.values[0])}`;
      for (let i = 1; i < lx.length; i++) d += `L${X(lx[i])},${Y(opts.line.values[i])}`;
      parts.push(el('svg:path', { d, class: 'total' }));
      lx.forEach((x, i) => {
        if (opts.marks && opts.marks[i]) {
          parts.push(el('svg:circle', { cx: X(x), cy: Y(opts.line.values[i]), r: opts.marks[i] === 2 ? 5 : 2.5,
            class: opts.marks[i] === 2 ? 'peak-mark' : 'mark' }));
        }
      });
    }
    const cursor = el('svg:line', { y1: PAD.t, y2: H - PAD.b, class: 'cursor', style: { display: 'none' } });
    parts.push(cursor);
    svg.replaceChildren(...parts);
    const nearest = (ev) => {
      const px = ev.clientX - svg.getBoundingClientRect().left;
      let best = 0;
      lx.forEach((x, i) => { if (Math.abs(X(x) - px) < Math.abs(X(lx[best]) - px)) best = i; });
      return [best, px];
    };
    svg.onmousemove = (ev) => {
      const [best, px] = nearest(ev);
      cursor.setAttribute('x1', X(lx[best]));
      cursor.setAttribute('x2', X(lx[best]));
      cursor.style.display = '';
      tip.style.display = 'block';
      tip.style.left = `${Math.min(px + 12, W - 260)}px`;
      tip.replaceChildren(el('b', null, `${opts.xLabel} ${lx[best]}`), el('br'),
        `${opts.line.name}: ${both(opts.line.values[best])}`,
        opts.detail ? opts.detail(best) : null);
    };
    svg.onmouseleave = () => { cursor.style.display = 'none'; tip.style.display = 'none'; };
    svg.onclick = (ev) => { if (opts.onPick && lx.length) opts.onPick(nearest(ev)[0]); };
  }
  wrap.redraw = draw;
  requestAnimationFrame(draw);
  return wrap;
}
