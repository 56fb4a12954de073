//! Replies, byte for byte, including the meta return flags and quiet mode.

use crate::common;

use common::request;
use remem_memcache::response::meta::{self, DebugInfo, MetaCommand, MetaItem, MetaStatus};
use remem_memcache::response::{self as text};
use remem_memcache::{MetaFlags, ProtocolError, Request};

fn written(write: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut out = Vec::new();
    write(&mut out);
    out
}

fn flags_of(line: &[u8]) -> MetaFlags<'_> {
    match request(line) {
        Request::MetaGet { flags, .. }
        | Request::MetaSet { flags, .. }
        | Request::MetaDelete { flags, .. }
        | Request::MetaArithmetic { flags, .. } => flags,
        other => panic!("not a meta command: {other:?}"),
    }
}

#[test]
fn text_replies_are_memcacheds_lines() {
    assert_eq!(written(|out| text::value(out, b"k", 7, b"a\r\nb", None)), b"VALUE k 7 4\r\na\r\nb\r\n");
    assert_eq!(
        written(|out| text::value(out, b"k", u32::MAX, b"", Some(u64::MAX))),
        b"VALUE k 4294967295 0 18446744073709551615\r\n\r\n"
    );
    assert_eq!(written(text::end), b"END\r\n");
    assert_eq!(written(text::stored), b"STORED\r\n");
    assert_eq!(written(text::not_stored), b"NOT_STORED\r\n");
    assert_eq!(written(text::exists), b"EXISTS\r\n");
    assert_eq!(written(text::not_found), b"NOT_FOUND\r\n");
    assert_eq!(written(text::deleted), b"DELETED\r\n");
    assert_eq!(written(text::touched), b"TOUCHED\r\n");
    assert_eq!(written(text::ok), b"OK\r\n");
    assert_eq!(written(text::error), b"ERROR\r\n");
    assert_eq!(written(|out| text::number(out, 0)), b"0\r\n");
    assert_eq!(written(|out| text::number(out, 1234567890)), b"1234567890\r\n");
    assert_eq!(written(|out| text::version(out, "1.6.21")), b"VERSION 1.6.21\r\n");
    assert_eq!(written(|out| text::client_error(out, "bad data chunk")), b"CLIENT_ERROR bad data chunk\r\n");
    assert_eq!(written(|out| text::server_error(out, "out of memory")), b"SERVER_ERROR out of memory\r\n");
    assert_eq!(written(|out| text::stat(out, "curr_items", 42)), b"STAT curr_items 42\r\n");
    assert_eq!(written(|out| text::stat(out, "version", "1.6.21")), b"STAT version 1.6.21\r\n");
    assert_eq!(
        written(|out| text::protocol_error(out, &ProtocolError::ObjectTooLarge)),
        b"SERVER_ERROR object too large for cache\r\n"
    );
}

#[test]
#[should_panic(expected = "one line")]
fn an_error_message_with_a_line_break_is_a_programmer_error() {
    text::client_error(&mut Vec::new(), "two\r\nlines");
}

#[test]
fn mg_hit_echoes_return_flags_in_request_order() {
    let flags = flags_of(b"mg foo s v f t c k O123 h l q\r\n");
    let item = MetaItem {
        cas: 5,
        client_flags: 30,
        ttl_seconds: -1,
        size: 2,
        hit_before: true,
        last_access_seconds: 9,
        ..MetaItem::default()
    };
    let out = written(|out| {
        assert!(meta::reply(
            out,
            MetaCommand::Get,
            MetaStatus::hit(&flags),
            &flags,
            b"foo",
            &item,
            Some(b"hi")
        ))
    });
    assert_eq!(out, b"VA 2 s2 f30 t-1 c5 kfoo O123 h1 l9\r\nhi\r\n");
    let flags = flags_of(b"mg foo t\r\n");
    let item =
        MetaItem { ttl_seconds: 78, win_already_sent: true, stale: true, won: true, ..MetaItem::default() };
    let out = written(|out| {
        assert!(meta::reply(out, MetaCommand::Get, MetaStatus::hit(&flags), &flags, b"foo", &item, None))
    });
    assert_eq!(out, b"HD t78 Z X W\r\n");
}

#[test]
fn mg_miss_echoes_only_opaque_and_key_and_is_hidden_by_quiet() {
    let flags = flags_of(b"mg foo v k O7 c\r\n");
    let out = written(|out| {
        assert!(meta::reply(
            out,
            MetaCommand::Get,
            MetaStatus::En,
            &flags,
            b"foo",
            &MetaItem::default(),
            None
        ))
    });
    assert_eq!(out, b"EN kfoo O7\r\n");
    let flags = flags_of(b"mg foo v q\r\n");
    let out = written(|out| {
        assert!(!meta::reply(
            out,
            MetaCommand::Get,
            MetaStatus::En,
            &flags,
            b"foo",
            &MetaItem::default(),
            None
        ))
    });
    assert!(out.is_empty());
    // Quiet does not hide a hit.
    let out = written(|out| {
        assert!(meta::reply(
            out,
            MetaCommand::Get,
            MetaStatus::Va,
            &flags,
            b"foo",
            &MetaItem::default(),
            Some(b"x")
        ))
    });
    assert_eq!(out, b"VA 1\r\nx\r\n");
}

