//! Nulgrind (`--tool=none`): the program runs under the translation engine, uninstrumented.
//!
//! As in Valgrind, the tool that does nothing is how the core's own cost and transparency
//! are measured: a program under `--tool=none` must behave exactly as natively, and the
//! slowdown is the engine's alone. It asks for translation and for no allocator events, and
//! prints Valgrind's banner.

use std::sync::atomic::{AtomicBool, Ordering};

use oxgrind_tool::{Exit, Host, Needs, OptionError, Tool};

#[derive(Default)]
pub struct Nulgrind {
    quiet: bool,
    started: AtomicBool,
}

impl Nulgrind {
    pub fn new() -> Self {
        Self::default()
    }
}

impl Tool for Nulgrind {
    fn name(&self) -> &'static str {
        "none"
    }

    fn parse_option(&mut self, _arg: &str) -> Result<bool, OptionError> {
        Ok(false)
    }

    fn core_options(&mut self, core: &oxgrind_tool::CoreView) {
        self.quiet = !core.talks();
    }

    fn needs(&self) -> Needs {
        Needs {
            translation: true,
            ignores_heap: true,
            ..Needs::default()
        }
    }

    fn on_start(&self, host: &dyn Host) {
        if self.quiet || self.started.swap(true, Ordering::AcqRel) {
            return;
        }
        let mut out = String::new();
        out.push_str(&host.banner(
            "Nulgrind, the minimal Valgrind tool",
            "Copyright (C) 2002-2017, and GNU GPL'd, by Nicholas Nethercote.",
        ));
        host.log(&out);
    }

    fn fini(&self, host: &dyn Host, exit: Exit) {
        if self.quiet || matches!(exit, Exit::Exec) {
            return;
        }
        host.log(&format!("=={}== \n", host.pid()));
    }
}
