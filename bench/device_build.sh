#!/usr/bin/env bash
# Builds a committed snapshot of the repository on the device, so that what runs there is exactly a commit
# (helpers' uncommitted edits in the working tree do not leak in).
#   here:        bench/device_build.sh pack            # .carry-src = `git archive HEAD` (+ nccl.h), no data
#   on device:   TARGETS="zipage-eval test_cuda_fp8_kv" JOBS=16 bench/device_build.sh build
#   or, to skip the device build (~150 s of device time): build here (Release, -DZIPAGE_ENABLE_CUDA=ON
#   -DCMAKE_CUDA_ARCHITECTURES=90a, in BUILD=build-ops), then `TARGETS="test_cuda_kernels zipage-bench"
#   bench/device_build.sh prebuilt` builds those targets there and copies them and the one library the device image
#   lacks in this version (Debian's libbenchmark) into
#   .carry-bin; carry it and run `PREBUILT=.carry-bin bench/run_fused_ab.sh start`. The binaries name data files by
#   the absolute paths of this checkout (.carry-bin/ROOT), which the driver links to the device's copy:
#   on device:   B=/tmp/dev-bin bench/device_build.sh unpack   # PREBUILT (default .carry-bin) into $B, the link
#                made; the caller then puts $B/lib on LD_LIBRARY_PATH
# The build goes to $BD (default /tmp/bd, kept between calls while the machine stays warm); models/, data/
# and tests/data are symlinked from the working tree copy. Each device call copies the tree anew, which drops
# those links: a later call that runs what an earlier one built (the bundled model, test data) first runs
#   on device:   bench/device_build.sh link
# (a binary then says "the bundled model is missing (looked for .../.carry-src/models/stories260K.gguf" otherwise). NCCL: the header comes with the snapshot (the
# device image has the library only).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
SRC="${SRC:-$root/.carry-src}"  # `build` of another packed tree: SRC=dir (with its own .nccl/nccl.h)
case "${1:-}" in
  pack)
    rm -rf "$SRC" && mkdir -p "$SRC/.nccl"
    git -C "$root" archive HEAD -- . ':!models' ':!data' ':!tests/data' ':!docs' | tar -x -C "$SRC"
    cp /usr/local/cuda/include/nccl.h "$SRC/.nccl/"
    echo "packed $(git -C "$root" rev-parse --short HEAD) into $SRC ($(du -sh "$SRC" | cut -f1))" ;;
  prebuilt)
    # DEST: where the set goes (default .carry-bin; e.g. .carry-old-bin for an older commit's build, BUILD naming its
    # build folder and COMMIT what it was built from: `git rev-parse HEAD` here otherwise).
    BIN="${DEST:-$root/.carry-bin}" BD="$root/${BUILD:-build-ops}"
    # shellcheck disable=SC2086
    cmake --build "$BD" -j "${JOBS:-2}" --target ${TARGETS:?TARGETS names the binaries to build and carry} > /dev/null
    rm -rf "$BIN" && mkdir -p "$BIN/lib"
    for t in $TARGETS; do find "$BD" -maxdepth 3 -type f -perm -u+x -name "$t" -exec cp {} "$BIN"/ \;; done
    for lib in $(ldd "$BIN"/* 2>/dev/null | awk '/libbenchmark/ { print $3 }' | sort -u); do cp -L "$lib" "$BIN/lib/"; done
    echo "$root" > "$BIN/ROOT"
    echo "${COMMIT:-$(git -C "$root" rev-parse --short HEAD)}" > "$BIN/COMMIT"
    n=$(find "$BIN" -maxdepth 1 -type f -perm -u+x | wc -l)
    # Stripped and xz-compressed (20 MB of fat binaries become ~2.3 MB): the tree a call carries is at most 64 MiB.
    find "$BIN" -maxdepth 1 -type f -perm -u+x -exec strip {} \;
    tar -C "$BIN" -cJf "$BIN.tar.xz" . && rm -rf "$BIN" && mkdir -p "$BIN" && mv "$BIN.tar.xz" "$BIN/bin.tar.xz"
    echo "prebuilt $(tar -xJOf "$BIN/bin.tar.xz" ./COMMIT) ($n binaries, $(du -sh "$BIN" | cut -f1)) in $BIN" ;;
  unpack)
    # Out of the working tree (each device call copies the tree anew, which would remove an untracked folder while a
    # detached driver still runs), and this checkout's path as the binaries know it linked to the device's copy.
    B=${B:-/tmp/dev-bin} PREBUILT=${PREBUILT:-$root/.carry-bin}
    mkdir -p "$B" && tar -C "$B" -xJf "$PREBUILT/bin.tar.xz"
    built_root=$(cat "$B/ROOT")
    [ -e "$built_root" ] || { mkdir -p "$(dirname "$built_root")" && ln -sfn "$root" "$built_root"; }
    echo "prebuilt binaries of $(cat "$B/COMMIT"), $built_root -> $(readlink -f "$built_root")" ;;
  link)
    for d in models data tests/data; do ln -sfn "$root/$d" "$SRC/$d"; done
    echo "linked models, data and tests/data into $SRC" ;;
  build)
    BD=${BD:-/tmp/bd}
    for d in models data tests/data; do ln -sfn "$root/$d" "$SRC/$d"; done
    nccl_lib=$(ls /usr/lib/x86_64-linux-gnu/libnccl.so* 2>/dev/null | head -1 || true)
    cmake -S "$SRC" -B "$BD" -DCMAKE_BUILD_TYPE=Release -DZIPAGE_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
      -DZIPAGE_BUILD_PREBUILT=OFF -DZIPAGE_NCCL_INCLUDE_DIR="$SRC/.nccl" ${nccl_lib:+-DZIPAGE_NCCL_LIBRARY=$nccl_lib} \
      > "${OUT:-/tmp}/cmake_configure.log" 2>&1
    # shellcheck disable=SC2086
    cmake --build "$BD" -j "${JOBS:-16}" --target ${TARGETS:?TARGETS names the targets to build} \
      > "${OUT:-/tmp}/build.log" 2>&1 || { tail -40 "${OUT:-/tmp}/build.log"; exit 1; }
    echo "built ${TARGETS} in $BD" ;;
  *) echo "usage: $0 pack|prebuilt|unpack|link|build" >&2; exit 2 ;;
esac
