#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| oxgrind_fuzz::suppressions(data));
