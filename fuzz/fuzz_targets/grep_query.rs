#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vilvona_fuzz::run("grep_query", data));
