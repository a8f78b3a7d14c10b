//! The peer stores `ftkv bench store` compares against, started by ftkv itself on 127.0.0.1
//! only: Redis 7 (1 primary + 2 replicas) and etcd 3.4 (3 members, data on tmpfs), both from
//! Debian's packages; and the minimal clients that give each its best numbers.
//!
//! Every server is a child process whose PID is registered; [`Servers`] kills them on drop, and
//! a Ctrl-C handler kills every registered server before the process exits.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

/// PIDs of every server started by this process, for the Ctrl-C handler.
static RUNNING: Mutex<Vec<u32>> = Mutex::new(Vec::new());

/// Installs (once) the interrupt handler, which kills the registered servers and exits.
pub fn install_interrupt_handler() -> Result<()> {
    static REGISTERED: std::sync::Once = std::sync::Once::new();
    REGISTERED.call_once(|| ftkv_launch::interrupt::on_interrupt(kill_registered));
    ftkv_launch::interrupt::install()
}

/// Kills every registered server.
pub fn kill_registered() {
    let pids = RUNNING.lock().unwrap_or_else(|p| p.into_inner()).clone();
    for pid in pids {
        if let Err(e) = ftkv_launch::launch::kill_pid(pid).map(drop) {
            eprintln!("ftkv: stopping server {pid}: {e}");
        }
    }
}

