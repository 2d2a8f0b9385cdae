//! How tensors cross stages. The runtime sees only [`Transport`]; the in-process
//! implementation links stage threads with bounded FIFO channels, one per
//! (sender, receiver, payload) as the lowered schedule lists them. A GPU transport (NCCL)
//! implements the same trait.

use schedules::{Channel, Payload};
use std::collections::HashMap;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};

/// A tensor in flight, tagged with what it is so the receiver can check it got the right one.
#[derive(Debug)]
pub struct Message {
    /// The virtual stage that sent it.
    pub virtual_stage: usize,
    pub microbatch: usize,
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TransportError {
    /// The peer's end is gone: it stopped (failed) before this transfer could happen.
    #[error("stage {peer} stopped before the transfer")]
    PeerStopped { peer: usize },
    #[error("no {payload:?} channel between stage {from} and stage {to}")]
    NoChannel { from: usize, to: usize, payload: Payload },
}

pub trait Transport: Send {
    fn send(&mut self, to: usize, payload: Payload, msg: Message) -> Result<(), TransportError>;
    fn recv(&mut self, from: usize, payload: Payload) -> Result<Message, TransportError>;
}

/// One stage's ends of the in-process channels.
pub struct InProcess {
    rank: usize,
    senders: HashMap<(usize, Payload), SyncSender<Message>>,
    receivers: HashMap<(usize, Payload), Receiver<Message>>,
}

impl InProcess {
    /// A transport per stage for `channels`, each holding at most `capacity` messages.
    pub fn mesh(stages: usize, channels: &[Channel], capacity: usize) -> Vec<InProcess> {
        let mut ends: Vec<InProcess> = (0..stages)
            .map(|rank| InProcess { rank, senders: HashMap::new(), receivers: HashMap::new() })
            .collect();
        for c in channels {
            let (tx, rx) = sync_channel(capacity);
            ends[c.from].senders.insert((c.to, c.payload), tx);
            ends[c.to].receivers.insert((c.from, c.payload), rx);
        }
        ends
    }
}

impl Transport for InProcess {
    fn send(&mut self, to: usize, payload: Payload, msg: Message) -> Result<(), TransportError> {
        let tx = self.senders.get(&(to, payload)).ok_or(TransportError::NoChannel {
            from: self.rank,
            to,
            payload,
        })?;
        tx.send(msg).map_err(|_| TransportError::PeerStopped { peer: to })
    }

    fn recv(&mut self, from: usize, payload: Payload) -> Result<Message, TransportError> {
        let rx = self.receivers.get(&(from, payload)).ok_or(TransportError::NoChannel {
            from,
            to: self.rank,
            payload,
        })?;
        rx.recv().map_err(|_| TransportError::PeerStopped { peer: from })
    }
}
