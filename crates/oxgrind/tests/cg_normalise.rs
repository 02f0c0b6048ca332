//! Shared by the cg_annotate tests: Perl's hash order made comparable (see
//! `cg_annotate_vs_valgrind.rs`).

const FANCY: &str =
    "--------------------------------------------------------------------------------";

/// Sorts each run of function-table rows with the same counts, and the annotation chunks.
pub fn normalise(text: &str, whole_table: bool) -> String {
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    // Function table rows: everything between the `file:function` header's closing rule and
    // the next blank line.
    while i < lines.len() {
        out.push(lines[i].to_string());
        if lines[i].ends_with(" file:function\n") && i + 1 < lines.len() {
            i += 1;
            out.push(lines[i].to_string());
            i += 1;
            let mut rows = vec![];
            while i < lines.len() && lines[i] != "\n" {
                rows.push(lines[i]);
                i += 1;
            }
            let mut k = 0;
            while k < rows.len() {
                // With `--sort`, rows tie on the sort events only: compare the table as a set.
                let key = |r: &str| {
                    if whole_table {
                        String::new()
                    } else {
                        r.rsplit_once("  ")
                            .map(|x| x.0.to_string())
                            .unwrap_or_default()
                    }
                };
                let mut j = k;
                while j < rows.len() && key(rows[j]) == key(rows[k]) {
                    j += 1;
                }
                let mut group: Vec<&str> = rows[k..j].to_vec();
                group.sort();
                out.extend(group.iter().map(|s| s.to_string()));
                k = j;
            }
            continue;
        }
        i += 1;
    }
    // Annotation chunks: from a rule followed by `-- Auto-annotated source:` up to the next
    // one, or to the list of files not found, or to the `events annotated` totals.
    let text: String = out.concat();
    let marker = format!("{FANCY}\n-- ");
    let Some(start) = text.find(&marker) else {
        return text;
    };
    let end = text
        .find(&format!("{FANCY}\nThe following"))
        .or_else(|| {
            let totals = text.rfind(" events annotated\n")?;
            let mut at = totals;
            for _ in 0..4 {
                at = text[..at].rfind('\n')?;
            }
            Some(at + 1)
        })
        .unwrap_or(text.len());
    let mut chunks: Vec<&str> = text[start..end]
        .split(&marker)
        .filter(|c| !c.is_empty())
        .collect();
    chunks.sort();
    let mut s = text[..start].to_string();
    for c in chunks {
        s.push_str(&marker);
        s.push_str(c);
    }
    s.push_str(&text[end..]);
    s
}
