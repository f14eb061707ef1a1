#!/usr/bin/env bash
# Packs binaries with the shared libraries they need that a bare base image
# lacks, into OUT/bin and OUT/lib: the Dockerfile's final stages copy OUT and
# nothing else. System libraries (glibc, libstdc++, libgcc, the CUDA driver)
# stay out: every base image has its own.
#   bundle-runtime.sh OUT BINARY...
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 OUT BINARY..." >&2; exit 2; }
out=$1; shift
mkdir -p "$out/bin" "$out/lib"
system='^(linux-vdso|ld-linux|libc\.so|libm\.so|libstdc\+\+|libgcc_s|libpthread|libdl|librt|libcuda\.so|libnvidia)'
for bin in "$@"; do
  install -m 0755 "$bin" "$out/bin/"
  ldd "$bin" | awk '/=> \//{print $1" "$3}' | while read -r name path; do
    [[ "$name" =~ $system ]] && continue
    [ -e "$out/lib/$name" ] || install -m 0644 "$(readlink -f "$path")" "$out/lib/$name"
  done
done
echo "bundle-runtime: $(ls "$out/bin" | wc -l) binaries, $(ls "$out/lib" | wc -l) libraries in $out"
