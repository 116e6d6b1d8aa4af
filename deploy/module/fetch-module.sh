#!/bin/sh
# Init container: copies the filter module out of its OCI image (make release; the compat Wasm
# image: one tar+gzip layer holding plugin.wasm) into $OUT (an emptyDir shared with Envoy) and
# checks its sha256. Envoy's bootstrap (the sync singleton) can only load a module from a file
# or an HTTP URL, never from a registry: this is how the singleton gets the same module as the
# filter. Runs in quay.io/skopeo/stable (sh, skopeo, tar, gzip, sha256sum).
#
#   IMAGE        registry/repository:tag or @sha256:... (no oci:// prefix)
#   WASM_SHA256  sha256 of plugin.wasm (dist/envoy_prefix_router-<version>.wasm.sha256)
#   OUT          directory to write plugin.wasm to (default /wasm)
#   SKOPEO_ARGS  extra `skopeo copy` arguments, e.g. --src-tls-verify=false for a plain-HTTP registry
set -eu
OUT="${OUT:-/wasm}"
work="$(mktemp -d)"
# shellcheck disable=SC2086 # SKOPEO_ARGS is a list of flags
skopeo copy --retry-times 3 ${SKOPEO_ARGS:-} "docker://${IMAGE}" "dir:${work}/image"
found=""
for blob in "${work}"/image/*; do
    if tar -xzf "$blob" -C "$work" plugin.wasm 2>/dev/null; then
        found=yes
        break
    fi
done
[ -n "$found" ] || { echo "fetch-module: no layer of ${IMAGE} holds plugin.wasm" >&2; exit 1; }
echo "${WASM_SHA256}  ${work}/plugin.wasm" | sha256sum -c - >&2
mkdir -p "$OUT"
cp "${work}/plugin.wasm" "${OUT}/plugin.wasm.tmp"
mv "${OUT}/plugin.wasm.tmp" "${OUT}/plugin.wasm"
rm -rf "$work"
echo "fetch-module: ${IMAGE} -> ${OUT}/plugin.wasm (sha256 ${WASM_SHA256})" >&2
