// Small DOM and number helpers shared by every view.

// el('div', {class: 'x', onclick: f}, child, 'text', ...): children may be nodes, strings,
// arrays or null. Text always goes in as text nodes: labels come from the profiled program.
export function el(tag, attrs, ...children) {
  const svg = tag.startsWith('svg:');
  const e = svg
    ? document.createElementNS('http://www.w3.org/2000/svg', tag.slice(4))
    : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v == null || v === false) continue;
    if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else if (k === 'style' && typeof v === 'object') Object.assign(e.style, v);
    else e.setAttribute(k, v === true ? '' : String(v));
  }
  append(e, children);
  return e;
}

function append(e, children) {
  for (const c of children) {
    if (c == null || c === false) continue;
    if (Array.isArray(c)) append(e, c);
    else e.appendChild(typeof c === 'object' ? c : document.createTextNode(String(c)));
  }
}

export function commify(n) {
  return String(n).replace(/\B(?=(\d{3})+(?!\d))/g, ',');
}

const UNITS = ['KiB', 'MiB', 'GiB', 'TiB', 'PiB', 'EiB'];

// 14.3 MiB: binary units, one decimal (the Rust side's size::human).
export function human(bytes) {
  if (bytes < 1024) return `${bytes} B`;
  let v = bytes / 1024;
  let u = 0;
  while (v >= 1024 && u + 1 < UNITS.length) { v /= 1024; u++; }
  return `${v.toFixed(1)} ${UNITS[u]}`;
}

// 15,012,345 B (14.3 MiB): Valgrind's exact figure beside the rounded one.
export function both(bytes) {
  return bytes < 1024 ? `${commify(bytes)} B` : `${commify(bytes)} B (${human(bytes)})`;
}

export function signed(delta) {
  const s = delta < 0 ? '-' : '+';
  const m = Math.abs(delta);
  return m < 1024 ? `${s}${commify(m)} B` : `${s}${commify(m)} B (${s}${human(m)})`;
}

export function pct(part, whole) {
  return whole > 0 ? `${(100 * part / whole).toFixed(2)}%` : '';
}

// Code addresses differ between runs and builds; what people read is the rest.
export function stripAddress(label) {
  const m = /^0x[0-9A-Fa-f]+: /.exec(label);
  return m ? label.slice(m[0].length) : label;
}

// A sortable table: columns [{name, value(row), text(row)?, num?}], rows, a row limit.
export function table(columns, rows, opts = {}) {
  const limit = opts.limit || 200;
  let sortCol = opts.sort ?? -1;
  let desc = true;
  let shown = limit;
  const tbody = el('tbody');
  const more = el('button', { class: 'more', onclick: () => { shown += limit; fill(); } });
  const head = columns.map((c, i) => el('th', {
    class: c.num ? 'num sortable' : 'sortable',
    onclick: () => { desc = sortCol === i ? !desc : true; sortCol = i; fill(); },
  }, c.name));
  function fill() {
    let sorted = rows;
    if (sortCol >= 0) {
      const v = columns[sortCol].value;
      sorted = rows.slice().sort((a, b) => {
        const x = v(a), y = v(b);
        const r = x < y ? -1 : x > y ? 1 : 0;
        return desc ? -r : r;
      });
    }
    head.forEach((h, i) => h.classList.toggle('sorted', i === sortCol));
    tbody.replaceChildren(...sorted.slice(0, shown).map((r) => el('tr', null,
      columns.map((c) => el('td', { class: c.num ? 'num' : null, title: c.title ? c.title(r) : null },
        c.text ? c.text(r) : c.value(r))))));
    more.textContent = `show ${Math.min(limit, sorted.length - shown)} more of ${sorted.length}`;
    more.style.display = sorted.length > shown ? '' : 'none';
  }
  fill();
  return el('div', { class: 'table-wrap' },
    el('table', { class: 'data', 'data-test': opts.test }, el('thead', null, el('tr', null, head)), tbody),
    more);
}

// Distinct, colour-blind friendly-ish palette (Okabe-Ito and Tableau mixed).
export const PALETTE = ['#4e79a7', '#f28e2b', '#59a14f', '#e15759', '#76b7b2', '#edc948',
  '#b07aa1', '#ff9da7', '#9c755f', '#86bcb6', '#bab0ac'];
