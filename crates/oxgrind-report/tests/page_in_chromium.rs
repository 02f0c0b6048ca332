//! The report page, opened in Debian's headless Chromium: no console errors, and the chart,
//! the flame graph and the tables show the numbers of the real Valgrind files they were made
//! from. Expected numbers are computed here from the files (through oxgrind-formats), not
//! copied from the page.

mod common;
use common::{example, js, run_in_chromium, PageRun};
use oxgrind_report::size::both;

fn page(files: &[std::path::PathBuf]) -> String {
    let inputs: Vec<_> = files
        .iter()
        .map(|f| oxgrind_report::load(f).unwrap())
        .collect();
    // The examples' sources are in examples/src (Valgrind ran them in /src/fmt).
    let options = oxgrind_report::Options {
        source_dirs: vec![example("src", "")],
    };
    oxgrind_report::report_html(&inputs, &options)
}

/// Runs each expression as a step (`{"eval": ...}`), in order, in one page.
fn eval_all(html: &str, exprs: &[String]) -> PageRun {
    let items: Vec<String> = exprs
        .iter()
        .map(|e| format!("{{\"eval\": {}}}", js(e)))
        .collect();
    let run = run_in_chromium(html, &format!("[{}]", items.join(",")));
    assert!(
        run.console_errors.is_empty(),
        "console errors: {:?}",
        run.console_errors
    );
    assert_eq!(run.results.len(), exprs.len());
    run
}

/// JS: type `text` in the search box `sel` and return the status line once redrawn.
fn search(box_sel: &str, status_sel: &str, text: &str) -> String {
    format!(
        "(() => {{ const s = document.querySelector('{box_sel}'); s.value = {}; \
         s.dispatchEvent(new Event('input')); \
         return document.querySelector('{status_sel}').textContent; }})()",
        js(text)
    )
}

