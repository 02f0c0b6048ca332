//! massif.out reader and writer: Valgrind's own files come back byte for byte, the looser
//! grammar ms_print accepts reads into the same model, and bad files say where and why.

mod common;

use oxgrind_formats::massif::{
    self, MassifFile, ParseErrorKind, Snapshot, SnapshotKind, TreeNode, HEAP_ROOT_LABEL,
};

#[test]
fn parse_then_write_reproduces_every_valgrind_example_byte_for_byte() {
    for file in common::example_files() {
        let bytes = std::fs::read(&file).unwrap();
        let model = massif::parse(&bytes).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let written = massif::write(&model);
        assert!(
            written.as_bytes() == bytes.as_slice(),
            "{}: round trip differs",
            file.display()
        );
        assert!(!model.snapshots.is_empty());
    }
}

#[test]
fn parsed_example_has_expected_shape() {
    let bytes = std::fs::read(common::massif_examples().join("massif.out.small")).unwrap();
    let m = massif::parse(&bytes).unwrap();
    assert_eq!(
        m.desc,
        "--detailed-freq=1 --massif-out-file=massif.out.small"
    );
    assert_eq!(m.cmd, "./ms_small");
    assert_eq!(m.time_unit, "i");
    let s1 = &m.snapshots[1];
    assert_eq!(
        (s1.time, s1.mem_heap_b, s1.mem_heap_extra_b),
        (134210, 10, 14)
    );
    let tree = s1.tree.as_ref().unwrap();
    assert_eq!(tree.label, HEAP_ROOT_LABEL);
    assert_eq!(tree.children[0].label, "0x109166: s1 (ms_small.c:3)");
    assert_eq!(tree.children[0].children[0].bytes, 10);
}

fn sample() -> MassifFile {
    MassifFile {
        desc: "--depth=3".into(),
        cmd: "./prog a b".into(),
        time_unit: "B".into(),
        snapshots: vec![
            Snapshot {
                time: 0,
                ..Default::default()
            },
            Snapshot {
                time: 100,
                mem_heap_b: 30,
                mem_heap_extra_b: 8,
                mem_stacks_b: 0,
                kind: SnapshotKind::Peak,
                tree: Some(TreeNode {
                    bytes: 30,
                    label: HEAP_ROOT_LABEL.into(),
                    children: vec![
                        TreeNode {
                            bytes: 20,
                            label: "0x1: f (a.c:1)".into(),
                            children: vec![TreeNode {
                                bytes: 20,
                                label: "0x2: main (a.c:9)".into(),
                                children: vec![],
                            }],
                        },
                        TreeNode {
                            bytes: 10,
                            label: "in 2 places, all below massif's threshold (1.00%)".into(),
                            children: vec![],
                        },
                    ],
                }),
            },
        ],
    }
}

#[test]
fn writer_emits_massif_layout() {
    let expected = "desc: --depth=3\ncmd: ./prog a b\ntime_unit: B\n\
#-----------\nsnapshot=0\n#-----------\ntime=0\nmem_heap_B=0\nmem_heap_extra_B=0\nmem_stacks_B=0\nheap_tree=empty\n\
#-----------\nsnapshot=1\n#-----------\ntime=100\nmem_heap_B=30\nmem_heap_extra_B=8\nmem_stacks_B=0\nheap_tree=peak\n\
n2: 30 (heap allocation functions) malloc/new/new[], --alloc-fns, etc.\n\
 \x20n1: 20 0x1: f (a.c:1)\n  n0: 20 0x2: main (a.c:9)\n\
\x20n0: 10 in 2 places, all below massif's threshold (1.00%)\n";
    assert_eq!(massif::write(&sample()), expected);
    assert_eq!(massif::parse(expected).unwrap(), sample());
}

#[test]
fn reader_accepts_ms_print_looser_grammar() {
    let loose = "# a comment line\n\ndesc: --depth=3\ncmd:   ./prog a b\n   \ntime_unit: B\n\
snapshot=0   # trailing comment\ntime=0\nmem_heap_B=0\nmem_heap_extra_B=0\n\n\nmem_stacks_B=0\nheap_tree=empty\n\
snapshot=1\ntime= 100 \nmem_heap_B=30\nmem_heap_extra_B=8\nmem_stacks_B=0\nheap_tree=peak\n\
n2:30 (heap allocation functions) malloc/new/new[], --alloc-fns, etc.\n\
n1:   20 0x1: f (a.c:1)\n\t\tn0: 20 0x2: main (a.c:9)\n\
         n0: 10 in 2 places, all below massif's threshold (1.00%)";
    assert_eq!(massif::parse(loose).unwrap(), sample());
}

#[test]
fn several_desc_lines_are_kept_as_lines() {
    let text = "desc: --a\ndesc: --b\ncmd: x\ntime_unit: i\n";
    let m = massif::parse(text).unwrap();
    assert_eq!(m.desc, "--a\n--b");
    assert!(m.snapshots.is_empty());
    assert_eq!(massif::write(&m), text);
}

#[test]
fn hash_inside_labels_survives_a_round_trip() {
    let text = "desc: (none)\ncmd: ./a#b\ntime_unit: i\n#-----------\nsnapshot=0\n#-----------\n\
time=1\nmem_heap_B=4\nmem_heap_extra_B=0\nmem_stacks_B=0\nheap_tree=detailed\n\
n1: 4 (heap allocation functions) malloc/new/new[], --alloc-fns, etc.\n n0: 4 0x1: op#1 (x.c:2)\n";
    let m = massif::parse(text).unwrap();
    assert_eq!(m.cmd, "./a#b");
    assert_eq!(
        m.snapshots[0].tree.as_ref().unwrap().children[0].label,
        "0x1: op#1 (x.c:2)"
    );
    assert_eq!(massif::write(&m), text);
}

