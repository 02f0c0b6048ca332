// The diff view: both totals and the change, then every site with a bar for its change
// (red grew, green shrank), largest change first, filterable.

import { el, both, commify, signed, table } from './util.js';

export function diffView(d) {
  // Bytes for Massif, DHAT and Memcheck; a count (instructions) for Cachegrind.
  const amount = d.bytes ? both : commify;
  const change = d.bytes ? signed : (v) => `${v < 0 ? '-' : '+'}${commify(Math.abs(v))}`;
  const delta = d.new_total - d.old_total;
  const pctText = d.old_total ? `${delta >= 0 ? '+' : ''}${(100 * delta / d.old_total).toFixed(2)}%` : (d.new_total ? 'new' : '+0.00%');
  const out = [el('h2', null, `Diff of two ${d.of} files: ${d.measure}`), el('p', { class: 'cmd' }, d.total_means)];
  out.push(el('div', { class: 'cards' },
    el('div', { class: 'card' }, el('div', { class: 'label' }, 'old'), el('div', { class: 'big', 'data-test': 'diff-old' }, amount(d.old_total)),
      el('div', { class: 'small' }, d.old_path)),
    el('div', { class: 'card' }, el('div', { class: 'label' }, 'new'), el('div', { class: 'big', 'data-test': 'diff-new' }, amount(d.new_total)),
      el('div', { class: 'small' }, d.new_path)),
    el('div', { class: `card${delta > 0 ? ' bad' : ''}` }, el('div', { class: 'label' }, 'change'),
      el('div', { class: 'big', 'data-test': 'diff-change' }, `${change(delta)} ${pctText}`)),
    d.also.map(([n, a, b]) => el('div', { class: 'card' }, el('div', { class: 'label' }, n),
      el('div', { class: 'big' }, `${commify(a)} \u2192 ${commify(b)}`)))));
  const rows = d.sites.filter(([, a, b]) => a !== b);
  const maxAbs = rows.reduce((m, [, a, b]) => Math.max(m, Math.abs(b - a)), 1);
  const bar = (r) => {
    const v = r[2] - r[1];
    const w = `${Math.max(1, 100 * Math.abs(v) / maxAbs)}%`;
    return el('div', { class: 'bar-cell' }, el('div', { class: v > 0 ? 'bar grown' : 'bar shrunk', style: { width: w } }));
  };
  const filter = el('input', { type: 'search', placeholder: 'filter sites', 'data-test': 'diff-filter' });
  const box = el('div');
  const fill = () => {
    const q = filter.value.trim().toLowerCase();
    const shown = q ? rows.filter((r) => r[0].toLowerCase().includes(q)) : rows;
    box.replaceChildren(table([
      { name: 'change', num: true, value: (r) => Math.abs(r[2] - r[1]), text: (r) => change(r[2] - r[1]) },
      { name: '', value: (r) => r[2] - r[1], text: bar },
      { name: 'old', num: true, value: (r) => r[1], text: (r) => commify(r[1]) },
      { name: 'new', num: true, value: (r) => r[2], text: (r) => commify(r[2]) },
      { name: 'site', value: (r) => r[0] },
    ], shown, { test: 'diff-sites' }));
  };
  filter.addEventListener('input', fill);
  fill();
  out.push(el('h3', null, `${rows.length} of ${d.sites.length} sites changed`), el('div', { class: 'toolbar' }, filter), box);
  return el('section', { class: 'view' }, out);
}
