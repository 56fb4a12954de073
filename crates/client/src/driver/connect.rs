//! Opening a node connection: connect (TCP, or the node's Unix socket), encrypt it if asked
//! (TCP only: `remem_proto::encryption`), authenticate with the cluster secret, ask the node's
//! info; and blocking control round trips used before the connection joins the event loop.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use remem_proto::auth::Secret;
use remem_proto::blocking::HandshakeError;
use remem_proto::encryption::{self, SecureStream};
use remem_proto::{Control, ErrorCode, NodeInfo};

use super::NodeAddress;
use crate::error::ConnectError;

/// A blocking connection during connect: TCP, encrypted TCP or Unix.
pub(crate) enum BlockingStream {
    Tcp(TcpStream),
    Encrypted(Box<SecureStream<TcpStream>>),
    Unix(UnixStream),
}

impl Read for BlockingStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            BlockingStream::Tcp(stream) => stream.read(buf),
            BlockingStream::Encrypted(stream) => stream.read(buf),
            BlockingStream::Unix(stream) => stream.read(buf),
        }
    }
}

impl Write for BlockingStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            BlockingStream::Tcp(stream) => stream.write(buf),
            BlockingStream::Encrypted(stream) => stream.write(buf),
            BlockingStream::Unix(stream) => stream.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Who a connection claims to be: the client id, and the session that claims it (0 claims
/// nothing: see `Control::Hello`).
pub(crate) type Claim = (u64, u64);

/// Connects (over the Unix socket `unix` if given, else TCP, encrypted if `encrypt`: a Unix
/// socket never is), authenticates as `claim` and asks the node for its info, each step bounded
/// by `timeout`. Another live session holding the client id is [`ConnectError::ClientIdInUse`];
/// a node that does not encrypt when asked to, or does when not asked, is
/// [`ConnectError::Handshake`] with the node's own words.
pub(crate) fn connect_node(
    address: SocketAddr,
    unix: Option<&Path>,
    secret: &Secret,
    (client_id, session): Claim,
    timeout: Duration,
    encrypt: bool,
) -> Result<(BlockingStream, NodeInfo), ConnectError> {
    let io_error = |source| ConnectError::Io { address, source };
    let mut stream = match unix {
        Some(path) => {
            let stream = UnixStream::connect(path).map_err(io_error)?;
            stream.set_read_timeout(Some(timeout)).map_err(io_error)?;
            stream.set_write_timeout(Some(timeout)).map_err(io_error)?;
            BlockingStream::Unix(stream)
        }
        None => {
            let stream = TcpStream::connect_timeout(&address, timeout).map_err(io_error)?;
            stream.set_nodelay(true).map_err(io_error)?;
            stream.set_read_timeout(Some(timeout)).map_err(io_error)?;
            stream.set_write_timeout(Some(timeout)).map_err(io_error)?;
            if encrypt {
                let stream = encryption::initiate(stream, secret)
                    .map_err(|error| ConnectError::Handshake { address, message: error.to_string() })?;
                BlockingStream::Encrypted(Box::new(stream))
            } else {
                BlockingStream::Tcp(stream)
            }
        }
    };
    remem_proto::blocking::handshake_session(&mut stream, secret, client_id, session).map_err(|source| {
        match source {
            HandshakeError::Rejected { code: ErrorCode::ClientIdInUse, message } => {
                ConnectError::ClientIdInUse { address, client_id, message }
            }
            source => ConnectError::Handshake { address, message: source.to_string() },
        }
    })?;
    match blocking_control(&mut stream, 1, &Control::NodeInfo, address)? {
        Control::NodeInfoReply(info) => Ok((stream, info)),
        other => Err(unexpected(address, &other)),
    }
}

/// What connecting to one node gave: the open stream and the node's info, or why not.
pub(crate) type Connected = Result<(BlockingStream, NodeInfo), ConnectError>;

/// Connects to every node of `nodes` at once, one thread each, every one bounded by `timeout`
/// (see [`connect_node`]): a cluster with dead or stopped nodes costs the timeout once, not once
/// per node. `shared_memory` says whether to use the nodes' Unix sockets. Results come in the
/// order of `nodes`.
pub(crate) fn connect_all(
    nodes: &[NodeAddress],
    shared_memory: bool,
    secret: &Secret,
    claim: Claim,
    timeout: Duration,
    encrypt: bool,
) -> Vec<Connected> {
    let connect = |node: &NodeAddress| {
        let unix = node.unix_socket.as_deref().filter(|_| shared_memory);
        connect_node(node.address, unix, secret, claim, timeout, encrypt)
    };
    let connect = &connect;
    std::thread::scope(|scope| {
        let handles: Vec<_> = nodes
            .iter()
            .map(|node| {
                std::thread::Builder::new()
                    .name("remem-connect".into())
                    .spawn_scoped(scope, move || connect(node))
                    .map_err(|_| node)
            })
            .collect();
        handles
            .into_iter()
            .map(|handle| match handle {
                Ok(handle) => handle.join().expect("a connect thread does not panic"),
                // No thread to spare: this node is connected to here, in turn.
                Err(node) => connect(node),
            })
            .collect()
    })
}

/// Asks one node for its status: connects, authenticates with a random client id and session 0
/// (claims nothing, maps nothing) and disconnects, encrypted if `encrypt`. For `remem status`;
/// the data path never uses it.
pub fn query_node(
    address: SocketAddr,
    secret: &Secret,
    timeout: Duration,
    encrypt: bool,
) -> Result<crate::NodeStatus, ConnectError> {
    let (_stream, info) = connect_node(address, None, secret, (rand::random(), 0), timeout, encrypt)?;
    Ok(info.into())
}

/// One control request and its reply on a blocking stream.
pub(crate) fn blocking_control(
    stream: &mut (impl Read + Write),
    request_id: u64,
    message: &Control,
    address: SocketAddr,
) -> Result<Control, ConnectError> {
    let io_error = |source| ConnectError::Io { address, source };
    remem_proto::blocking::write_control(stream, request_id, message).map_err(io_error)?;
    let mut body = Vec::new();
    let header = remem_proto::blocking::read_frame(stream, &mut body)
        .map_err(|error| ConnectError::Protocol { address, message: error.to_string() })?;
    if header.request_id != request_id {
        return Err(ConnectError::Protocol { address, message: "reply to another request".into() });
    }
    let reply = Control::decode_body(header.kind, &body)
        .map_err(|error| ConnectError::Protocol { address, message: error.to_string() })?;
    if let Control::Error { code, message } = reply {
        return Err(ConnectError::Refused { address, code: format!("{code:?}"), message });
    }
    Ok(reply)
}

pub(crate) fn unexpected(address: SocketAddr, reply: &Control) -> ConnectError {
    ConnectError::Protocol { address, message: format!("unexpected reply {:?}", reply.kind()) }
}
