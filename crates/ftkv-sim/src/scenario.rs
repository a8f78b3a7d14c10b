//! The drawing every seeded model shares: ranks on hosts, how many die, and which ones.

use rand::rngs::SmallRng;
use rand::Rng;

/// 3–6 ranks on 1–3 hosts, mapped by slot or by node: the rank count and each rank's host.
pub fn ranks_on_hosts(rng: &mut SmallRng) -> (usize, Vec<u32>) {
    let ranks = rng.gen_range(3..=6usize);
    let host_count = rng.gen_range(1..=3usize.min(ranks - 1));
    let by_node = rng.gen_bool(0.5);
    let per_host = ranks.div_ceil(host_count);
    let hosts =
        (0..ranks).map(|r| if by_node { r % host_count } else { r / per_host } as u32).collect();
    (ranks, hosts)
}

/// How many of `ranks` to kill: up to `copies − 1`, leaving a majority alive (a recovery that
/// finds a minority alive refuses to go on: `Error::Partitioned`).
pub fn kill_count(rng: &mut SmallRng, copies: usize, ranks: usize) -> usize {
    rng.gen_range(0..=(copies - 1).min((ranks - 1) / 2))
}

/// `count` distinct victims among `ranks` (`count` ≤ `ranks`), each with how it dies: a
/// victim is drawn until it is a new one, then `death` draws its death, seeing the victims
/// drawn before it.
pub fn victims<D>(
    rng: &mut SmallRng,
    count: usize,
    ranks: usize,
    mut death: impl FnMut(&mut SmallRng, &[(i32, D)]) -> D,
) -> Vec<(i32, D)> {
    assert!(count <= ranks, "{count} distinct victims among {ranks} ranks");
    let mut kills: Vec<(i32, D)> = Vec::with_capacity(count);
    while kills.len() < count {
        let victim = rng.gen_range(0..ranks as i32);
        if kills.iter().any(|(v, _)| *v == victim) {
            continue;
        }
        let how = death(rng, &kills);
        kills.push((victim, how));
    }
    kills
}
