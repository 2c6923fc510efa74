//! Toxiproxy's `reset_peer` toxic, which the `noxious` library lacks: a connection of the
//! proxy is reset (TCP RST) `timeout` ms after the toxic meets it, and nothing passes on the
//! toxic's stream meanwhile.
//!
//! The library owns the sockets and offers no hook into a connection, so this works beside
//! it. The library runs a `timeout` toxic (timeout 0) on the stream, which holds and discards
//! the bytes, as Toxiproxy's reset toxic does while it waits. A watcher task polls the
//! library's list of connections; each connection gets its deadline when the watcher first
//! sees it (or when the toxic is added, for connections already open). At the deadline the
//! socket facing the stream's receiver (the client for `downstream`, the upstream server for
//! `upstream`) is found among the process's descriptors by its addresses and disconnected
//! with `connect(AF_UNSPEC)`, which makes the kernel send an RST (`tcp_disconnect`) without
//! closing the descriptor under the library's feet; the library then sees the socket fail
//! and closes the connection's other side.
//!
//! Toxiproxy starts the wait at the first byte on the stream; here it starts when the
//! connection is seen, within a few milliseconds of its accept. Upstream sockets are told
//! apart only by when they appear: connections accepted in the same poll are reset together.

use crate::sockets::{sockets, Endpoints};
use noxious::state::ProxyState;
use noxious::toxic::StreamDirection;
use std::collections::{HashMap, HashSet};
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How often the watcher looks for new connections and due resets.
const POLL: Duration = Duration::from_millis(5);

/// Send an RST on the socket with these addresses, if it is still open.
pub fn reset(socket: Endpoints) -> bool {
    for (fd, found) in sockets() {
        if found == socket {
            // SAFETY: a sockaddr of family AF_UNSPEC disconnects a TCP socket (tcp_disconnect):
            // the kernel sends an RST; the descriptor stays open and owned by the library.
            let mut unspec: libc::sockaddr = unsafe { std::mem::zeroed() };
            unspec.sa_family = libc::AF_UNSPEC as libc::sa_family_t;
            let len = std::mem::size_of::<libc::sockaddr>() as libc::socklen_t;
            return unsafe { libc::connect(fd, &unspec, len) } == 0;
        }
    }
    false
}

/// What one `reset_peer` toxic on one running proxy watches.
#[derive(Debug, Clone)]
pub struct Target {
    pub proxy: String,
    pub listen_port: u16,
    pub upstream: String,
    pub direction: StreamDirection,
    pub timeout: Duration,
}

/// Start watching the proxy's connections; abort the handle to stop.
pub fn spawn(state: Arc<ProxyState>, target: Target) -> JoinHandle<()> {
    tokio::spawn(watch(state, target))
}

async fn watch(state: Arc<ProxyState>, target: Target) {
    let upstreams: HashSet<SocketAddr> = target
        .upstream
        .to_socket_addrs()
        .map(|a| a.collect())
        .unwrap_or_default();
    // Sockets already reset or waiting, and the deadline of each waiting one.
    let mut known: HashSet<Endpoints> = HashSet::new();
    let mut due: HashMap<Endpoints, Instant> = HashMap::new();
    loop {
        let clients: HashSet<SocketAddr> = state.lock().clients.keys().copied().collect();
        let now = Instant::now();
        let deadline = now + target.timeout;
        let open = sockets();
        for (_, socket) in &open {
            let ours = match target.direction {
                StreamDirection::Downstream => {
                    socket.local.port() == target.listen_port && clients.contains(&socket.peer)
                }
                StreamDirection::Upstream => upstreams.contains(&socket.peer),
            };
            if ours && known.insert(*socket) {
                due.insert(*socket, deadline);
            }
        }
        let alive: HashSet<Endpoints> = open.iter().map(|(_, s)| *s).collect();
        known.retain(|s| alive.contains(s));
        due.retain(|s, _| alive.contains(s));
        let ready: Vec<Endpoints> = due
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(s, _)| *s)
            .collect();
        for socket in ready {
            due.remove(&socket);
            if reset(socket) {
                eprintln!(
                    "brokerchaos-toxiproxy: proxy {}: reset_peer sent RST on {} -> {}",
                    target.proxy, socket.local, socket.peer
                );
            }
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{ErrorKind, Read};

    #[test]
    fn disconnect_sends_a_reset_the_peer_sees() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        let socket = Endpoints {
            local: server.local_addr().unwrap(),
            peer: server.peer_addr().unwrap(),
        };
        assert!(sockets().iter().any(|(_, s)| *s == socket));
        assert!(reset(socket));
        client
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        // The first call after the RST reports it (a write would consume the error first).
        let err = client.read(&mut [0u8; 8]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ConnectionReset);
        assert!(!reset(socket), "a reset socket is no longer connected");
        drop(server);
    }
}
