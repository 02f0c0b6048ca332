//! `--max-peak`, `--max-allocs`, `--max-leaked` on a run: a program with known figures
//! (tests/corpus/budgets.c: 101 allocations, a 105,000-byte peak, 5,000 bytes lost) passes
//! under each budget with its own exit status and breaks each one over it with exit status 3
//! and one line naming the budget, the overshoot and the site.

mod common;
use common::*;
use std::process::Command;

fn run_tool(tool: &str, budget: &str) -> std::process::Output {
    let prog = build("budgets.c", &["-g", "-O0"]);
    let mut cmd = Command::new(oxgrind());
    cmd.arg(format!("--tool={tool}"));
    if tool == "massif" {
        cmd.arg("--massif-out-file=/dev/null");
    }
    run(cmd.arg(budget).arg(&prog))
}

/// The budget lines of a run's stderr.
fn budget_lines(o: &std::process::Output) -> Vec<String> {
    stderr(o)
        .lines()
        .filter(|l| l.contains("budget broken"))
        .map(str::to_string)
        .collect()
}

#[test]
fn max_peak_passes_under_and_breaks_over_naming_the_site() {
    for tool in ["memcheck", "massif"] {
        let under = run_tool(tool, "--max-peak=200K");
        assert_eq!(under.status.code(), Some(0), "{tool}: {}", stderr(&under));
        assert!(budget_lines(&under).is_empty());
        let over = run_tool(tool, "--max-peak=100K");
        assert_eq!(over.status.code(), Some(3), "{tool}: {}", stderr(&over));
        let lines = budget_lines(&over);
        assert_eq!(lines.len(), 1, "{lines:?}");
        // The site is named from the live blocks when the peak first went over budget (and
        // again each time it grew by an eighth): here at 103,000 bytes, 98 small blocks.
        assert_eq!(
            lines[0],
            "oxgrind: budget broken: --max-peak=102400: the heap peaked at 105,000 B (102.5 KiB), \
             2,600 B (2.5 KiB) over; top site near the peak: many_small (budgets.c:10), \
             98,000 B (95.7 KiB) of 103,000 B (100.6 KiB) live"
        );
    }
}

#[test]
fn max_allocs_passes_under_and_breaks_over_naming_the_site() {
    let under = run_tool("memcheck", "--max-allocs=101");
    assert_eq!(under.status.code(), Some(0), "{}", stderr(&under));
    let over = run_tool("memcheck", "--max-allocs=50");
    assert_eq!(over.status.code(), Some(3));
    assert_eq!(
        budget_lines(&over),
        [
            "oxgrind: budget broken: --max-allocs=50: the program made 101 allocations, 51 over; \
          top site: many_small (budgets.c:10) (100 allocations)"
        ]
    );
}

#[test]
fn max_leaked_passes_under_and_breaks_over_naming_the_loss_record() {
    let under = run_tool("memcheck", "--max-leaked=5000");
    assert_eq!(under.status.code(), Some(0), "{}", stderr(&under));
    let over = run_tool("memcheck", "--max-leaked=1K");
    assert_eq!(over.status.code(), Some(3));
    assert_eq!(
        budget_lines(&over),
        ["oxgrind: budget broken: --max-leaked=1024: 5,000 B (4.9 KiB) definitely and indirectly lost, \
          3,976 B (3.9 KiB) over; largest loss record: leak_it (budgets.c:9) (5,000 B (4.9 KiB))"]
    );
}

#[test]
fn budgets_the_tool_cannot_measure_are_refused_before_the_run() {
    let o = run_tool("massif", "--max-leaked=1M");
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("--max-leaked needs Memcheck's leak check"),
        "{}",
        stderr(&o)
    );
    let o = run_tool("none", "--max-allocs=10");
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("need a tool that tracks the heap"),
        "{}",
        stderr(&o)
    );
    let o = run_tool("memcheck", "--max-peak=lots");
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("Bad option: --max-peak=lots: expected a size"),
        "{}",
        stderr(&o)
    );
}
