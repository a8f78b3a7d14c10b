//! Where a job's ranks run: this machine alone, a real cluster's hostfile, or hosts simulated
//! on this machine.
//!
//! A simulated host is a network namespace with its own address, a UTS namespace with its own
//! host name, and its own PRRTE daemon: `mpirun` runs in a head namespace that holds a bridge,
//! each host's namespace is joined to the bridge by a veth pair, and PRRTE starts the daemons
//! through an ssh stand-in (`plm_ssh_agent`) that runs them inside the host's namespaces. Open
//! MPI then uses TCP between hosts and shared memory only within one, as on a real cluster,
//! and a host's link can be cut or slowed. All traffic stays inside the job's namespaces.
//!
//! The hosts share this machine's cores, and the job's processes are scheduled as one
//! machine's: the process that makes the cluster moves into a CPU control group of the job's
//! own for the job's lifetime, so every process of the job (`mpirun`, the daemons, the ranks)
//! runs there beside it. Without it each remote daemon, which starts a session of its own,
//! takes its host's ranks into a scheduling group of their own (the kernel's autogroups), and
//! under oversubscription the kernel left a whole host's group without a time slice for 5–9 s
//! (measured with 32 ranks over 4 hosts on 2 cores: whole hosts' ranks ended themselves as
//! stopped, recoveries took up to 9.7 s and the pool 20–52 s; all in one group, 13–36 ms and
//! 9–13 s, and the driver saw no gap over 1 s in the ranks' output; with only the job's
//! processes grouped and the driver outside, gaps of 1.3–3 s).
//!
//! Namespaces, bridge, control group and files are unique to the job and removed when it
//! ends, however it ends (also by the interrupt handler). Needs root, iproute2 and util-linux.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, ensure, Context, Result};

/// The subnet of every simulated cluster. Each job's bridge lives in its own head namespace,
/// so two jobs' identical subnets never meet.
pub const SUBNET: &str = "10.250.0.0/24";
const HEAD_ADDRESS: &str = "10.250.0.254/24";

/// `FTKV_NODES`: the number of simulated hosts (set by `--nodes`).
pub const NODES_VAR: &str = "FTKV_NODES";
/// `FTKV_HOSTFILE`: a real cluster's hostfile passed to `mpirun` (set by `--hostfile`).
pub const HOSTFILE_VAR: &str = "FTKV_HOSTFILE";
/// `FTKV_MAP_BY`: `mpirun --map-by` (set by `--map-by`); by default ranks follow the slots.
pub const MAP_BY_VAR: &str = "FTKV_MAP_BY";

/// Where the ranks of a job run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hosts {
    /// All ranks on this machine (oversubscribed when they outnumber the cores).
    ThisMachine,
    /// `n` hosts simulated on this machine, the ranks spread evenly by slot.
    Simulated(usize),
    /// A real hostfile, given to `mpirun` as is.
    Hostfile(PathBuf),
}

impl Hosts {
    /// From `FTKV_NODES` / `FTKV_HOSTFILE` (which `--nodes` and `--hostfile` set); refuses both
    /// at once and a node count that is not a number ≥ 1.
    pub fn from_env() -> Result<Hosts> {
        let nodes = std::env::var(NODES_VAR).ok().filter(|v| !v.is_empty());
        let hostfile = std::env::var_os(HOSTFILE_VAR).filter(|v| !v.is_empty());
        match (nodes, hostfile) {
            (Some(_), Some(_)) => bail!("--nodes and --hostfile exclude each other"),
            (Some(n), None) => parse_nodes(&n).map(Hosts::Simulated),
            (None, Some(file)) => Ok(Hosts::Hostfile(PathBuf::from(file))),
            (None, None) => Ok(Hosts::ThisMachine),
        }
    }

