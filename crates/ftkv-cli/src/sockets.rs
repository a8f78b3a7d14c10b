//! The listening TCP sockets a process holds, from `/proc` (Linux): what a test needs to
//! connect to a rank's listeners from outside the job.

use std::collections::HashSet;
use std::net::{Ipv4Addr, SocketAddrV4};

/// The IPv4 TCP sockets process `pid` listens on: (socket inode, address), as seen in its own
/// network namespace. Empty when the process is gone.
pub fn listening(pid: u32) -> Vec<(u64, SocketAddrV4)> {
    let held = socket_inodes(pid);
    let Ok(table) = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")) else {
        return Vec::new();
    };
    table.lines().skip(1).filter_map(parse_listener).filter(|(i, _)| held.contains(i)).collect()
}

/// The inodes of the sockets among process `pid`'s open descriptors.
fn socket_inodes(pid: u32) -> HashSet<u64> {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return HashSet::new() };
    fds.filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter_map(|target| {
            let text = target.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned();
            text.parse().ok()
        })
        .collect()
}

/// One `/proc/net/tcp` row in the LISTEN state (`0A`): its inode and local address.
fn parse_listener(row: &str) -> Option<(u64, SocketAddrV4)> {
    let fields: Vec<&str> = row.split_whitespace().collect();
    if fields.get(3) != Some(&"0A") {
        return None;
    }
    let (ip, port) = fields.get(1)?.split_once(':')?;
    let ip = Ipv4Addr::from(u32::from_str_radix(ip, 16).ok()?.swap_bytes());
    let port = u16::from_str_radix(port, 16).ok()?;
    Some((fields.get(9)?.parse().ok()?, SocketAddrV4::new(ip, port)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listen_row_gives_its_inode_and_address() {
        let row = "   1: 0200FA0A:A0C3 00000000:0000 0A 00000000:00000000 00:00000000 00000000 \
                   0        0 123456 1 0000000000000000 100 0 0 10 0";
        let want = SocketAddrV4::new(Ipv4Addr::new(10, 250, 0, 2), 0xA0C3);
        assert_eq!(parse_listener(row), Some((123456, want)));
        assert_eq!(parse_listener(&row.replace(" 0A ", " 01 ")), None);
    }

    #[test]
    fn this_process_sees_its_own_listener() {
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let Ok(std::net::SocketAddr::V4(mine)) = listener.local_addr() else { panic!() };
        let found = listening(std::process::id());
        assert!(found.iter().any(|(_, a)| *a == mine), "{found:?} lacks {mine}");
    }
}
