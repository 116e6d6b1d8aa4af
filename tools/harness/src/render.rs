//! `envoy/*.yaml` rendered for a test: placeholder ports replaced, module
//! paths made absolute, plugin JSON patched; and EDS files.

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::paths::{repo_root, with_module_paths, WASM_REL_PATH};
use crate::ports::Ports;
use crate::test_dir::TestDir;

/// Reads `envoy/<name>` from the repository.
pub fn envoy_template(name: &str) -> String {
    let path = repo_root().join("envoy").join(name);
    fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// Replaces every whole number in `text` that is a placeholder port by its
/// test port, in one pass (so a substituted port is never rewritten again).
pub fn substitute_ports(text: &str, ports: &Ports) -> String {
    let mut out = String::with_capacity(text.len());
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i].is_ascii_digit() {
            let start = i;
            while i < bytes.len() && bytes[i].is_ascii_digit() {
                i += 1;
            }
            let run = &text[start..i];
            match run.parse::<u16>().ok().and_then(|p| ports.substitution(p)) {
                Some(port) => out.push_str(&port.to_string()),
                None => out.push_str(run),
            }
        } else {
            let ch = text[i..].chars().next().expect("char boundary");
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

/// Applies `patch` to the plugin configuration JSON of every wasm plugin in an
/// Envoy config: the block scalar that follows a `value: |` line and parses as
/// a JSON object. The JSON is written back pretty-printed at the same indent.
pub fn patch_plugin_json(yaml: &str, patch: &mut dyn FnMut(&mut Value)) -> String {
    let lines: Vec<&str> = yaml.lines().collect();
    let mut out: Vec<String> = Vec::with_capacity(lines.len());
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        out.push(line.to_string());
        i += 1;
        if line.trim_end().ends_with("value: |") {
            let key_indent = indent_of(line);
            let start = i;
            while i < lines.len()
                && (lines[i].trim().is_empty() || indent_of(lines[i]) > key_indent)
            {
                i += 1;
            }
            let block = &lines[start..i];
            let body_indent = block
                .iter()
                .filter(|l| !l.trim().is_empty())
                .map(|l| indent_of(l))
                .min()
                .unwrap_or(key_indent + 2);
            let json: String = block
                .iter()
                .map(|l| l.get(body_indent..).unwrap_or(""))
                .collect::<Vec<_>>()
                .join("\n");
            match serde_json::from_str::<Value>(&json) {
                Ok(mut value) if value.is_object() => {
                    patch(&mut value);
                    let pretty = serde_json::to_string_pretty(&value).expect("serialize JSON");
                    let pad = " ".repeat(body_indent);
                    out.extend(pretty.lines().map(|l| format!("{pad}{l}")));
                }
                _ => out.extend(block.iter().map(|l| l.to_string())),
            }
        }
    }
    let mut text = out.join("\n");
    text.push('\n');
    text
}

fn indent_of(line: &str) -> usize {
    line.len() - line.trim_start_matches(' ').len()
}

/// `envoy/<name>` with its placeholder ports replaced, the wasm module
/// paths made absolute (so a custom target dir works) and the plugin JSON
/// patched.
pub fn render_text(name: &str, ports: &Ports, patch: &mut dyn FnMut(&mut Value)) -> String {
    let text = with_module_paths(&substitute_ports(&envoy_template(name), ports));
    patch_plugin_json(&text, patch)
}

/// [`render_text`] written to `dir`; returns the path of the written file.
pub fn render_config(
    dir: &TestDir,
    name: &str,
    ports: &Ports,
    patch: &mut dyn FnMut(&mut Value),
) -> PathBuf {
    let text = render_text(name, ports, patch);
    let path = dir.join(name);
    fs::write(&path, text).expect("write rendered envoy config");
    path
}

/// One endpoint of an EDS file: its hostname (the pod name), its port on
/// 127.0.0.1 and Envoy's health status for it (`HEALTHY`, `UNHEALTHY`, ...).
pub type EdsHost = (String, u16, &'static str);

/// `envoy/lds.yaml` rendered into `dir`, its listeners delivered from the
/// file `listener.yaml` beside it (write that with [`write_lds_listeners`]);
/// returns (bootstrap path, listener file path).
pub fn render_lds(dir: &TestDir, ports: &Ports) -> (PathBuf, PathBuf) {
    let path = render_config(dir, "lds.yaml", ports, &mut |_| {});
    let listener = dir.join("listener.yaml");
    let text = fs::read_to_string(&path).expect("read rendered lds.yaml");
    assert!(
        text.contains("envoy/lds/listener.yaml"),
        "lds.yaml names no listener file"
    );
    let text = text.replace("envoy/lds/listener.yaml", &listener.display().to_string());
    fs::write(&path, text).expect("write lds.yaml");
    (path, listener)
}

/// One listener of `envoy/lds/listener.yaml` (the `ingress` listener on
/// `ports.listener`) as an LDS resource, renamed `name` (the listener, its
/// filter chain and its stat prefix) and listening on `port`, loading
/// `module`, its plugin configuration patched.
pub fn lds_listener(
    ports: &Ports,
    name: &str,
    port: u16,
    module: &Path,
    patch: &mut dyn FnMut(&mut Value),
) -> String {
    let text = substitute_ports(&envoy_template("lds/listener.yaml"), ports)
        .replace(WASM_REL_PATH, &module.display().to_string());
    let text = patch_plugin_json(&text, patch);
    let (_, item) = text
        .split_once("resources:\n")
        .expect("lds/listener.yaml has a resources list");
    let listen = format!("port_value: {}", ports.listener);
    assert!(item.contains(&listen) && item.contains("name: ingress"));
    let chain = "      - filters:\n";
    assert!(item.contains(chain), "lds/listener.yaml's chain moved");
    item.replacen("name: ingress", &format!("name: {name}"), 1)
        .replacen(
            chain,
            &format!("      - name: {name}\n        filters:\n"),
            1,
        )
        .replace("stat_prefix: ingress", &format!("stat_prefix: {name}"))
        .replace(&listen, &format!("port_value: {port}"))
}

/// Writes an LDS file of `listeners` (from [`lds_listener`]) over `path`
/// through a rename, as a control plane's update lands (Envoy's file watch
/// follows the move).
pub fn write_lds_listeners(path: &Path, listeners: &[String]) {
    let text = format!("resources:\n{}", listeners.concat());
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, text).expect("write listener file");
    fs::rename(&tmp, path).expect("move listener file in place");
}

/// Writes the `pods` cluster's EDS file by rename (Envoy's file watch
/// follows moves, and never sees a half-written file).
pub fn write_eds(path: &Path, hosts: &[EdsHost]) {
    let endpoints: Vec<_> = hosts
        .iter()
        .map(|(name, port, health)| {
            serde_json::json!({
                "endpoint": {
                    "hostname": name,
                    "address": { "socket_address": { "address": "127.0.0.1", "port_value": port } }
                },
                "health_status": health
            })
        })
        .collect();
    let doc = serde_json::json!({
        "resources": [{
            "@type": "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
            "cluster_name": "pods",
            "endpoints": [{ "lb_endpoints": endpoints }]
        }]
    });
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, serde_json::to_string_pretty(&doc).expect("EDS json")).expect("write EDS");
    fs::rename(&tmp, path).expect("rename EDS");
}
