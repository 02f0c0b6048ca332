// The few entry points that cannot be written in Rust: C++ `operator new` must be able to
// throw `std::bad_alloc` through its own frame, and `execl`-style functions are variadic.
// The string functions (strings.c) are C so their byte loops match Valgrind's exactly.
fn main() {
    println!("cargo:rerun-if-changed=src/shim.c");
    // The translation engine must never enter the dynamic loader's lazy resolver from
    // translated code: bind every symbol at load time.
    println!("cargo:rustc-link-arg-cdylib=-Wl,-z,now");
    cc::Build::new()
        .file("src/shim.c")
        .flag("-fexceptions")
        .flag("-fno-builtin")
        .flag("-fvisibility=default")
        .opt_level(2)
        .compile("oxgrind_shim");
    // Runs while the loader relocates us, before any object is initialised (init_order.c):
    // no call may leave the file (no loop turned into memset/memcpy) and no stack-protector
    // canary (it lives in TLS).
    println!("cargo:rerun-if-changed=src/init_order.c");
    cc::Build::new()
        .file("src/init_order.c")
        .flag("-fno-builtin")
        .flag("-fno-tree-loop-distribute-patterns")
        .flag("-fno-stack-protector")
        .flag("-fvisibility=hidden")
        .opt_level(2)
        .compile("oxgrind_init_order");
    // The string functions must never become calls to themselves: no builtins, and no
    // turning a copy loop into a memcpy/memmove call.
    println!("cargo:rerun-if-changed=src/strings.c");
    cc::Build::new()
        .file("src/strings.c")
        .flag("-fno-builtin")
        .flag("-fno-tree-loop-distribute-patterns")
        .flag("-fvisibility=hidden")
        .opt_level(2)
        .compile("oxgrind_strings");
    // The replacements of glibc's string functions run instrumented on the program's behalf:
    // their loops must make exactly the accesses written (no vectorising, no merged stores,
    // no calls to the functions they replace). No frame pointer either (cc forces one with
    // debug information): the engine's definedness fast path has no `leave`, so each return
    // through one would be a slow step; the stack is unwound by the CFI.
    println!("cargo:rerun-if-changed=src/replace.c");
    cc::Build::new()
        .file("src/replace.c")
        .force_frame_pointer(false)
        .flag("-fno-builtin")
        .flag("-fno-tree-loop-distribute-patterns")
        .flag("-fno-tree-vectorize")
        .flag("-fno-tree-slp-vectorize")
        .flag("-fno-store-merging")
        .flag("-fvisibility=hidden")
        .opt_level(2)
        .compile("oxgrind_replace");
}
