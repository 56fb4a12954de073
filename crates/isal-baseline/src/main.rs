//! remem-isal-baseline: the bar the codec is held to (DESIGN.md: within 1.2x of ISA-L), measured
//! on Debian's libisal-dev in a process of its own.
//!
//! Fairness by construction: this binary compiles remem-codec's own `params.rs`, `page_codec.rs`,
//! `matrix.rs`, `isal.rs` and `bench.rs` (through `#[path]`), and only swaps `isal_ffi.rs` for a
//! hand-written binding to the system library. So the table cache, the stack pointer arrays, the
//! loss patterns and the timing loop are the very code `remem bench codec` runs; only the ISA-L
//! build differs. It is a separate process because the vendored ISA-L 2.32 and Debian's 2.30
//! export the same C symbols, and one address space can hold only one of them.
//!
//! Prints one JSON line:
//! `{"library":"isa-l (Debian libisal-dev)","k":8,"r":2,"page_bytes":4096,"encode_ns":..,
//! "decode_one_lost_ns":..,"decode_two_lost_ns":..}` (a decode field is null when r is too small).

#[allow(dead_code)]
#[path = "../../codec/src/bench.rs"]
mod bench;
#[allow(dead_code)]
#[path = "../../codec/src/isal.rs"]
mod isal;
mod isal_ffi;
#[allow(dead_code)]
#[path = "../../codec/src/matrix.rs"]
mod matrix;
#[allow(dead_code)]
#[path = "../../codec/src/page_codec.rs"]
mod page_codec;
#[allow(dead_code)]
#[path = "../../codec/src/params.rs"]
mod params;

const USAGE: &str = "usage: remem-isal-baseline [--data-splits K] [--parity-splits R] \
                     [--page-bytes BYTES] [--iterations N]";

struct Arguments {
    data_splits: usize,
    parity_splits: usize,
    page_bytes: usize,
    iterations: usize,
}

fn parse_arguments() -> Result<Arguments, String> {
    let mut arguments = Arguments { data_splits: 8, parity_splits: 2, page_bytes: 4096, iterations: 100_000 };
    let mut words = std::env::args().skip(1);
    while let Some(flag) = words.next() {
        let target = match flag.as_str() {
            "--data-splits" => &mut arguments.data_splits,
            "--parity-splits" => &mut arguments.parity_splits,
            "--page-bytes" => &mut arguments.page_bytes,
            "--iterations" => &mut arguments.iterations,
            "--help" | "-h" => return Err(USAGE.to_string()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        };
        let value = words.next().ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        *target = value.parse().map_err(|error| format!("{flag} {value:?}: {error}"))?;
    }
    if arguments.iterations == 0 {
        return Err(format!("--iterations must be positive\n{USAGE}"));
    }
    Ok(arguments)
}

fn json_number(value: Option<f64>) -> String {
    value.map_or_else(|| "null".to_string(), |ns| format!("{ns:.1}"))
}

fn main() {
    let arguments = match parse_arguments() {
        Ok(arguments) => arguments,
        Err(message) => {
            eprintln!("{message}");
            std::process::exit(2);
        }
    };
    let params = match params::CodecParams::new(
        arguments.data_splits,
        arguments.parity_splits,
        arguments.page_bytes,
    ) {
        Ok(params) => params,
        Err(error) => {
            eprintln!("invalid parameters: {error}");
            std::process::exit(2);
        }
    };
    let mut codec = isal::IsalCodec::new(params);
    let timings = bench::measure(&mut codec, arguments.iterations);
    println!(
        "{{\"library\":\"isa-l (Debian libisal-dev)\",\"k\":{},\"r\":{},\"page_bytes\":{},\
         \"encode_ns\":{:.1},\"decode_one_lost_ns\":{},\"decode_two_lost_ns\":{}}}",
        params.data_splits,
        params.parity_splits,
        params.page_bytes,
        timings.encode_ns,
        json_number(timings.decode_one_lost_ns),
        json_number(timings.decode_two_lost_ns),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use page_codec::PageCodec;

    #[test]
    fn shared_generator_matrix_is_debian_isal_cauchy1_for_k_at_least_2() {
        for data_splits in [2, 4, 8, 16] {
            for parity_splits in 0..=4 {
                assert_eq!(
                    matrix::generator_matrix(data_splits, parity_splits),
                    isal_ffi::cauchy1_matrix(data_splits, parity_splits)
                );
            }
        }
    }

    #[test]
    fn debian_isal_coder_restores_a_page_losing_two_data_splits_k8_r2() {
        let params = params::CodecParams::new(8, 2, 4096).expect("valid");
        let mut codec = isal::IsalCodec::new(params);
        let page: Vec<u8> = (0..4096u32).map(|index| (index * 7 + 3) as u8).collect();
        let mut parity = vec![0u8; params.parity_bytes()];
        codec.encode(&page, &mut parity);
        let mut damaged = page.clone();
        damaged[..1024].fill(0);
        codec.decode(&mut damaged, &parity, 0b11_1111_1100).expect("8 splits present");
        assert_eq!(damaged, page);
    }

    #[test]
    fn bench_runs_with_tiny_iterations() {
        let params = params::CodecParams::new(8, 2, 4096).expect("valid");
        let timings = bench::measure(&mut isal::IsalCodec::new(params), 5);
        assert!(timings.encode_ns > 0.0 && timings.decode_two_lost_ns.is_some());
    }
}