#[test]
fn massif_page_shows_the_peak_the_sites_and_a_searchable_flame_graph() {
    let path = example("massif", "massif.out.default");
    let file = oxgrind_formats::massif::parse(&std::fs::read(&path).unwrap()).unwrap();
    let peak_i = oxgrind_report::massif_peak_index(&file).unwrap();
    let peak = &file.snapshots[peak_i];
    let peak_total = peak.mem_heap_b + peak.mem_heap_extra_b + peak.mem_stacks_b;
    let sites = oxgrind_report::massif_sites_of(peak.tree.as_ref().unwrap());
    let (top_site, top_bytes) = &sites[0];
    // A search for the second site's function finds it (and maybe deeper frames of the same
    // name, counted once): at least the site's own bytes.
    let (second_site, second_bytes) = &sites[1];
    let second_fn = second_site.split(' ').next().unwrap();

    let run = eval_all(
        &page(&[path]),
        &[
            "document.querySelector('[data-test=massif-peak]').textContent".into(),
            "document.querySelector('[data-test=massif-peak]').dataset.bytes".into(),
            "[...document.querySelectorAll('[data-test=massif-sites] tbody tr:first-child td')].map(t => t.textContent).join('|')".into(),
            "document.querySelectorAll('[data-test=massif-chart] path.band').length".into(),
            "document.querySelectorAll('[data-test=massif-chart] path.total').length".into(),
            format!("document.querySelector('[data-test=massif-legend]').textContent.includes({})", js(top_site)),
            // The flame graph: the root spans the peak's heap; the top site is a frame.
            "document.querySelector('[data-test=massif-flame] .frame').dataset.value".into(),
            format!(
                "[...document.querySelectorAll('[data-test=massif-flame] .frame')].filter(f => f.title.startsWith({})).map(f => f.dataset.value).join()",
                js(&format!("{top_site}\n"))
            ),
            search("[data-test=massif-flame-search]", "[data-test=massif-flame-status]", second_fn),
            "document.querySelectorAll('[data-test=massif-flame] .frame.match').length > 0".into(),
            // Zoom: click the top site's frame; the status names it.
            format!(
                "(() => {{ const s = document.querySelector('[data-test=massif-flame-search]'); s.value = ''; \
                 s.dispatchEvent(new Event('input')); \
                 [...document.querySelectorAll('[data-test=massif-flame] .frame')].find(f => f.title.startsWith({})).click(); \
                 return document.querySelector('[data-test=massif-flame-status]').textContent; }})()",
                js(&format!("{top_site}\n"))
            ),
            // A click on the chart far left of the peak shows another snapshot's tree.
            "(() => { const svg = document.querySelector('[data-test=massif-chart]'); const r = svg.getBoundingClientRect(); \
             svg.dispatchEvent(new MouseEvent('click', { clientX: r.left + r.width * 0.6, clientY: r.top + 100 })); \
             return [document.querySelector('[data-test=massif-flame-title]').textContent, \
                     document.querySelector('[data-test=massif-flame] .frame').dataset.value]; })()".into(),
        ],
    );
    let r = &run.results;
    assert_eq!(r[0], js(&both(peak_total)));
    assert_eq!(r[1], js(&peak_total.to_string()));
    let heap_pct = format!("{:.2}%", 100.0 * *top_bytes as f64 / peak.mem_heap_b as f64);
    assert_eq!(
        r[2],
        js(&format!("{}|{heap_pct}|{top_site}", both(*top_bytes)))
    );
    assert!(r[3].parse::<usize>().unwrap() >= 2, "bands: {}", r[3]);
    assert_eq!(r[4], "1");
    assert_eq!(r[5], "true");
    assert_eq!(r[6], js(&peak.mem_heap_b.to_string()));
    assert_eq!(r[7], js(&top_bytes.to_string()));
    // "N matching frames: 133,800 B (130.7 KiB) (14.69%)"
    let status: String = r[8].trim_matches('"').to_string();
    assert!(status.contains("matching frames: "), "{status}");
    let matched_bytes: u64 = status
        .split("matching frames: ")
        .nth(1)
        .unwrap()
        .split(" B")
        .next()
        .unwrap()
        .replace(',', "")
        .parse()
        .unwrap();
    assert!(matched_bytes >= *second_bytes, "{status} vs {second_bytes}");
    assert!(matched_bytes < peak.mem_heap_b, "{status}");
    assert_eq!(r[9], "true");
    assert!(
        r[10].contains(&format!("zoomed to {top_site}")),
        "{}",
        r[10]
    );
    // ["Snapshot N ", "<its heap bytes>"]: a detailed snapshot other than the peak.
    let other: Vec<String> = r[11]
        .trim_matches(['[', ']'])
        .split(',')
        .map(|s| s.trim().trim_matches('"').to_string())
        .collect();
    let n: usize = other[0]
        .trim()
        .strip_prefix("Snapshot ")
        .expect(&r[11])
        .parse()
        .unwrap();
    assert_ne!(n, peak_i);
    let snap = &file.snapshots[n];
    assert!(snap.tree.is_some(), "snapshot {n} has no tree");
    assert_eq!(other[1], snap.mem_heap_b.to_string(), "{}", r[11]);
}

