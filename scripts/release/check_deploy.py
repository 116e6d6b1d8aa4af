#!/usr/bin/env python3
"""Checks the deploy/ recipes and extracts the Envoy configurations they produce.

    check_deploy.py OUT_DIR

For each recipe (deploy/kubernetes, deploy/envoy-gateway, deploy/istio):
1. renders it with `kubectl kustomize` when kubectl is on PATH, else (or with
   CHECK_DEPLOY_RENDERER=minimal) with a minimal renderer of the kustomize
   features the recipes use (resources, namespace, configMapGenerator);
2. checks every object against its schema: core Kubernetes kinds with
   kubernetes-validate (strict: unknown fields are errors), the Envoy Gateway,
   Gateway API and Istio kinds against the CRD schemas vendored in
   deploy/schemas/crds.json.gz, made strict the same way;
3. checks that each fetch-module init container runs deploy/module/fetch-module.sh
   verbatim;
4. writes to OUT_DIR the Envoy configuration each recipe produces:
   - kubernetes.yaml: the ConfigMap's envoy.yaml as shipped;
   - envoy-gateway.yaml, istio.yaml: the parts the recipe writes (the bootstrap
     merge with the singleton, bridge and admin cluster; the filter as Envoy
     Gateway's translator or the EnvoyFilter builds it, with the EnvoyPatchPolicy
     applied; the override_host policy) around a stand-in listener and pods
     cluster, on the test placeholders (docs/CONTRACTS.md) so a test can run it.
   The module path is the build's (target/wasm32-wasip1/release/...).
Prints one line per check; exits 1 on the first failure.
"""

import copy
import gzip
import json
import os
import shutil
import subprocess
import sys

import jsonschema
import kubernetes_validate
import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEPLOY = os.path.join(ROOT, "deploy")
RECIPES = ["kubernetes", "envoy-gateway", "istio"]
K8S_VERSION = "1.32.0"
WASM = "target/wasm32-wasip1/release/envoy_prefix_router.wasm"
# The test placeholders (tools/harness: PLACEHOLDER_*).
LISTENER, ADMIN, PODS, REDIS = 18080, 18901, [18001, 18002, 18003, 18004], 16379


def fail(msg):
    print(f"check_deploy: FAILED: {msg}")
    sys.exit(1)


# --- rendering ------------------------------------------------------------------------------

def render_minimal(path, seen=None):
    """The kustomize subset the recipes use."""
    k = yaml.safe_load(open(os.path.join(path, "kustomization.yaml")))
    objs = []
    for res in k.get("resources", []):
        full = os.path.normpath(os.path.join(path, res))
        if os.path.isdir(full):
            objs += render_minimal(full)
        else:
            objs += [d for d in yaml.safe_load_all(open(full)) if d]
    for gen in k.get("configMapGenerator", []):
        data = {}
        for f in gen.get("files", []):
            data[os.path.basename(f)] = open(os.path.join(path, f)).read()
        objs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": gen["name"]}, "data": data})
    if "namespace" in k:
        for o in objs:
            if o["kind"] != "Namespace":
                o.setdefault("metadata", {})["namespace"] = k["namespace"]
    return objs


def render(recipe):
    path = os.path.join(DEPLOY, recipe)
    if shutil.which("kubectl") and os.environ.get("CHECK_DEPLOY_RENDERER") != "minimal":
        out = subprocess.run(["kubectl", "kustomize", path], capture_output=True, text=True)
        if out.returncode != 0:
            fail(f"kubectl kustomize {recipe}: {out.stderr.strip()}")
        return [d for d in yaml.safe_load_all(out.stdout) if d], "kubectl kustomize"
    return render_minimal(path), "minimal renderer (no kubectl)"


# --- schemas ----------------------------------------------------------------------------------

def strict(schema):
    """A CRD schema where unknown fields are errors (the API server would prune them silently)."""
    if isinstance(schema, dict):
        s = {k: strict(v) for k, v in schema.items()}
        if ("properties" in s and "additionalProperties" not in s
                and not s.get("x-kubernetes-preserve-unknown-fields")):
            s["additionalProperties"] = False
        if s.get("x-kubernetes-int-or-string"):
            s.pop("type", None)
            s["anyOf"] = [{"type": "integer"}, {"type": "string"}]
        if s.get("nullable"):
            s.pop("type", None)
        return s
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


def check_object(obj, crds):
    api, kind = obj["apiVersion"], obj["kind"]
    name = f"{kind}/{obj['metadata'].get('name')}"
    key = f"{api}/{kind}"
    if key in crds:
        schema = strict(crds[key]["schema"])
        body = {k: v for k, v in obj.items() if k not in ("metadata", "apiVersion", "kind")}
        errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(body), key=lambda e: list(e.path))
        if errors:
            e = errors[0]
            fail(f"{name}: {'/'.join(map(str, e.path))}: {e.message} (schema {crds[key]['source']})")
        return f"CRD schema {key}"
    if "." in api.split("/")[0] and not api.startswith(("apps/", "networking.k8s.io/", "policy/")):
        fail(f"{name}: no schema for {key}")
    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        fail(f"{name}: {str(e).splitlines()[0]}")
    return f"Kubernetes {K8S_VERSION} schema"