    /// The number of hosts, when known before the job starts.
    pub fn count(&self) -> Option<usize> {
        match self {
            Hosts::ThisMachine => Some(1),
            Hosts::Simulated(n) => Some(*n),
            Hosts::Hostfile(file) => read_hostfile(file).ok().map(|h| h.len()),
        }
    }
}

fn parse_nodes(text: &str) -> Result<usize> {
    match text.trim().parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => bail!("--nodes (FTKV_NODES) must be a number of hosts ≥ 1, got {text:?}"),
    }
}

/// A hostfile's `(host, slots)` entries; a line without `slots=` counts as one slot.
pub fn read_hostfile(path: &Path) -> Result<Vec<(String, usize)>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the hostfile {}", path.display()))?;
    let mut hosts = Vec::new();
    for line in text.lines().map(|l| l.split('#').next().unwrap_or("").trim()) {
        let mut words = line.split_whitespace();
        let Some(host) = words.next() else { continue };
        let slots = words
            .find_map(|w| w.strip_prefix("slots="))
            .map(|s| s.parse::<usize>().with_context(|| format!("bad slots in {line:?}")))
            .transpose()?
            .unwrap_or(1);
        hosts.push((host.to_owned(), slots));
    }
    ensure!(!hosts.is_empty(), "the hostfile {} names no host", path.display());
    Ok(hosts)
}

/// `mpirun` flags that place `ranks` ranks on `hosts` (`hostfile` is the file to pass for
/// simulated hosts). Ranks follow the slots; `--oversubscribe` only when they outnumber them.
pub fn mapping_flags(hosts: &Hosts, ranks: usize, hostfile: Option<&Path>) -> Result<Vec<String>> {
    let mut flags = Vec::new();
    let slots = match hosts {
        Hosts::ThisMachine => return Ok(vec!["--oversubscribe".to_owned()]),
        Hosts::Simulated(n) => n * ranks.div_ceil(*n),
        Hosts::Hostfile(file) => read_hostfile(file)?.iter().map(|(_, s)| s).sum(),
    };
    let file = match hosts {
        Hosts::Hostfile(file) => file.as_path(),
        _ => hostfile.context("a simulated cluster's hostfile")?,
    };
    flags.extend(["--hostfile".to_owned(), file.display().to_string()]);
    if ranks > slots {
        flags.push("--oversubscribe".to_owned());
    }
    if let Some(map_by) = std::env::var(MAP_BY_VAR).ok().filter(|v| !v.is_empty()) {
        flags.extend(["--map-by".to_owned(), map_by]);
    }
    if let Hosts::Simulated(_) = hosts {
        // Every simulated host's daemon would bind its ranks to the same cores.
        flags.extend(
            ["--bind-to", "none", "--prtemca", "prte_if_include", SUBNET].map(String::from),
        );
        flags.extend(["--mca", "btl_tcp_if_include", SUBNET].map(String::from));
        // The hosts share this machine's cores: ranks that spin in MPI without yielding wait
        // for a scheduler tick per message (4-20 ms per ping instead of 60 µs, measured).
        flags.extend(["--mca", "mpi_yield_when_idle", "1"].map(String::from));
        // With the default socket buffers a 1 MiB message waits for a write event, and with
        // several threads in MPI that wait stalled for seconds (measured: 12 s and 16 s in
        // 1000 puts; 75 ms at most with 8 MiB buffers).
        for buf in ["btl_tcp_sndbuf", "btl_tcp_rcvbuf"] {
            flags.extend(["--mca", buf, "8388608"].map(String::from));
        }
    }
    Ok(flags)
}

/// Hosts simulated on this machine for one job; removed on drop.
#[derive(Debug)]
pub struct SimulatedCluster {
    id: String,
    hosts: Vec<String>,
    dir: PathBuf,
    removed: bool,
}

/// Clusters that exist now, for the interrupt handler.
static LIVE_CLUSTERS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

