//! Arbitrary bytes as an NBD client's handshake options or transmission requests, cut and
//! validated as the server does. The parsing and its oracle (no panic; an accepted request stays
//! inside the export) live in `remem_nbd::fuzzing`, which a stable test runs too.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    remem_nbd::fuzzing::parse(data);
});
