#!/usr/bin/env python3
"""Pulls the release image back with the ORAS Python client (a second OCI
client, independent of skopeo) and checks it end to end:

    oras_pull.py HOST:PORT REPOSITORY TAG MANIFEST_DIGEST WASM_SHA256 OUT.wasm

the manifest's bytes hash to MANIFEST_DIGEST, the layer blob to its
descriptor's digest, and the layer's plugin.wasm to WASM_SHA256; writes
plugin.wasm to OUT.wasm. Plain HTTP (a test registry on 127.0.0.1).
Exits 1 naming the first mismatch.
"""

import hashlib
import io
import sys
import tarfile
import tempfile

import oras.client

MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def sha(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def main():
    host, repo, tag, want_manifest, want_wasm, out = sys.argv[1:7]
    client = oras.client.OrasClient(hostname=host, insecure=True)
    resp = client.do_request(f"http://{host}/v2/{repo}/manifests/{tag}", "GET", headers={"Accept": MANIFEST})
    if resp.status_code != 200:
        sys.exit(f"oras_pull: manifest: HTTP {resp.status_code}")
    if sha(resp.content) != want_manifest:
        sys.exit(f"oras_pull: manifest digest {sha(resp.content)}, want {want_manifest}")
    manifest = client.get_manifest(f"{host}/{repo}:{tag}", allowed_media_type=[MANIFEST])
    (layer,) = manifest["layers"]
    with tempfile.NamedTemporaryFile() as blob:
        client.download_blob(f"{host}/{repo}:{tag}", layer["digest"], blob.name)
        data = open(blob.name, "rb").read()
    if sha(data) != layer["digest"]:
        sys.exit(f"oras_pull: layer digest {sha(data)}, want {layer['digest']}")
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        wasm = tar.extractfile("plugin.wasm").read()
    if hashlib.sha256(wasm).hexdigest() != want_wasm:
        sys.exit(f"oras_pull: plugin.wasm sha256 {hashlib.sha256(wasm).hexdigest()}, want {want_wasm}")
    with open(out, "wb") as f:
        f.write(wasm)
    print(f"oras_pull: {host}/{repo}:{tag} manifest {want_manifest}, layer {layer['digest']}, plugin.wasm {want_wasm}")


if __name__ == "__main__":
    main()
