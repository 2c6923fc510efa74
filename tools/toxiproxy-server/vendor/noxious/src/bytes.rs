//! Byte counters of a proxy (added by brokerchaos; not in noxious 1.0.4 as published).
//!
//! Each direction of a proxy counts the bytes its copy loop read from the sending socket and
//! the bytes it wrote to the receiving socket, over every connection the proxy ever carried,
//! open or closed. A toxic that discards (a `timeout`) shows as bytes read and none written.
//! Beside them, the proxy counts the connections it accepted and those whose upstream connect
//! failed (closed at once: nothing listened behind the proxy).

use crate::toxic::StreamDirection;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Bytes one direction of a proxy read and wrote.
#[derive(Debug, Default)]
pub struct DirectionBytes {
    read: AtomicU64,
    written: AtomicU64,
}

impl DirectionBytes {
    /// Bytes read from the sending side's socket.
    pub fn read(&self) -> u64 {
        self.read.load(Ordering::Relaxed)
    }

    /// Bytes written to the receiving side's socket.
    pub fn written(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }

    pub(crate) fn add_read(&self, n: usize) {
        self.read.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub(crate) fn add_written(&self, n: usize) {
        self.written.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// The connections a proxy accepted, and those of them it closed because the upstream connect failed.
#[derive(Debug, Default)]
pub struct ConnectionCounts {
    accepted: AtomicU64,
    upstream_failed: AtomicU64,
}

impl ConnectionCounts {
    /// Client connections the proxy accepted.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    /// Accepted connections closed at once because the upstream connect failed.
    pub fn upstream_failed(&self) -> u64 {
        self.upstream_failed.load(Ordering::Relaxed)
    }

    pub(crate) fn add_accepted(&self) {
        self.accepted.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn add_upstream_failed(&self) {
        self.upstream_failed.fetch_add(1, Ordering::Relaxed);
    }
}

/// The byte counters of a proxy: `upstream` (client to server) and `downstream` (server to client),
/// and its connection counts.
#[derive(Debug, Default, Clone)]
pub struct ByteCounters {
    /// Bytes from the client towards the upstream server.
    pub upstream: Arc<DirectionBytes>,
    /// Bytes from the upstream server back to the client.
    pub downstream: Arc<DirectionBytes>,
    /// Connections accepted, and those whose upstream connect failed.
    pub connections: Arc<ConnectionCounts>,
}

impl ByteCounters {
    /// The counters of one direction.
    pub fn of(&self, direction: StreamDirection) -> &Arc<DirectionBytes> {
        match direction {
            StreamDirection::Upstream => &self.upstream,
            StreamDirection::Downstream => &self.downstream,
        }
    }
}
