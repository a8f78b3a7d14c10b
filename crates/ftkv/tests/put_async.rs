//! `Store::put_async` on the in-process fabric: the first copy is complete when it returns, every
//! copy once the handle is waited for (whether the replicator thread or the waiting owner wrote
//! them), a leaked handle is completed by the next write, and an owner that dies before waiting
//! leaves a value a recovery reads back (here the new one: its first holder survives). Bounded
//! by a timeout.

mod common;

use common::within;
use ftkv::fabric::local::LocalCluster;
use ftkv::fabric::Fabric;
use ftkv::{Config, Key, Store};

fn value(owner: i32, version: u32) -> Vec<u8> {
    let mut v = format!("{owner}:{version}:").into_bytes();
    v.resize(512 + (version as usize * 37) % 3000, b'a' + (version % 26) as u8);
    v
}

#[test]
fn every_copy_holds_the_last_value_once_waited_for() {
    let outcomes = within(60, "asynchronous puts".into(), || {
        LocalCluster::new(4).run(|fabric| {
            let mut store = Store::create(&fabric, Config::new(["checkpoint"], 3)).unwrap();
            let me = store.worker();
            let key = Key::new(me, 0);
            for version in 1..=40 {
                let written = value(me, version);
                let pending = store.put_async(key, &written).unwrap();
                match version % 3 {
                    0 => pending.wait().unwrap(),
                    1 => drop(pending),
                    _ => {
                        // Computing meanwhile: the replicator thread writes the other copies.
                        std::thread::sleep(std::time::Duration::from_millis(2));
                        pending.wait().unwrap();
                    }
                }
            }
            store.sync().unwrap();
            (0..4).all(|owner| {
                let copies = store.read_copies(Key::new(owner, 0)).unwrap();
                copies.len() == 3
                    && copies.iter().all(|(_, v)| v.as_deref() == Some(&value(owner, 40)[..]))
            })
        })
    });
    assert_eq!(outcomes, vec![Some(true); 4], "every worker saw every key's 3 copies current");
}

/// Values of 1 MiB, beyond the write-through bound: the handed-off path with extents.
#[test]
fn large_values_reach_every_copy_and_a_leaked_handle_is_completed_by_the_replicator() {
    let outcomes = within(60, "large asynchronous puts".into(), || {
        LocalCluster::new(4).run(|fabric| {
            let mut store = Store::create(&fabric, Config::new(["checkpoint"], 3)).unwrap();
            let me = store.worker();
            let key = Key::new(me, 0);
            let mut whole = true;
            for version in 1..=6 {
                let written = big(me, version);
                let pending = store.put_async(key, &written).unwrap();
                if version == 3 {
                    std::mem::forget(pending);
                    // The replicator completes a leaked handle's copies; the barrier waits.
                    store.sync().unwrap();
                    let copies = store.read_copies(key).unwrap();
                    whole &= copies.len() == 3
                        && copies.iter().all(|(_, v)| v.as_deref() == Some(&written[..]));
                    continue;
                }
                if version % 2 == 0 {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                pending.wait().unwrap();
                let copies = store.read_copies(key).unwrap();
                whole &= copies.len() == 3
                    && copies.iter().all(|(_, v)| v.as_deref() == Some(&written[..]));
            }
            store.sync().unwrap();
            whole
                && (0..4).all(|owner| {
                    let copies = store.read_copies(Key::new(owner, 0)).unwrap();
                    copies.iter().all(|(_, v)| v.as_deref() == Some(&big(owner, 6)[..]))
                })
        })
    });
    assert_eq!(outcomes, vec![Some(true); 4], "every copy held each waited-for value");
}

fn big(owner: i32, version: u32) -> Vec<u8> {
    let mut v = value(owner, version);
    v.resize(1 << 20, version as u8);
    v
}

#[test]
fn an_owner_killed_before_waiting_leaves_its_new_value_on_the_first_holder() {
    let outcomes = within(60, "a kill before the wait".into(), || {
        let cluster = LocalCluster::new(5);
        cluster.arm(1, "before_wait", 1);
        cluster.run(|fabric| {
            let mut store = Store::create(&fabric, Config::new(["checkpoint"], 2)).unwrap();
            let me = store.worker();
            store.put(Key::new(me, 0), &value(me, 1)).unwrap();
            store.sync().unwrap();
            // A survivor that gets here after worker 1 died, or whose own key has a copy on
            // worker 1, learns of the failure from its own put.
            let second = value(me, 2);
            let written = store.put_async(Key::new(me, 0), &second).and_then(|pending| {
                fabric.failpoint("before_wait");
                pending.wait()
            });
            if let Err(e) = written {
                assert!(e.needs_recovery(), "{e}");
            }
            while !store.needs_recovery() {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            store.recover().unwrap();
            store.get(Key::new(1, 0)).unwrap()
        })
    });
    assert!(outcomes[1].is_none(), "worker 1 died");
    for (worker, outcome) in outcomes.iter().enumerate().filter(|(w, _)| *w != 1) {
        assert_eq!(outcome.as_ref().unwrap().as_deref(), Some(&value(1, 2)[..]), "worker {worker}");
    }
}

/// A detached put (the C API's form) is waited for with its value, or released without it
/// (its copies then come from the first copy); a wait for a put that a later write completed
/// is refused and changes nothing.
#[test]
fn a_detached_put_is_waited_for_once_and_never_after_a_later_write() {
    let outcomes = within(60, "detached puts".into(), || {
        LocalCluster::new(4).run(|fabric| {
            let mut store = Store::create(&fabric, Config::new(["checkpoint"], 3)).unwrap();
            let me = store.worker();
            let key = Key::new(me, 0);
            let all_hold = |store: &mut Store<_>, expected: &[u8]| {
                let copies = store.read_copies(key).unwrap();
                copies.len() == 3 && copies.iter().all(|(_, v)| v.as_deref() == Some(expected))
            };
            let first = big(me, 1);
            let put = store.put_async(key, &first).unwrap().detach();
            assert_eq!(put.len(), first.len());
            let short = store.wait_detached(put, &first[..10]);
            assert!(matches!(short, Err(ftkv::Error::ValueMismatch { .. })), "{short:?}");
            // The first put stayed pending: the second completes it before it starts.
            let second = big(me, 2);
            let put = store.put_async(key, &second).unwrap().detach();
            let waited = store.wait_detached(put, &second);
            let mut held = waited.is_ok() && all_hold(&mut store, &second);
            let third = big(me, 3);
            let stale = store.put_async(key, &third).unwrap().detach();
            store.put(key, &value(me, 4)).unwrap();
            let late = store.wait_detached(stale, &third);
            held &= matches!(late, Err(ftkv::Error::NotPending { .. }));
            held &= all_hold(&mut store, &value(me, 4));
            let fifth = big(me, 5);
            let released = store.put_async(key, &fifth).unwrap().detach();
            store.release_detached(released);
            held &= all_hold(&mut store, &fifth);
            store.sync().unwrap();
            held
        })
    });
    assert_eq!(outcomes, vec![Some(true); 4], "every copy held each completed value");
}
