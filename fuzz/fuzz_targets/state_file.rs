//! Fuzz the persistent prefix cache's file reader (`vela_engine::persist`): `decode` of the
//! whole file (what a load runs) and `read_header` of the same bytes as a file on disk (what the
//! index at start-up runs).
//!
//! Asserts: both return `Ok` or an error, never panic or allocate beyond the input (every
//! length is checked against the bytes left); a file that decodes has a header that
//! `read_header` accepts with the same identity and tokens; what decoded, encoded again,
//! decodes to the same header and state.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;
use vela_engine::persist;

fn scratch() -> &'static std::path::Path {
    static P: OnceLock<std::path::PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        std::env::temp_dir().join(format!("vela-fuzz-state-{}.vpc", std::process::id()))
    })
}

fuzz_target!(|data: &[u8]| {
    let decoded = persist::decode(data);
    std::fs::write(scratch(), data).expect("scratch file");
    let header = persist::read_header(scratch());
    if let Ok((h, state)) = decoded {
        let hh = header.expect("a file that decodes has a readable header");
        assert_eq!(hh.identity, h.identity);
        assert_eq!(hh.tokens, h.tokens);
        let again = persist::encode(&h.identity, &h.tokens, &state);
        let (h2, s2) = persist::decode(&again).expect("a re-encoded state decodes");
        assert_eq!(h2.identity, h.identity);
        assert_eq!(h2.tokens, h.tokens);
        assert!(s2 == state, "re-encoding changed the state");
    }
});
