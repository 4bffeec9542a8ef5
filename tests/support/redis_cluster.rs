//! A Redis Cluster of three primaries on loopback ports, started by the test that needs it
//! and torn down when the last test holding it lets go: `redis-server --cluster-enabled yes`
//! three times in a temporary directory, `redis-cli --cluster create`, then a wait for
//! `cluster_state:ok` on every node. Only `std` (the processes and `redis-cli`), so any
//! test binary can take it in by `#[path]`; it declares `mod support;` beside it.
//!
//! Without `redis-server` or `redis-cli` the test is skipped with a notice on the
//! process's stderr, and fails instead with `CI` set, like `support::url` for the servers
//! the other suites use.
#![allow(dead_code)]

use std::io::Write;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// How many primaries the cluster has (no replicas).
pub const PRIMARIES: usize = 3;

/// How many times a cluster is started on fresh ports before a test gives up.
const START_ATTEMPTS: usize = 5;

/// A running cluster; dropping it stops its servers and removes their directory.
pub struct LocalCluster {
    servers: Vec<Child>,
    dir: PathBuf,
    ports: Vec<u16>,
}

/// The cluster the tests of this process share while at least one holds it.
static SHARED: Mutex<Weak<LocalCluster>> = Mutex::new(Weak::new());

impl LocalCluster {
    /// The cluster the running tests share, started if none holds one; `None` (after a
    /// visible notice, a panic under `CI`) when `redis-server` or `redis-cli` is missing.
    pub fn shared(suite: &str) -> Option<Arc<LocalCluster>> {
        let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(cluster) = shared.upgrade() {
            return Some(cluster);
        }
        let cluster = Arc::new(LocalCluster::start(suite)?);
        *shared = Arc::downgrade(&cluster);
        Some(cluster)
    }

    /// Starts a cluster of its own (see [`LocalCluster::shared`] for `None`).
    pub fn start(suite: &str) -> Option<LocalCluster> {
        for tool in ["redis-server", "redis-cli"] {
            let version = Command::new(tool).arg("--version").output();
            // `Redis server v=7.0.15 …`, `redis-cli 7.0.15`: 7.0 has `cluster-port`.
            let major = version.as_ref().ok().and_then(|out| {
                let text = String::from_utf8_lossy(&out.stdout).into_owned();
                let number = text.split([' ', '=']).find(|w| w.contains('.'))?.to_owned();
                number.split('.').next()?.parse::<u32>().ok()
            });
            let missing = match (&version, major) {
                (Err(e), _) => format!("no {tool} ({e})"),
                (Ok(_), Some(major)) if major >= 7 => continue,
                (Ok(out), _) => format!(
                    "{tool} is older than 7.0 ({})",
                    String::from_utf8_lossy(&out.stdout).trim()
                ),
            };
            assert!(
                std::env::var_os("CI").is_none(),
                "{suite} needs redis-server and redis-cli 7.0 or later to start a local Redis Cluster: {missing}; CI never skips a backend"
            );
            let _ = writeln!(
                std::io::stderr(),
                "\nSKIPPED {suite}: cannot start a local Redis Cluster: {missing}"
            );
            return None;
        }
        // A port found free can be taken before its server binds it (another process's
        // listener, or an outgoing connection's source port, come from the same range):
        // such a node exits at once, and the cluster starts again on other ports.
        let mut taken = Vec::new();
        for _ in 0..START_ATTEMPTS {
            match LocalCluster::launch() {
                Ok(cluster) => return Some(cluster),
                Err(why) => taken.push(why),
            }
        }
        panic!(
            "{suite}: no local Redis Cluster after {START_ATTEMPTS} attempts: {}",
            taken.join("; ")
        );
    }

    /// Starts three nodes on ports free a moment ago and joins them into a cluster; `Err`
    /// when a node exited before answering (its port taken), its servers stopped.
    fn launch() -> Result<LocalCluster, String> {
        let dir = std::env::temp_dir().join(crate::support::unique("tc-redis-cluster"));
        std::fs::create_dir_all(&dir).expect("a temporary directory for the cluster");
        let mut cluster = LocalCluster {
            servers: Vec::new(),
            dir,
            ports: Vec::new(),
        };
        // Each node's client port and cluster bus port (Redis 7's `cluster-port`), all free.
        let mut free = free_ports(2 * PRIMARIES).into_iter();
        for _ in 0..PRIMARIES {
            let (port, bus) = (free.next().unwrap(), free.next().unwrap());
            let server = Command::new("redis-server")
                .args([
                    "--port",
                    &port.to_string(),
                    "--cluster-port",
                    &bus.to_string(),
                ])
                .args(["--bind", "127.0.0.1", "--cluster-enabled", "yes"])
                .args(["--cluster-config-file", &format!("nodes-{port}.conf")])
                .args(["--cluster-node-timeout", "5000"])
                .args(["--save", "", "--appendonly", "no"])
                .arg("--dir")
                .arg(&cluster.dir)
                .stdout(Stdio::null())
                .spawn()
                .expect("redis-server starts");
            cluster.servers.push(server);
            cluster.ports.push(port);
        }
        // Each port answered by its own node (`INFO server` names the process), not by
        // whatever else holds the port while our node fails to bind it and exits.
        let pids: Vec<u32> = cluster.servers.iter().map(Child::id).collect();
        for (port, pid) in cluster.ports.clone().into_iter().zip(pids) {
            let own = format!("process_id:{pid}");
            cluster.wait_for(port, &["INFO", "server"], |out| {
                out.lines().any(|line| line.trim_end() == own)
            })?;
        }
        let created = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(cluster.ports.iter().map(|p| format!("127.0.0.1:{p}")))
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .expect("redis-cli runs");
        assert!(
            created.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&created.stderr)
        );
        for port in cluster.ports.clone() {
            let ok = |out: &str| out.contains("cluster_state:ok");
            if let Err(why) = cluster.wait_for(port, &["CLUSTER", "INFO"], ok) {
                panic!("{why} after the cluster was created");
            }
        }
        Ok(cluster)
    }

    /// Waits until `redis-cli -p port ARGS` answers with what `expected` accepts; `Err` if
    /// a node exited meanwhile.
    fn wait_for(
        &mut self,
        port: u16,
        args: &[&str],
        expected: impl Fn(&str) -> bool,
    ) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let out = Command::new("redis-cli")
                .args(["-h", "127.0.0.1", "-p", &port.to_string()])
                .args(args)
                .output()
                .expect("redis-cli runs");
            if expected(&String::from_utf8_lossy(&out.stdout)) {
                return Ok(());
            }
            for (server, node) in self.servers.iter_mut().zip(&self.ports) {
                if let Ok(Some(status)) = server.try_wait() {
                    return Err(format!(
                        "the node on port {node} exited ({status}); its port may have been taken"
                    ));
                }
            }
            assert!(
                Instant::now() < deadline,
                "node 127.0.0.1:{port} never answered {args:?} as expected"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The nodes' client ports.
    pub fn ports(&self) -> &[u16] {
        &self.ports
    }

    /// `redis://127.0.0.1:PORT` of each node.
    pub fn node_urls(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect()
    }

    /// `redis+cluster://127.0.0.1:P1,127.0.0.1:P2,…`, the store's URL form.
    pub fn url(&self) -> String {
        let nodes: Vec<String> = self
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis+cluster://{}", nodes.join(","))
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        for server in &mut self.servers {
            let _ = server.kill();
            let _ = server.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `n` distinct loopback ports that were free a moment ago (the listeners are held until
/// all are chosen, so none repeats).
fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("a free loopback port"))
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().expect("its address").port())
        .collect()
}
