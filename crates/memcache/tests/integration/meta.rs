//! The meta commands: flags, base64 keys, quiet mode, opaque tokens, modes and their errors.

use crate::common;

use std::borrow::Cow;

use common::{assert_prefixes_incomplete, invalid, line_error, request, Invalid};
use remem_memcache::{MetaFlags, MetaSetMode, ProtocolError, Request};

fn meta_get_flags(line: &[u8]) -> MetaFlags<'_> {
    match request(line) {
        Request::MetaGet { flags, .. } => flags,
        other => panic!("not an mg: {other:?}"),
    }
}

#[test]
fn mn_is_a_noop() {
    assert_eq!(request(b"mn\r\n"), Request::MetaNoop);
}

#[test]
fn mg_parses_return_flags_in_request_order() {
    let Request::MetaGet { key, flags } = request(b"mg foo v f t c k O123 q s h l u\r\n") else { panic!() };
    assert_eq!(&*key, b"foo");
    assert!(flags.return_value && flags.return_client_flags && flags.return_ttl && flags.return_cas);
    assert!(flags.return_key && flags.quiet && flags.return_size && flags.return_hit_before);
    assert!(flags.return_last_access && flags.no_lru_bump && !flags.base64_key);
    assert_eq!(flags.opaque, Some(&b"123"[..]));
    assert_eq!(flags.order.as_slice(), b"vftckOqshlu");
}

#[test]
fn mg_item_modifying_flags_carry_their_tokens() {
    let flags = meta_get_flags(b"mg foo N30 R-5 T2147483647 E99\r\n");
    assert_eq!(flags.vivify_exptime, Some(30));
    assert_eq!(flags.recache_exptime, Some(-5));
    assert_eq!(flags.exptime, Some(i64::from(i32::MAX)));
    assert_eq!(flags.new_cas, Some(99));
}

#[test]
fn base64_keys_are_decoded_and_owned() {
    let Request::MetaGet { key, flags } = request(b"mg AAEC/w== b k\r\n") else { panic!() };
    assert!(matches!(key, Cow::Owned(_)));
    assert_eq!(&*key, &[0, 1, 2, 255]);
    assert!(flags.base64_key);
    // Padding may be left out.
    let Request::MetaDelete { key, .. } = request(b"md AAEC/w b\r\n") else { panic!() };
    assert_eq!(&*key, &[0, 1, 2, 255]);
    assert_eq!(line_error(b"mg !!!! b\r\n"), ProtocolError::KeyDecoding);
    assert_eq!(line_error(b"md !!!! b\r\n"), ProtocolError::InvalidOrDuplicateFlag);
    assert_eq!(line_error(b"ma !!!! b\r\n"), ProtocolError::InvalidOrDuplicateFlag);
}

#[test]
fn the_scheme_hint_is_the_p_token_else_the_l_token() {
    assert_eq!(meta_get_flags(b"mg k Prep3\r\n").scheme_hint, Some(&b"rep3"[..]));
    assert_eq!(meta_get_flags(b"mg k Lec8+2\r\n").scheme_hint, Some(&b"ec8+2"[..]));
    assert_eq!(meta_get_flags(b"mg k Lec8+2 Prep3\r\n").scheme_hint, Some(&b"rep3"[..]));
    assert_eq!(meta_get_flags(b"mg k v\r\n").scheme_hint, None);
}

