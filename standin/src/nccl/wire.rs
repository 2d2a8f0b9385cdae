//! The frames ranks and the hub exchange over a communicator's sockets: one fixed header
//! and a payload. Writes never raise SIGPIPE: a peer that is gone is an error to report,
//! not a signal that ends the process.

use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Rank to hub on joining: `peer` is the rank, `seq` the communicator's size.
    Hello = 1,
    /// Hub to rank: every rank has joined.
    Ready,
    /// Hub to rank: the communicator cannot form; the payload says why.
    Refused,
    /// Rank to hub: elements for `peer` ([`ALL`]: every other rank); hub to rank: elements
    /// from `peer`.
    Data,
    /// Hub to rank: the `Data` to `peer` on `channel` with `seq` was delivered (payload
    /// `[1]`) or could not be (`[0]`: a receiver had left).
    Ack,
    /// Rank to hub: the rank leaves on purpose (destroy or abort).
    Goodbye,
    /// Hub to rank: rank `peer` has left, on purpose if `seq` is 1.
    Left,
}

/// A `Data` frame's `peer` that means every other rank.
pub const ALL: u32 = u32::MAX;

/// What a `Data` frame belongs to: matched by (peer, channel, seq) at the receiver.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Channel {
    /// ncclSend/ncclRecv, `seq` counted per (sender, receiver).
    PointToPoint = 0,
    /// A collective, `seq` counted per communicator.
    Collective = 1,
}

#[derive(Debug)]
pub struct Frame {
    pub kind: Kind,
    pub peer: u32,
    pub channel: Channel,
    pub seq: u64,
    pub payload: Vec<u8>,
}

const HEADER: usize = 1 + 4 + 1 + 8 + 8;

impl Frame {
    pub fn new(kind: Kind, peer: u32, channel: Channel, seq: u64, payload: Vec<u8>) -> Frame {
        Frame { kind, peer, channel, seq, payload }
    }

    pub fn control(kind: Kind, peer: u32, seq: u64) -> Frame {
        Frame::new(kind, peer, Channel::PointToPoint, seq, Vec::new())
    }

    pub fn write(&self, socket: &UnixStream) -> io::Result<()> {
        let mut bytes = Vec::with_capacity(HEADER + self.payload.len());
        bytes.push(self.kind as u8);
        bytes.extend_from_slice(&self.peer.to_le_bytes());
        bytes.push(self.channel as u8);
        bytes.extend_from_slice(&self.seq.to_le_bytes());
        bytes.extend_from_slice(&(self.payload.len() as u64).to_le_bytes());
        bytes.extend_from_slice(&self.payload);
        send_all(socket, &bytes)
    }

    /// The next frame; `UnexpectedEof` when the other end has closed.
    pub fn read(mut socket: &UnixStream) -> io::Result<Frame> {
        let mut header = [0u8; HEADER];
        socket.read_exact(&mut header)?;
        let invalid = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
        let kind = match header[0] {
            1 => Kind::Hello,
            2 => Kind::Ready,
            3 => Kind::Refused,
            4 => Kind::Data,
            5 => Kind::Ack,
            6 => Kind::Goodbye,
            7 => Kind::Left,
            _ => return Err(invalid("unknown frame kind")),
        };
        let channel = match header[5] {
            0 => Channel::PointToPoint,
            1 => Channel::Collective,
            _ => return Err(invalid("unknown channel")),
        };
        let word = |at: usize| u64::from_le_bytes(header[at..at + 8].try_into().expect("8 bytes"));
        let peer = u32::from_le_bytes(header[1..5].try_into().expect("4 bytes"));
        let mut payload = vec![0u8; word(14) as usize];
        socket.read_exact(&mut payload)?;
        Ok(Frame { kind, peer, channel, seq: word(6), payload })
    }
}

/// Writes every byte with MSG_NOSIGNAL (a Rust `write` to a closed socket would raise
/// SIGPIPE in a host program that has not ignored it).
fn send_all(socket: &UnixStream, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        // SAFETY: `bytes` is a live slice and the descriptor is the socket's.
        let n =
            unsafe { libc::send(socket.as_raw_fd(), bytes.as_ptr().cast(), bytes.len(), libc::MSG_NOSIGNAL) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        bytes = &bytes[n as usize..];
    }
    Ok(())
}

/// Ends both directions of `socket`: a thread blocked reading or writing it returns.
pub fn shut(socket: &UnixStream) {
    let _ = socket.shutdown(std::net::Shutdown::Both);
}
