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

#[test]
fn parse_args_reads_options_like_ms_print() {
    use ms_print::{Invocation, Options, UsageErrorKind};
    let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let inv = ms_print::parse_args(&args(&[
        "--threshold=2.5%",
        "--x=0040",
        "f1",
        "f2",
        "--y=9",
    ]));
    assert_eq!(
        inv,
        Ok(Invocation::Render {
            options: Options {
                threshold: 2.5,
                x: 40,
                y: 9
            },
            file: "f1".into(),
            arguments: args(&["--threshold=2.5%", "--x=0040", "f1", "f2", "--y=9"]),
        })
    );
    let kind = |a: &[&str]| ms_print::parse_args(&args(a)).unwrap_err().kind;
    assert_eq!(
        kind(&["--x=3", "f"]),
        UsageErrorKind::OutOfRange("--x=3".into())
    );
    assert_eq!(
        kind(&["--threshold=100.5", "f"]),
        UsageErrorKind::OutOfRange("--threshold=100.5".into())
    );
    assert_eq!(
        kind(&["--threshold=-1", "f"]),
        UsageErrorKind::UnknownOption("--threshold=-1".into())
    );
    assert_eq!(kind(&["-", "f"]), UsageErrorKind::UnknownOption("-".into()));
    assert_eq!(kind(&["--threshold=5"]), UsageErrorKind::MissingFile);
    assert!(matches!(
        ms_print::parse_args(&args(&["-h", "f"])),
        Ok(Invocation::Help { .. })
    ));
    // First problem wins, in command-line order.
    assert_eq!(
        kind(&["--x=2", "--version"]),
        UsageErrorKind::OutOfRange("--x=2".into())
    );
}

#[test]
fn render_rejects_options_out_of_ms_print_ranges() {
    let input = std::fs::read(common::massif_examples().join("massif.out.small")).unwrap();
    for options in [
        ms_print::Options {
            x: 3,
            ..Default::default()
        },
        ms_print::Options {
            y: 1001,
            ..Default::default()
        },
        ms_print::Options {
            threshold: f64::NAN,
            ..Default::default()
        },
    ] {
        let err = ms_print::render_bytes(&input, &options, &["f"]).unwrap_err();
        assert_eq!(err.kind, ms_print::RenderErrorKind::BadOptions);
    }
}
