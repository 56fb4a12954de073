//! Prints `remem_codec::bench::measure` of the fast coder as one JSON line, in the shape
//! `remem-isal-baseline` prints, so the two can be set side by side:
//! `cargo run --release -p remem-codec --example measure -- 8 2 4096 100000`.

fn main() {
    let arguments: Vec<usize> = std::env::args()
        .skip(1)
        .map(|argument| argument.parse().expect("arguments are: k r page_bytes iterations"))
        .collect();
    let argument = |index: usize, default: usize| arguments.get(index).copied().unwrap_or(default);
    let params = remem_codec::CodecParams::new(argument(0, 8), argument(1, 2), argument(2, 4096))
        .expect("valid codec parameters");
    let timings = remem_codec::bench::measure(&mut *remem_codec::new_codec(params), argument(3, 100_000));
    let show = |value: Option<f64>| value.map_or("null".to_string(), |ns| format!("{ns:.1}"));
    println!(
        "{{\"library\":\"isa-l 2.32 (erasure-isa-l, remem-codec)\",\"k\":{},\"r\":{},\"page_bytes\":{},\
         \"encode_ns\":{:.1},\"decode_one_lost_ns\":{},\"decode_two_lost_ns\":{}}}",
        params.data_splits,
        params.parity_splits,
        params.page_bytes,
        timings.encode_ns,
        show(timings.decode_one_lost_ns),
        show(timings.decode_two_lost_ns)
    );
}
