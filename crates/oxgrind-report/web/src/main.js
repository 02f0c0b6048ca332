// Entry point of the report page: reads the data the launcher embedded and shows one tab per
// input file (or the diff). Everything is in this one file: no network, works from file://.

import { el } from './util.js';
import { massifView } from './massif.js';
import { dhatView } from './dhat.js';
import { memcheckView } from './memcheck.js';
import { diffView } from './diff.js';
import { cachegrindView } from './cachegrind.js';

const VIEWS = { massif: massifView, dhat: dhatView, memcheck: memcheckView, cachegrind: cachegrindView, diff: diffView };

function main() {
  const data = JSON.parse(document.getElementById('oxgrind-data').textContent);
  const app = document.getElementById('app');
  const items = data.diff ? [Object.assign({ kind: 'diff', path: 'diff' }, data.diff)] : data.files;
  const tabs = el('nav', { class: 'tabs' });
  const views = [];
  items.forEach((f, i) => {
    let view;
    try {
      view = VIEWS[f.kind](f);
    } catch (e) {
      view = el('section', { class: 'view' }, el('p', { class: 'error' }, `cannot show ${f.path}: ${e}`));
      console.error(e);
    }
    view.dataset.kind = f.kind;
    views.push(view);
    const name = f.path.split('/').pop();
    tabs.appendChild(el('button', {
      class: 'tab', 'data-test': `tab-${i}`, title: f.path,
      onclick: () => show(i),
    }, `${f.kind}: ${name}`));
  });
  function show(i) {
    views.forEach((v, k) => { v.hidden = k !== i; });
    [...tabs.children].forEach((t, k) => t.classList.toggle('active', k === i));
    if (views[i].redraw) requestAnimationFrame(() => views[i].redraw());
  }
  app.replaceChildren(items.length > 1 ? tabs : '', ...views);
  show(0);
  // For tests and docs/report.md's timings: milliseconds from navigation to the first view built.
  document.body.dataset.readyMs = String(Math.round(performance.now()));
  document.body.dataset.ready = '1';
}

main();
