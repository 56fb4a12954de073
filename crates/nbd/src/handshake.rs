//! Fixed newstyle handshake and option haggling, over any blocking `Read + Write`.
//!
//! The server offers one export. Options are answered one at a time (the client may not send
//! the next before the final reply). Hostile input ends the haggling with an error reply where
//! the spec gives one and a hard disconnect where it does not: unknown client flags, a bad
//! option magic, an option longer than [`MAX_OPTION_BYTES`], more than [`MAX_OPTIONS`] options,
//! or `NBD_OPT_EXPORT_NAME` naming another export. Memory per connection is bounded by
//! `MAX_OPTION_BYTES`.
//!
//! TLS (`NBD_OPT_STARTTLS`): the haggling does no TLS itself. With TLS offered it answers
//! STARTTLS with `NBD_REP_ACK` and returns [`HandshakeOutcome::StartTls`]; the caller wraps the
//! socket in TLS and calls [`haggle`] again on the TLS stream with the same [`Haggling`]. With TLS
//! required (the spec's FORCEDTLS mode) every option before STARTTLS but ABORT gets
//! `NBD_REP_ERR_TLS_REQD`, and `NBD_OPT_EXPORT_NAME` (which cannot be refused) ends the session.
//! Options agreed before TLS (structured replies) are forgotten once it starts: a
//! man in the middle could have sent them.

use std::io::{self, Read, Write};

use crate::protocol::*;

/// Longest option data read; the longest valid one (`NBD_OPT_GO` with a 4096-byte name and a
/// few information requests) is far shorter.
pub const MAX_OPTION_BYTES: u32 = 64 * 1024;
/// Most options one connection may send before it is dropped (the spec allows a hard
/// disconnect for a client whose haggling is a denial of service).
pub const MAX_OPTIONS: usize = 256;

/// The one export a server offers.
#[derive(Clone, Debug)]
pub struct Export {
    pub name: String,
    pub description: String,
    pub size_bytes: u64,
    /// Largest READ or WRITE payload accepted (the spec's maximum block size).
    pub max_request_bytes: u32,
    /// The preferred block size: requests aligned to it avoid read-modify-write.
    pub page_bytes: u32,
}

impl Export {
    /// Transmission flags. Multi-conn is advertised because every connection of a server drives
    /// the same client under one lock, with no cache: a reply means the data is on the nodes,
    /// visible to every connection (docs/NBD.md, "Several connections").
    pub fn transmission_flags(&self, structured_replies: bool) -> u16 {
        let mut flags = FLAG_HAS_FLAGS
            | FLAG_SEND_FLUSH
            | FLAG_SEND_FUA
            | FLAG_SEND_TRIM
            | FLAG_SEND_WRITE_ZEROES
            | FLAG_SEND_FAST_ZERO
            | FLAG_CAN_MULTI_CONN;
        if structured_replies {
            // Every read is answered with one data chunk, so "don't fragment" always holds.
            flags |= FLAG_SEND_DF;
        }
        flags
    }

    fn matches(&self, name: &[u8]) -> bool {
        // The empty name is the default export: ours.
        name.is_empty() || name == self.name.as_bytes()
    }
}

/// Whether this connection may, must or already does use TLS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tls {
    /// Not offered: STARTTLS gets `NBD_REP_ERR_POLICY`.
    Off,
    /// Offered; with `required`, nothing but STARTTLS and ABORT is served before it.
    Offered { required: bool },
    /// The session runs over TLS now.
    Active,
}

/// The state of one connection's haggling, kept across STARTTLS.
#[derive(Debug)]
pub struct Haggling {
    no_zeroes: bool,
    structured_replies: bool,
    options_left: usize,
    pub tls: Tls,
}

/// What the haggling agreed on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Negotiated {
    pub structured_replies: bool,
    pub transmission_flags: u16,
}

#[derive(Debug, PartialEq, Eq)]
pub enum HandshakeOutcome {
    Transmission(Negotiated),
    /// The client sent `NBD_OPT_ABORT` (or closed the connection between options).
    Ended,
    /// STARTTLS was acknowledged: run TLS on the socket, then [`haggle`] again.
    StartTls,
}

