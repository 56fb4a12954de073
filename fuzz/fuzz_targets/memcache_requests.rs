//! Arbitrary bytes as what a memcached client sent (text and meta commands), parsed request
//! after request as the server does. The parsing and its oracle (no panic; bounds; slices inside
//! the request; prefixes incomplete) live in `remem_memcache::fuzzing`, which a stable test runs
//! too.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    remem_memcache::fuzzing::parse(data);
});
