//! Binding a listener's TCP socket so that it serves every IP family the node has
//! (docs/listeners.md, "IP families").
//!
//! Rust's `bind("0.0.0.0:<port>")` is IPv4 only, so on an IPv6-only or dual-stack cluster the
//! API server (webhook), the kubelet (probes) and Prometheus could not reach a listener bound
//! there. The wildcard `[::]:<port>` is bound here as **one dual-stack socket**: `AF_INET6` with
//! `IPV6_V6ONLY` off, set explicitly so that the host's `net.ipv6.bindv6only` sysctl does not
//! change it (ipv6(7)); IPv4 peers are then seen as `::ffff:a.b.c.d`. That socket works with
//! IPv6 turned off by sysctl (`net.ipv6.conf.*.disable_ipv6=1`: IPv4 still connects); only a
//! kernel without IPv6 (booted with `ipv6.disable=1`) refuses `socket(AF_INET6)` with
//! `EAFNOSUPPORT`, and then [`bind_tcp`] binds `0.0.0.0:<port>` instead, with a warning that
//! names the flag. Any other address is bound as given.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};

use socket2::{Domain, Protocol, Socket, Type};

/// The listen(2) backlog: the pending-connection queue the kernel keeps per listener (clamped to
/// `net.core.somaxconn`); tokio's `TcpListener::bind` uses the same.
pub const LISTEN_BACKLOG: i32 = 1024;

/// Binds and listens on `addr` for the command-line flag `flag` (named in the log line and the
/// error): `[::]:<port>` as one dual-stack socket (IPv4 and IPv6), any other address as given,
/// with `SO_REUSEADDR` (as the standard library does: a restart binds again while old
/// connections are in `TIME_WAIT`) and [`LISTEN_BACKLOG`]. The listener is non-blocking, ready
/// for `tokio::net::TcpListener::from_std` (inside a Tokio runtime) or `axum_server::from_tcp`.
///
/// # Errors
/// The socket(2), setsockopt(2), bind(2) or listen(2) error (`EADDRINUSE` when the port is
/// taken), with the flag and address in its message; `socket(AF_INET6)` failing with
/// `EAFNOSUPPORT` for `[::]` is not an error but the IPv4 fallback ([`ipv4_fallback`]).
pub fn bind_tcp(flag: &str, addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    let e = match listen(addr) {
        Ok(listener) => return Ok(listener),
        Err(e) => e,
    };
    let Some(v4) = ipv4_fallback(addr, &e) else { return Err(context(flag, addr, e)) };
    tracing::warn!(
        flag,
        %addr,
        fallback = %v4,
        error = %e,
        "this kernel has no IPv6 (booted with ipv6.disable=1?): listening on IPv4 only"
    );
    let listener = listen(v4).map_err(|e| context(flag, v4, e))?;
    Ok(listener)
}

/// The address to bind instead of `addr` after `err`: `0.0.0.0:<port>` when `addr` is the IPv6
/// wildcard and the kernel has no IPv6 at all (`EAFNOSUPPORT` from socket(2), ipv6(7)); `None`
/// for every other address or error, which stays an error.
#[must_use]
pub fn ipv4_fallback(addr: SocketAddr, err: &io::Error) -> Option<SocketAddr> {
    let no_ipv6 = err.raw_os_error() == Some(rustix::io::Errno::AFNOSUPPORT.raw_os_error());
    (addr.is_ipv6() && addr.ip().is_unspecified() && no_ipv6)
        .then(|| SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), addr.port()))
}

fn listen(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if addr.is_ipv6() && addr.ip().is_unspecified() {
        socket.set_only_v6(false)?;
    }
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(LISTEN_BACKLOG)?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

fn context(flag: &str, addr: SocketAddr, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("cannot listen on {flag} {addr}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{Ipv6Addr, TcpStream};

    fn accept_from(l: &std::net::TcpListener, to: SocketAddr) -> SocketAddr {
        let mut client = TcpStream::connect(to).unwrap();
        client.write_all(b"x").unwrap();
        l.set_nonblocking(false).unwrap();
        let (mut conn, peer) = l.accept().unwrap();
        let mut byte = [0u8; 1];
        conn.read_exact(&mut byte).unwrap();
        assert_eq!(&byte, b"x");
        peer
    }

    #[test]
    fn the_ipv6_wildcard_serves_ipv4_and_ipv6_clients_on_one_socket() {
        let l = bind_tcp("--admin-addr", "[::]:0".parse().unwrap()).unwrap();
        let port = l.local_addr().unwrap().port();
        assert!(l.local_addr().unwrap().is_ipv6());
        let v4 = accept_from(&l, SocketAddr::new(Ipv4Addr::LOCALHOST.into(), port));
        assert!(
            matches!(v4.ip(), std::net::IpAddr::V6(ip) if ip.to_ipv4_mapped() == Some(Ipv4Addr::LOCALHOST)),
            "{v4}"
        );
        let v6 = accept_from(&l, SocketAddr::new(Ipv6Addr::LOCALHOST.into(), port));
        assert_eq!(v6.ip(), std::net::IpAddr::V6(Ipv6Addr::LOCALHOST));
    }

    #[test]
    fn other_addresses_are_bound_as_given_and_a_taken_port_names_the_flag() {
        let l = bind_tcp("--admin-addr", "127.0.0.1:0".parse().unwrap()).unwrap();
        let at = l.local_addr().unwrap();
        assert_eq!(at.ip(), std::net::IpAddr::V4(Ipv4Addr::LOCALHOST));
        accept_from(&l, at);
        let err = bind_tcp("--webhook-addr", at).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
        assert!(err.to_string().contains(&format!("--webhook-addr {at}")), "{err}");
        // A dual-stack wildcard on the same port conflicts with the IPv4 socket too.
        let err = bind_tcp("--webhook-addr", SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), at.port())).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse, "{err}");
    }

    #[test]
    fn only_the_ipv6_wildcard_on_a_kernel_without_ipv6_falls_back_to_ipv4() {
        let afnosupport = io::Error::from_raw_os_error(rustix::io::Errno::AFNOSUPPORT.raw_os_error());
        let wildcard: SocketAddr = "[::]:9090".parse().unwrap();
        assert_eq!(ipv4_fallback(wildcard, &afnosupport), Some("0.0.0.0:9090".parse().unwrap()));
        assert_eq!(ipv4_fallback("[::1]:9090".parse().unwrap(), &afnosupport), None);
        assert_eq!(ipv4_fallback("0.0.0.0:9090".parse().unwrap(), &afnosupport), None);
        let in_use = io::Error::from(io::ErrorKind::AddrInUse);
        assert_eq!(ipv4_fallback(wildcard, &in_use), None);
    }
}
