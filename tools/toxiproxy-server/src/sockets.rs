//! The process's own sockets, found by descriptor.
//!
//! The `noxious` library owns every socket of a proxied connection and hides it in its own
//! wrappers, so what this server does to those sockets (set `TCP_NODELAY`, send a
//! `reset_peer` RST) it does by finding them among the process's descriptors in
//! `/proc/self/fd`.

use std::net::SocketAddr;

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

/// Every socket descriptor of this process (TCP or not, connected or not).
pub fn descriptors() -> Vec<libc::c_int> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    dir.filter_map(|entry| {
        let entry = entry.ok()?;
        let target = std::fs::read_link(entry.path()).ok()?;
        if !target.to_string_lossy().starts_with("socket:") {
            return None;
        }
        entry.file_name().to_str()?.parse().ok()
    })
    .collect()
}

/// Every connected socket of this process: descriptor and addresses.
pub fn sockets() -> Vec<(libc::c_int, Endpoints)> {
    descriptors()
        .into_iter()
        .filter_map(|fd| Some((fd, endpoints(fd)?)))
        .collect()
}

/// Turn Nagle's algorithm off on one socket; false if it is not a TCP socket (or is gone).
pub fn set_nodelay(fd: libc::c_int) -> bool {
    let on: libc::c_int = 1;
    // SAFETY: the option value is a valid c_int of the given length; a descriptor that is
    // not a TCP socket (or was closed meanwhile) only yields an error.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            &on as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    rc == 0
}

/// Whether a TCP socket has `TCP_NODELAY` set; None if it is not a TCP socket.
pub fn nodelay(fd: libc::c_int) -> Option<bool> {
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: value and len are valid for writing and len holds value's size.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            &mut value as *mut libc::c_int as *mut libc::c_void,
            &mut len,
        )
    };
    (rc == 0).then_some(value != 0)
}