#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("client flags {flags:#x} include unknown bits")]
    UnknownClientFlags { flags: u32 },
    #[error("{0}")]
    Decode(#[from] DecodeError),
    #[error("option {option} carries {length} bytes, more than {MAX_OPTION_BYTES}")]
    OptionTooLong { option: u32, length: u32 },
    #[error("more than {MAX_OPTIONS} options")]
    TooManyOptions,
    #[error("NBD_OPT_EXPORT_NAME asked for an unknown export ({name_bytes} bytes)")]
    UnknownExport { name_bytes: usize },
    #[error("NBD_OPT_EXPORT_NAME before STARTTLS, and TLS is required")]
    TlsRequired,
    #[error("every transmission slot is taken")]
    NoSlot,
}

/// Runs the whole handshake without TLS and with every client admitted (tests, and servers
/// that offer no TLS).
pub fn negotiate<S: Read + Write>(
    stream: &mut S,
    export: &Export,
) -> Result<HandshakeOutcome, HandshakeError> {
    let mut haggling = greet(stream, Tls::Off)?;
    haggle(stream, export, &mut haggling, &|| true)
}

/// Sends the greeting and reads the client flags.
pub fn greet<S: Read + Write>(stream: &mut S, tls: Tls) -> Result<Haggling, HandshakeError> {
    let mut out = Vec::with_capacity(18);
    out.extend_from_slice(&INIT_MAGIC.to_be_bytes());
    out.extend_from_slice(&OPTION_MAGIC.to_be_bytes());
    out.extend_from_slice(&(HANDSHAKE_FIXED_NEWSTYLE | HANDSHAKE_NO_ZEROES).to_be_bytes());
    stream.write_all(&out)?;
    stream.flush()?;

    let mut flag_bytes = [0u8; 4];
    stream.read_exact(&mut flag_bytes)?;
    let client_flags = u32::from_be_bytes(flag_bytes);
    if client_flags & !(CLIENT_FIXED_NEWSTYLE | CLIENT_NO_ZEROES) != 0 {
        return Err(HandshakeError::UnknownClientFlags { flags: client_flags });
    }
    Ok(Haggling {
        no_zeroes: client_flags & CLIENT_NO_ZEROES != 0,
        structured_replies: false,
        options_left: MAX_OPTIONS,
        tls,
    })
}

