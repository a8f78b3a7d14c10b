//! Compare-and-swap on the in-process fabric: concurrent read-compare-swap loops from every
//! rank on every rank's word end with exact counts, and a word that holds something else is
//! left alone.

mod common;

use common::within;
use ftkv::fabric::local::LocalCluster;
use ftkv::fabric::{Fabric, FabricWindow};

const RANKS: usize = 4;
const ROUNDS: u64 = 300;

#[test]
fn concurrent_compare_and_swap_loops_count_exactly() {
    let counts = within(30, "compare-and-swap loops".into(), || {
        LocalCluster::new(RANKS).run(|fabric| {
            let window = fabric.open_window(64, &[(0, 64)]).expect("a window");
            fabric.barrier().expect("barrier");
            for round in 0..ROUNDS {
                for step in 0..RANKS as i32 {
                    let target = (fabric.rank() + step + round as i32) % RANKS as i32;
                    let mut seen = 0;
                    loop {
                        let held = window.compare_and_swap(target, 8, seen, seen + 1).unwrap();
                        if held == seen {
                            break;
                        }
                        seen = held;
                    }
                }
            }
            fabric.barrier().expect("barrier");
            let refused = window.compare_and_swap(fabric.rank(), 8, u64::MAX, 0).unwrap();
            let mut word = [0u8; 8];
            window.read_local(8, &mut word).unwrap();
            (refused, u64::from_le_bytes(word))
        })
    });
    for (rank, count) in counts.into_iter().enumerate() {
        let (refused, stored) = count.expect("every rank finishes");
        assert_eq!(refused, RANKS as u64 * ROUNDS, "rank {rank}'s counter");
        assert_eq!(stored, RANKS as u64 * ROUNDS, "a refused swap changed rank {rank}'s word");
    }
}
