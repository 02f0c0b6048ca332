//! The example preload library runs inside other programs: bind every symbol at load time
//! so the engine never enters the dynamic loader's lazy resolver while guest code runs.
fn main() {
    println!("cargo:rustc-link-arg-examples=-Wl,-z,now");
}
