//! A whole setup: four pods and Envoy on a rendered config.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::envoy::{Envoy, EnvoyOptions, EnvoyStartError};
use crate::http::Reply;
use crate::paths::wasm_module;
use crate::pod::Pod;
use crate::ports::Ports;
use crate::process::wait_until;
use crate::prompts::{chat_body, completion_body};
use crate::render::render_config;
use crate::test_dir::TestDir;

/// An edit of the plugin configuration JSON.
pub type PluginPatch = Box<dyn FnMut(&mut Value)>;

/// An edit of the rendered YAML text, given the ports it was rendered on.
type ConfigEdit = Box<dyn FnOnce(String, &Ports) -> String>;

/// Builds a test setup: four podsim pods (named `pod-1`..`pod-4`) on the
/// ports of the config's four endpoints, and Envoy on a rendered config.
pub struct Setup {
    config: &'static str,
    options: EnvoyOptions,
    patches: Vec<PluginPatch>,
    edits: Vec<ConfigEdit>,
    /// Extra podsim arguments for every pod.
    pod_args: Vec<&'static str>,
}

/// A running setup. Fields drop in order: Envoy first, then the pods.
pub struct Running {
    pub envoy: Envoy,
    pub pods: Vec<Pod>,
    pub ports: Ports,
    pub dir: TestDir,
}

impl Setup {
    /// A setup on `envoy/<config>`.
    pub fn new(config: &'static str) -> Setup {
        Setup {
            config,
            options: EnvoyOptions::default(),
            patches: Vec::new(),
            edits: Vec::new(),
            pod_args: Vec::new(),
        }
    }

