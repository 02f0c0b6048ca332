//! `oxgrind`: run a program under a memory tool, as `valgrind` does, or view a tool's output.
//!
//! ```text
//! oxgrind [options] prog [args]        run prog under --tool (memcheck by default)
//! oxgrind ms_print [options] FILE      render a massif.out file as Valgrind's ms_print
//! oxgrind cg_annotate [options] FILE   render a cachegrind.out file as Valgrind's cg_annotate
//! oxgrind cg_merge [-o OUT] FILES...    add cachegrind.out files up as Valgrind's cg_merge
//! oxgrind cg_diff FILE1 FILE2          subtract cachegrind.out files as Valgrind's cg_diff
//! oxgrind report [options] FILE...     one HTML page (or JSON, SARIF) for tools' outputs
//! oxgrind diff [options] OLD NEW       two runs compared site by site
//! ```
//! The launcher does little itself: it parses the options (rejecting mistakes before the
//! program starts), checks the program can take our runtime library, and `exec`s it with the
//! runtime preloaded. Being replaced by the program keeps its pid, stdin/stdout/stderr and
//! exit status (or fatal signal) exactly what they would be without oxgrind.
//! Every failure is one line on stderr, `oxgrind: ...`, and exit status 1, except a program
//! that cannot be run at all: 127 when it does not exist, 126 when it cannot be executed, as
//! Valgrind and shells answer.

mod launch;
mod viewers;

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let argv0 = args.first().map(String::as_str).unwrap_or("oxgrind");
    let rest = &args[1.min(args.len())..];
    // A program literally called `ms_print`, `cg_annotate`, `cg_merge`, `cg_diff`, `report` or `diff` can still be run as
    // `oxgrind -- report` or `oxgrind ./report`: only the bare first word selects the viewer.
    let result = if argv0.ends_with("oxgrind-ms_print") {
        viewers::ms_print::main(rest).map(|()| ExitCode::SUCCESS)
    } else {
        match rest.first().map(String::as_str) {
            Some("ms_print") => viewers::ms_print::main(&rest[1..]).map(|()| ExitCode::SUCCESS),
            Some("cg_annotate") => {
                viewers::cg_annotate::main(&rest[1..]).map(|()| ExitCode::SUCCESS)
            }
            Some("cg_merge") => viewers::cg_merge::main(&rest[1..]).map(|()| ExitCode::SUCCESS),
            Some("cg_diff") => viewers::cg_diff::main(&rest[1..]).map(|()| ExitCode::SUCCESS),
            Some("report") => viewers::report::main(&rest[1..]).map(|()| ExitCode::SUCCESS),
            // diff decides its own status: a broken --fail-if-grown budget is not an error.
            Some("diff") => viewers::diff::main(&rest[1..]),
            _ => launch::main(rest).map(|()| ExitCode::SUCCESS),
        }
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            // A closed pipe (`oxgrind ms_print f | head`) is not an error worth a message.
            if err.downcast_ref::<std::io::Error>().map(|e| e.kind())
                == Some(std::io::ErrorKind::BrokenPipe)
            {
                return ExitCode::SUCCESS;
            }
            eprintln!("oxgrind: {err:#}");
            match err.downcast_ref::<launch::CannotRun>() {
                Some(c) => ExitCode::from(c.status),
                None => ExitCode::FAILURE,
            }
        }
    }
}
