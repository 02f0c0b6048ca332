//! The heap tree of a detailed snapshot, built exactly as Valgrind's `XT_massif_print` builds
//! it (formats.md §1.3).
//!
//! Input: every execution context (EC) that existed when the snapshot was taken, sorted by its
//! address sequence, with the bytes it held. At each depth, ECs sharing the address at that
//! depth form a group; groups below the significance size are merged into one "in N places"
//! line; groups are printed biggest first (ties: lower address first) and recursed into. An
//! address in inlined code prints one `n1:` line per inlined level before the real one.
//!
//! This module only arranges numbers and labels into [`TreeNode`]s; the labels come from the
//! caller (frame texts computed when the stack was first classified).

use oxgrind_formats::massif::TreeNode;
use oxgrind_tool::Addr;

/// One EC as the tree sees it: its frames (outermost caller last) and its bytes.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Ec<'a> {
    pub frames: &'a [Addr],
    pub bytes: u64,
}

struct Group {
    /// ECs of this group (a sub-slice of the parent's), or `None` for the merged
    /// insignificant group.
    range: Option<(usize, usize)>,
    ip: Addr,
    /// For the merged group: how many groups it stands for.
    n_merged: u32,
    total: u64,
}

/// Significance size (`sig_sz`): a group smaller than this is merged.
pub(crate) fn significance(total: u64, extra: u64, stacks: u64, threshold: f64) -> u64 {
    if total == 0 && threshold != 0.0 {
        1
    } else {
        ((total + extra + stacks) as f64 * threshold / 100.0) as u64
    }
}