#[test]
fn flag_errors_report_memcacheds_texts() {
    assert_eq!(line_error(b"mg k v v\r\n"), ProtocolError::DuplicateFlag);
    assert_eq!(line_error(b"mg k \xff\r\n"), ProtocolError::DuplicateFlag);
    assert_eq!(line_error(b"mg k z\r\n"), ProtocolError::InvalidFlag);
    assert_eq!(line_error(b"mg k Nsoon\r\n"), ProtocolError::BadToken);
    assert_eq!(line_error(b"mg k C-1\r\n"), ProtocolError::BadToken);
    assert_eq!(line_error(b"mg k Fx\r\n"), ProtocolError::BadCommandLineFormat);
    assert_eq!(line_error(b"mg k MEE\r\n"), ProtocolError::ModeTokenLength);
    assert_eq!(line_error(b"ma k Jx\r\n"), ProtocolError::InvalidOrDuplicateFlag);
    assert_eq!(line_error(b"mg k Jx\r\n"), ProtocolError::InvalidInitialValue);
    assert_eq!(line_error(b"mg k Dx\r\n"), ProtocolError::InvalidDeltaValue);
    assert_eq!(line_error(b"md k v v\r\n"), ProtocolError::InvalidOrDuplicateFlag);
    // memcached keeps parsing after a bad token; the last error recorded wins, except that a
    // duplicate or unknown flag stops at once.
    assert_eq!(line_error(b"mg k Nx Jx\r\n"), ProtocolError::InvalidInitialValue);
    assert_eq!(line_error(b"mg k Nx Fx\r\n"), ProtocolError::BadToken);
    assert_eq!(line_error(b"mg k Nx z\r\n"), ProtocolError::InvalidFlag);
    assert_eq!(line_error(b"mg k Ok\x01\r\n"), ProtocolError::BadToken);
}

#[test]
fn opaque_tokens_are_at_most_32_bytes_with_their_o() {
    let opaque = format!("mg k O{}\r\n", "9".repeat(31));
    assert_eq!(meta_get_flags(opaque.as_bytes()).opaque.map(<[u8]>::len), Some(31));
    let opaque = format!("mg k O{}\r\n", "9".repeat(32));
    assert_eq!(line_error(opaque.as_bytes()), ProtocolError::OpaqueTooLong);
    assert_eq!(meta_get_flags(b"mg k O\r\n").opaque, Some(&b""[..]));
}

#[test]
fn at_most_eighteen_flags() {
    assert_eq!(
        meta_get_flags(b"mg a2V5 b c f h k l s t v q u x I O1 C1 E1 F1 N1\r\n").order.as_slice().len(),
        18
    );
    assert_eq!(
        line_error(b"mg k c f h k l s t v q u x I O1 C1 E1 F1 N1 R1 T1\r\n"),
        ProtocolError::TooManyFlags
    );
}

#[test]
fn meta_keys_follow_the_key_rules() {
    let long = format!("mg {} v\r\n", "k".repeat(251));
    assert_eq!(line_error(long.as_bytes()), ProtocolError::BadCommandLineFormat);
    assert_eq!(line_error(b"mg a\tb v\r\n"), ProtocolError::BadCommandLineFormat);
    assert_eq!(line_error(b"mg\r\n"), ProtocolError::UnknownCommand);
    assert_eq!(line_error(b"md\r\n"), ProtocolError::UnknownCommand);
}

#[test]
fn ms_takes_its_length_as_the_second_token() {
    let Request::MetaSet { key, data, flags } = request(b"ms foo 2 T90 F1 c k O5 MR I C7 q\r\nhi\r\n") else {
        panic!()
    };
    assert_eq!((&*key, data), (&b"foo"[..], &b"hi"[..]));
    assert_eq!((flags.exptime, flags.client_flags, flags.compare_cas), (Some(90), Some(1), Some(7)));
    assert_eq!(flags.set_mode(), MetaSetMode::Replace);
    assert!(flags.invalidate && flags.quiet && flags.return_cas && flags.return_key);
    assert_eq!(flags.order.as_slice(), b"TFckOMICq");
    for (mode, expected) in [
        ("E", MetaSetMode::Add),
        ("A", MetaSetMode::Append),
        ("P", MetaSetMode::Prepend),
        ("S", MetaSetMode::Set),
    ] {
        let line = format!("ms k 0 M{mode}\r\n\r\n");
        let Request::MetaSet { flags, .. } = request(line.as_bytes()) else { panic!() };
        assert_eq!(flags.set_mode(), expected);
    }
    let Request::MetaSet { flags, .. } = request(b"ms k 0\r\n\r\n") else { panic!() };
    assert_eq!((flags.set_mode(), flags.order.as_slice()), (MetaSetMode::Set, &b""[..]));
    assert_prefixes_incomplete(b"ms k 5 T0\r\nab\r\nc\r\n");
}