def check_fetch_scripts(objs, recipe):
    script = open(os.path.join(DEPLOY, "module", "fetch-module.sh")).read()
    found = 0
    for o in objs:
        pod = None
        if o["kind"] == "Deployment":
            pod = o["spec"]["template"]["spec"]
        elif o["kind"] == "EnvoyProxy":
            pod = o["spec"]["provider"]["kubernetes"]["envoyDeployment"]
        for c in (pod or {}).get("initContainers", []):
            if c["name"] == "fetch-module":
                if c["command"][-1] != script:
                    fail(f"{recipe}: {o['kind']}/{o['metadata']['name']}: the fetch-module script differs from deploy/module/fetch-module.sh")
                found += 1
    if found != 1:
        fail(f"{recipe}: {found} fetch-module init containers, want 1")


# --- Envoy configs ----------------------------------------------------------------------------

def find(objs, kind, name=None):
    for o in objs:
        if o["kind"] == kind and (name is None or o["metadata"]["name"] == name):
            return o
    fail(f"no {kind} {name or ''}")


def router():
    return {"name": "envoy.filters.http.router",
            "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}


def ingress(filters, cluster):
    return {
        "name": "ingress",
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": LISTENER}},
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": "ingress",
                "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [
                    {"match": {"prefix": "/"}, "route": {"cluster": cluster, "timeout": "600s"}}]}]},
                "http_filters": filters + [router()]}}]}]}


def pods_cluster(name, lb_policy):
    return {"name": name, "connect_timeout": "1s",
            "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [
                {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": p}}}} for p in PODS]}]},
            "load_balancing_policy": lb_policy}


def override_host(header):
    return {"policies": [{"typed_extension_config": {
        "name": "envoy.load_balancing_policies.override_host",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost",
            "override_host_sources": [{"header": header}],
            "fallback_policy": {"policies": [{"typed_extension_config": {
                "name": "envoy.load_balancing_policies.round_robin",
                "typed_config": {"@type": "type.googleapis.com/envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin"}}}]}}}}]}


def on_placeholders(bootstrap, admin_port):
    """The recipe's Redis and admin addresses moved to the test placeholders; module path the build's."""
    for c in bootstrap["static_resources"]["clusters"]:
        for ep in c["load_assignment"]["endpoints"][0]["lb_endpoints"]:
            sa = ep["endpoint"]["address"]["socket_address"]
            if c["name"] == "redis":
                c["type"] = "STATIC"
                sa["address"], sa["port_value"] = "127.0.0.1", REDIS
            if sa["port_value"] == admin_port:
                sa["port_value"] = ADMIN
    for ext in bootstrap.get("bootstrap_extensions", []):
        ext["typed_config"]["config"]["vm_config"]["code"] = {"local": {"filename": WASM}}
    bootstrap["admin"] = {"address": {"socket_address": {"address": "127.0.0.1", "port_value": ADMIN}}}
    return bootstrap


def json_pointer_set(doc, pointer, value):
    parts = [p.replace("~1", "/").replace("~0", "~") for p in pointer.strip("/").split("/")]
    for p in parts[:-1]:
        doc = doc.setdefault(p, {})
    doc[parts[-1]] = value