fn parse_err(text: &str) -> (usize, ParseErrorKind, String) {
    let e = massif::parse(text).expect_err("should not parse");
    let msg = e.to_string();
    (e.line, e.kind, msg)
}

#[test]
fn missing_cmd_is_reported_with_its_line() {
    let (line, kind, msg) = parse_err("desc: x\n\ntime_unit: i\n");
    assert_eq!(line, 3);
    assert!(matches!(kind, ParseErrorKind::Expected { .. }));
    assert!(
        msg.starts_with("line 3: expected a `desc:` or `cmd:` line"),
        "{msg}"
    );
}

#[test]
fn bad_number_names_the_field() {
    let (line, kind, msg) = parse_err("desc: x\ncmd: y\ntime_unit: i\nsnapshot=0\ntime=12x\n");
    assert_eq!(line, 5);
    assert!(
        matches!(kind, ParseErrorKind::BadNumber { field: "time", .. }),
        "{kind:?}"
    );
    assert!(msg.contains("time="), "{msg}");
}

#[test]
fn truncated_tree_reports_end_of_file() {
    let (line, kind, msg) = parse_err(
        "desc: x\ncmd: y\ntime_unit: i\nsnapshot=0\ntime=1\nmem_heap_B=4\nmem_heap_extra_B=0\n\
mem_stacks_B=0\nheap_tree=detailed\nn2: 4 root\n n0: 4 a\n",
    );
    assert_eq!(line, 12);
    assert!(matches!(kind, ParseErrorKind::Expected { found: None, .. }));
    assert!(
        msg.contains("tree node") && msg.contains("end of file"),
        "{msg}"
    );
}

#[test]
fn unknown_heap_tree_kind_is_rejected() {
    let (line, kind, _) = parse_err(
        "desc: x\ncmd: y\ntime_unit: i\nsnapshot=0\ntime=1\nmem_heap_B=4\nmem_heap_extra_B=0\n\
mem_stacks_B=0\nheap_tree=full\n",
    );
    assert_eq!(line, 9);
    assert!(matches!(kind, ParseErrorKind::BadHeapTree { .. }));
}

#[test]
fn non_utf8_line_is_reported() {
    let (line, kind, _) = {
        let e = massif::parse(&b"desc: x\ncmd: \xff\n"[..]).unwrap_err();
        (e.line, e.kind, ())
    };
    assert_eq!((line, kind), (2, ParseErrorKind::NotUtf8));
}

#[test]
fn very_deep_tree_parses_without_recursion() {
    // Indentation is ignored by the reader (as by ms_print), so a hostile file can nest
    // 200,000 levels in a few megabytes; reading it must not overflow the stack.
    let depth = 200_000;
    let mut text = String::from("desc: x\ncmd: y\ntime_unit: i\nsnapshot=0\ntime=1\nmem_heap_B=7\nmem_heap_extra_B=0\nmem_stacks_B=0\nheap_tree=detailed\n");
    for d in 0..depth {
        let n = if d + 1 == depth { 0 } else { 1 };
        text.push_str(&format!("n{n}: 7 f{d}\n"));
    }
    let m = massif::parse(&text).unwrap();
    // Dropping the nested Vecs is recursive in Drop; flatten the tree first so the test
    // itself does not depend on the stack size.
    let mut stack = vec![m.snapshots.into_iter().next().unwrap().tree.unwrap()];
    let mut nodes = 0;
    while let Some(mut n) = stack.pop() {
        nodes += 1;
        stack.append(&mut n.children);
    }
    assert_eq!(nodes, depth);
}

#[test]
fn deep_tree_is_written_with_one_space_per_level() {
    let depth = 2_000;
    let mut node = TreeNode {
        bytes: 1,
        label: "leaf".into(),
        children: vec![],
    };
    for _ in 1..depth {
        node = TreeNode {
            bytes: 1,
            label: "f".into(),
            children: vec![node],
        };
    }
    let file = MassifFile {
        snapshots: vec![Snapshot {
            kind: SnapshotKind::Detailed,
            tree: Some(node),
            ..Default::default()
        }],
        ..Default::default()
    };
    let text = massif::write(&file);
    let last = text.lines().last().unwrap();
    assert_eq!(last.len(), depth - 1 + "n0: 1 leaf".len());
    assert!(last.ends_with("n0: 1 leaf"));
    assert_eq!(massif::parse(&text).unwrap(), file);
}

#[test]
fn writer_gives_a_treeless_detailed_snapshot_a_root_and_drops_an_empty_ones_tree() {
    let file = MassifFile {
        desc: "(none)".into(),
        cmd: "./p".into(),
        time_unit: "i".into(),
        snapshots: vec![
            Snapshot {
                mem_heap_b: 5,
                kind: SnapshotKind::Detailed,
                tree: None,
                ..Default::default()
            },
            Snapshot {
                kind: SnapshotKind::Empty,
                tree: Some(TreeNode {
                    bytes: 1,
                    label: "x".into(),
                    children: vec![],
                }),
                ..Default::default()
            },
        ],
    };
    let text = massif::write(&file);
    assert!(
        text.contains(&format!("heap_tree=detailed\nn0: 5 {HEAP_ROOT_LABEL}\n")),
        "{text}"
    );
    assert!(text.ends_with("heap_tree=empty\n"), "{text}");
    assert!(massif::parse(&text).is_ok());
}
