//! Feeds arbitrary bytes to the receiving side of an encrypted node connection (`--encrypt`):
//! as a connection's opening, as ciphertext, and as plaintext sealed and then altered. The body
//! and its oracle (no panic; nothing unsealed or altered is ever handed out) live in
//! `remem_proto::fuzzing::open_messages`, which a stable-toolchain test runs too.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    remem_proto::fuzzing::open_messages(data);
});
