//! Extents: memory segments of a window's members beyond the window itself, each as long as the
//! bytes last written to it (see `ftkv::fabric::RmaOps::put_extent`).
//!
//! An MPI window cannot grow, and a window sized for the largest value a put may bring reserves
//! that much for every slot on every rank. An extent is a file of the host's shared-memory file
//! system (`/dev/shm`, tmpfs) named after the window, the member that holds it and its id:
//! members on the same host write and read it with `pwrite`/`pread` (one copy, like a put into
//! shared memory, and no mapping that a shortening could turn into `SIGBUS`), and a member's
//! serving thread does the same for members on other hosts. Writing sizes the file first: it
//! grows when shorter and is cut (tmpfs gives the pages back) when much longer, so memory
//! follows the data. The files outlive a killed holder; the window's closing removes them, and
//! the launcher removes what a killed job left: the extents of windows whose marker file
//! ([`Extents::open_marker`]) no live process holds open.

use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{MpiError, Result};

/// Where extents live: the host's shared-memory file system.
const SHM_DIR: &str = "/dev/shm";
/// The prefix of every extent file (the launcher's clean-up matches it).
pub const FILE_PREFIX: &str = "ftkv-x";
/// An extent longer than its new bytes by more than this share of them (and by more than
/// [`SHORTEN_SLACK`]) is cut to their length.
const SHORTEN_BELOW: u64 = 2;
const SHORTEN_SLACK: u64 = 1 << 20;

/// The extents of one window on this host, named `ftkv-x<window>-<member>-<id>`.
#[derive(Debug, Clone, Copy)]
pub struct Extents {
    window: u64,
}

impl Extents {
    /// The extents of the window called `window` (the same on every member).
    pub fn new(window: u64) -> Extents {
        Extents { window }
    }

    /// A name for a new window, unique on this host: the process id, the clock and a counter.
    pub fn fresh_window_name() -> u64 {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let pid = u64::from(std::process::id());
        let count = COUNTER.fetch_add(1, Ordering::Relaxed);
        nanos.rotate_left(17) ^ (pid << 40) ^ pid ^ count.wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }

    fn path(&self, member: i32, id: u64) -> PathBuf {
        PathBuf::from(format!("{SHM_DIR}/{FILE_PREFIX}{:016x}-{member}-{id:x}", self.window))
    }

    /// Opens the marker of `member`'s extents, `ftkv-x<window>-<member>-open`, which the member
    /// keeps open while it holds the window: a launcher cleaning up after a job removes a
    /// window's extents only when no live process has one of its markers open.
    pub fn open_marker(&self, member: i32) -> Result<File> {
        let path = format!("{SHM_DIR}/{FILE_PREFIX}{:016x}-{member}-open", self.window);
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| io_error("opening an extent marker", e))
    }

    /// Makes `member`'s extent `id` hold `data` at its start, sized to it first. Fails when the
    /// file system has no room (the extent may then hold part of `data`).
    pub fn write(&self, member: i32, id: u64, data: &[u8]) -> Result<()> {
        let file = self.open_to_write(member, id)?;
        size_for(&file, data.len() as u64)?;
        file.write_all_at(data, 0).map_err(|e| io_error("writing an extent", e))
    }

    /// Reads the first `out.len()` bytes of `member`'s extent `id`; bytes past its end, or of
    /// an extent that does not exist, read as zero.
    pub fn read(&self, member: i32, id: u64, out: &mut [u8]) -> Result<()> {
        let file = match File::open(self.path(member, id)) {
            Ok(file) => file,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                out.fill(0);
                return Ok(());
            }
            Err(e) => return Err(io_error("opening an extent", e)),
        };
        let mut filled = 0;
        while filled < out.len() {
            match file.read_at(&mut out[filled..], filled as u64) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(io_error("reading an extent", e)),
            }
        }
        out[filled..].fill(0);
        Ok(())
    }

    /// Makes `target`'s extent `to` hold the first `len` bytes of `source`'s extent `from`,
    /// copied by the kernel from file to file (no buffer of this process). Fails when the
    /// source holds fewer bytes, or when the file system has no room.
    pub fn copy(&self, source: i32, from: u64, target: i32, to: u64, len: u64) -> Result<()> {
        let input = File::open(self.path(source, from))
            .map_err(|e| io_error("opening an extent to copy", e))?;
        let mut output = self.open_to_write(target, to)?;
        size_for(&output, len)?;
        let copied = std::io::copy(&mut std::io::Read::take(input, len), &mut output)
            .map_err(|e| io_error("copying an extent", e))?;
        if copied < len {
            return Err(io_error(
                "copying an extent",
                std::io::Error::other(format!("the source holds {copied} of {len} bytes")),
            ));
        }
        Ok(())
    }

    /// `member`'s extent `id`, opened to be written (created when absent, kept as it is).
    fn open_to_write(&self, member: i32, id: u64) -> Result<File> {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(self.path(member, id))
            .map_err(|e| io_error("opening an extent", e))
    }

    /// Removes `member`'s extent `id` (nothing when there is none).
    pub fn free(&self, member: i32, id: u64) -> Result<()> {
        match std::fs::remove_file(self.path(member, id)) {
            Err(e) if e.kind() != ErrorKind::NotFound => Err(io_error("removing an extent", e)),
            _ => Ok(()),
        }
    }

    /// Removes the extents of `member`, or of every member when `None`; errors are ignored
    /// (another member may be removing the same files).
    pub fn remove_all(&self, member: Option<i32>) {
        let prefix = match member {
            Some(member) => format!("{FILE_PREFIX}{:016x}-{member}-", self.window),
            None => format!("{FILE_PREFIX}{:016x}-", self.window),
        };
        let Ok(entries) = std::fs::read_dir(SHM_DIR) else { return };
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
}