/// Answers options until transmission starts, the client leaves, or STARTTLS is acknowledged.
/// `admit` is asked once, right before a successful `NBD_OPT_GO` or `NBD_OPT_EXPORT_NAME`
/// reply, whether a transmission slot is free (and takes it if so): a GO without one gets
/// `NBD_REP_ERR_POLICY`, an EXPORT_NAME without one ends the session.
pub fn haggle<S: Read + Write>(
    stream: &mut S,
    export: &Export,
    haggling: &mut Haggling,
    admit: &dyn Fn() -> bool,
) -> Result<HandshakeOutcome, HandshakeError> {
    let mut out = Vec::with_capacity(256);
    let mut data = Vec::new();
    while haggling.options_left > 0 {
        haggling.options_left -= 1;
        let Some(option) = read_option(stream, &mut data)? else { return Ok(HandshakeOutcome::Ended) };
        out.clear();
        let tls_missing = haggling.tls == Tls::Offered { required: true };
        let structured_replies = haggling.structured_replies;
        match option {
            OPT_EXPORT_NAME if tls_missing => return Err(HandshakeError::TlsRequired),
            OPT_EXPORT_NAME => {
                if !export.matches(&data) {
                    return Err(HandshakeError::UnknownExport { name_bytes: data.len() });
                }
                if !admit() {
                    return Err(HandshakeError::NoSlot);
                }
                let flags = export.transmission_flags(structured_replies);
                out.extend_from_slice(&export.size_bytes.to_be_bytes());
                out.extend_from_slice(&flags.to_be_bytes());
                if !haggling.no_zeroes {
                    out.extend_from_slice(&[0u8; 124]);
                }
                stream.write_all(&out)?;
                stream.flush()?;
                return Ok(HandshakeOutcome::Transmission(Negotiated {
                    structured_replies,
                    transmission_flags: flags,
                }));
            }
            OPT_ABORT => {
                // The client may already have closed its end; a failed ACK changes nothing.
                encode_option_reply(option, REP_ACK, &[], &mut out);
                let _ = stream.write_all(&out).and_then(|()| stream.flush());
                return Ok(HandshakeOutcome::Ended);
            }
            OPT_STARTTLS => match haggling.tls {
                Tls::Off => {
                    encode_option_reply(option, REP_ERR_POLICY, b"this server does not offer TLS", &mut out)
                }
                Tls::Active => encode_option_reply(option, REP_ERR_INVALID, b"TLS is already on", &mut out),
                Tls::Offered { .. } if !data.is_empty() => {
                    encode_option_reply(option, REP_ERR_INVALID, b"NBD_OPT_STARTTLS takes no data", &mut out)
                }
                Tls::Offered { .. } => {
                    encode_option_reply(option, REP_ACK, &[], &mut out);
                    stream.write_all(&out)?;
                    stream.flush()?;
                    haggling.tls = Tls::Active;
                    haggling.structured_replies = false;
                    return Ok(HandshakeOutcome::StartTls);
                }
            },
            _ if tls_missing => encode_option_reply(
                option,
                REP_ERR_TLS_REQD,
                b"TLS is required: send NBD_OPT_STARTTLS",
                &mut out,
            ),
            OPT_LIST => list_reply(&data, export, &mut out),
            OPT_STRUCTURED_REPLY => {
                if data.is_empty() {
                    haggling.structured_replies = true;
                    encode_option_reply(option, REP_ACK, &[], &mut out);
                } else {
                    encode_option_reply(option, REP_ERR_INVALID, b"option takes no data", &mut out);
                }
            }
            OPT_INFO | OPT_GO => {
                let go = info_or_go(option, &data, export, structured_replies, admit, &mut out);
                stream.write_all(&out)?;
                stream.flush()?;
                if go {
                    return Ok(HandshakeOutcome::Transmission(Negotiated {
                        structured_replies,
                        transmission_flags: export.transmission_flags(structured_replies),
                    }));
                }
                continue;
            }
            _ => {
                // Metadata contexts, extended headers and anything newer: not offered.
                encode_option_reply(option, REP_ERR_UNSUP, &[], &mut out);
            }
        }
        stream.write_all(&out)?;
        stream.flush()?;
    }
    Err(HandshakeError::TooManyOptions)
}

/// Reads the next option's header and data into `data`: its option number, or `None` when the
/// client closed the connection between options.
fn read_option<S: Read>(stream: &mut S, data: &mut Vec<u8>) -> Result<Option<u32>, HandshakeError> {
    let mut header_bytes = [0u8; OPTION_HEADER_BYTES];
    match stream.read_exact(&mut header_bytes) {
        Ok(()) => {}
        Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(error) => return Err(error.into()),
    }
    let header = decode_option_header(&header_bytes)?;
    if header.length > MAX_OPTION_BYTES {
        return Err(HandshakeError::OptionTooLong { option: header.option, length: header.length });
    }
    data.clear();
    data.resize(header.length as usize, 0);
    stream.read_exact(data)?;
    Ok(Some(header.option))
}

/// `NBD_OPT_LIST`: the one export, then the ACK.
fn list_reply(data: &[u8], export: &Export, out: &mut Vec<u8>) {
    if !data.is_empty() {
        return encode_option_reply(OPT_LIST, REP_ERR_INVALID, b"NBD_OPT_LIST takes no data", out);
    }
    let mut payload = Vec::with_capacity(4 + export.name.len());
    payload.extend_from_slice(&(export.name.len() as u32).to_be_bytes());
    payload.extend_from_slice(export.name.as_bytes());
    encode_option_reply(OPT_LIST, REP_SERVER, &payload, out);
    encode_option_reply(OPT_LIST, REP_ACK, &[], out);
}

