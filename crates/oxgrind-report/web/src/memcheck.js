// The Memcheck view: the leak summary by category (sizes as Valgrind writes them, beside the
// rounded ones), then errors grouped by kind, each with its stacks and, where the source was
// readable when the report was made, the lines around each frame.

import { el, both, commify } from './util.js';

const KIND_NAMES = {
  InvalidRead: 'Invalid reads', InvalidWrite: 'Invalid writes', InvalidFree: 'Invalid frees',
  MismatchedFree: 'Mismatched frees', InvalidJump: 'Invalid jumps', Overlap: 'Overlapping copies',
  InvalidMemPool: 'Invalid memory-pool operations', UninitCondition: 'Conditional jumps on uninitialised values',
  UninitValue: 'Uses of uninitialised values', SyscallParam: 'Bad system call parameters',
  ClientCheck: 'Client checks', FishyValue: 'Fishy argument values', CoreMemError: 'Core memory errors',
  ReallocSizeZero: 'realloc() with size 0',
  Leak_DefinitelyLost: 'Definitely lost', Leak_IndirectlyLost: 'Indirectly lost',
  Leak_PossiblyLost: 'Possibly lost', Leak_StillReachable: 'Still reachable',
};

function frameView(fr, i) {
  const where = fr.file ? `${fr.file}:${fr.line}` : fr.obj ? `in ${fr.obj}` : '';
  const parts = [el('div', { class: 'fr', title: `${fr.ip}${fr.dir ? `  ${fr.dir}/${fr.file}` : ''}` },
    i === 0 ? 'at ' : 'by ', el('b', null, fr.fn || '???'), ' ', el('span', { class: 'where' }, where ? `(${where})` : ''))];
  if (fr.src) {
    parts.push(el('pre', { class: 'src' }, fr.src.lines.map((l, k) => {
      const n = fr.src.first + k;
      const text = `${String(n).padStart(5)}  ${l}\n`;
      return n === fr.line ? el('span', { class: 'hl' }, text) : text;
    })));
  }
  return parts;
}

function stackView(frames) {
  return el('div', { class: 'stack' }, frames.map(frameView));
}

function errorView(e) {
  return el('div', { class: 'err', 'data-kind': e.kind },
    el('div', { class: 'what' }, e.what, e.count > 1 ? el('span', { class: 'count' }, `  (${commify(e.count)} times)`) : ''),
    stackView(e.stack),
    e.aux.map((a) => (a.what != null ? el('div', { class: 'aux' }, a.what) : stackView(a.stack))));
}

export function memcheckView(f) {
  const out = [el('h2', null, f.tool === 'memcheck' ? 'Memcheck' : f.tool), el('p', { class: 'cmd' }, el('code', null, f.cmd), ` pid ${f.pid}`)];
  const errors = f.errors.filter((e) => !e.kind.startsWith('Leak_'));
  const leaks = f.errors.filter((e) => e.kind.startsWith('Leak_'));
  const occurrences = errors.reduce((s, e) => s + e.count, 0);
  const byKind = Object.fromEntries(f.leak_summary.map((l) => [l.kind, l]));
  out.push(el('div', { class: 'cards' },
    el('div', { class: `card${errors.length ? ' bad' : ''}` }, el('div', { class: 'label' }, 'errors'),
      el('div', { class: 'big', 'data-test': 'mc-errors' }, commify(occurrences)),
      el('div', { class: 'small' }, `from ${errors.length} contexts`)),
    f.leak_summary.map((l) => el('div', { class: `card${l.bytes && l.kind !== 'Leak_StillReachable' ? ' bad' : ''}` },
      el('div', { class: 'label' }, l.name),
      el('div', { class: 'big', 'data-test': `mc-${l.kind}` }, both(l.bytes)),
      el('div', { class: 'small' }, `in ${l.blocks == null ? 'some' : commify(l.blocks)} blocks, ${l.records} records`)))));
  if (f.fatal_signal) {
    const s = f.fatal_signal;
    out.push(el('div', { class: 'err-group' }, el('div', { class: 'err' },
      el('div', { class: 'what error' }, `Process terminating with ${s.signame} (signal ${s.signo})${s.event ? `: ${s.event}` : ''}`),
      stackView(s.stack))));
  }

  out.push(el('h3', null, 'Leaks'));
  out.push(el('table', { class: 'data', 'data-test': 'mc-leak-table' },
    el('thead', null, el('tr', null, el('th', null, 'category'), el('th', { class: 'num' }, 'bytes'),
      el('th', { class: 'num' }, 'blocks'), el('th', { class: 'num' }, 'loss records'))),
    el('tbody', null, f.leak_summary.map((l) => el('tr', null, el('td', null, l.name),
      el('td', { class: 'num' }, both(l.bytes)), el('td', { class: 'num' }, l.blocks == null ? '?' : commify(l.blocks)),
      el('td', { class: 'num' }, commify(l.records)))))));
  if (leaks.length === 0) out.push(el('p', { class: 'small' }, 'No leak records in this file (run with --leak-check=full).'));

  // Groups: errors by kind in order of first appearance, then leak kinds in summary order.
  const groups = new Map();
  for (const e of errors) { if (!groups.has(e.kind)) groups.set(e.kind, []); groups.get(e.kind).push(e); }
  for (const l of f.leak_summary) {
    const recs = leaks.filter((e) => e.kind === l.kind).sort((a, b) => b.leak.bytes - a.leak.bytes);
    if (recs.length) groups.set(l.kind, recs);
  }
  out.push(el('h3', null, 'Errors and leak records by kind'));
  if (groups.size === 0) out.push(el('p', null, 'No errors.'));
  for (const [kind, list] of groups) {
    const leak = kind.startsWith('Leak_');
    const count = leak ? `${list.length} records, ${both(list.reduce((s, e) => s + e.leak.bytes, 0))} with what hangs off them` : `${commify(list.reduce((s, e) => s + e.count, 0))} occurrence${list.reduce((s, e) => s + e.count, 0) === 1 ? '' : 's'} in ${list.length} context${list.length === 1 ? '' : 's'}`;
    out.push(el('details', { class: 'err-group', open: true, 'data-test': `mc-group-${kind}` },
      el('summary', null, KIND_NAMES[kind] || kind, ' ', el('span', { class: 'count' }, `(${kind}: ${count})`)),
      list.map(errorView)));
  }
  return el('section', { class: 'view' }, out);
}