impl SimulatedCluster {
    /// Creates `nodes` hosts with `slots` slots each: namespaces, bridge, links, addresses,
    /// the hostfile and the ssh stand-in.
    pub fn create(nodes: usize, slots: usize) -> Result<SimulatedCluster> {
        ensure!(is_root(), "--nodes needs root: it makes a network namespace per host");
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let serial = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let id = format!("ftkv{}x{serial}", std::process::id());
        let dir = std::env::temp_dir().join(format!("{id}-cluster"));
        let hosts = (0..nodes).map(|i| format!("{id}n{i}")).collect();
        LIVE_CLUSTERS.lock().unwrap_or_else(|p| p.into_inner()).push(id.clone());
        let mut cluster = SimulatedCluster { id, hosts, dir, removed: false };
        if let Err(e) = cluster.build(slots) {
            cluster.remove();
            return Err(e.context("creating the simulated hosts"));
        }
        Ok(cluster)
    }

    fn build(&self, slots: usize) -> Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let hostfile: String = self.hosts.iter().map(|h| format!("{h} slots={slots}\n")).collect();
        std::fs::write(self.hostfile(), hostfile)?;
        join_scheduling_group(&self.id);
        write_agent(&self.agent())?;
        let head = self.head();
        ip(&["netns", "add", &head])?;
        ip(&["-n", &head, "link", "set", "lo", "up"])?;
        ip(&["-n", &head, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &head, "link", "set", "br0", "up"])?;
        ip(&["-n", &head, "addr", "add", HEAD_ADDRESS, "dev", "br0"])?;
        for (i, host) in self.hosts.iter().enumerate() {
            self.add_host(i, host)?;
        }
        Ok(())
    }

    fn add_host(&self, i: usize, host: &str) -> Result<()> {
        let head = self.head();
        let veth = format!("v{i}");
        ip(&["netns", "add", host])?;
        ip(&["-n", host, "link", "set", "lo", "up"])?;
        ip(&[
            "-n", &head, "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns",
            host,
        ])?;
        ip(&["-n", &head, "link", "set", &veth, "master", "br0", "up"])?;
        ip(&["-n", host, "addr", "add", &format!("10.250.0.{}/24", i + 1), "dev", "eth0"])?;
        ip(&["-n", host, "link", "set", "eth0", "up"])
    }

    /// The hosts' names (also their namespaces' names), in hostfile order.
    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }

    pub fn hostfile(&self) -> PathBuf {
        self.dir.join("hostfile")
    }

    fn agent(&self) -> PathBuf {
        self.dir.join("ssh-stand-in")
    }

    fn head(&self) -> String {
        format!("{}head", self.id)
    }

    /// `mpirun` and its flags: run in the head namespace, daemons started by the stand-in.
    pub fn launcher(&self, mpirun: &Path) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.head()]).arg(mpirun);
        cmd.args(["--prtemca", "plm_ssh_agent"]).arg(self.agent());
        cmd
    }

    /// Cuts host `i` off the others (its link to the bridge goes down); `false` restores it.
    pub fn set_link(&self, i: usize, up: bool) -> Result<()> {
        ip(&["-n", &self.head(), "link", "set", &format!("v{i}"), if up { "up" } else { "down" }])
    }

    /// Limits every host's outgoing link to `rate` (a `tc` rate such as `100mbit`) with a
    /// queue of at most `latency` (`tc tbf`: this kernel has no netem for added delay).
    pub fn throttle_links(&self, rate: &str, latency: &str) -> Result<()> {
        for host in &self.hosts {
            run(Command::new("ip")
                .args(["netns", "exec", host, "tc", "qdisc", "add", "dev"])
                .args(["eth0", "root", "tbf", "rate", rate, "burst", "64kb", "latency", latency]))?;
        }
        Ok(())
    }

    /// The index of the simulated host process `pid` runs on (by its network namespace).
    pub fn host_of(&self, pid: u32) -> Option<usize> {
        let of_pid = std::fs::read_link(format!("/proc/{pid}/ns/net")).ok()?;
        self.hosts.iter().position(|host| {
            let netns = Path::new("/run/netns").join(host);
            std::fs::metadata(netns).is_ok_and(|meta| namespace_link(&meta) == of_pid)
        })
    }

    /// Removes namespaces and files (idempotent). Processes still inside a namespace keep it
    /// alive until they exit: end the job's processes first.
    pub fn remove(&mut self) {
        if std::mem::replace(&mut self.removed, true) {
            return;
        }
        remove_cluster(&self.id);
        remove_scheduling_group(&self.id);
        let _ = std::fs::remove_dir_all(&self.dir);
        LIVE_CLUSTERS.lock().unwrap_or_else(|p| p.into_inner()).retain(|c| *c != self.id);
    }
}

