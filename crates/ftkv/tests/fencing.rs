//! Fencing on the in-process fabric: a writer stopped inside a put, declared failed while
//! stopped and then resumed, lands its late write in the holders' slots, and no survivor ever
//! reads it back, with global and with localized recovery. The resumed writer's next put ends
//! it. Every scenario runs under a hard timeout.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{wait_until, within};
use ftkv::fabric::local::{LocalCluster, LocalFabric};
use ftkv::{Config, Key, Recovery, Store};

const RANKS: usize = 4;
const STOPPED: i32 = 3;

fn config(recovery: Recovery) -> Config {
    let mut config = Config::new(["checkpoint"], 2);
    config.initial_capacity = 1024;
    config.max_value = 4096;
    config.suspicion = Duration::from_millis(300);
    match recovery {
        Recovery::Global => config,
        Recovery::Localized => config.localized(),
    }
}

/// The steps the test drives from outside the ranks, and what the stopped rank saw.
#[derive(Default)]
struct Script {
    /// Survivors that learnt of the declaration (and so fenced their slots).
    noticed: AtomicUsize,
    /// Set once the stopped rank was resumed and its late put returned.
    late_put_returned: AtomicBool,
    late_put_ok: AtomicBool,
    /// Survivors done reading after the late write.
    done: AtomicUsize,
}

/// What each survivor read of the stopped rank's key: after noticing it failed, and after
/// its late write landed.
type Reads = (Option<Vec<u8>>, Option<Vec<u8>>);

fn survivor(store: &mut Store<LocalFabric>, script: &Script, recovery: Recovery) -> Reads {
    let key = Key::new(STOPPED, 0);
    wait_until("the survivor notices the declared rank", || match recovery {
        Recovery::Global => store.needs_recovery(),
        Recovery::Localized => {
            store.follow().expect("follow");
            store.failed().contains(&STOPPED)
        }
    });
    script.noticed.fetch_add(1, Ordering::AcqRel);
    let before = match recovery {
        Recovery::Global => None,
        Recovery::Localized => store.get(key).expect("read after the declaration"),
    };
    wait_until("the late put returns", || script.late_put_returned.load(Ordering::Acquire));
    if recovery == Recovery::Global {
        let report = store.recover().expect("global recovery");
        assert_eq!(report.failed, vec![STOPPED]);
        assert!(report.keys_lost.is_empty(), "{report:?}");
    }
    let after = store.get(key).expect("read after the late write");
    script.done.fetch_add(1, Ordering::AcqRel);
    (before, after)
}

fn stopped_writer(store: &mut Store<LocalFabric>, script: &Script) -> Reads {
    let key = store.own_key("checkpoint").expect("own key");
    store.put(key, b"acknowledged").expect("the first put");
    let late = store.put(key, b"late");
    script.late_put_ok.store(late.is_ok(), Ordering::Release);
    script.late_put_returned.store(true, Ordering::Release);
    std::thread::sleep(Duration::from_millis(350));
    let _ = store.put(key, b"after the suspicion bound");
    panic!("a resumed rank past the suspicion bound must not get here")
}

fn scenario(recovery: Recovery) {
    let cluster = LocalCluster::new(RANKS);
    cluster.stop_at(STOPPED, "put_stall", 2);
    let script = Arc::new(Script::default());
    let driver = {
        let (cluster, script) = (cluster.clone(), script.clone());
        std::thread::spawn(move || {
            wait_until("the writer stops in its second put", || cluster.is_stopped(STOPPED));
            cluster.declare(STOPPED);
            let survivors = RANKS - 1;
            wait_until("every survivor noticed", || {
                script.noticed.load(Ordering::Acquire) == survivors
            });
            cluster.resume(STOPPED);
        })
    };
    let results = cluster.run(|fabric| {
        let mut store = Store::create(&fabric, config(recovery)).expect("store");
        if store.worker() == STOPPED {
            stopped_writer(&mut store, &script)
        } else {
            survivor(&mut store, &script, recovery)
        }
    });
    driver.join().expect("the driver");
    assert!(results[STOPPED as usize].is_none(), "the resumed writer must end");
    assert!(script.late_put_ok.load(Ordering::Acquire), "the late put landed and returned Ok");
    for (rank, reads) in results.iter().enumerate().filter(|(r, _)| *r != STOPPED as usize) {
        let (before, after) = reads.clone().expect("a survivor finishes");
        if recovery == Recovery::Localized {
            assert_eq!(before.as_deref(), Some(&b"acknowledged"[..]), "rank {rank} before");
        }
        assert_eq!(after.as_deref(), Some(&b"acknowledged"[..]), "rank {rank} read the late write");
    }
}

#[test]
fn a_late_write_of_a_declared_writer_is_never_read_with_global_recovery() {
    within(60, "global".into(), || scenario(Recovery::Global));
}

#[test]
fn a_late_write_of_a_declared_writer_is_never_read_with_localized_recovery() {
    within(60, "localized".into(), || scenario(Recovery::Localized));
}
