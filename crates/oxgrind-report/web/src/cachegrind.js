// The Cachegrind view: event totals with the miss rates cg_annotate users compute by hand,
// then the cost per function and the costliest source lines, sortable by any event.

import { el, commify, pct, table } from './util.js';

// Miss rates from Cachegrind's standard events, when present: [label, misses, refs].
const RATES = [
  ['I1 miss rate', ['I1mr'], ['Ir']],
  ['LLi miss rate', ['ILmr'], ['Ir']],
  ['D1 miss rate', ['D1mr', 'D1mw'], ['Dr', 'Dw']],
  ['LLd miss rate', ['DLmr', 'DLmw'], ['Dr', 'Dw']],
  ['branch mispredict rate', ['Bcm', 'Bim'], ['Bc', 'Bi']],
];

export function cachegrindView(f) {
  const ev = f.events;
  const at = (name) => ev.indexOf(name);
  const total = (names) => names.reduce((s, n) => s + (at(n) >= 0 ? f.summary[at(n)] : 0), 0);
  const out = [el('h2', null, 'Cachegrind'), el('p', { class: 'cmd' }, el('code', null, f.cmd)),
    el('p', { class: 'small' }, f.desc.join(' \u00b7 '))];
  out.push(el('div', { class: 'cards' },
    ev.map((e, i) => el('div', { class: 'card' }, el('div', { class: 'label' }, e),
      el('div', { class: 'big', 'data-test': `cg-total-${e}` }, commify(f.summary[i] ?? 0)))),
    RATES.filter(([, m, r]) => m.every((n) => at(n) >= 0) && total(r) > 0).map(([label, m, r]) =>
      el('div', { class: 'card' }, el('div', { class: 'label' }, label),
        el('div', { class: 'big' }, pct(total(m), total(r)))))));
  const cols = (lead) => lead.concat(ev.map((e, i) => ({
    name: e, num: true, value: (r) => r[r.length - ev.length + i],
    text: (r) => commify(r[r.length - ev.length + i]),
    title: (r) => pct(r[r.length - ev.length + i], f.summary[i]),
  })));
  out.push(el('h3', null, 'Functions'));
  out.push(table(cols([
    { name: 'function', value: (r) => r[1] },
    { name: 'file', value: (r) => r[0] },
  ]), f.functions, { test: 'cg-functions', sort: 2, limit: 25 }));
  out.push(el('h3', null, `Source lines (the ${f.lines.length} costliest)`));
  out.push(table(cols([
    { name: 'file:line', value: (r) => `${r[0]}:${r[2]}` },
    { name: 'function', value: (r) => r[1] },
  ]), f.lines, { test: 'cg-lines', sort: 2, limit: 25 }));
  return el('section', { class: 'view' }, out);
}