#[test]
fn dhat_page_shows_totals_a_sortable_tree_and_a_flame_graph_per_metric() {
    let path = example("dhat", "dhat.out.heap");
    let file = oxgrind_formats::dhat::parse(&std::fs::read(&path).unwrap()).unwrap();
    let tb: u64 = file.pps.iter().map(|p| p.tb).sum();
    let gb: u64 = file.pps.iter().map(|p| p.gb).sum();
    // The tree's first level: PPs grouped by their innermost frame, largest first.
    let top_by = |metric: fn(&oxgrind_formats::dhat::Pp) -> u64| {
        let mut by: std::collections::BTreeMap<u32, u64> = Default::default();
        for p in &file.pps {
            *by.entry(p.fs[0]).or_default() += metric(p);
        }
        let (frame, v) = by
            .into_iter()
            .max_by_key(|&(f, v)| (v, std::cmp::Reverse(f)))
            .unwrap();
        (
            oxgrind_report::sites::without_address(&file.ftbl[frame as usize]).to_string(),
            v,
        )
    };
    let (top_frame, top_tb) = top_by(|p| p.tb);
    let run = eval_all(
        &page(&[path]),
        &[
            "document.querySelector('[data-test=dhat-total]').dataset.bytes".into(),
            "document.querySelector('[data-test=dhat-tree] .node .fr').textContent".into(),
            "document.querySelector('[data-test=dhat-tree] .node .metric').textContent".into(),
            // Sorted by blocks instead: the first row's metric is a block count.
            "(() => { const s = document.querySelector('[data-test=dhat-sort]'); s.selectedIndex = 1; \
             s.dispatchEvent(new Event('change')); \
             return document.querySelector('[data-test=dhat-tree] .node .metric').textContent; })()".into(),
            "document.querySelector('[data-test=dhat-flame] .frame').dataset.value".into(),
            "(() => { const s = document.querySelector('[data-test=dhat-flame-metric]'); s.selectedIndex = 1; \
             s.dispatchEvent(new Event('change')); \
             return document.querySelector('[data-test=dhat-flame] .frame').dataset.value; })()".into(),
            search("[data-test=dhat-flame-search]", "[data-test=dhat-flame-status]", "^main "),
            // Opening a node lists all its figures, as dh_view does.
            "(() => { const s = document.querySelector('[data-test=dhat-sort]'); s.selectedIndex = 0; \
             s.dispatchEvent(new Event('change')); \
             document.querySelector('[data-test=dhat-tree] .node').click(); \
             return document.querySelector('[data-test=dhat-tree] .details').textContent; })()".into(),
        ],
    );
    let r = &run.results;
    assert_eq!(r[0], js(&tb.to_string()));
    assert_eq!(r[1], js(&top_frame));
    assert!(r[2].starts_with(&format!("\"{}", both(top_tb))), "{}", r[2]);
    let blocks: u64 = file.pps.iter().map(|p| p.tbk).sum();
    assert!(r[3].contains('%') && !r[3].contains(" B"), "{}", r[3]);
    let _ = blocks;
    assert_eq!(r[4], js(&tb.to_string()));
    assert_eq!(r[5], js(&gb.to_string()));
    // Every PP's stack ends in main here: all the t-gmax bytes match.
    assert!(
        r[6].contains(&format!("{} (100.00%)", both(gb))),
        "{}",
        r[6]
    );
    let top_blocks: u64 = file
        .pps
        .iter()
        .filter(|p| {
            oxgrind_report::sites::without_address(&file.ftbl[p.fs[0] as usize]) == top_frame
        })
        .map(|p| p.tbk)
        .sum();
    assert!(
        r[7].starts_with(&format!("\"total: {} in {top_blocks} blocks", both(top_tb))),
        "{}",
        r[7]
    );
}

