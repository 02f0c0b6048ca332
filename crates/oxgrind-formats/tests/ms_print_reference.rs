//! Our ms_print against the outputs stored beside the reference files
//! (`examples/massif/ms_print.<name>.txt`, produced by Valgrind 3.19's ms_print with default
//! options as `ms_print massif.out.<name>`).

mod common;

use oxgrind_formats::massif::{self, ms_print};

fn stored_pairs() -> Vec<(String, Vec<u8>, Vec<u8>)> {
    let dir = common::massif_examples();
    let mut pairs = Vec::new();
    for file in common::example_files() {
        let name = file.file_name().unwrap().to_str().unwrap().to_string();
        let suffix = name.trim_start_matches("massif.out.");
        let expected = dir.join(format!("ms_print.{suffix}.txt"));
        if let Ok(expected) = std::fs::read(&expected) {
            pairs.push((name, std::fs::read(&file).unwrap(), expected));
        }
    }
    assert!(
        pairs.len() >= 10,
        "expected the 10 stored ms_print outputs, found {}",
        pairs.len()
    );
    pairs
}

#[test]
fn render_bytes_matches_stored_ms_print_outputs() {
    for (name, input, expected) in stored_pairs() {
        let got = ms_print::render_bytes(&input, &ms_print::Options::default(), &[name.as_str()])
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        common::assert_same(
            &name,
            &common::Outcome {
                stdout: got,
                ok: true,
            },
            &common::Outcome {
                stdout: expected,
                ok: true,
            },
        );
    }
}

#[test]
fn render_of_parsed_model_matches_stored_ms_print_outputs() {
    for (name, input, expected) in stored_pairs() {
        let model = massif::parse(&input).unwrap_or_else(|e| panic!("{name}: {e}"));
        let got = ms_print::render(&model, &ms_print::Options::default(), &[name.as_str()])
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        common::assert_same(
            &name,
            &common::Outcome {
                stdout: got.into_bytes(),
                ok: true,
            },
            &common::Outcome {
                stdout: expected,
                ok: true,
            },
        );
    }
}