def envoy_gateway_config(objs):
    proxy = find(objs, "EnvoyProxy")
    bootstrap = yaml.safe_load(proxy["spec"]["bootstrap"]["value"])
    if proxy["spec"]["bootstrap"].get("type") != "Merge":
        fail("envoy-gateway: the EnvoyProxy bootstrap is not a Merge")
    policy = find(objs, "EnvoyExtensionPolicy")
    route = find(objs, "HTTPRoute")
    ns = policy["metadata"]["namespace"]
    wasm = policy["spec"]["wasm"][0]
    # As Envoy Gateway names it (internal/gatewayapi/envoyextensionpolicy.go irConfigNameForWasm)
    # and builds it (internal/xds/translator/wasm.go wasmConfig).
    ir_name = f"envoyextensionpolicy/{ns}/{policy['metadata']['name']}/wasm/0"
    filt = {"name": f"envoy.filters.http.wasm/{ir_name}",
            "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
                             "config": {"name": wasm.get("name", ir_name), "root_id": wasm["rootID"],
                                        "vm_config": {"vm_id": ir_name, "runtime": "envoy.wasm.runtime.v8",
                                                      "code": {"local": {"filename": WASM}}},
                                        "configuration": {"@type": "type.googleapis.com/google.protobuf.StringValue",
                                                          "value": json.dumps(wasm["config"])},
                                        "fail_open": wasm.get("failOpen", False)}}}
    # Route rule 0's cluster, as Envoy Gateway names it.
    cluster = f"httproute/{route['metadata']['namespace']}/{route['metadata']['name']}/rule/0"
    listener = ingress([filt], cluster)
    gateway = find(objs, "Gateway")
    listener_name = f"{gateway['metadata']['namespace']}/{gateway['metadata']['name']}/{gateway['spec']['listeners'][0]['name']}"
    patch = find(objs, "EnvoyPatchPolicy")
    for p in patch["spec"]["jsonPatches"]:
        if p["name"] != listener_name:
            fail(f"envoy-gateway: EnvoyPatchPolicy patches listener {p['name']}, the Gateway's is {listener_name}")
        want = f"..http_filters[?(@.name=='{filt['name']}')]"
        if p["operation"]["jsonPath"] != want:
            fail(f"envoy-gateway: EnvoyPatchPolicy jsonPath {p['operation']['jsonPath']} does not select {filt['name']}")
        json_pointer_set(filt, p["operation"]["path"], p["operation"]["value"])
    btp = find(objs, "BackendTrafficPolicy")
    header = btp["spec"]["loadBalancer"]["endpointOverride"]["extractFrom"][0]["header"]
    bootstrap["static_resources"]["listeners"].append(listener)
    bootstrap["static_resources"]["clusters"].append(pods_cluster(cluster, override_host(header)))
    return on_placeholders(bootstrap, 19000)


def merge(dst, src):
    """Protobuf-style merge of JSON: maps merged, lists appended, scalars replaced."""
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            merge(dst[k], v)
        elif isinstance(v, list) and isinstance(dst.get(k), list):
            dst[k] = dst[k] + v
        else:
            dst[k] = copy.deepcopy(v)


def istio_config(objs):
    cm = find(objs, "ConfigMap", "prefix-router-bootstrap")
    bootstrap = json.loads(cm["data"]["custom_bootstrap.json"])
    ef = find(objs, "EnvoyFilter")
    ext = filt_ref = cluster_patch = None
    for p in ef["spec"]["configPatches"]:
        if p["applyTo"] == "EXTENSION_CONFIG":
            ext = copy.deepcopy(p["patch"]["value"])
        elif p["applyTo"] == "HTTP_FILTER":
            filt_ref = p["patch"]["value"]
        elif p["applyTo"] == "CLUSTER":
            cluster_patch = p
    if not (ext and filt_ref and cluster_patch):
        fail("istio: the EnvoyFilter lacks its extension config, filter or cluster patch")
    if filt_ref["name"] != ext["name"]:
        fail(f"istio: the HTTP filter {filt_ref['name']} names no extension config ({ext['name']})")
    # What istio-agent hands Envoy: the oci:// module fetched to a local file (pkg/wasm/convert.go).
    ext["typed_config"]["config"]["vm_config"]["code"] = {"local": {"filename": WASM}}
    filt = {"name": ext["name"], "typed_config": ext["typed_config"]}
    m = cluster_patch["match"]["cluster"]
    cluster = f"outbound|{m['portNumber']}||{m['service']}"
    c = pods_cluster(cluster, None)
    del c["load_balancing_policy"]
    merge(c, cluster_patch["patch"]["value"])
    bootstrap["static_resources"]["listeners"].append(ingress([filt], cluster))
    bootstrap["static_resources"]["clusters"].append(c)
    return on_placeholders(bootstrap, 15000)


def kubernetes_config(objs):
    for o in objs:
        if o["kind"] == "ConfigMap" and "envoy.yaml" in o.get("data", {}):
            return o["data"]["envoy.yaml"].replace("/wasm/plugin.wasm", WASM)
    fail("kubernetes: no ConfigMap with envoy.yaml")


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    crds = json.load(gzip.open(os.path.join(DEPLOY, "schemas", "crds.json.gz")))
    for recipe in RECIPES:
        objs, how = render(recipe)
        print(f"check_deploy: {recipe}: {len(objs)} objects ({how})")
        for o in objs:
            print(f"check_deploy:   {o['kind']}/{o['metadata']['name']}: {check_object(o, crds)} OK")
        check_fetch_scripts(objs, recipe)
        print(f"check_deploy:   fetch-module init container runs deploy/module/fetch-module.sh OK")
        if recipe == "kubernetes":
            text = kubernetes_config(objs)
        elif recipe == "envoy-gateway":
            text = yaml.safe_dump(envoy_gateway_config(objs), sort_keys=False)
        else:
            text = yaml.safe_dump(istio_config(objs), sort_keys=False)
        path = os.path.join(out, f"{recipe}.yaml")
        with open(path, "w") as f:
            f.write(text)
        print(f"check_deploy:   Envoy config -> {path}")


if __name__ == "__main__":
    main()
