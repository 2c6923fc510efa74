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

/// A TCP socket of this process, by its addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Endpoints {
    pub local: SocketAddr,
    pub peer: SocketAddr,
}

fn sockaddr(storage: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match storage.ss_family as libc::c_int {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let sin = unsafe { &*(storage as *const _ as *const libc::sockaddr_in) };
            let ip = std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            Some(SocketAddr::from((ip, u16::from_be(sin.sin_port))))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let sin6 = unsafe { &*(storage as *const _ as *const libc::sockaddr_in6) };
            let ip = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(SocketAddr::from((ip, u16::from_be(sin6.sin6_port))))
        }
        _ => None,
    }
}

fn name_of(
    fd: libc::c_int,
    call: unsafe extern "C" fn(
        libc::c_int,
        *mut libc::sockaddr,
        *mut libc::socklen_t,
    ) -> libc::c_int,
) -> Option<SocketAddr> {
    // SAFETY: a zeroed sockaddr_storage is valid, and the length tells the kernel its size.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: storage and len are valid for writing; a closed fd only yields an error.
    let rc = unsafe { call(fd, &mut storage as *mut _ as *mut libc::sockaddr, &mut len) };
    if rc == 0 {
        sockaddr(&storage)
    } else {
        None
    }
}

fn endpoints(fd: libc::c_int) -> Option<Endpoints> {
    Some(Endpoints {
        local: name_of(fd, libc::getsockname)?,
        peer: name_of(fd, libc::getpeername)?,
    })
}

/// Every connected socket of this process: descriptor and addresses.
pub fn sockets() -> Vec<(libc::c_int, Endpoints)> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    dir.filter_map(|entry| {
        let entry = entry.ok()?;
        let target = std::fs::read_link(entry.path()).ok()?;
        if !target.to_string_lossy().starts_with("socket:") {
            return None;
        }
        let fd: libc::c_int = entry.file_name().to_str()?.parse().ok()?;
        Some((fd, endpoints(fd)?))
    })
    .collect()
}

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
