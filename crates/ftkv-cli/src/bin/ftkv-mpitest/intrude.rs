//! `ftkv-mpitest intrude <ip:port>...`: a process that is no member of the job connects to
//! window listeners and tries to get requests applied. Per address, at once: a connection that
//! sends garbage, one with a forged introduction (right magic, plausible ranks, a guessed
//! secret) followed by a put of `0xff` over the window's first bytes, one that stops midway
//! through an introduction, one that connects and sends nothing, and one that closes at once.
//! Prints `intruded <connections>` with the number of connections the listeners accepted; a
//! listener that is gone (the window closed) refuses, which is not an error here.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// The introduction's layout the listeners expect: magic, origin and target ranks, secret.
const MAGIC: &[u8; 8] = b"FTKVLNK1";
const SECRET_LEN: usize = 16;
/// The request kind of a put (see `ftkv_mpi`'s remote links).
const OP_PUT: u8 = 1;
/// How long the silent connection stays open: past the listeners' introduction timeout.
const SILENT_FOR: Duration = Duration::from_millis(2500);

pub fn main() -> ! {
    let addresses: Vec<SocketAddr> =
        std::env::args().skip(2).filter_map(|a| a.parse().ok()).collect();
    let connected: usize = std::thread::scope(|s| {
        let tries: Vec<_> = addresses
            .iter()
            .flat_map(|&address| ATTEMPTS.iter().map(move |&attempt| (address, attempt)))
            .map(|(address, attempt)| s.spawn(move || attempt(address)))
            .collect();
        tries.into_iter().map(|t| t.join().unwrap_or(false) as usize).sum()
    });
    ftkv_cli::rank_println!("intruded {connected}");
    std::process::exit(0)
}

type Attempt = fn(SocketAddr) -> bool;

const ATTEMPTS: [Attempt; 5] = [garbage, forged_put, half_introduction, silent, closed_at_once];

fn connect(address: SocketAddr) -> Option<TcpStream> {
    TcpStream::connect_timeout(&address, Duration::from_secs(1)).ok()
}

/// Sends `bytes` on a new connection and keeps it open a moment; whether it connected.
fn send(address: SocketAddr, bytes: &[u8], hold: Duration) -> bool {
    let Some(mut stream) = connect(address) else { return false };
    let _ = stream.write_all(bytes);
    std::thread::sleep(hold);
    true
}

fn garbage(address: SocketAddr) -> bool {
    let bytes: Vec<u8> = (0..4096u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    send(address, &bytes, Duration::from_millis(200))
}

/// A forged introduction from member 0 to member 1 with an all-zero secret, then a put of eight
/// `0xff` bytes at displacement 0.
fn forged_put(address: SocketAddr) -> bool {
    let mut bytes = MAGIC.to_vec();
    bytes.extend_from_slice(&0u32.to_le_bytes());
    bytes.extend_from_slice(&1u32.to_le_bytes());
    bytes.extend_from_slice(&[0u8; SECRET_LEN]);
    bytes.extend_from_slice(&1u32.to_le_bytes());
    bytes.push(OP_PUT);
    bytes.extend_from_slice(&0u64.to_le_bytes());
    bytes.extend_from_slice(&8u64.to_le_bytes());
    bytes.extend_from_slice(&[0xff; 8]);
    send(address, &bytes, Duration::from_millis(200))
}

fn half_introduction(address: SocketAddr) -> bool {
    send(address, &MAGIC[..5], Duration::from_millis(200))
}

fn silent(address: SocketAddr) -> bool {
    send(address, &[], SILENT_FOR)
}

fn closed_at_once(address: SocketAddr) -> bool {
    connect(address).is_some()
}