#[test]
fn ms_errors_swallow_the_data_once_the_length_is_known() {
    assert_eq!(
        invalid(b"ms k\r\n"),
        Invalid {
            error: ProtocolError::BadCommandLineFormat,
            consumed: 6,
            swallow: 0,
            close: false,
            noreply: false
        }
    );
    assert_eq!(invalid(b"ms k -1\r\n").swallow, 0);
    assert_eq!(invalid(b"ms k S5\r\n").swallow, 0);
    assert_eq!(
        invalid(b"ms k 3 MX q\r\n"),
        Invalid {
            error: ProtocolError::InvalidSetMode,
            consumed: 13,
            swallow: 5,
            close: false,
            noreply: false
        }
    );
    assert_eq!(invalid(b"ms k 3 v v\r\n").swallow, 5);
    assert_eq!(invalid(b"ms k 3 Fx\r\n").error, ProtocolError::BadCommandLineFormat);
    let long = format!("ms {} 3\r\n", "k".repeat(251));
    assert_eq!(invalid(long.as_bytes()).swallow, 5);
    assert_eq!(line_error(b"ms\r\n"), ProtocolError::UnknownCommand);
}

#[test]
fn ma_parses_mode_delta_and_vivify() {
    let Request::MetaArithmetic { key, flags } = request(b"ma n MD D5 J10 N0 v t c\r\n") else { panic!() };
    assert_eq!(&*key, b"n");
    assert!(flags.decrement() && flags.return_value);
    assert_eq!((flags.delta_or_default(), flags.initial_value, flags.vivify_exptime), (5, Some(10), Some(0)));
    for (line, decrement) in
        [(&b"ma n\r\n"[..], false), (b"ma n M+\r\n", false), (b"ma n MI\r\n", false), (b"ma n M-\r\n", true)]
    {
        let Request::MetaArithmetic { flags, .. } = request(line) else { panic!() };
        assert_eq!(flags.decrement(), decrement);
        assert_eq!(flags.delta_or_default(), 1);
    }
    assert_eq!(line_error(b"ma n MX\r\n"), ProtocolError::InvalidArithmeticMode);
    assert_eq!(line_error(b"ma n D-1\r\n"), ProtocolError::InvalidOrDuplicateFlag);
}

#[test]
fn md_parses_invalidate_ttl_and_cas() {
    let Request::MetaDelete { key, flags } = request(b"md k I T30 q k O9 C12 x\r\n") else { panic!() };
    assert_eq!(&*key, b"k");
    assert!(flags.invalidate && flags.quiet && flags.return_key && flags.remove_value);
    assert_eq!((flags.exptime, flags.compare_cas, flags.opaque), (Some(30), Some(12), Some(&b"9"[..])));
    // memcached ignores a mode on md and mg.
    assert!(matches!(request(b"md k MZ\r\n"), Request::MetaDelete { .. }));
}

#[test]
fn me_dumps_one_key_possibly_base64() {
    assert_eq!(request(b"me foo\r\n"), Request::MetaDebug { key: Cow::Borrowed(b"foo"), base64_key: false });
    assert_eq!(
        request(b"me Zm9v b\r\n"),
        Request::MetaDebug { key: Cow::Owned(b"foo".to_vec()), base64_key: true }
    );
    assert_eq!(line_error(b"me\r\n"), ProtocolError::BadCommandLineFormat);
    assert_eq!(line_error(b"me !!! b\r\n"), ProtocolError::BadCommandLineFormat);
}
