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

/// [`jump_to_c`] for the allocation functions, which also hand the C version the program's
/// stack and frame pointers at the call, in the two argument registers after their own
/// (see `hooks::pass_caller`: the allocation's stack is walked from the caller).
macro_rules! jump_to_c_with_caller {
    ($($name:ident => $target:ident($sp:literal, $bp:literal);)*) => {
        extern "C" {
            $(fn $target();)*
        }
        $(
            #[unsafe(naked)]
            #[no_mangle]
            pub unsafe extern "C" fn $name() {
                // SAFETY: copies rsp and rbp into the two argument registers after the
                // function's own and jumps; the C function takes the exported function's
                // arguments plus those two and returns to our caller.
                core::arch::naked_asm!(
                    concat!("mov ", $sp, ", rsp"),
                    concat!("mov ", $bp, ", rbp"),
                    "jmp {}",
                    sym $target
                )
            }
        )*
    };
}

jump_to_c_with_caller! {
    _Znwm => oxgrind_c_Znwm("rsi", "rdx");
    _Znam => oxgrind_c_Znam("rsi", "rdx");
    _ZnwmRKSt9nothrow_t => oxgrind_c_ZnwmRKSt9nothrow_t("rdx", "rcx");
    _ZnamRKSt9nothrow_t => oxgrind_c_ZnamRKSt9nothrow_t("rdx", "rcx");
    _ZnwmSt11align_val_t => oxgrind_c_ZnwmSt11align_val_t("rdx", "rcx");
    _ZnamSt11align_val_t => oxgrind_c_ZnamSt11align_val_t("rdx", "rcx");
    _ZnwmSt11align_val_tRKSt9nothrow_t => oxgrind_c_ZnwmSt11align_val_tRKSt9nothrow_t("rcx", "r8");
    _ZnamSt11align_val_tRKSt9nothrow_t => oxgrind_c_ZnamSt11align_val_tRKSt9nothrow_t("rcx", "r8");
}

jump_to_c! {
    execl => oxgrind_c_execl;
    execlp => oxgrind_c_execlp;
    execle => oxgrind_c_execle;
}
