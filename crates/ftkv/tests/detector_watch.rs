//! A failure detector that stops making progress ends its process (in-process fabric): one
//! rank's detector thread is held at the start of a round; within the watchdog bound its clock
//! ends the rank, and the other ranks, which go on putting, learn of the failure.

mod common;

use std::time::{Duration, Instant};

use common::within;
use ftkv::fabric::local::LocalCluster;
use ftkv::{Config, Key, Store};

const RANKS: usize = 4;
const STUCK: i32 = 3;

#[test]
fn a_stuck_detector_ends_its_process_and_the_others_learn_of_it() {
    within(60, "a stuck detector".into(), || {
        let cluster = LocalCluster::new(RANKS);
        cluster.stop_at(STUCK, "detector_round", 5);
        let started = Instant::now();
        let results = std::thread::scope(|s| {
            let resumer = s.spawn(|| {
                while !cluster.is_dead(STUCK) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                let ended_after = started.elapsed();
                cluster.resume(STUCK);
                ended_after
            });
            let results = cluster.run(|fabric| {
                let mut config = Config::new(["checkpoint"], 2).localized();
                config.watchdog = Duration::from_millis(500);
                let mut store = Store::create(&fabric, config).expect("a store");
                let me = store.worker();
                let mut round = 0u64;
                while !store.failed().contains(&STUCK) {
                    round += 1;
                    store.put(Key::new(me, 0), &round.to_le_bytes()).expect("a put");
                    std::thread::sleep(Duration::from_millis(1));
                }
                round
            });
            (results, resumer.join().expect("the resumer"))
        });
        let (rounds, ended_after) = results;
        assert!(rounds[STUCK as usize].is_none(), "the stuck rank was not ended");
        assert!(ended_after >= Duration::from_millis(500), "ended before the bound");
        assert!(ended_after < Duration::from_secs(10), "ended after {ended_after:?}");
        for (rank, round) in rounds.iter().enumerate().filter(|(r, _)| *r != STUCK as usize) {
            assert!(round.is_some(), "rank {rank} did not learn of the failure");
        }
    });
}