fn make_groups(depth: usize, ecs: &[Ec<'_>], sig: u64) -> Vec<Group> {
    let mut groups: Vec<Group> = Vec::new();
    for (i, ec) in ecs.iter().enumerate() {
        if ec.frames.len() <= depth {
            // Stack ends above this depth: no group (children may sum to less than parent).
            continue;
        }
        let ip = ec.frames[depth];
        match groups.last_mut() {
            Some(g) if g.ip == ip && g.range.is_some_and(|(_, end)| end == i) => {
                g.total += ec.bytes;
                g.range = g.range.map(|(s, _)| (s, i + 1));
            }
            _ => groups.push(Group {
                range: Some((i, i + 1)),
                ip,
                n_merged: 0,
                total: ec.bytes,
            }),
        }
    }
    // Merge insignificant groups into the first of them, keeping the others' order.
    let mut out: Vec<Group> = Vec::with_capacity(groups.len());
    let mut insig: Option<usize> = None;
    for g in groups {
        if g.total < sig {
            match insig {
                None => {
                    insig = Some(out.len());
                    out.push(Group {
                        range: None,
                        ip: 0,
                        n_merged: 1,
                        total: g.total,
                    });
                }
                Some(k) => {
                    out[k].total += g.total;
                    out[k].n_merged += 1;
                }
            }
        } else {
            out.push(g);
        }
    }
    out.sort_by(|a, b| b.total.cmp(&a.total).then(a.ip.cmp(&b.ip)));
    out
}

fn output_group(
    depth: usize,
    ecs: &[Ec<'_>],
    group: &Group,
    sig: u64,
    threshold: f64,
    labels: &mut dyn FnMut(Addr) -> Vec<String>,
) -> TreeNode {
    let Some((start, end)) = group.range else {
        let label = if group.n_merged == 1 {
            format!("in 1 place, below massif's threshold ({threshold:.2}%)")
        } else {
            format!(
                "in {} places, all below massif's threshold ({threshold:.2}%)",
                group.n_merged
            )
        };
        return TreeNode {
            bytes: group.total,
            label,
            children: Vec::new(),
        };
    };
    let mine = &ecs[start..end];
    let children: Vec<TreeNode> = make_groups(depth + 1, mine, sig)
        .iter()
        .map(|g| output_group(depth + 1, mine, g, sig, threshold, labels))
        .collect();
    let mut levels = labels(group.ip);
    if levels.is_empty() {
        levels.push(format!("0x{:X}: ???", group.ip));
    }
    // Innermost inlined level first: it is the top line; each further level hangs under the
    // previous one, and the real children under the last (outermost) one.
    let mut node = TreeNode {
        bytes: group.total,
        label: levels.pop().unwrap_or_default(),
        children,
    };
    while let Some(label) = levels.pop() {
        node = TreeNode {
            bytes: group.total,
            label,
            children: vec![node],
        };
    }
    node
}

/// Builds the tree of one detailed snapshot. `ecs` must be sorted by frames
/// (lexicographically, a prefix first). Returns the root, whose byte count is `mem_heap_B`.
pub(crate) fn build(
    ecs: &[Ec<'_>],
    extra: u64,
    stacks: u64,
    threshold: f64,
    root_label: &str,
    labels: &mut dyn FnMut(Addr) -> Vec<String>,
) -> TreeNode {
    let total: u64 = ecs.iter().map(|e| e.bytes).sum();
    let sig = significance(total, extra, stacks, threshold);
    let children = make_groups(0, ecs, sig)
        .iter()
        .map(|g| output_group(0, ecs, g, sig, threshold, labels))
        .collect();
    TreeNode {
        bytes: total,
        label: root_label.to_string(),
        children,
    }
}

/// The tree in massif.out syntax (`n<children>: <bytes> <label>`, one space of indent per
/// level): for tests and debugging; the file itself is written by `oxgrind_formats`.
#[cfg(test)]
pub(crate) fn to_text(node: &TreeNode) -> String {
    fn go(n: &TreeNode, indent: usize, out: &mut String) {
        out.push_str(&format!(
            "{:indent$}n{}: {} {}\n",
            "",
            n.children.len(),
            n.bytes,
            n.label
        ));
        for c in &n.children {
            go(c, indent + 1, out);
        }
    }
    let mut s = String::new();
    go(node, 0, &mut s);
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxgrind_formats::massif::HEAP_ROOT_LABEL;
    use std::collections::HashMap;

    struct Names(HashMap<Addr, Vec<String>>);
    impl Names {
        fn new(list: &[(Addr, &str)]) -> Self {
            Names(
                list.iter()
                    .map(|&(a, s)| (a, vec![format!("0x{a:X}: {s}")]))
                    .collect(),
            )
        }
        fn f(&self) -> impl FnMut(Addr) -> Vec<String> + '_ {
            move |a| self.0.get(&a).cloned().unwrap_or_default()
        }
    }

    fn tree(ecs: &mut [(Vec<Addr>, u64)], extra: u64, threshold: f64, names: &Names) -> String {
        ecs.sort();
        let v: Vec<Ec<'_>> = ecs
            .iter()
            .map(|(f, b)| Ec {
                frames: f,
                bytes: *b,
            })
            .collect();
        to_text(&build(
            &v,
            extra,
            0,
            threshold,
            HEAP_ROOT_LABEL,
            &mut names.f(),
        ))
    }

    /// formats.md §1.2, second example (ms_small at its peak, default threshold): big's 5000
    /// bytes are significant, the four small sites (52 bytes) are merged.
    #[test]
    fn small_sites_are_merged_into_one_line_below_threshold() {
        let names = Names::new(&[
            (0x109166, "s1 (ms_small.c:3)"),
            (0x1091C6, "big (ms_small.c:7)"),
            (0x1091F1, "main (ms_small.c:9)"),
        ]);
        let mut ecs = vec![
            (vec![0x109166, 0x1091DD], 10),
            (vec![0x10917E, 0x1091E2], 12),
            (vec![0x109196, 0x1091E7], 14),
            (vec![0x1091AE, 0x1091EC], 16),
            (vec![0x1091C6, 0x1091F1], 5000),
        ];
        let expected = "\
n2: 5052 (heap allocation functions) malloc/new/new[], --alloc-fns, etc.
 n1: 5000 0x1091C6: big (ms_small.c:7)
  n0: 5000 0x1091F1: main (ms_small.c:9)
 n0: 52 in 4 places, all below massif's threshold (1.00%)
";
        assert_eq!(tree(&mut ecs, 60, 1.0, &names), expected);
    }

    /// formats.md §1.2, first example (ms_prog at its peak, --threshold=10.0).
    #[test]
    fn grouping_by_address_at_each_depth_with_threshold_ten() {
        let names = Names::new(&[
            (0x1093AB, "main (ms_prog.c:24)"),
            (0x109180, "big_alloc (ms_prog.c:6)"),
        ]);
        let mut ecs = vec![
            (vec![0x1093AB], 750000),
            (vec![0x109180, 0x1091CE, 0x109231], 84000),
            (vec![0x109180, 0x1091E8, 0x109267], 49800),
            (vec![0x10919A, 0x109273], 16600),
            (vec![0x1091B4, 0x109300], 400),
        ];
        let expected = "\
n3: 900800 (heap allocation functions) malloc/new/new[], --alloc-fns, etc.
 n0: 750000 0x1093AB: main (ms_prog.c:24)
 n1: 133800 0x109180: big_alloc (ms_prog.c:6)
  n0: 133800 in 2 places, all below massif's threshold (10.00%)
 n0: 17000 in 2 places, all below massif's threshold (10.00%)
";
        // extra as in massif.out.thresh10's peak: sig = (900800 + 26936) * 10% = 92773.
        assert_eq!(tree(&mut ecs, 26936, 10.0, &names), expected);
    }

    #[test]
    fn one_insignificant_group_says_in_1_place() {
        let names = Names::new(&[(0x1, "a (x.c:1)")]);
        let mut ecs = vec![(vec![0x1], 1000), (vec![0x2], 5)];
        assert_eq!(
            tree(&mut ecs, 0, 1.0, &names),
            "n2: 1005 (heap allocation functions) malloc/new/new[], --alloc-fns, etc.\n \
             n0: 1000 0x1: a (x.c:1)\n n0: 5 in 1 place, below massif's threshold (1.00%)\n"
        );
    }

    #[test]
    fn empty_heap_merges_zero_byte_contexts_and_threshold_zero_shows_them() {
        let names = Names::new(&[(0x1, "a (x.c:1)"), (0x2, "b (x.c:2)")]);
        let mut ecs = vec![(vec![0x1], 0), (vec![0x2], 0)];
        assert_eq!(
            tree(&mut ecs, 0, 1.0, &names),
            "n1: 0 (heap allocation functions) malloc/new/new[], --alloc-fns, etc.\n \
             n0: 0 in 2 places, all below massif's threshold (1.00%)\n"
        );
        assert_eq!(
            tree(&mut ecs, 0, 0.0, &names),
            "n2: 0 (heap allocation functions) malloc/new/new[], --alloc-fns, etc.\n \
             n0: 0 0x1: a (x.c:1)\n n0: 0 0x2: b (x.c:2)\n"
        );
    }

    #[test]
    fn equal_totals_are_ordered_by_address() {
        let names = Names::new(&[(0x5, "e (x.c:5)"), (0x3, "c (x.c:3)")]);
        let mut ecs = vec![(vec![0x5], 100), (vec![0x3], 100)];
        let t = tree(&mut ecs, 0, 1.0, &names);
        assert!(t.find("0x3:").unwrap() < t.find("0x5:").unwrap(), "{t}");
    }

    #[test]
    fn merged_group_comes_first_among_equal_totals() {
        // sig = 30 * 50% = 15: a (15) is significant; b (8) and c (7) merge into 15 bytes,
        // which ties with a and wins on its address 0.
        let names = Names::new(&[(0x5, "a (x.c:5)")]);
        let mut ecs = vec![(vec![0x5], 15), (vec![0x6], 8), (vec![0x7], 7)];
        assert_eq!(
            tree(&mut ecs, 0, 50.0, &names),
            "n2: 30 (heap allocation functions) malloc/new/new[], --alloc-fns, etc.\n \
             n0: 15 in 2 places, all below massif's threshold (50.00%)\n n0: 15 0x5: a (x.c:5)\n"
        );
    }

    #[test]
    fn a_context_ending_at_a_node_is_not_a_child_group() {
        // [a] and [a, b]: a's node has 300 bytes but one child of 200.
        let names = Names::new(&[(0xa, "a (x.c:1)"), (0xb, "b (x.c:2)")]);
        let mut ecs = vec![(vec![0xa], 100), (vec![0xa, 0xb], 200)];
        assert_eq!(
            tree(&mut ecs, 0, 1.0, &names),
            "n1: 300 (heap allocation functions) malloc/new/new[], --alloc-fns, etc.\n \
             n1: 300 0xA: a (x.c:1)\n  n0: 200 0xB: b (x.c:2)\n"
        );
    }

    #[test]
    fn inlined_levels_print_as_a_chain_of_single_children() {
        let mut names = Names::new(&[(0x2, "main (x.c:9)")]);
        names.0.insert(
            0x1,
            vec![
                "0x1: __mmap64 (mmap64.c:58)".into(),
                "0x1: mmap (mmap64.c:46)".into(),
            ],
        );
        let mut ecs = vec![(vec![0x1, 0x2], 4096)];
        assert_eq!(
            tree(&mut ecs, 0, 1.0, &names),
            "n1: 4096 (heap allocation functions) malloc/new/new[], --alloc-fns, etc.\n \
             n1: 4096 0x1: __mmap64 (mmap64.c:58)\n  n1: 4096 0x1: mmap (mmap64.c:46)\n   \
             n0: 4096 0x2: main (x.c:9)\n"
        );
    }

    #[test]
    fn significance_counts_extra_heap_but_is_one_for_an_empty_heap() {
        assert_eq!(significance(1000, 100, 0, 1.0), 11);
        assert_eq!(significance(0, 100, 0, 1.0), 1);
        assert_eq!(significance(0, 100, 0, 0.0), 0);
    }
}
