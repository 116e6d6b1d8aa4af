//! Who the pods are and which may take traffic, as Envoy sees them: parses
//! the admin `/clusters?format=json` reply for one upstream cluster.
//!
//! A host is routable unless Envoy marks it otherwise: failed active health
//! check, outlier ejection, EDS health `UNHEALTHY`/`DRAINING`/`TIMEOUT`, or
//! pending removal. A host that left the cluster is simply absent.

use std::fmt;

use serde::Deserialize;

/// How a pod is named in the table and in sync payloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum PodNaming {
    /// `ip:port`, the endpoint's address.
    #[default]
    Address,
    /// The endpoint's `hostname` (e.g. the Kubernetes pod name as EDS sets
    /// it), else its address.
    Hostname,
}

/// One host of the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// Stable pod name (see [`PodNaming`]).
    pub name: String,
    /// `ip:port`, what the destination header must carry.
    pub address: String,
    pub healthy: bool,
}

/// Why a reply could not be used (the last good member set stays).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MembershipError {
    Malformed(String),
    /// The cluster is not in the reply.
    NoCluster(String),
    /// The cluster has no hosts at all.
    Empty(String),
}

impl fmt::Display for MembershipError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MembershipError::Malformed(e) => write!(f, "malformed /clusters reply: {e}"),
            MembershipError::NoCluster(c) => write!(f, "cluster `{c}` not in the /clusters reply"),
            MembershipError::Empty(c) => write!(f, "cluster `{c}` has no hosts"),
        }
    }
}

#[derive(Deserialize)]
struct Clusters {
    #[serde(default)]
    cluster_statuses: Vec<ClusterStatus>,
}

#[derive(Deserialize)]
struct ClusterStatus {
    name: String,
    #[serde(default)]
    host_statuses: Vec<HostStatus>,
}

#[derive(Deserialize)]
struct HostStatus {
    address: Option<Address>,
    #[serde(default)]
    hostname: String,
    #[serde(default)]
    health_status: Health,
}

#[derive(Deserialize)]
struct Address {
    socket_address: Option<SocketAddress>,
}

#[derive(Deserialize)]
struct SocketAddress {
    address: String,
    #[serde(default)]
    port_value: u32,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Health {
    failed_active_health_check: bool,
    failed_outlier_check: bool,
    pending_dynamic_removal: bool,
    excluded_via_immediate_hc_fail: bool,
    active_hc_timeout: bool,
    eds_health_status: String,
}

impl Health {
    fn routable(&self) -> bool {
        !(self.failed_active_health_check
            || self.failed_outlier_check
            || self.pending_dynamic_removal
            || self.excluded_via_immediate_hc_fail
            || self.active_hc_timeout
            || matches!(
                self.eds_health_status.as_str(),
                "UNHEALTHY" | "DRAINING" | "TIMEOUT"
            ))
    }
}

/// Most hosts taken from one cluster.
pub const MAX_HOSTS: usize = 1024;

/// The hosts of `cluster` in an admin `/clusters?format=json` reply. Hosts
/// without a socket address are skipped; names longer than the registry
/// takes fall back to the address.
pub fn parse_clusters(
    json: &[u8],
    cluster: &str,
    naming: PodNaming,
) -> Result<Vec<Host>, MembershipError> {
    let parsed: Clusters =
        serde_json::from_slice(json).map_err(|e| MembershipError::Malformed(e.to_string()))?;
    let status = parsed
        .cluster_statuses
        .into_iter()
        .find(|c| c.name == cluster)
        .ok_or_else(|| MembershipError::NoCluster(cluster.to_string()))?;
    let mut hosts: Vec<Host> = status
        .host_statuses
        .into_iter()
        .filter_map(|h| {
            let sa = h.address?.socket_address?;
            let port = u16::try_from(sa.port_value).ok().filter(|p| *p > 0)?;
            let address = if sa.address.contains(':') {
                format!("[{}]:{port}", sa.address)
            } else {
                format!("{}:{port}", sa.address)
            };
            let name = match naming {
                PodNaming::Hostname
                    if !h.hostname.is_empty()
                        && h.hostname.len() <= crate::shared::registry::MAX_NAME =>
                {
                    h.hostname
                }
                _ => address.clone(),
            };
            Some(Host {
                name,
                address,
                healthy: h.health_status.routable(),
            })
        })
        .take(MAX_HOSTS)
        .collect();
    if hosts.is_empty() {
        return Err(MembershipError::Empty(cluster.to_string()));
    }
    hosts.sort_by(|a, b| a.name.cmp(&b.name));
    hosts.dedup_by(|a, b| a.name == b.name);
    Ok(hosts)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// Shaped like Envoy 1.40's reply (stats trimmed).
    const REPLY: &str = r#"{"cluster_statuses":[
      {"name":"other","host_statuses":[{"address":{"socket_address":{"address":"127.0.0.1","port_value":1}},"health_status":{"eds_health_status":"HEALTHY"}}]},
      {"name":"pods","host_statuses":[
        {"address":{"socket_address":{"address":"10.0.0.2","port_value":8000}},"stats":[{"name":"cx_total"}],"health_status":{"eds_health_status":"HEALTHY"},"weight":1,"hostname":"pod-b","locality":{}},
        {"address":{"socket_address":{"address":"10.0.0.1","port_value":8000}},"health_status":{"eds_health_status":"HEALTHY","failed_outlier_check":true},"hostname":"pod-a"},
        {"address":{"socket_address":{"address":"10.0.0.3","port_value":8000}},"health_status":{"eds_health_status":"UNHEALTHY"}},
        {"address":{"socket_address":{"address":"10.0.0.4","port_value":8000}},"health_status":{"failed_active_health_check":true}},
        {"address":{"pipe":{"path":"/x"}},"health_status":{}}
      ]}]}"#;

    #[test]
    fn hosts_of_the_named_cluster_with_envoys_health() {
        let hosts = parse_clusters(REPLY.as_bytes(), "pods", PodNaming::Address).unwrap();
        let got: Vec<(&str, bool)> = hosts.iter().map(|h| (h.name.as_str(), h.healthy)).collect();
        assert_eq!(
            got,
            vec![
                ("10.0.0.1:8000", false),
                ("10.0.0.2:8000", true),
                ("10.0.0.3:8000", false),
                ("10.0.0.4:8000", false)
            ]
        );
    }

    #[test]
    fn hostname_naming_uses_the_endpoint_hostname_else_the_address() {
        let hosts = parse_clusters(REPLY.as_bytes(), "pods", PodNaming::Hostname).unwrap();
        let names: Vec<(&str, &str)> = hosts
            .iter()
            .map(|h| (h.name.as_str(), h.address.as_str()))
            .collect();
        assert!(names.contains(&("pod-a", "10.0.0.1:8000")));
        assert!(names.contains(&("pod-b", "10.0.0.2:8000")));
        assert!(names.contains(&("10.0.0.3:8000", "10.0.0.3:8000")));
    }

    #[test]
    fn bad_replies_are_errors_not_empty_sets() {
        assert!(matches!(
            parse_clusters(b"{not json", "pods", PodNaming::Address),
            Err(MembershipError::Malformed(_))
        ));
        assert!(matches!(
            parse_clusters(REPLY.as_bytes(), "nope", PodNaming::Address),
            Err(MembershipError::NoCluster(_))
        ));
        let empty = r#"{"cluster_statuses":[{"name":"pods","host_statuses":[]}]}"#;
        assert!(matches!(
            parse_clusters(empty.as_bytes(), "pods", PodNaming::Address),
            Err(MembershipError::Empty(_))
        ));
    }
}