impl Drop for SimulatedCluster {
    fn drop(&mut self) {
        self.remove();
    }
}

/// `net:[inode]`, as `/proc/PID/ns/net` shows the namespace behind `meta`.
fn namespace_link(meta: &std::fs::Metadata) -> PathBuf {
    use std::os::unix::fs::MetadataExt;
    PathBuf::from(format!("net:[{}]", meta.ino()))
}

/// Removes every namespace of cluster `id` (its hosts' and its head's).
fn remove_cluster(id: &str) {
    for name in namespaces_with_prefix(id) {
        let removed = ip(&["netns", "del", &name]);
        if let Err(e) = removed.as_ref() {
            if Path::new("/run/netns").join(&name).exists() {
                eprintln!("ftkv: removing the simulated host {name}: {e:#}");
            }
        }
    }
}

/// Removes the clusters of this process that still exist (the interrupt handler's part).
pub fn remove_live_clusters() {
    let ids = std::mem::take(&mut *LIVE_CLUSTERS.lock().unwrap_or_else(|p| p.into_inner()));
    for id in ids {
        remove_cluster(&id);
        remove_scheduling_group(&id);
        let _ = std::fs::remove_dir_all(std::env::temp_dir().join(format!("{id}-cluster")));
    }
}

/// The network namespaces whose names start with `prefix`.
pub fn namespaces_with_prefix(prefix: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/run/netns") else { return Vec::new() };
    entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name.starts_with(prefix))
        .collect()
}

/// Namespaces of simulated clusters whose creating process is gone (a driver that was
/// SIGKILLed cannot remove its own); removed before a new cluster is made.
pub fn remove_orphaned_clusters() {
    for name in namespaces_with_prefix("ftkv").into_iter().filter(|n| creator_is_gone(n)) {
        let _ = ip(&["netns", "del", &name]);
    }
    let Some(root) = cpu_hierarchy() else { return };
    let Ok(entries) = std::fs::read_dir(&root) else { return };
    for name in entries.filter_map(|e| e.ok()?.file_name().into_string().ok()) {
        if creator_is_gone(&name) {
            let _ = std::fs::remove_dir(root.join(&name));
        }
    }
}

/// Whether `name` is a cluster's (`ftkv<pid>x...`) whose creating process `pid` is gone.
fn creator_is_gone(name: &str) -> bool {
    let pid = name.strip_prefix("ftkv").and_then(|rest| rest.split('x').next());
    let pid = pid.and_then(|p| p.parse::<u32>().ok());
    pid.is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
}

/// The root of the CPU controller's hierarchy: cgroup v1's `cpu` mount, or the unified
/// (v2) hierarchy when it has the CPU controller; `None` when neither can be used.
fn cpu_hierarchy() -> Option<PathBuf> {
    let v1 = Path::new("/sys/fs/cgroup/cpu");
    if v1.join("cgroup.procs").exists() {
        return Some(v1.to_owned());
    }
    let v2 = Path::new("/sys/fs/cgroup");
    let controllers = std::fs::read_to_string(v2.join("cgroup.subtree_control")).ok()?;
    controllers.split_whitespace().any(|c| c == "cpu").then(|| v2.to_owned())
}

