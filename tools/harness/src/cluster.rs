//! A local Redis Cluster for tests and benchmarks: cluster-enabled
//! `redis-server`s on free loopback ports (no persistence, 2 s node timeout),
//! made one cluster by `redis-cli --cluster create`; replicas added with
//! `redis-cli --cluster add-node --cluster-slave`. Every server is killed
//! and reaped on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::paths::redis_server_bin;
use crate::ports::free_port;
use crate::process::{spawn_owned, wait_until};

/// One cluster node, killed and reaped on drop.
pub struct Node {
    child: Child,
    pub port: u16,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `redis-cli`, beside `redis-server`.
pub fn redis_cli() -> PathBuf {
    redis_server_bin().with_file_name("redis-cli")
}

/// `redis-cli -h 127.0.0.1 -p port args...`, its stdout trimmed; panics if
/// the command fails.
pub fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new(redis_cli())
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run redis-cli: {e}"));
    assert!(
        out.status.success(),
        "redis-cli {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// One cluster-enabled `redis-server` on a free port, its cluster bus on
/// another (not Redis's default of the port + 10000, which nothing
/// reserved), files in `dir/node-<i>`, answering PING.
pub fn spawn_node(dir: &Path, i: usize) -> Node {
    let port = free_port();
    let bus = free_port();
    let node_dir = dir.join(format!("node-{i}"));
    std::fs::create_dir_all(&node_dir).expect("node dir");
    let child = spawn_owned(
        Command::new(redis_server_bin())
            .current_dir(&node_dir)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--cluster-enabled", "yes"])
            .args(["--cluster-port", &bus.to_string()])
            .args(["--cluster-config-file", "nodes.conf"])
            .args(["--cluster-node-timeout", "2000"])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--logfile", "redis.log"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )
    .unwrap_or_else(|e| panic!("spawn redis-server: {e}"));
    let up = wait_until(Duration::from_secs(10), || {
        Command::new(redis_cli())
            .args(["-p", &port.to_string(), "PING"])
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "PONG")
    });
    assert!(up, "redis-server on {port} not up");
    Node { child, port }
}

/// `masters` masters on free ports, all 16,384 slots assigned in equal
/// contiguous ranges, `cluster_state:ok` on every one.
pub fn start_cluster(dir: &Path, masters: usize) -> Vec<Node> {
    let cli_ok = Command::new(redis_cli())
        .args(["--cluster", "help"])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("create"));
    assert!(cli_ok, "{} has no --cluster support", redis_cli().display());
    let nodes: Vec<Node> = (0..masters).map(|i| spawn_node(dir, i)).collect();
    let addrs: Vec<String> = nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port))
        .collect();
    let mut args = vec!["--cluster", "create"];
    args.extend(addrs.iter().map(String::as_str));
    args.push("--cluster-yes");
    cli(nodes[0].port, &args);
    for n in &nodes {
        let ok = wait_until(Duration::from_secs(20), || {
            cli(n.port, &["CLUSTER", "INFO"]).contains("cluster_state:ok")
        });
        assert!(ok, "cluster not ok on {}", n.port);
    }
    nodes
}

/// A new node (files in `dir/node-<i>`) joined as a replica of the master
/// on `master`, once its replication link is up.
pub fn add_replica(dir: &Path, i: usize, seed: u16, master: u16) -> Node {
    let replica = spawn_node(dir, i);
    let master_id = cli(master, &["CLUSTER", "MYID"]);
    cli(
        seed,
        &[
            "--cluster",
            "add-node",
            &format!("127.0.0.1:{}", replica.port),
            &format!("127.0.0.1:{seed}"),
            "--cluster-slave",
            "--cluster-master-id",
            &master_id,
        ],
    );
    let linked = wait_until(Duration::from_secs(20), || {
        cli(replica.port, &["INFO", "replication"]).contains("master_link_status:up")
    });
    assert!(linked, "replica never synced with its master");
    replica
}
