#!/usr/bin/env python3
"""Extracts the openAPIV3Schema of the CRD kinds the deploy/ recipes use into
deploy/schemas/crds.json.gz, so `make test` checks the recipes offline.

    vendor_crd_schemas.py OUT.json.gz SOURCE=CRD.yaml [SOURCE=CRD.yaml ...]

SOURCE names where the CRD file came from (repository@commit:path); it is kept
in the output next to each schema. Only the kinds in KINDS are kept.
"""

import gzip
import json
import sys

import yaml

KINDS = {
    "gateway.envoyproxy.io": {"EnvoyExtensionPolicy", "EnvoyPatchPolicy", "EnvoyProxy", "BackendTrafficPolicy"},
    "gateway.networking.k8s.io": {"GatewayClass", "Gateway", "HTTPRoute"},
    "networking.istio.io": {"EnvoyFilter", "Gateway", "VirtualService"},
    "extensions.istio.io": {"WasmPlugin"},
}


def main():
    out, sources = sys.argv[1], sys.argv[2:]
    schemas = {}
    for arg in sources:
        source, path = arg.split("=", 1)
        with open(path) as f:
            for doc in yaml.safe_load_all(f):
                if not doc or doc.get("kind") != "CustomResourceDefinition":
                    continue
                spec = doc["spec"]
                group, kind = spec["group"], spec["names"]["kind"]
                if kind not in KINDS.get(group, ()):
                    continue
                for version in spec["versions"]:
                    if not version.get("served"):
                        continue
                    key = f"{group}/{version['name']}/{kind}"
                    schemas[key] = {"source": source, "schema": version["schema"]["openAPIV3Schema"]}
    with gzip.GzipFile(out, "wb", mtime=0) as f:
        f.write(json.dumps(schemas, sort_keys=True, separators=(",", ":")).encode())
    for key in sorted(schemas):
        print(key, "<-", schemas[key]["source"])


if __name__ == "__main__":
    main()
