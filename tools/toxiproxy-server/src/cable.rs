//! The sockets of proxied connections, set up the way Toxiproxy's are.
//!
//! Toxiproxy runs on Go's `net` package, where every TCP connection, accepted or dialled,
//! has `TCP_NODELAY` set: each chunk a proxy writes leaves at once. `noxious` 1.0.4 sets no
//! socket option, so Nagle's algorithm holds back a small write while an earlier one is
//! unacknowledged; a reply written in two parts (a header then a body, a command's reply then
//! a replication ack) then waits for the peer's delayed ACK, about 40 ms on Linux, on every
//! round trip through the proxy.
//!
//! The library's proxy runner is generic over its listener type and connects upstream through
//! that type's stream (`Runner::run_proxy::<Listener>`, `Listener::Stream::connect`). The types
//! here wrap the library's own and, once the upstream connection is open (the accepted client
//! socket is open too by then, and nothing has been forwarded yet), set `TCP_NODELAY` on every
//! TCP socket of the process that lacks it. The library's wrappers do not expose their
//! sockets, so they are found by descriptor (`crate::sockets`).

use crate::sockets;
use async_trait::async_trait;
use noxious::socket::{
    ReadStream, SocketListener, SocketStream, TcpListener, TcpStream, WriteStream,
};
use std::io;
use std::net::SocketAddr;

/// The listener handed to the library's proxy runner.
#[derive(Debug)]
pub struct Listener {
    inner: TcpListener,
}

/// A proxied connection's socket (client or upstream side).
#[derive(Debug)]
pub struct Stream {
    inner: TcpStream,
}

/// Set `TCP_NODELAY` on every TCP socket of the process where it is off; how many were set.
pub fn nodelay_everywhere() -> usize {
    sockets::descriptors()
        .into_iter()
        .filter(|&fd| sockets::nodelay(fd) == Some(false) && sockets::set_nodelay(fd))
        .count()
}

#[async_trait]
impl SocketListener for Listener {
    type Stream = Stream;

    async fn bind(addr: &str) -> io::Result<Listener> {
        Ok(Listener {
            inner: TcpListener::bind(addr).await?,
        })
    }

    async fn accept(&self) -> io::Result<(Stream, SocketAddr)> {
        let (inner, addr) = self.inner.accept().await?;
        Ok((Stream { inner }, addr))
    }
}

#[async_trait]
impl SocketStream for Stream {
    /// Called by the runner for each accepted client, before it forwards a byte.
    async fn connect(addr: &str) -> io::Result<Stream> {
        let inner = TcpStream::connect(addr).await?;
        nodelay_everywhere();
        Ok(Stream { inner })
    }

    fn into_split(self) -> (ReadStream, WriteStream) {
        self.inner.into_split()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn nagle_is_turned_off_on_open_tcp_sockets() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        assert_eq!(sockets::nodelay(client.as_raw_fd()), Some(false));
        assert!(nodelay_everywhere() >= 2);
        assert_eq!(sockets::nodelay(client.as_raw_fd()), Some(true));
        assert_eq!(sockets::nodelay(server.as_raw_fd()), Some(true));
        let file = std::fs::File::open("/proc/self/status").unwrap();
        assert_eq!(sockets::nodelay(file.as_raw_fd()), None);
    }
}
