//! Exported entry points implemented in C (`shim.c`).
//!
//! A Rust cdylib exports only the symbols Rust itself defines (rustc hides everything else
//! with a version script), so `operator new` and the variadic `execl` family, written in C,
//! need a Rust-defined name. Each is a naked function that only jumps to the C version: no
//! Rust frame stays on the stack, so a `std::bad_alloc` thrown by the C code unwinds
//! through C frames only, and the variadic arguments arrive untouched.

macro_rules! jump_to_c {
    ($($name:ident => $target:ident;)*) => {
        extern "C" {
            $(fn $target();)*
        }
        $(
            #[unsafe(naked)]
            #[no_mangle]
            pub unsafe extern "C" fn $name() {
                // SAFETY: a tail jump with every argument register untouched; the C function
                // has the exported function's exact signature and returns to our caller.
                core::arch::naked_asm!("jmp {}", sym $target)
            }
        )*
    };
}

jump_to_c! {
    _Znwm => oxgrind_c_Znwm;
    _Znam => oxgrind_c_Znam;
    _ZnwmRKSt9nothrow_t => oxgrind_c_ZnwmRKSt9nothrow_t;
    _ZnamRKSt9nothrow_t => oxgrind_c_ZnamRKSt9nothrow_t;
    _ZnwmSt11align_val_t => oxgrind_c_ZnwmSt11align_val_t;
    _ZnamSt11align_val_t => oxgrind_c_ZnamSt11align_val_t;
    _ZnwmSt11align_val_tRKSt9nothrow_t => oxgrind_c_ZnwmSt11align_val_tRKSt9nothrow_t;
    _ZnamSt11align_val_tRKSt9nothrow_t => oxgrind_c_ZnamSt11align_val_tRKSt9nothrow_t;
    execl => oxgrind_c_execl;
    execlp => oxgrind_c_execlp;
    execle => oxgrind_c_execle;
}