/// Grows `file` to `len` bytes when shorter, cuts it when much longer.
fn size_for(file: &File, len: u64) -> Result<()> {
    let current = file.metadata().map_err(|e| io_error("sizing an extent", e))?.len();
    let too_long = current > len.saturating_mul(SHORTEN_BELOW).max(len + SHORTEN_SLACK);
    if current < len || too_long {
        file.set_len(len).map_err(|e| io_error("sizing an extent", e))?;
    }
    Ok(())
}

fn io_error(op: &'static str, e: std::io::Error) -> MpiError {
    MpiError::Other { op, class: -1, msg: e.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_extent_copies_into_another_and_a_short_source_fails() {
        let extents = Extents::new(Extents::fresh_window_name());
        let data: Vec<u8> = (0..3000u32).map(|i| i as u8).collect();
        extents.write(0, 1, &data).unwrap();
        extents.write(1, 2, &[9u8; 5000]).unwrap();
        extents.copy(0, 1, 1, 2, 2000).unwrap();
        let mut out = vec![7u8; 2000];
        extents.read(1, 2, &mut out).unwrap();
        assert_eq!(out, data[..2000]);
        assert!(extents.copy(0, 1, 1, 3, 4000).is_err(), "3000 bytes cannot give 4000");
        extents.remove_all(None);
    }

    #[test]
    fn an_extent_grows_shrinks_and_reads_zeros_past_its_end() {
        let extents = Extents::new(Extents::fresh_window_name());
        let mut out = vec![7u8; 16];
        extents.read(3, 9, &mut out).unwrap();
        assert_eq!(out, vec![0u8; 16], "a missing extent reads as zeros");
        let big = vec![5u8; 3 << 20];
        extents.write(3, 9, &big).unwrap();
        let mut back = vec![0u8; big.len()];
        extents.read(3, 9, &mut back).unwrap();
        assert_eq!(back, big);
        extents.write(3, 9, b"small").unwrap();
        let path = extents.path(3, 9);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 5, "memory given back");
        let mut longer = [1u8; 8];
        extents.read(3, 9, &mut longer).unwrap();
        assert_eq!(&longer, b"small\0\0\0");
        extents.free(3, 9).unwrap();
        extents.free(3, 9).unwrap();
        assert!(!path.exists());
        extents.write(3, 1, b"a").unwrap();
        extents.write(4, 1, b"b").unwrap();
        extents.remove_all(Some(3));
        assert!(!extents.path(3, 1).exists() && extents.path(4, 1).exists());
        extents.remove_all(None);
        assert!(!extents.path(4, 1).exists());
    }
}
