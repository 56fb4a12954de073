//! The fuzz target's body (`remem_nbd::fuzzing::parse`) on stable, without libFuzzer: a few
//! thousand deterministic inputs, each a run of well-formed requests or options (lengths and
//! offsets around the export's end, page edges, the maximum request, the u32 and u64 ends),
//! half of them mutated (bytes flipped, cut, repeated), so every run covers the same ground.
//! The oracle (no panic, accepted requests within the export) is the target's own.

use remem_nbd::protocol::*;

use remem_proto::fuzzing::Xorshift as Rng;

/// An offset or length that sits on an interesting edge of an export of `size` bytes.
fn edge(rng: &mut Rng, size: u64) -> u64 {
    let near = rng.pick(&[0, size, size / 2, 4096, 1 << 16, u64::from(u32::MAX), u64::MAX]);
    let delta = rng.pick(&[0u64, 1, 511, 4095, 4096, 4097]);
    if rng.next_u64() & 1 == 0 {
        near.wrapping_add(delta)
    } else {
        near.wrapping_sub(delta)
    }
}

/// The export set-up bytes and a run of well-formed transmission requests.
fn requests(rng: &mut Rng) -> Vec<u8> {
    let any = rng.below(1 << 40);
    let size = rng.pick(&[0u64, 4096, 1 << 20, (1 << 40) - 1, any]);
    let mut data = size.to_be_bytes().to_vec();
    data.push(rng.pick(&[0, 1]));
    for _ in 0..rng.below(8) + 1 {
        let command =
            rng.pick(&[CMD_READ, CMD_WRITE, CMD_DISC, CMD_FLUSH, CMD_TRIM, CMD_WRITE_ZEROES, 5, 99]);
        let flags = rng.below(1 << 5) as u16 & rng.pick(&[0, 0xffff, CMD_FLAG_FUA | CMD_FLAG_FAST_ZERO]);
        let length = (edge(rng, size) as u32).min(rng.pick(&[u32::MAX, 1 << 16, 5000]));
        let header =
            RequestHeader { flags, command, handle: rng.next_u64(), offset: edge(rng, size), length };
        encode_request(&header, &mut data);
        if command == CMD_WRITE {
            let payload = (length as usize).min(1 << 16);
            data.extend(std::iter::repeat_n(0xa5, payload));
        }
    }
    data
}

/// The export set-up bytes (options mode) and a run of options, `NBD_OPT_GO`/`INFO` data among
/// them.
fn options(rng: &mut Rng) -> Vec<u8> {
    let mut data = vec![0; 8];
    data.push(2 | rng.pick(&[0, 1]));
    for _ in 0..rng.below(6) + 1 {
        let name_bytes = rng.pick(&[0usize, 1, 7, 4096, 4097]);
        let mut option = (name_bytes as u32).to_be_bytes().to_vec();
        option.extend(std::iter::repeat_n(b'x', name_bytes.min(5000)));
        let count = rng.pick(&[0u16, 1, 3, 0xffff]);
        option.extend_from_slice(&count.to_be_bytes());
        for _ in 0..count.min(4) {
            option.extend_from_slice(&rng.pick(&[0u16, 1, 2, 3, 77]).to_be_bytes());
        }
        let length = rng.pick(&[option.len() as u32, option.len() as u32 + 1, 64 * 1024 + 1, 0]);
        data.extend_from_slice(&OPTION_MAGIC.to_be_bytes());
        data.extend_from_slice(&rng.pick(&[1u32, 6, 7]).to_be_bytes());
        data.extend_from_slice(&length.to_be_bytes());
        data.extend_from_slice(&option);
    }
    data
}

#[test]
fn four_thousand_generated_and_mutated_inputs_keep_the_parsers_oracle() {
    let mut rng = Rng::new(0x5eed_0f4e);
    let (mut accepted_requests, mut accepted_options) = (0, 0);
    for round in 0..4000 {
        let options_mode = round % 4 == 3;
        let mut data = if options_mode { options(&mut rng) } else { requests(&mut rng) };
        if round % 2 == 1 {
            rng.mutate(&mut data, &[0, 0xff]);
        }
        let accepted = remem_nbd::fuzzing::parse(&data);
        if options_mode {
            accepted_options += accepted;
        } else {
            accepted_requests += accepted;
        }
    }
    // The generator reaches the validated paths, not only the early refusals.
    assert!(accepted_requests > 1000, "only {accepted_requests} requests accepted");
    assert!(accepted_options > 100, "only {accepted_options} options accepted");
}

#[test]
fn random_bytes_keep_the_parsers_oracle() {
    let mut rng = Rng::new(0x000b_17e5);
    for _ in 0..2000 {
        let data: Vec<u8> = (0..rng.below(200)).map(|_| rng.next_u64() as u8).collect();
        remem_nbd::fuzzing::parse(&data);
    }
}
