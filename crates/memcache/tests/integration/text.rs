//! The text protocol, command by command, and its errors as memcached 1.6 reports them.

use crate::common;

use std::borrow::Cow;

use common::{
    assert_prefixes_incomplete, assert_prefixes_incomplete_with, invalid, invalid_with, line_error,
    parse_default, request, request_with, unlinked_with, Invalid,
};
use remem_memcache::{parse, Limits, Parse, ProtocolError, Request, StoreMode};

fn keys(list: &[&'static [u8]]) -> Vec<Cow<'static, [u8]>> {
    list.iter().map(|key| Cow::Borrowed(*key)).collect()
}

#[test]
fn get_gets_gat_gats_parse_their_keys() {
    assert_eq!(
        request(b"get a\r\n"),
        Request::Get { keys: keys(&[b"a"]), with_cas: false, touch_exptime: None }
    );
    assert_eq!(
        request(b"gets a bb  ccc\r\n"),
        Request::Get { keys: keys(&[b"a", b"bb", b"ccc"]), with_cas: true, touch_exptime: None }
    );
    assert_eq!(
        request(b"gat 30 a b\r\n"),
        Request::Get { keys: keys(&[b"a", b"b"]), with_cas: false, touch_exptime: Some(30) }
    );
    assert_eq!(
        request(b"gats -1 a\r\n"),
        Request::Get { keys: keys(&[b"a"]), with_cas: true, touch_exptime: Some(-1) }
    );
    assert_eq!(
        request(b"get a a\r\n"),
        Request::Get { keys: keys(&[b"a", b"a"]), with_cas: false, touch_exptime: None }
    );
}

#[test]
fn get_without_keys_is_error_and_bad_exptime_is_reported() {
    assert_eq!(line_error(b"get\r\n"), ProtocolError::UnknownCommand);
    assert_eq!(line_error(b"get   \r\n"), ProtocolError::UnknownCommand);
    assert_eq!(line_error(b"gat 10\r\n"), ProtocolError::UnknownCommand);
    assert_eq!(line_error(b"gat soon a\r\n"), ProtocolError::InvalidExptime);
    assert_eq!(line_error(b"gat 4294967296 a\r\n"), ProtocolError::InvalidExptime);
}

#[test]
fn keys_over_250_bytes_or_with_control_characters_are_bad_format() {
    let mut line = b"get ".to_vec();
    line.extend_from_slice(&[b'k'; 250]);
    line.extend_from_slice(b"\r\n");
    assert!(matches!(request(&line), Request::Get { .. }));
    let mut line = b"get a ".to_vec();
    line.extend_from_slice(&[b'k'; 251]);
    line.extend_from_slice(b"\r\n");
    assert_eq!(line_error(&line), ProtocolError::BadCommandLineFormat);
    assert_eq!(line_error(b"get a\tb\r\n"), ProtocolError::BadCommandLineFormat);
    assert_eq!(line_error(b"get a\x01b\r\n"), ProtocolError::BadCommandLineFormat);
    assert_eq!(line_error(b"get a\x7fb\r\n"), ProtocolError::BadCommandLineFormat);
    assert_eq!(line_error(b"delete a\x00b\r\n"), ProtocolError::BadCommandLineFormat);
    // UTF-8 keys are bytes >= 0x80: memcached and pymemcache (allow_unicode_keys) accept them.
    assert_eq!(
        request("get clé\r\n".as_bytes()),
        Request::Get { keys: vec![Cow::Borrowed("clé".as_bytes())], with_cas: false, touch_exptime: None }
    );
}

#[test]
fn get_with_ten_thousand_keys_within_the_line_limit() {
    let mut line = b"get".to_vec();
    for index in 0..10_000 {
        line.extend_from_slice(format!(" k{index}").as_bytes());
    }
    line.extend_from_slice(b"\r\n");
    assert!(line.len() < Limits::default().max_line_bytes);
    let Request::Get { keys, .. } = request(&line) else { panic!("not a get") };
    assert_eq!(keys.len(), 10_000);
    assert_eq!(&*keys[9_999], b"k9999");
}

#[test]
fn set_family_parse_with_their_data_block() {
    let parsed = request(b"set k 5 100 5\r\nhello\r\n");
    assert_eq!(
        parsed,
        Request::Store {
            mode: StoreMode::Set,
            key: Cow::Borrowed(b"k"),
            flags: 5,
            exptime: 100,
            data: b"hello",
            cas_unique: 0,
            noreply: false
        }
    );
    // pymemcache's default form.
    let Request::Store { noreply, data, .. } = request(b"set k 0 0 5 noreply\r\nhe\r\no\r\n") else {
        panic!()
    };
    assert!(noreply);
    assert_eq!(data, b"he\r\no");
    for (command, mode) in [
        ("add", StoreMode::Add),
        ("replace", StoreMode::Replace),
        ("append", StoreMode::Append),
        ("prepend", StoreMode::Prepend),
    ] {
        let line = format!("{command} k 4294967295 -1 0\r\n\r\n");
        let parsed = request(line.as_bytes());
        assert_eq!(
            parsed,
            Request::Store {
                mode,
                key: Cow::Borrowed(b"k"),
                flags: u32::MAX,
                exptime: -1,
                data: b"",
                cas_unique: 0,
                noreply: false
            }
        );
    }
    assert_eq!(
        request(b"cas k 1 2 3 18446744073709551615 noreply\r\nabc\r\n"),
        Request::Store {
            mode: StoreMode::Cas,
            key: Cow::Borrowed(b"k"),
            flags: 1,
            exptime: 2,
            data: b"abc",
            cas_unique: u64::MAX,
            noreply: true
        }
    );
    // A sixth token that is not `noreply` is ignored, as memcached does.
    let Request::Store { noreply, .. } = request(b"set k 0 0 1 whatever\r\nx\r\n") else { panic!() };
    assert!(!noreply);
}

#[test]
fn set_split_at_every_byte_is_incomplete_until_whole() {
    assert_prefixes_incomplete(b"set key 0 0 10\r\n0123\r\n6789\r\n");
    assert_prefixes_incomplete(b"cas key 0 0 2 77 noreply\r\nab\r\n");
}

#[test]
fn pipelined_requests_parse_one_after_another() {
    let input = b"set a 0 0 1\r\n1\r\nget a b\r\nincr a 5\nmn\r\ndelete a noreply\r\nget";
    let mut rest = &input[..];
    let mut parsed = Vec::new();
    while let Parse::Request { request, consumed } = parse_default(rest) {
        parsed.push(request);
        rest = &rest[consumed..];
    }
    assert_eq!(parsed.len(), 5);
    assert!(matches!(parsed[2], Request::Arithmetic { increment: true, delta: 5, .. }));
    assert_eq!(parsed[3], Request::MetaNoop);
    assert_eq!(rest, b"get");
}

#[test]
fn value_too_large_swallows_its_data_block_even_before_it_arrives() {
    let limits = Limits { max_item_bytes: 10, ..Limits::default() };
    let line = b"set k 0 0 11\r\n";
    let expected = Invalid {
        error: ProtocolError::ObjectTooLarge,
        consumed: line.len(),
        swallow: 13,
        close: false,
        noreply: false,
    };
    assert_eq!(invalid_with(line, &limits), expected);
    assert_eq!(invalid_with(b"set k 0 0 11\r\n01234567890\r\nget k\r\n", &limits), expected);
    assert!(matches!(parse(b"set k 0 0 10\r\n0123456789\r\n", &limits), Parse::Request { .. }));
    // The default limit is 1 MiB; 2^31 - 3 is the longest length memcached still reads as one.
    let huge = invalid(b"set k 0 0 2147483645 noreply\r\n");
    assert_eq!(
        huge,
        Invalid {
            error: ProtocolError::ObjectTooLarge,
            consumed: 30,
            swallow: 2_147_483_647,
            close: false,
            noreply: true
        }
    );
    let meta = invalid(b"ms k 1048577 q\r\n");
    assert_eq!(
        meta,
        Invalid {
            error: ProtocolError::ObjectTooLarge,
            consumed: 16,
            swallow: 1_048_579,
            close: false,
            noreply: false
        }
    );
}

#[test]
fn data_block_without_crlf_is_a_bad_data_chunk_and_consumes_the_block() {
    let input = b"set k 0 0 3\r\nabcdeget k\r\n";
    let rejected = invalid(input);
    assert_eq!(
        rejected,
        Invalid {
            error: ProtocolError::BadDataChunk,
            consumed: 18,
            swallow: 0,
            close: false,
            noreply: false
        }
    );
    // The bytes after the block are read as the next command.
    assert!(matches!(
        parse_default(&input[18..]),
        Parse::Request { request: Request::Get { .. }, consumed: 7 }
    ));
    assert_eq!(invalid(b"set k 0 0 1 noreply\r\nx\n\n").error, ProtocolError::BadDataChunk);
    assert!(invalid(b"set k 0 0 1 noreply\r\nx\n\n").noreply);
    assert_eq!(invalid(b"ms k 1 q\r\nxyz").error, ProtocolError::BadDataChunk);
    assert!(!invalid(b"ms k 1 q\r\nxyz").noreply);
}

#[test]
fn hostile_storage_lines_are_bad_format_and_swallow_when_the_length_is_known() {
    for line in [
        "set k 0 0 -1\r\n",
        "set k 0 0 abc\r\n",
        "set k 0 0 2147483646\r\n",
        "set k 0 0 99999999999999999999 noreply\r\n",
    ] {
        let rejected = invalid(line.as_bytes());
        let expected = Invalid {
            error: ProtocolError::BadCommandLineFormat,
            consumed: line.len(),
            swallow: 0,
            close: false,
            noreply: false,
        };
        assert_eq!(rejected, expected, "{line:?}");
    }
    for line in [
        "set k 4294967296 0 3\r\n",
        "set k -1 0 3\r\n",
        "set k 0 2147483648 3\r\n",
        "set k 0 x 3\r\n",
        "cas k 0 0 3 -5\r\n",
    ] {
        let rejected = invalid(line.as_bytes());
        let expected = Invalid {
            error: ProtocolError::BadCommandLineFormat,
            consumed: line.len(),
            swallow: 5,
            close: false,
            noreply: false,
        };
        assert_eq!(rejected, expected, "{line:?}");
    }
    let long_key = format!("set {} 0 0 3 noreply\r\n", "k".repeat(251));
    let rejected = invalid(long_key.as_bytes());
    assert_eq!(
        (rejected.error, rejected.swallow, rejected.noreply),
        (ProtocolError::BadCommandLineFormat, 5, true)
    );
    assert_eq!(line_error(b"set k 0 0\r\n"), ProtocolError::UnknownCommand);
    assert_eq!(line_error(b"set k 0 0 1 noreply extra\r\n"), ProtocolError::UnknownCommand);
    assert_eq!(line_error(b"cas k 0 0 1\r\n"), ProtocolError::UnknownCommand);
}

#[test]
fn incr_decr_parse_and_reject_bad_deltas() {
    assert_eq!(
        request(b"incr n 18446744073709551615\r\n"),
        Request::Arithmetic { increment: true, key: Cow::Borrowed(b"n"), delta: u64::MAX, noreply: false }
    );
    assert_eq!(
        request(b"decr n 1 noreply\r\n"),
        Request::Arithmetic { increment: false, key: Cow::Borrowed(b"n"), delta: 1, noreply: true }
    );
    assert_eq!(line_error(b"incr n -1\r\n"), ProtocolError::InvalidDeltaArgument);
    assert_eq!(line_error(b"incr n 18446744073709551616\r\n"), ProtocolError::InvalidDeltaArgument);
    assert!(invalid(b"decr n x noreply\r\n").noreply);
    assert_eq!(line_error(b"incr n\r\n"), ProtocolError::UnknownCommand);
    assert_eq!(line_error(b"incr n 1 noreply x\r\n"), ProtocolError::UnknownCommand);
}

#[test]
fn delete_accepts_the_legacy_zero_and_noreply_only() {
    assert_eq!(request(b"delete k\r\n"), Request::Delete { key: Cow::Borrowed(b"k"), noreply: false });
    assert_eq!(request(b"delete k noreply\r\n"), Request::Delete { key: Cow::Borrowed(b"k"), noreply: true });
    assert_eq!(request(b"delete k 0\r\n"), Request::Delete { key: Cow::Borrowed(b"k"), noreply: false });
    assert_eq!(
        request(b"delete k 0 noreply\r\n"),
        Request::Delete { key: Cow::Borrowed(b"k"), noreply: true }
    );
    assert_eq!(line_error(b"delete k 10\r\n"), ProtocolError::DeleteUsage);
    assert_eq!(
        ProtocolError::DeleteUsage.response(),
        "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]"
    );
    assert_eq!(line_error(b"delete k 0 x\r\n"), ProtocolError::DeleteUsage);
    assert_eq!(line_error(b"delete\r\n"), ProtocolError::UnknownCommand);
    assert_eq!(line_error(b"delete a b c d\r\n"), ProtocolError::UnknownCommand);
}

#[test]
fn touch_parses_and_rejects_bad_exptimes() {
    assert_eq!(
        request(b"touch k -5\r\n"),
        Request::Touch { key: Cow::Borrowed(b"k"), exptime: -5, noreply: false }
    );
    assert_eq!(
        request(b"touch k 10 noreply\r\n"),
        Request::Touch { key: Cow::Borrowed(b"k"), exptime: 10, noreply: true }
    );
    assert_eq!(line_error(b"touch k ten\r\n"), ProtocolError::InvalidExptime);
    assert_eq!(line_error(b"touch k\r\n"), ProtocolError::UnknownCommand);
}

#[test]
fn flush_all_takes_an_optional_delay_and_noreply() {
    assert_eq!(request(b"flush_all\r\n"), Request::FlushAll { delay: 0, noreply: false });
    assert_eq!(request(b"flush_all 10\r\n"), Request::FlushAll { delay: 10, noreply: false });
    assert_eq!(request(b"flush_all noreply\r\n"), Request::FlushAll { delay: 0, noreply: true });
    assert_eq!(request(b"flush_all 0 noreply\r\n"), Request::FlushAll { delay: 0, noreply: true });
    assert_eq!(line_error(b"flush_all soon\r\n"), ProtocolError::InvalidExptime);
    assert_eq!(line_error(b"flush_all noreply 5\r\n"), ProtocolError::InvalidExptime);
    assert_eq!(line_error(b"flush_all 1 2 3\r\n"), ProtocolError::UnknownCommand);
}

#[test]
fn stats_version_verbosity_quit() {
    assert_eq!(request(b"stats\r\n"), Request::Stats { group: None });
    assert_eq!(request(b"stats items\r\n"), Request::Stats { group: Some(b"items") });
    assert_eq!(request(b"stats  detail dump  \r\n"), Request::Stats { group: Some(b"detail dump") });
    assert_eq!(request(b"version\r\n"), Request::Version);
    assert_eq!(request(b"quit\r\n"), Request::Quit);
    assert_eq!(request(b"verbosity 1\r\n"), Request::Verbosity { level: 1, noreply: false });
    assert_eq!(request(b"verbosity 5 noreply\r\n"), Request::Verbosity { level: 5, noreply: true });
    assert_eq!(line_error(b"verbosity\r\n"), ProtocolError::UnknownCommand);
    assert_eq!(line_error(b"verbosity loud\r\n"), ProtocolError::BadCommandLineFormat);
}

#[test]
fn unknown_empty_and_wrong_case_commands_are_error() {
    assert_eq!(line_error(b"bogus a b\r\n"), ProtocolError::UnknownCommand);
    assert_eq!(line_error(b"\r\n"), ProtocolError::UnknownCommand);
    assert_eq!(line_error(b"\n"), ProtocolError::UnknownCommand);
    assert_eq!(line_error(b"   \r\n"), ProtocolError::UnknownCommand);
    assert_eq!(line_error(b"GET a\r\n"), ProtocolError::UnknownCommand);
    assert_eq!(line_error(b"mx a\r\n"), ProtocolError::UnknownCommand);
    assert_eq!(ProtocolError::UnknownCommand.response(), "ERROR");
}

#[test]
fn a_bare_newline_ends_a_line_but_not_a_data_block() {
    assert_eq!(
        request(b"get a\n"),
        Request::Get { keys: keys(&[b"a"]), with_cas: false, touch_exptime: None }
    );
    assert!(matches!(request(b"set a 0 0 1\nx\r\n"), Request::Store { .. }));
    assert_eq!(invalid(b"set a 0 0 1\nx\nzz").error, ProtocolError::BadDataChunk);
}

#[test]
fn a_line_over_the_limit_closes_the_connection() {
    let limits = Limits { max_line_bytes: 16, max_get_line_bytes: 16, ..Limits::default() };
    assert_eq!(parse(b"get aaaaaaaaaaaa", &limits), Parse::Incomplete);
    let rejected = invalid_with(b"get aaaaaaaaaaaaaaaaaaaa", &limits);
    assert_eq!(
        rejected,
        Invalid { error: ProtocolError::LineTooLong, consumed: 24, swallow: 0, close: true, noreply: false }
    );
    assert_eq!(invalid_with(b"get aaaaaaaaaaaaaa\r\n", &limits).error, ProtocolError::LineTooLong);
    assert!(matches!(parse(b"get aaaaaaaaaaaa\r\n", &limits), Parse::Request { .. }));
    assert_eq!(ProtocolError::LineTooLong.response(), "CLIENT_ERROR line too long");
}

#[test]
fn a_multi_key_get_line_may_pass_the_line_limit_up_to_its_own() {
    let limits = Limits { max_line_bytes: 16, max_get_line_bytes: 64, ..Limits::default() };
    // memcached's t/getset.t: thousands of keys on one get line.
    let long_get = format!("get {}\r\n", ["foobarbaz"; 5].join(" "));
    assert!(long_get.len() > 16 && long_get.len() < 64);
    let Request::Get { keys, .. } = request_with(long_get.as_bytes(), &limits) else { panic!("not a get") };
    assert_eq!(keys.len(), 5);
    assert_prefixes_incomplete_with(long_get.as_bytes(), &limits);
    for word in ["gets", "gat 0", "gats 0", "  get"] {
        let line = format!("{word} {}\r\n", ["k"; 10].join(" "));
        assert!(matches!(parse(line.as_bytes(), &limits), Parse::Request { .. }), "{line:?}");
    }
    // Other commands keep the line limit; so does a get past its own.
    assert_eq!(invalid_with(b"delete aaaaaaaaaaaaaaaaa\r\n", &limits).error, ProtocolError::LineTooLong);
    let too_long = format!("get {}\r\n", ["foobarbaz"; 7].join(" "));
    assert_eq!(
        invalid_with(too_long.as_bytes(), &limits),
        Invalid {
            error: ProtocolError::LineTooLong,
            consumed: too_long.len(),
            swallow: 0,
            close: true,
            noreply: false
        }
    );
    // The command word must come early (memcached: within 100 bytes).
    let late = format!("{}get a\r\n", " ".repeat(101));
    let wide = Limits { max_line_bytes: 104, max_get_line_bytes: 4096, ..Limits::default() };
    assert_eq!(invalid_with(late.as_bytes(), &wide).error, ProtocolError::LineTooLong);
    let early = format!("{}get a\r\n", " ".repeat(100));
    assert!(matches!(parse(early.as_bytes(), &wide), Parse::Request { .. }));
    // The read buffer a server needs covers both kinds of request.
    assert_eq!(limits.max_request_bytes(), 16 + 1024 * 1024 + 4);
    let tiny = Limits { max_item_bytes: 8, max_line_bytes: 16, max_get_line_bytes: 100, ..Limits::default() };
    assert_eq!(tiny.max_request_bytes(), 102);
}

#[test]
fn a_set_refused_as_too_large_unlinks_its_key_as_memcached_does() {
    let limits = Limits { max_item_bytes: 4, ..Limits::default() };
    assert_eq!(unlinked_with(b"set foo 0 0 5\r\n", &limits), Some(b"foo".to_vec()));
    assert_eq!(unlinked_with(b"set foo 0 0 5 noreply\r\n", &limits), Some(b"foo".to_vec()));
    assert_eq!(unlinked_with(b"ms foo 5 T0\r\n", &limits), Some(b"foo".to_vec()));
    assert_eq!(unlinked_with(b"ms Zm9v 5 b\r\n", &limits), Some(b"foo".to_vec()));
    // memcached unlinks only for set ("unacceptable for SET"); the others leave the item.
    for command in ["add", "replace", "append", "prepend"] {
        let line = format!("{command} foo 0 0 5\r\n");
        assert_eq!(unlinked_with(line.as_bytes(), &limits), None, "{command}");
    }
    assert_eq!(unlinked_with(b"cas foo 0 0 5 1\r\n", &limits), None);
    // Other errors unlink nothing.
    assert_eq!(unlinked_with(b"set foo 0 0 1\r\nxyz", &limits), None);
    assert_eq!(unlinked_with(b"set foo x 0 1\r\n", &limits), None);
}

#[test]
fn a_line_that_looks_like_http_closes_the_connection_without_a_reply() {
    for line in ["GET / HTTP/1.0\r\n", "PUT /asdf/asd/fasdfasdf/sadf HTTP/1.1\r\n", "DELETE HTTP/1.1\r\n"] {
        assert_eq!(
            invalid(line.as_bytes()),
            Invalid {
                error: ProtocolError::UnknownCommand,
                consumed: line.len(),
                swallow: 0,
                close: true,
                noreply: true
            },
            "{line:?}"
        );
    }
    // Only unknown commands: a get of a key named so is a get, and other words are ERROR.
    assert!(matches!(request(b"get / HTTP/1.0\r\n"), Request::Get { .. }));
    assert_eq!(line_error(b"GET / HTTP\r\n"), ProtocolError::UnknownCommand);
    assert_eq!(line_error(b"HTTP/1.1 GET\r\n"), ProtocolError::UnknownCommand);
}

#[test]
fn slabs_automove_is_checked_as_memcached_checks_it() {
    for line in ["slabs automove 0\r\n", "slabs automove 2\r\n", "slabs automove ratio 0.8\r\n"] {
        assert_eq!(request(line.as_bytes()), Request::SlabsAutomove { noreply: false }, "{line:?}");
    }
    assert_eq!(request(b"slabs automove 1 noreply\r\n"), Request::SlabsAutomove { noreply: true });
    assert_eq!(line_error(b"slabs automove invalid\r\n"), ProtocolError::BadCommandLineFormat);
    assert_eq!(line_error(b"slabs automove -1\r\n"), ProtocolError::BadCommandLineFormat);
    assert_eq!(line_error(b"slabs automove 3\r\n"), ProtocolError::UnknownCommand);
    assert_eq!(line_error(b"slabs automove ratio\r\n"), ProtocolError::UnknownCommand);
    assert_eq!(line_error(b"slabs automove ratio x\r\n"), ProtocolError::UnknownCommand);
    assert_eq!(line_error(b"slabs automove\r\n"), ProtocolError::UnknownCommand);
    assert_eq!(line_error(b"slabs reassign 1 2\r\n"), ProtocolError::UnknownCommand);
}

#[test]
fn transition_is_remems_extension() {
    assert_eq!(
        request(b"transition k ec8+2\r\n"),
        Request::Transition { key: Cow::Borrowed(b"k"), scheme: b"ec8+2", naive: false }
    );
    assert_eq!(
        request(b"transition k rep3 naive\r\n"),
        Request::Transition { key: Cow::Borrowed(b"k"), scheme: b"rep3", naive: true }
    );
    assert_eq!(line_error(b"transition k rep3 fast\r\n"), ProtocolError::BadCommandLineFormat);
    assert_eq!(line_error(b"transition k\r\n"), ProtocolError::UnknownCommand);
}

#[test]
fn errors_render_memcacheds_exact_text() {
    let mut out = Vec::new();
    ProtocolError::BadDataChunk.write_to(&mut out);
    assert_eq!(out, b"CLIENT_ERROR bad data chunk\r\n");
    assert_eq!(ProtocolError::ObjectTooLarge.to_string(), "SERVER_ERROR object too large for cache");
    assert_eq!(ProtocolError::InvalidDeltaArgument.response(), "CLIENT_ERROR invalid numeric delta argument");
    assert_eq!(
        ProtocolError::NonNumericValue.response(),
        "CLIENT_ERROR cannot increment or decrement non-numeric value"
    );
    assert_eq!(ProtocolError::BadCommandLineFormat.response(), "CLIENT_ERROR bad command line format");
}
