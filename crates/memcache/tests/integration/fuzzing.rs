//! The fuzz target's body (`remem_memcache::fuzzing::parse`) on stable, without libFuzzer: a few
//! thousand deterministic inputs, each a run of well-formed text and meta requests (keys and
//! data blocks around the limits, base64 keys, noreply, wrong lengths), half of them mutated
//! (bytes flipped, cut, repeated), so every run covers the same ground. The oracle (no panic,
//! bounds, slices inside the request, prefixes incomplete) is the target's own.

use remem_proto::fuzzing::Xorshift as Rng;

/// A key of an interesting length (the small limit is 16, memcached's 250).
fn key(rng: &mut Rng) -> String {
    let length = rng.pick(&[1usize, 2, 15, 16, 17, 250, 251]);
    (0..length).map(|index| (b'a' + ((index as u64 + rng.below(26)) % 26) as u8) as char).collect()
}

/// A number token, sometimes not one.
fn number(rng: &mut Rng) -> String {
    rng.pick(&["0", "1", "5", "-1", "4294967295", "4294967296", "18446744073709551616", "x", "2592001"])
        .to_owned()
}

/// One well-formed (or nearly) request.
fn request(rng: &mut Rng) -> Vec<u8> {
    let key = key(rng);
    let data_bytes = rng.pick(&[0usize, 1, 63, 64, 65, 1000]);
    let data: String = "v".repeat(data_bytes);
    let announced = rng.pick(&[data_bytes, data_bytes, data_bytes + 1, usize::MAX / 2]);
    let noreply = rng.pick(&["", " noreply"]);
    let text = match rng.below(16) {
        0 => format!("get {key} {}\r\n", self::key(rng)),
        1 => format!("gets {key}\r\n"),
        2 => format!("gat {} {key}\r\n", number(rng)),
        3 => format!("set {key} {} {} {announced}{noreply}\r\n{data}\r\n", number(rng), number(rng)),
        4 => format!("cas {key} 0 0 {announced} {}{noreply}\r\n{data}\r\n", number(rng)),
        5 => format!("{} {key} {}{noreply}\r\n", rng.pick(&["incr", "decr"]), number(rng)),
        6 => format!("delete {key}{noreply}\r\n"),
        7 => format!("touch {key} {}\r\n", number(rng)),
        8 => format!("mg {key} v t f k O{} q\r\n", number(rng)),
        9 => format!("ms {key} {announced} T{} F{} I\r\n{data}\r\n", number(rng), number(rng)),
        10 => format!("md {key} q\r\nmn\r\n"),
        11 => format!("ma {key} D{} N0 MD\r\n", number(rng)),
        12 => format!("me {key}\r\nmg {} b v\r\n", rng.pick(&["a2V5", "=", "a2V5a2V5a2V5a2V5a2V5a2V5", ""])),
        13 => format!(
            "{}\r\n",
            rng.pick(&["stats", "stats items", "version", "verbosity 1", "flush_all 0", "quit"])
        ),
        14 => format!("transition {key} {} naive\r\n", rng.pick(&["rep3", "ec8+2", ""])),
        _ => format!("{}\n", rng.pick(&["", "get", "bogus x", "set k 0 0", "mg", "ms k"])),
    };
    text.into_bytes()
}

#[test]
fn four_thousand_generated_and_mutated_inputs_keep_the_parsers_oracle() {
    let mut rng = Rng::new(0x6d65_6d63);
    let mut requests = 0;
    for round in 0..4000 {
        let mut data = vec![rng.next_u64() as u8];
        for _ in 0..rng.below(6) + 1 {
            data.extend(request(&mut rng));
        }
        if round % 2 == 1 {
            rng.mutate(&mut data, &[b' ', b'\r', b'\n', 0, 0xff, b'0']);
        }
        requests += remem_memcache::fuzzing::parse(&data);
    }
    // The generator reaches parsed requests, not only the early refusals.
    assert!(requests > 3000, "only {requests} requests parsed");
}

#[test]
fn random_bytes_keep_the_parsers_oracle() {
    let mut rng = Rng::new(0x000b_17e5);
    for _ in 0..2000 {
        let data: Vec<u8> = (0..rng.below(300))
            .map(|_| {
                let any = rng.next_u64() as u8;
                rng.pick(&[b' ', b'\r', b'\n', b'g', b'e', b't', b'm', b'1', any])
            })
            .collect();
        remem_memcache::fuzzing::parse(&data);
    }
}