/// `NBD_OPT_INFO` or `NBD_OPT_GO`: the replies into `out`; true when transmission starts (a GO
/// for this export that got a transmission slot from `admit`).
fn info_or_go(
    option: u32,
    data: &[u8],
    export: &Export,
    structured_replies: bool,
    admit: &dyn Fn() -> bool,
    out: &mut Vec<u8>,
) -> bool {
    match decode_info_request(data) {
        Err(error) => {
            encode_option_reply(option, REP_ERR_INVALID, error.to_string().as_bytes(), out);
            false
        }
        Ok(request) if !export.matches(request.name) => {
            encode_option_reply(option, REP_ERR_UNKNOWN, b"no such export", out);
            false
        }
        Ok(_) if option == OPT_GO && !admit() => {
            encode_option_reply(option, REP_ERR_POLICY, b"too many connections", out);
            false
        }
        Ok(request) => {
            encode_info_replies(option, &request, export, structured_replies, out);
            option == OPT_GO
        }
    }
}

fn encode_info_replies(
    option: u32,
    request: &InfoRequest<'_>,
    export: &Export,
    structured_replies: bool,
    out: &mut Vec<u8>,
) {
    let mut payload = Vec::with_capacity(64);
    payload.extend_from_slice(&INFO_EXPORT.to_be_bytes());
    payload.extend_from_slice(&export.size_bytes.to_be_bytes());
    payload.extend_from_slice(&export.transmission_flags(structured_replies).to_be_bytes());
    encode_option_reply(option, REP_INFO, &payload, out);
    // Block sizes go out even unasked: minimum 1 (any alignment works, by read-modify-write),
    // preferred one page, maximum the request cap.
    payload.clear();
    payload.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    payload.extend_from_slice(&1u32.to_be_bytes());
    payload.extend_from_slice(&export.page_bytes.to_be_bytes());
    payload.extend_from_slice(&export.max_request_bytes.to_be_bytes());
    encode_option_reply(option, REP_INFO, &payload, out);
    if request.wants_name {
        payload.clear();
        payload.extend_from_slice(&INFO_NAME.to_be_bytes());
        payload.extend_from_slice(export.name.as_bytes());
        encode_option_reply(option, REP_INFO, &payload, out);
    }
    if request.wants_description {
        payload.clear();
        payload.extend_from_slice(&INFO_DESCRIPTION.to_be_bytes());
        payload.extend_from_slice(export.description.as_bytes());
        encode_option_reply(option, REP_INFO, &payload, out);
    }
    encode_option_reply(option, REP_ACK, &[], out);
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::io::Cursor;

    /// A scripted client: reads come from `input`, writes collect in `output`.
    pub struct Scripted {
        pub input: Cursor<Vec<u8>>,
        pub output: Vec<u8>,
    }

    impl Read for Scripted {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.input.read(buf)
        }
    }

    impl Write for Scripted {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.output.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    pub fn export() -> Export {
        Export {
            name: "disk".into(),
            description: "test".into(),
            size_bytes: 1 << 20,
            max_request_bytes: 1 << 25,
            page_bytes: 4096,
        }
    }

    pub fn option(option: u32, data: &[u8], out: &mut Vec<u8>) {
        out.extend_from_slice(&OPTION_MAGIC.to_be_bytes());
        out.extend_from_slice(&option.to_be_bytes());
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        out.extend_from_slice(data);
    }

    pub fn go_data(name: &[u8], infos: &[u16]) -> Vec<u8> {
        let mut data = Vec::new();
        data.extend_from_slice(&(name.len() as u32).to_be_bytes());
        data.extend_from_slice(name);
        data.extend_from_slice(&(infos.len() as u16).to_be_bytes());
        for info in infos {
            data.extend_from_slice(&info.to_be_bytes());
        }
        data
    }

    fn run(input: Vec<u8>) -> (Result<HandshakeOutcome, HandshakeError>, Vec<u8>) {
        let mut stream = Scripted { input: Cursor::new(input), output: Vec::new() };
        let result = negotiate(&mut stream, &export());
        (result, stream.output)
    }

    /// Option replies after the 18-byte greeting: (option, type, payload).
    fn replies(output: &[u8]) -> Vec<(u32, u32, Vec<u8>)> {
        let mut rest = &output[18..];
        let mut replies = Vec::new();
        while rest.len() >= 20 {
            assert_eq!(u64::from_be_bytes(rest[0..8].try_into().unwrap()), OPTION_REPLY_MAGIC);
            let option = u32::from_be_bytes(rest[8..12].try_into().unwrap());
            let reply = u32::from_be_bytes(rest[12..16].try_into().unwrap());
            let length = u32::from_be_bytes(rest[16..20].try_into().unwrap()) as usize;
            replies.push((option, reply, rest[20..20 + length].to_vec()));
            rest = &rest[20 + length..];
        }
        replies
    }

    #[test]
    fn go_with_structured_replies_enters_transmission() {
        let mut input = CLIENT_FIXED_NEWSTYLE.to_be_bytes().to_vec();
        option(OPT_STRUCTURED_REPLY, &[], &mut input);
        option(OPT_GO, &go_data(b"disk", &[INFO_BLOCK_SIZE]), &mut input);
        let (result, output) = run(input);
        let negotiated = match result.unwrap() {
            HandshakeOutcome::Transmission(negotiated) => negotiated,
            other => panic!("{other:?}"),
        };
        assert!(negotiated.structured_replies);
        assert_ne!(negotiated.transmission_flags & FLAG_SEND_DF, 0);
        let replies = replies(&output);
        assert_eq!(replies[0], (OPT_STRUCTURED_REPLY, REP_ACK, vec![]));
        let export_info = &replies[1];
        assert_eq!(export_info.1, REP_INFO);
        assert_eq!(&export_info.2[0..2], &INFO_EXPORT.to_be_bytes());
        assert_eq!(u64::from_be_bytes(export_info.2[2..10].try_into().unwrap()), 1 << 20);
        let block = &replies[2].2;
        assert_eq!(&block[0..2], &INFO_BLOCK_SIZE.to_be_bytes());
        assert_eq!(u32::from_be_bytes(block[6..10].try_into().unwrap()), 4096);
        assert_eq!(replies.last().unwrap().1, REP_ACK);
    }

    #[test]
    fn unknown_export_in_go_is_an_error_reply_not_a_disconnect() {
        let mut input = CLIENT_FIXED_NEWSTYLE.to_be_bytes().to_vec();
        option(OPT_GO, &go_data(b"other", &[]), &mut input);
        option(OPT_LIST, &[], &mut input);
        option(OPT_ABORT, &[], &mut input);
        let (result, output) = run(input);
        assert_eq!(result.unwrap(), HandshakeOutcome::Ended);
        let replies = replies(&output);
        assert_eq!(replies[0].1, REP_ERR_UNKNOWN);
        assert_eq!(replies[1], (OPT_LIST, REP_SERVER, [&4u32.to_be_bytes()[..], b"disk"].concat()));
        assert_eq!(replies[2].1, REP_ACK);
        assert_eq!(replies[3], (OPT_ABORT, REP_ACK, vec![]));
    }

    #[test]
    fn export_name_without_zeroes() {
        let mut input = (CLIENT_FIXED_NEWSTYLE | CLIENT_NO_ZEROES).to_be_bytes().to_vec();
        option(OPT_EXPORT_NAME, b"disk", &mut input);
        let (result, output) = run(input);
        assert!(matches!(result.unwrap(), HandshakeOutcome::Transmission(_)));
        assert_eq!(output.len(), 18 + 10);
    }

    #[test]
    fn unknown_client_flags_disconnect() {
        let (result, _) = run(0x80u32.to_be_bytes().to_vec());
        assert!(matches!(result, Err(HandshakeError::UnknownClientFlags { .. })));
    }

    #[test]
    fn oversized_option_disconnects_without_reading_it() {
        let mut input = CLIENT_FIXED_NEWSTYLE.to_be_bytes().to_vec();
        input.extend_from_slice(&OPTION_MAGIC.to_be_bytes());
        input.extend_from_slice(&OPT_GO.to_be_bytes());
        input.extend_from_slice(&u32::MAX.to_be_bytes());
        let (result, _) = run(input);
        assert!(matches!(result, Err(HandshakeError::OptionTooLong { .. })));
    }

    #[test]
    fn unsupported_options_get_err_unsup() {
        let mut input = CLIENT_FIXED_NEWSTYLE.to_be_bytes().to_vec();
        option(10, &[0; 8], &mut input);
        option(OPT_STARTTLS, &[], &mut input);
        let (result, output) = run(input);
        assert_eq!(result.unwrap(), HandshakeOutcome::Ended);
        let replies = replies(&output);
        assert_eq!(replies[0].1, REP_ERR_UNSUP);
        assert_eq!(replies[1].1, REP_ERR_POLICY);
    }

    fn run_with(
        input: Vec<u8>,
        tls: Tls,
        admit: bool,
    ) -> (Result<HandshakeOutcome, HandshakeError>, Vec<u8>) {
        let mut stream = Scripted { input: Cursor::new(input), output: Vec::new() };
        let result = greet(&mut stream, tls)
            .and_then(|mut haggling| haggle(&mut stream, &export(), &mut haggling, &|| admit));
        (result, stream.output)
    }

    #[test]
    fn tls_required_refuses_options_before_starttls_then_acks_it() {
        let mut input = CLIENT_FIXED_NEWSTYLE.to_be_bytes().to_vec();
        option(OPT_GO, &go_data(b"disk", &[]), &mut input);
        option(OPT_LIST, &[], &mut input);
        option(OPT_STARTTLS, &[], &mut input);
        let (result, output) = run_with(input, Tls::Offered { required: true }, true);
        assert_eq!(result.unwrap(), HandshakeOutcome::StartTls);
        let replies = replies(&output);
        assert_eq!(replies[0].1, REP_ERR_TLS_REQD);
        assert_eq!(replies[1].1, REP_ERR_TLS_REQD);
        assert_eq!(replies[2], (OPT_STARTTLS, REP_ACK, vec![]));
    }

    #[test]
    fn export_name_before_starttls_disconnects_when_tls_is_required() {
        let mut input = CLIENT_FIXED_NEWSTYLE.to_be_bytes().to_vec();
        option(OPT_EXPORT_NAME, b"disk", &mut input);
        let (result, _) = run_with(input, Tls::Offered { required: true }, true);
        assert!(matches!(result, Err(HandshakeError::TlsRequired)));
    }

    #[test]
    fn go_without_a_free_slot_gets_err_policy_and_the_client_may_retry() {
        let mut input = CLIENT_FIXED_NEWSTYLE.to_be_bytes().to_vec();
        option(OPT_GO, &go_data(b"disk", &[]), &mut input);
        option(OPT_ABORT, &[], &mut input);
        let (result, output) = run_with(input, Tls::Off, false);
        assert_eq!(result.unwrap(), HandshakeOutcome::Ended);
        assert_eq!(replies(&output)[0].1, REP_ERR_POLICY);
    }

    proptest! {
        /// Arbitrary bytes after valid client flags: the haggling ends (reply, error or end of
        /// input) without a panic, and never reads an announced length it did not bound.
        #[test]
        fn arbitrary_option_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let mut input = CLIENT_FIXED_NEWSTYLE.to_be_bytes().to_vec();
            input.extend_from_slice(&bytes);
            let _ = run(input);
        }

        /// Well-framed options with arbitrary numbers and data.
        #[test]
        fn arbitrary_framed_options_never_panic(
            options in proptest::collection::vec((0u32..16, proptest::collection::vec(any::<u8>(), 0..64)), 0..8)
        ) {
            let mut input = CLIENT_FIXED_NEWSTYLE.to_be_bytes().to_vec();
            for (number, data) in &options {
                option(*number, data, &mut input);
            }
            let _ = run(input);
        }
    }
}
