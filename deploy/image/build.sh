#!/usr/bin/env bash
# Builds the wasm-fetcher image for each of PLATFORMS and writes them, as one multi-platform
# index tagged VERSION, to the OCI layout LAYOUT. Run by `make image`, which sets every variable
# below and installs the tools first (podman, skopeo, musl-tools, the aarch64 cross gcc, the Rust
# musl targets).
#
# The binary is built on the host, not in a build stage: a Rust toolchain in the build would
# download crates inside the build and cost minutes per platform; the context is only rootfs/.
# Podman keeps its images in a store of its own under target/image/ (vfs: works rootless and
# inside containers), so nothing here touches the user's podman images.
set -euo pipefail

: "${VERSION:?}" "${REVISION:?}" "${SOURCE:?}" "${EPOCH:?}" "${PLATFORMS:?}" "${LAYOUT:?}" "${WORK:?}"
CARGO=${CARGO:-cargo}
here=$(cd "$(dirname "$0")" && pwd)
podman=(podman --root "$WORK/storage" --runroot "$WORK/run" --storage-driver vfs)

# The Rust target, the cross tools' prefix and the OCI architecture of a platform.
rust_target() {
  case $1 in
    linux/amd64) echo x86_64-unknown-linux-musl ;;
    linux/arm64) echo aarch64-unknown-linux-musl ;;
    *) echo "build.sh: platform $1 is not built here (linux/amd64, linux/arm64)" >&2; return 1 ;;
  esac
}

# The store holds only what this script builds: start from nothing, so no image or list of an
# earlier run (another revision) is reused.
list=localhost/wasm-fetcher:$VERSION
"${podman[@]}" rmi --all --force >/dev/null 2>&1 || true

for platform in $PLATFORMS; do
  target=$(rust_target "$platform")
  arch=${platform#linux/}
  case $arch in
    # musl-gcc (musl-tools) is what the cc crate picks for x86_64 musl: ring's C and assembly.
    amd64) strip=strip ;;
    # Debian has no aarch64 musl-gcc: its glibc cross gcc compiles ring's C (which uses no libc
    # headers beyond the compiler's own) and links against the musl that Rust's target ships.
    arm64)
      strip=aarch64-linux-gnu-strip
      export CC_aarch64_unknown_linux_musl=aarch64-linux-gnu-gcc
      export AR_aarch64_unknown_linux_musl=aarch64-linux-gnu-ar
      export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_LINKER=aarch64-linux-gnu-gcc
      ;;
  esac
  echo "==> wasm-fetcher for $platform ($target)"
  "$CARGO" build --release --locked -p wasm-fetcher --target "$target"

  context=$WORK/$arch
  rm -rf "$context"
  mkdir -p "$context/rootfs/usr/local/bin" "$context/rootfs/etc/ssl/certs"
  "$strip" -o "$context/rootfs/usr/local/bin/wasm-fetcher" "target/$target/release/wasm-fetcher"
  cp "$here/passwd" "$here/group" "$context/rootfs/etc/"
  cp /etc/ssl/certs/ca-certificates.crt "$context/rootfs/etc/ssl/certs/"
  chmod 0555 "$context/rootfs/usr/local/bin/wasm-fetcher"
  chmod 0444 "$context/rootfs/etc/passwd" "$context/rootfs/etc/group" \
    "$context/rootfs/etc/ssl/certs/ca-certificates.crt"
  find "$context/rootfs" -type d -exec chmod 0755 {} +

  image=localhost/wasm-fetcher:$VERSION-$arch
  # --no-cache: buildah's cache does not see a changed build argument in a LABEL.
  "${podman[@]}" build --quiet --no-cache --platform "$platform" --format oci --timestamp "$EPOCH" \
    --build-arg VERSION="$VERSION" --build-arg REVISION="$REVISION" --build-arg SOURCE="$SOURCE" \
    -f "$here/Containerfile" -t "$image" "$context" >/dev/null
  if ! "${podman[@]}" manifest exists "$list"; then
    "${podman[@]}" manifest create "$list" >/dev/null
  fi
  "${podman[@]}" manifest add "$list" "containers-storage:$image" >/dev/null
done

rm -rf "$LAYOUT"
"${podman[@]}" manifest push --quiet --all "$list" "oci:$LAYOUT:$VERSION"
echo "==> $LAYOUT:$VERSION ($PLATFORMS)"