/// Makes cluster `id`'s CPU control group and moves this process into it, so that every
/// process it starts for the job runs there; warns (hosts' ranks then compete as groups of
/// their own) when this machine offers no CPU controller.
fn join_scheduling_group(id: &str) {
    let joined = cpu_hierarchy()
        .map(|root| root.join(id))
        .is_some_and(|dir| std::fs::create_dir(&dir).is_ok() && move_into(&dir).is_ok());
    if !joined {
        eprintln!(
            "ftkv: no CPU control group for the simulated hosts: each host's ranks are \
             scheduled as a group of their own, and a host may wait seconds for the cores"
        );
    }
}

/// Moves this process (all its threads) into the control group at `dir`.
fn move_into(dir: &Path) -> std::io::Result<()> {
    std::fs::write(dir.join("cgroup.procs"), std::process::id().to_string())
}

/// Moves this process back to the root of the CPU hierarchy and removes cluster `id`'s control
/// group, once the job's processes have ended (the group stays while one is left).
fn remove_scheduling_group(id: &str) {
    if let Some(root) = cpu_hierarchy() {
        let dir = root.join(id);
        if dir.exists() {
            let _ = move_into(&root);
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// The ssh stand-in: skips ssh's options, takes the host name, and runs the rest of its
/// arguments with a shell (as sshd would) inside that host's namespaces and with its name.
fn write_agent(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let script = r#"#!/bin/sh
# ssh stand-in for a host simulated by ftkv: ssh [options] host command...
while [ $# -gt 0 ]; do
  case "$1" in
    -o|-p|-l|-i) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
host=$1
shift
exec ip netns exec "$host" unshare --uts sh -c "hostname $host && $*"
"#;
    std::fs::write(path, script)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}

fn ip(args: &[&str]) -> Result<()> {
    run(Command::new("ip").args(args))
}

fn run(cmd: &mut Command) -> Result<()> {
    let out = cmd.output().with_context(|| format!("running {cmd:?} (is iproute2 installed?)"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// Whether this process runs as root (simulated hosts need it).
pub fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hostfile_gives_hosts_and_slots() {
        let dir = std::env::temp_dir().join(format!("ftkv-hostfile-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("hosts");
        std::fs::write(&file, "# cluster\nnode1 slots=3\nnode2 slots=2 max_slots=4\nnode3\n\n")
            .unwrap();
        let hosts = read_hostfile(&file).unwrap();
        assert_eq!(hosts, [("node1".into(), 3), ("node2".into(), 2), ("node3".into(), 1)]);
        let flags = mapping_flags(&Hosts::Hostfile(file.clone()), 6, None).unwrap();
        assert!(!flags.contains(&"--oversubscribe".to_owned()), "{flags:?}");
        let flags = mapping_flags(&Hosts::Hostfile(file.clone()), 7, None).unwrap();
        assert!(flags.contains(&"--oversubscribe".to_owned()), "{flags:?}");
        std::fs::write(&file, "# nothing\n").unwrap();
        assert!(read_hostfile(&file).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn simulated_hosts_get_even_slots_and_no_binding() {
        let flags = mapping_flags(&Hosts::Simulated(3), 6, Some(Path::new("/h"))).unwrap();
        assert!(!flags.contains(&"--oversubscribe".to_owned()), "{flags:?}");
        let joined = flags.join(" ");
        assert!(joined.contains("--hostfile /h"), "{joined}");
        assert!(joined.contains("--bind-to none"), "{joined}");
        assert!(joined.contains(&format!("btl_tcp_if_include {SUBNET}")), "{joined}");
        assert_eq!(mapping_flags(&Hosts::ThisMachine, 6, None).unwrap(), ["--oversubscribe"]);
    }

    #[test]
    fn node_counts_are_checked() {
        assert_eq!(parse_nodes("3").unwrap(), 3);
        assert!(parse_nodes("0").is_err());
        assert!(parse_nodes("x").is_err());
    }
}
