//! Counts a UTS tree on one thread: `uts_count "-t 1 -a 3 -d 10 -b 4 -r 19"`.
fn main() {
    let text = std::env::args().nth(1).unwrap_or_default();
    let params = ftkv_tasks::uts::Params::parse(&text).expect("parameters");
    let start = std::time::Instant::now();
    let c = ftkv_tasks::uts::count_sequential(&params);
    println!(
        "{} nodes, {} leaves, depth {}, {:.2} s",
        c.nodes,
        c.leaves,
        c.max_depth,
        start.elapsed().as_secs_f64()
    );
}
