//! Decodes arbitrary bytes as a stream of remem frames. The decoding and its oracle (no panic;
//! every decoded frame re-encodes to its own bytes) live in `remem_proto::fuzzing`, which the
//! stable-toolchain property tests run too.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    remem_proto::fuzzing::decode_stream(data);
});