/// Debian packages the peers come from; installed with apt when their binaries are missing.
pub fn ensure_installed() -> Result<()> {
    let missing: Vec<&str> = [("redis-server", "redis-server"), ("etcd", "etcd-server")]
        .iter()
        .filter(|(bin, _)| which(bin).is_none())
        .map(|&(_, package)| package)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("[peers] installing {} with apt", missing.join(" "));
    let status = Command::new("apt-get")
        .args(["install", "-y", "-q", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdout(Stdio::null())
        .status()
        .context("running apt-get")?;
    ensure!(status.success(), "apt-get install {} failed", missing.join(" "));
    for service in ["redis-server", "etcd"] {
        let _ = Command::new("service")
            .args([service, "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    Ok(())
}

fn which(binary: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(binary)).find(|p| p.is_file())
}

/// A group of server processes, killed (by PID) when dropped.
pub struct Servers {
    children: Vec<Child>,
    scratch: Vec<PathBuf>,
}

impl Servers {
    fn new() -> Servers {
        Servers { children: Vec::new(), scratch: Vec::new() }
    }

    fn spawn(&mut self, command: &mut Command) -> Result<()> {
        let program = format!("{:?}", command.get_program());
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {program}"))?;
        RUNNING.lock().unwrap_or_else(|p| p.into_inner()).push(child.id());
        self.children.push(child);
        Ok(())
    }

    fn check_alive(&mut self) -> Result<()> {
        for child in &mut self.children {
            if let Some(status) = child.try_wait()? {
                bail!("server {} exited early: {status}", child.id());
            }
        }
        Ok(())
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        let mut running = RUNNING.lock().unwrap_or_else(|p| p.into_inner());
        for child in &mut self.children {
            running.retain(|&pid| pid != child.id());
            if let Err(e) = child.kill().and_then(|()| child.wait().map(drop)) {
                eprintln!("ftkv: stopping server {}: {e}", child.id());
            }
        }
        for dir in &self.scratch {
            if let Err(e) = std::fs::remove_dir_all(dir) {
                eprintln!("ftkv: removing {}: {e}", dir.display());
            }
        }
    }
}

/// Polls `ready` every 50 ms until it returns true or `bound` passes.
fn wait_until(
    what: &str,
    bound: Duration,
    servers: &mut Servers,
    mut ready: impl FnMut() -> bool,
) -> Result<()> {
    let start = Instant::now();
    while !ready() {
        servers.check_alive()?;
        ensure!(start.elapsed() < bound, "{what} not ready after {bound:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// Ports of the Redis primary and its two replicas.
pub const REDIS_PORTS: [u16; 3] = [16390, 16391, 16392];

/// Starts Redis: a primary and two replicas of it, no persistence, and waits until both
/// replicas are connected.
pub fn start_redis() -> Result<Servers> {
    let mut servers = Servers::new();
    let dir = scratch_dir("redis")?;
    for (i, port) in REDIS_PORTS.iter().enumerate() {
        let mut cmd = Command::new("redis-server");
        cmd.args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .args(["--protected-mode", "no", "--dir", &dir.to_string_lossy()])
        .args(["--dbfilename", &format!("dump{port}.rdb")]);
        if i > 0 {
            cmd.args(["--replicaof", "127.0.0.1", &REDIS_PORTS[0].to_string()]);
        }
        servers.spawn(&mut cmd)?;
    }
    servers.scratch.push(dir);
    wait_until("redis replication", Duration::from_secs(20), &mut servers, || {
        let info = RedisClient::connect(REDIS_PORTS[0]).and_then(|mut c| c.info_replication());
        info.is_ok_and(|i| i.contains("connected_slaves:2"))
            && REDIS_PORTS[1..].iter().all(|&p| {
                RedisClient::connect(p)
                    .and_then(|mut c| c.info_replication())
                    .is_ok_and(|i| i.contains("master_link_status:up"))
            })
    })?;
    wait_until("redis WAIT acknowledgements", Duration::from_secs(20), &mut servers, || {
        let start = Instant::now();
        let written = RedisClient::connect(REDIS_PORTS[0])
            .and_then(|mut c| c.set_and_wait(b"ftkv-warm-up", b"1"));
        written.is_ok() && start.elapsed() < Duration::from_millis(20)
    })?;
    Ok(servers)
}

fn scratch_dir(name: &str) -> Result<PathBuf> {
    let base = if std::path::Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let dir = base.join(format!("ftkv-bench-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// A Redis connection (the `redis` crate, synchronous), with the two calls the benchmark makes:
/// a write followed by `WAIT` for both replicas in one round trip, and a read.
pub struct RedisClient {
    connection: redis::Connection,
}

impl RedisClient {
    pub fn connect(port: u16) -> Result<RedisClient> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?;
        let connection = client
            .get_connection_with_timeout(Duration::from_secs(10))
            .with_context(|| format!("connecting to redis on {port}"))?;
        connection.set_read_timeout(Some(Duration::from_secs(10)))?;
        Ok(RedisClient { connection })
    }

    fn info_replication(&mut self) -> Result<String> {
        Ok(redis::cmd("INFO").arg("replication").query(&mut self.connection)?)
    }

    /// `SET key value` and `WAIT 2 5000` pipelined; fails unless both replicas acknowledged.
    pub fn set_and_wait(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        let mut pipe = redis::pipe();
        pipe.cmd("SET").arg(key).arg(value).ignore();
        self.wait_for_replicas(pipe, "SET")
    }

    /// `DEL key` and `WAIT 2 5000` pipelined.
    pub fn del_and_wait(&mut self, key: &[u8]) -> Result<()> {
        let mut pipe = redis::pipe();
        pipe.cmd("DEL").arg(key).ignore();
        self.wait_for_replicas(pipe, "DEL")
    }

    fn wait_for_replicas(&mut self, mut pipe: redis::Pipeline, op: &str) -> Result<()> {
        pipe.cmd("WAIT").arg(2).arg(5000);
        let (replicas,): (i64,) = pipe.query(&mut self.connection)?;
        ensure!(replicas >= 2, "{op}: WAIT answered {replicas}, not 2 replicas");
        Ok(())
    }

    pub fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(redis::cmd("GET").arg(key).query(&mut self.connection)?)
    }
}

/// Client and peer ports of the three etcd members.
pub const ETCD_PORTS: [(u16, u16); 3] = [(12379, 12380), (22379, 22380), (32379, 32380)];

/// Starts a 3-member etcd cluster with its data directories on tmpfs and waits until every
/// member answers a linearizable read.
pub fn start_etcd() -> Result<Servers> {
    let mut servers = Servers::new();
    let dir = scratch_dir("etcd")?;
    let cluster: Vec<String> = ETCD_PORTS
        .iter()
        .enumerate()
        .map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}"))
        .collect();
    for (i, (client, peer)) in ETCD_PORTS.iter().enumerate() {
        let data = dir.join(format!("m{i}"));
        let mut cmd = Command::new("etcd");
        cmd.args(["--name", &format!("m{i}"), "--data-dir", &data.to_string_lossy()])
            .args(["--listen-client-urls", &format!("http://127.0.0.1:{client}")])
            .args(["--advertise-client-urls", &format!("http://127.0.0.1:{client}")])
            .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
            .args(["--initial-advertise-peer-urls", &format!("http://127.0.0.1:{peer}")])
            .args(["--initial-cluster", &cluster.join(","), "--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", "ftkv-bench", "--max-request-bytes", "8388608"])
            .args(["--quota-backend-bytes", "8589934592", "--auto-compaction-mode", "revision"])
            .args([
                "--auto-compaction-retention",
                "1000",
                "--logger",
                "zap",
                "--log-level",
                "error",
            ])
            .env("ETCD_UNSUPPORTED_ARCH", std::env::consts::ARCH);
        servers.spawn(&mut cmd)?;
    }
    servers.scratch.push(dir);
    wait_until("etcd", Duration::from_secs(30), &mut servers, || {
        ETCD_PORTS.iter().all(|&(port, _)| {
            EtcdClient::connect(port).and_then(|mut c| c.get(b"ftkv-ready", false)).is_ok()
        })
    })?;
    Ok(servers)
}

/// An etcd v3 gRPC client (the `etcd-client` crate, etcd's native protocol) driven by a
/// single-threaded runtime, so each writer thread has its own connection.
pub struct EtcdClient {
    runtime: tokio::runtime::Runtime,
    client: etcd_client::Client,
}

impl EtcdClient {
    pub fn connect(port: u16) -> Result<EtcdClient> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let endpoint = format!("http://127.0.0.1:{port}");
        let options = etcd_client::ConnectOptions::new().with_timeout(Duration::from_secs(10));
        let client = runtime
            .block_on(etcd_client::Client::connect([endpoint], Some(options)))
            .with_context(|| format!("connecting to etcd on {port}"))?;
        Ok(EtcdClient { runtime, client })
    }

    /// A put, acknowledged once a quorum of members has it (etcd's guarantee).
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        self.runtime.block_on(self.client.put(key, value, None))?;
        Ok(())
    }

    pub fn delete(&mut self, key: &[u8]) -> Result<()> {
        self.runtime.block_on(self.client.delete(key, None))?;
        Ok(())
    }

    /// The value of `key`; `serializable` reads this member's own copy without the leader.
    pub fn get(&mut self, key: &[u8], serializable: bool) -> Result<Option<Vec<u8>>> {
        let options = serializable.then(|| etcd_client::GetOptions::new().with_serializable());
        let reply = self.runtime.block_on(self.client.get(key, options))?;
        Ok(reply.kvs().first().map(|kv| kv.value().to_vec()))
    }

    /// This member's id and its leader's id.
    pub fn status(&mut self) -> Result<(u64, u64)> {
        let status = self.runtime.block_on(self.client.status())?;
        let member = status.header().map_or(0, |h| h.member_id());
        Ok((member, status.leader()))
    }
}