#[test]
fn base64_keys_are_echoed_encoded_with_a_b_flag() {
    let flags = flags_of(b"mg AAEC/w== b k v\r\n");
    let out = written(|out| {
        meta::reply(
            out,
            MetaCommand::Get,
            MetaStatus::Va,
            &flags,
            &[0, 1, 2, 255],
            &MetaItem::default(),
            Some(b""),
        );
    });
    assert_eq!(out, b"VA 0 kAAEC/w== b\r\n\r\n");
}

#[test]
fn ms_echoes_opaque_key_cas_size_and_quiet_hides_only_hd() {
    let flags = flags_of(b"ms foo 2 s c O1 k q T0\r\nhi\r\n");
    let item = MetaItem { cas: 77, size: 2, ..MetaItem::default() };
    assert!(written(|out| assert!(!meta::reply(
        out,
        MetaCommand::Set,
        MetaStatus::Hd,
        &flags,
        b"foo",
        &item,
        None
    )))
    .is_empty());
    let out = written(|out| {
        assert!(meta::reply(out, MetaCommand::Set, MetaStatus::Ns, &flags, b"foo", &item, None))
    });
    assert_eq!(out, b"NS s2 c77 O1 kfoo\r\n");
    let out = written(|out| {
        assert!(meta::reply(out, MetaCommand::Set, MetaStatus::Ex, &flags, b"foo", &item, None))
    });
    assert_eq!(out, b"EX s2 c77 O1 kfoo\r\n");
}

#[test]
fn md_echoes_opaque_and_key_and_quiet_hides_hd_not_nf() {
    let flags = flags_of(b"md foo q O4 k c\r\n");
    assert!(written(|out| assert!(!meta::reply(
        out,
        MetaCommand::Delete,
        MetaStatus::Hd,
        &flags,
        b"foo",
        &MetaItem::default(),
        None
    )))
    .is_empty());
    let out = written(|out| {
        assert!(meta::reply(
            out,
            MetaCommand::Delete,
            MetaStatus::Nf,
            &flags,
            b"foo",
            &MetaItem::default(),
            None
        ))
    });
    assert_eq!(out, b"NF O4 kfoo\r\n");
}

#[test]
fn ma_success_echoes_cas_ttl_opaque_key_and_quiet_hides_it() {
    let flags = flags_of(b"ma n v t c O1 k\r\n");
    let item = MetaItem { cas: 3, ttl_seconds: 100, ..MetaItem::default() };
    let out = written(|out| {
        assert!(meta::reply(out, MetaCommand::Arithmetic, MetaStatus::Va, &flags, b"n", &item, Some(b"42")))
    });
    assert_eq!(out, b"VA 2 t100 c3 O1 kn\r\n42\r\n");
    let out = written(|out| {
        assert!(meta::reply(out, MetaCommand::Arithmetic, MetaStatus::Nf, &flags, b"n", &item, None))
    });
    assert_eq!(out, b"NF O1 kn\r\n");
    let quiet = flags_of(b"ma n q v\r\n");
    assert!(written(|out| assert!(!meta::reply(
        out,
        MetaCommand::Arithmetic,
        MetaStatus::Va,
        &quiet,
        b"n",
        &item,
        Some(b"1")
    )))
    .is_empty());
    let out = written(|out| {
        assert!(meta::reply(out, MetaCommand::Arithmetic, MetaStatus::Ex, &quiet, b"n", &item, None))
    });
    assert_eq!(out, b"EX\r\n");
}

#[test]
fn mn_and_me_replies() {
    assert_eq!(written(meta::noop), b"MN\r\n");
    assert_eq!(written(meta::miss), b"EN\r\n");
    let info =
        DebugInfo { exptime_seconds: -1, last_access_seconds: 3, cas: 9, fetched: true, class: 1, size: 70 };
    assert_eq!(
        written(|out| meta::debug(out, b"foo", false, &info)),
        b"ME foo exp=-1 la=3 cas=9 fetch=yes cls=1 size=70\r\n"
    );
    let info = DebugInfo { fetched: false, ..info };
    assert_eq!(
        written(|out| meta::debug(out, b"foo", true, &info)),
        b"ME Zm9v exp=-1 la=3 cas=9 fetch=no cls=1 size=70\r\n"
    );
}
