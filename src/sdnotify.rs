//! systemd's readiness notification (`Type=notify`): "READY=1" sent as one
//! datagram to `$NOTIFY_SOCKET`, as sd_notify(3) does. Hand-written: the
//! protocol is one sendto(), smaller than any crate that wraps it.

use std::os::unix::net::UnixDatagram;

/// Tells systemd the service is ready; a no-op outside systemd.
pub fn ready() {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let sent = UnixDatagram::unbound().and_then(|s| {
        let bytes = path.as_encoded_bytes();
        if let Some(name) = bytes.strip_prefix(b"@") {
            // An abstract socket name.
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
            s.send_to_addr(b"READY=1", &addr)
        } else {
            s.send_to(b"READY=1", &path)
        }
    });
    if let Err(e) = sent {
        tracing::warn!(error = %e, "unable to notify systemd of readiness");
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn ready_sends_one_datagram_to_the_notify_socket() {
        let dir = std::env::temp_dir().join(format!("rkubelet-notify-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("notify.sock");
        let _ = std::fs::remove_file(&path);
        let sock = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        // SAFETY: no other test in this binary reads or writes NOTIFY_SOCKET.
        unsafe { std::env::set_var("NOTIFY_SOCKET", &path) };
        super::ready();
        unsafe { std::env::remove_var("NOTIFY_SOCKET") };
        let mut buf = [0u8; 64];
        sock.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let n = sock.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");
    }
}
