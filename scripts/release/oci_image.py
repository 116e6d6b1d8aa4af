#!/usr/bin/env python3
"""Builds an OCI image layout holding a proxy-wasm module, without Docker.

    oci_image.py MODULE.wasm OUT_DIR TAG [--created RFC3339] [--revision SHA] [--version V]

The image is the *compat* variant of the Wasm image specification
(github.com/solo-io/wasm, spec-compat.md), the one format that both Istio's
`WasmPlugin` and Envoy Gateway's `EnvoyExtensionPolicy` fetchers accept in
their first attempt and that any OCI registry stores (their fetchers are the
same code: istio/istio pkg/wasm/imagefetcher.go, envoyproxy/gateway
internal/wasm/imagefetcher.go):

  manifest  application/vnd.oci.image.manifest.v1+json (an image manifest,
            never an index: both fetchers call `desc.Image()`)
  config    application/vnd.oci.image.config.v1+json
  layer     application/vnd.oci.image.layer.v1.tar+gzip, one layer whose tar
            holds the module as `plugin.wasm` (the name both fetchers look for)
  annotation module.wasm.image/variant=compat (the spec asks for it with this
            layer type)

The output is byte-for-byte reproducible from the module and the arguments:
tar and gzip headers carry no time, owner or host, and JSON is written with
sorted keys. Uses the standard library only.
"""

import argparse
import gzip
import hashlib
import io
import json
import os
import sys
import tarfile

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"
VARIANT_ANNOTATION = "module.wasm.image/variant"
WASM_MAGIC = b"\0asm"


def canonical(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def digest(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def layer_tar(module):
    """A tar holding `plugin.wasm`, with fixed metadata."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("plugin.wasm")
        info.size = len(module)
        info.mode = 0o644
        info.mtime = 0
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        tar.addfile(info, io.BytesIO(module))
    return buf.getvalue()


def gzip_fixed(data):
    """gzip with mtime 0 and no file name in the header."""
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=9, mtime=0, filename="") as gz:
        gz.write(data)
    return buf.getvalue()


def write_blob(out, data):
    d = digest(data)
    path = os.path.join(out, "blobs", "sha256", d.split(":", 1)[1])
    with open(path, "wb") as f:
        f.write(data)
    return {"digest": d, "size": len(data)}


def build(module, out, tag, created, revision, version):
    if not module.startswith(WASM_MAGIC):
        raise SystemExit("oci_image: the module does not start with the wasm magic bytes")
    os.makedirs(os.path.join(out, "blobs", "sha256"), exist_ok=True)
    tar = layer_tar(module)
    layer = write_blob(out, gzip_fixed(tar))
    layer["mediaType"] = LAYER_TYPE
    config_json = {
        # The OCI Wasm working group's platform for a WASI module; neither
        # fetcher reads it (they take the manifest, not an index).
        "architecture": "wasm",
        "os": "wasip1",
        "config": {},
        "rootfs": {"type": "layers", "diff_ids": [digest(tar)]},
    }
    if created:
        config_json["created"] = created
    config = write_blob(out, canonical(config_json))
    config["mediaType"] = CONFIG_TYPE
    annotations = {VARIANT_ANNOTATION: "compat"}
    if created:
        annotations["org.opencontainers.image.created"] = created
    if revision:
        annotations["org.opencontainers.image.revision"] = revision
    if version:
        annotations["org.opencontainers.image.version"] = version
    annotations["org.opencontainers.image.licenses"] = "Apache-2.0"
    manifest_json = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": config,
        "layers": [layer],
        "annotations": annotations,
    }
    manifest = write_blob(out, canonical(manifest_json))
    manifest["mediaType"] = MANIFEST_TYPE
    manifest["annotations"] = {"org.opencontainers.image.ref.name": tag}
    with open(os.path.join(out, "oci-layout"), "wb") as f:
        f.write(canonical({"imageLayoutVersion": "1.0.0"}))
    with open(os.path.join(out, "index.json"), "wb") as f:
        f.write(canonical({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                           "manifests": [manifest]}))
    return manifest["digest"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("module")
    p.add_argument("out")
    p.add_argument("tag")
    p.add_argument("--created", default="")
    p.add_argument("--revision", default="")
    p.add_argument("--version", default="")
    a = p.parse_args()
    with open(a.module, "rb") as f:
        module = f.read()
    if os.path.exists(os.path.join(a.out, "index.json")):
        raise SystemExit(f"oci_image: {a.out} already holds an image; remove it first")
    print(build(module, a.out, a.tag, a.created, a.revision, a.version))
    return 0


if __name__ == "__main__":
    sys.exit(main())
