//! Helpers shared by the in-process scenario tests: a hard timeout and the writers' histories.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::{mpsc, Mutex};
use std::time::Duration;

use ftkv_sim::history::Op;

/// Every key's writes, as its owner tried them.
pub type History = Mutex<HashMap<(i32, u16), Vec<Op>>>;

/// Runs `body` on a thread and fails the test if it does not end within `secs`.
pub fn within<T: Send + 'static>(
    secs: u64,
    what: String,
    body: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body));
        let _ = tx.send(outcome);
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(Ok(value)) => value,
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        Err(_) => panic!("{what}: no end within {secs} s (hang)"),
    }
}

/// Waits until `ready` holds, failing the test if it does not within 20 s.
pub fn wait_until(what: &str, mut ready: impl FnMut() -> bool) {
    let started = std::time::Instant::now();
    while !ready() {
        assert!(started.elapsed() < Duration::from_secs(20), "never happened: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Marks write `seq` of `key` acknowledged.
pub fn acknowledge(history: &History, key: (i32, u16), seq: u32) {
    let mut history = history.lock().unwrap();
    let op = history.get_mut(&key).and_then(|ops| ops.iter_mut().rev().find(|o| o.seq == seq));
    op.expect("tried before acknowledged").acked = true;
}