#[test]
fn memcheck_page_shows_leaks_by_category_errors_by_kind_and_source_lines() {
    let path = example("memcheck", "mc_errors.plain.xml");
    let doc = oxgrind_formats::memcheck_xml_reader::parse(&std::fs::read(&path).unwrap()).unwrap();
    // Valgrind's LEAK SUMMARY for this run (mc_errors.default-summary.txt): definitely lost
    // 116 bytes in 2 blocks, indirectly lost 64 bytes; the XML has only the loss records.
    let summary = oxgrind_report::leak_summary(&doc);
    assert_eq!((summary[0].bytes, summary[0].blocks), (116, Some(2)));
    assert_eq!(summary[1].bytes, 64);
    let definite = summary[0].bytes;
    let run = eval_all(
        &page(&[path]),
        &[
            "document.querySelector('[data-test=mc-Leak_DefinitelyLost]').textContent".into(),
            "[...document.querySelectorAll('[data-test=mc-leak-table] tbody tr:first-child td')].map(t => t.textContent).join('|')".into(),
            // The largest definitely-lost record names the leaking function.
            "[...document.querySelectorAll('[data-test=mc-group-Leak_DefinitelyLost] .err')][0].textContent".into(),
            "document.querySelectorAll('[data-test=mc-group-InvalidRead] .err').length".into(),
            // The invalid write's source line, highlighted.
            "document.querySelector('[data-test=mc-group-InvalidWrite] pre.src .hl').textContent".into(),
            "document.querySelector('[data-test=mc-errors]').textContent".into(),
            "document.querySelector('[data-test=mc-Leak_IndirectlyLost]').textContent".into(),
        ],
    );
    let r = &run.results;
    assert_eq!(r[0], js(&both(definite)));
    assert_eq!(r[1], js(&format!("definitely lost|{}|2|2", both(definite))));
    assert!(
        r[2].contains("100 bytes in 1 blocks are definitely lost"),
        "{}",
        r[2]
    );
    assert!(r[2].contains("leak_definite"), "{}", r[2]);
    assert_eq!(r[3], "2");
    assert!(
        r[4].contains("24  ") && r[4].contains("a[10] = 5;"),
        "{}",
        r[4]
    );
    let occurrences: u64 = doc.error_counts.iter().map(|p| p.0).sum();
    assert_eq!(r[5], js(&occurrences.to_string()));
    assert_eq!(r[6], js(&both(64)));
}

#[test]
fn diff_page_shows_both_totals_and_the_grown_site_first() {
    let old = oxgrind_report::load(&example("memcheck", "mc_errors.with-supp.xml")).unwrap();
    let new = oxgrind_report::load(&example("memcheck", "mc_errors.plain.xml")).unwrap();
    let d = oxgrind_report::diff::diff(&old, &new).unwrap();
    let run = eval_all(
        &d.html(),
        &[
            "document.querySelector('[data-test=diff-old]').textContent".into(),
            "document.querySelector('[data-test=diff-new]').textContent".into(),
            "document.querySelector('[data-test=diff-change]').textContent".into(),
            "[...document.querySelectorAll('[data-test=diff-sites] tbody tr:first-child td')].map(t => t.textContent).join('|')".into(),
            "(() => { const f = document.querySelector('[data-test=diff-filter]'); f.value = 'no such site'; \
             f.dispatchEvent(new Event('input')); \
             return document.querySelectorAll('[data-test=diff-sites] tbody tr').length; })()".into(),
        ],
    );
    let r = &run.results;
    assert_eq!(r[0], js(&both(d.old_total)));
    assert_eq!(r[1], js(&both(d.new_total)));
    assert_eq!(r[2], js("+80 B +80.00%"));
    assert_eq!(
        r[3],
        js("+80 B||0|80|leak_indirect (mc_errors.c:10) <- main (mc_errors.c:56)")
    );
    assert_eq!(r[4], "0");
}

#[test]
fn cachegrind_page_shows_totals_and_functions_sorted_by_instructions() {
    let path = example("cachegrind", "cachegrind.out.static");
    let file = oxgrind_formats::cachegrind::parse(&std::fs::read(&path).unwrap()).unwrap();
    // The function with the most instructions, summed over its lines.
    let mut by: std::collections::HashMap<&str, u64> = Default::default();
    for r in &file.records {
        *by.entry(r.func.as_str()).or_default() += r.counts[0];
    }
    let (top, ir) = by.into_iter().max_by_key(|&(_, v)| v).unwrap();
    let run = eval_all(
        &page(&[path]),
        &[
            "document.querySelector('[data-test=cg-total-Ir]').textContent".into(),
            "[...document.querySelectorAll('[data-test=cg-functions] tbody tr:first-child td')].slice(0, 3).map(t => t.textContent).join('|')".into(),
        ],
    );
    assert_eq!(
        run.results[0],
        js(&oxgrind_formats::number::commify(file.summary[0]))
    );
    assert!(
        run.results[1].starts_with(&format!("\"{top}|"))
            && run.results[1].ends_with(&format!("|{}\"", oxgrind_formats::number::commify(ir))),
        "{} vs {top} {ir}",
        run.results[1]
    );
}