    /// podsim arguments for every pod, in place of [`Pod::start`]'s
    /// (`--time-scale 0`), e.g. a small KV cache.
    pub fn pod_args(mut self, args: &[&'static str]) -> Setup {
        self.pod_args.extend_from_slice(args);
        self
    }

    /// Envoy worker threads (`--concurrency`).
    pub fn concurrency(mut self, n: u32) -> Setup {
        self.options.concurrency = n;
        self
    }

    /// Patches the plugin configuration JSON before Envoy starts (patches
    /// apply in the order given).
    pub fn patch(mut self, patch: impl FnMut(&mut Value) + 'static) -> Setup {
        self.patches.push(Box::new(patch));
        self
    }

    /// Sets one top-level field of the plugin configuration.
    pub fn plugin_field(self, key: &'static str, value: Value) -> Setup {
        self.patch(move |config| {
            config[key] = value.clone();
        })
    }

    /// Edits the rendered YAML text (after ports and plugin JSON), e.g. a
    /// shorter route timeout. Panics if the edit changed nothing.
    pub fn edit_yaml(mut self, from: &'static str, to: &'static str) -> Setup {
        self.edits.push(Box::new(move |text: String, _: &Ports| {
            assert!(text.contains(from), "config has no {from:?} to edit");
            text.replace(from, to)
        }));
        self
    }

    /// Edits the rendered YAML text with `edit`, which also gets the ports
    /// (after ports and plugin JSON), e.g. a bootstrap service taken out.
    /// Panics if the edit changed nothing.
    pub fn edit(mut self, edit: impl FnOnce(String, &Ports) -> String + 'static) -> Setup {
        self.edits
            .push(Box::new(move |text: String, ports: &Ports| {
                let edited = edit(text.clone(), ports);
                assert_ne!(edited, text, "the edit changed nothing");
                edited
            }));
        self
    }

    /// Loads `module` in place of the filter's release build (e.g. the
    /// fault-injection build).
    pub fn module(mut self, module: PathBuf) -> Setup {
        self.edits.push(Box::new(move |text: String, _: &Ports| {
            let from = wasm_module().display().to_string();
            assert!(text.contains(&from), "config loads no {from}");
            text.replace(&from, &module.display().to_string())
        }));
        self
    }

    /// Renders the config into a scratch dir; Envoy is not started.
    pub fn render(mut self) -> (TestDir, Ports, PathBuf) {
        let dir = TestDir::new(self.config.trim_end_matches(".yaml"));
        let ports = Ports::free();
        let mut patches = std::mem::take(&mut self.patches);
        let path = render_config(&dir, self.config, &ports, &mut |config: &mut Value| {
            for patch in patches.iter_mut() {
                patch(config);
            }
        });
        if !self.edits.is_empty() {
            let mut text = fs::read_to_string(&path).expect("read rendered config");
            for edit in self.edits.drain(..) {
                text = edit(text, &ports);
            }
            fs::write(&path, text).expect("write edited config");
        }
        (dir, ports, path)
    }

    /// Starts Envoy alone (no pods); for tests that expect startup to fail.
    pub fn start_envoy_only(self) -> (TestDir, Result<Envoy, EnvoyStartError>) {
        let options = self.options.clone();
        let (dir, ports, path) = self.render();
        let envoy = Envoy::start(&path, &ports, dir.join("envoy.log"), &options);
        (dir, envoy)
    }

    /// Starts the four pods, then Envoy; panics (with Envoy's log) on failure.
    pub fn start(self) -> Running {
        let options = self.options.clone();
        let pod_args = self.pod_args.clone();
        let (dir, ports, path) = self.render();
        Running::start(dir, ports, &path, &options, &pod_args)
    }
}

impl Running {
    /// Starts four pods (`pod-1`..`pod-4`, with `pod_args` in place of
    /// [`Pod::start`]'s when given) on `ports.pods`, then Envoy on the
    /// rendered config at `config`, its log in `dir`; panics (with Envoy's
    /// log) on failure.
    pub fn start(
        dir: TestDir,
        ports: Ports,
        config: &Path,
        options: &EnvoyOptions,
        pod_args: &[&str],
    ) -> Running {
        let pods = ports
            .pods
            .iter()
            .enumerate()
            .map(|(i, &port)| {
                let name = format!("pod-{}", i + 1);
                if pod_args.is_empty() {
                    Pod::start(&dir, &name, port)
                } else {
                    Pod::start_with(&dir, &name, port, pod_args)
                }
            })
            .collect();
        let envoy = Envoy::start(config, &ports, dir.join("envoy.log"), options)
            .unwrap_or_else(|e| panic!("{e}"));
        Running {
            envoy,
            pods,
            ports,
            dir,
        }
    }

    /// The pod that answered as `name`.
    pub fn pod_named(&self, name: &str) -> &Pod {
        self.pods
            .iter()
            .find(|p| p.name == name)
            .unwrap_or_else(|| panic!("no pod named {name:?}"))
    }

    /// POSTs a JSON body to `path` through Envoy on a new connection.
    pub fn post(&self, path: &str, body: &str) -> Reply {
        self.post_with(path, body, &[])
    }

    /// Like [`Running::post`] with extra request headers.
    pub fn post_with(&self, path: &str, body: &str, headers: &[(&str, &str)]) -> Reply {
        self.envoy
            .post_json(path, body, headers)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// POSTs an OpenAI completions request.
    pub fn complete(&self, prompt: &Value) -> Reply {
        self.post("/v1/completions", &completion_body(prompt))
    }

    /// POSTs an OpenAI chat completions request.
    pub fn chat(&self, messages: &[(&str, &str)]) -> Reply {
        self.post("/v1/chat/completions", &chat_body(messages))
    }

    /// Waits (bounded) until every in-flight gauge reads 0; returns the gauges.
    pub fn wait_inflight_zero(&self, timeout: Duration) -> BTreeMap<String, i64> {
        let mut last = BTreeMap::new();
        wait_until(timeout, || {
            last = self.envoy.inflight();
            last.values().all(|&v| v == 0)
        });
        last
    }
}

// HTTP
