# Sourced by scripts/image-check.sh: buildah's settings, and local stand-ins for the base images that
# docker/Dockerfile.cpu and docker/Dockerfile.cuda name. No container registry is reachable here, so each stand-in is
# made from a Debian bookworm tree (debootstrap, minbase) and tagged with the name the Dockerfile's FROM uses. What
# each carries is what the Dockerfile's steps rely on, as the real image has it:
#
#   rust:<RUST_VERSION>-slim-bookworm   gcc, libc6-dev and wget (the real image's packages: no make), and this
#                                       machine's Rust toolchain (which must be RUST_VERSION) under /usr/local/rustup
#                                       with rustup's proxies in /usr/local/cargo/bin, as the real image lays it out
#   python:3.12-slim                    python, pip (Debian's Python 3.11: the real image's is 3.12), and as there
#                                       no setuptools, wheel or distutils
#   gcr.io/distroless/cc-debian12:nonroot
#                                       only the files of libc6, libgcc-s1, libgomp1, libstdc++6, ca-certificates,
#                                       tzdata, netbase and base-files, the user nonroot (65532), no shell
#   nvidia/cuda:<CUDA>-devel-ubuntu<U>  (--cuda) the CUDA 13 compiler, headers and runtime from NVIDIA's wheels in
#                                       /usr/local/cuda, and link stubs of libcuda, cuBLAS, cuRAND and NVRTC
#                                       (scripts/cuda-toolkit.sh) where the real image has the toolkit's libraries
#   nvidia/cuda:<CUDA>-cudnn-runtime-ubuntu<U>
#                                       (--cuda) the CUDA runtime, and stubs of cuBLAS, cuRAND and NVRTC that load
#                                       but abort if called (the real image has the libraries, and cuDNN)
#
# Every stand-in also trusts this machine's own extra certificate authorities (/usr/local/share/ca-certificates),
# without which no build step reaches the package registries through this machine's network. A stand-in proves the
# Dockerfile's own steps (paths, stages, packages, users, what the final stage needs to start); it cannot prove what
# the real images hold, Ubuntu's packages for the CUDA images, or anything about a GPU.

export BUILDAH_ISOLATION=chroot
# Each checkout's storage, and its run-time state (locks, mounts), apart from any other's.
RUNROOT=/run/inferd-image-$(printf %s "$CACHE" | sha256sum | cut -c1-12)
# overlay where this kernel mounts it (much faster with large layers), else vfs.
if [ -z "${INFERD_IMAGE_STORAGE_DRIVER:-}" ]; then
    INFERD_IMAGE_STORAGE_DRIVER=vfs
    if buildah --root "$CACHE/storage-overlay" --runroot "$RUNROOT-overlay" --storage-driver overlay \
        info >/dev/null 2>&1; then
        INFERD_IMAGE_STORAGE_DRIVER=overlay
    fi
fi
BUILDAH=(buildah --root "$CACHE/storage-$INFERD_IMAGE_STORAGE_DRIVER" --runroot "$RUNROOT-$INFERD_IMAGE_STORAGE_DRIVER"
         --storage-driver "$INFERD_IMAGE_STORAGE_DRIVER")
B() { "${BUILDAH[@]}" "$@"; }

# The versions the Dockerfiles pin, read from them, so that the stand-ins follow a change of a Dockerfile's ARG.
dockerfile_arg() { sed -n "s/^ARG $2=//p" "docker/Dockerfile.$1" | head -n 1; }
RUST_VERSION=$(dockerfile_arg cpu RUST_VERSION)
CUDA_VERSION=$(dockerfile_arg cuda CUDA_VERSION)
UBUNTU_VERSION=$(dockerfile_arg cuda UBUNTU_VERSION)
# A stand-in is made again when its recipe changes: this file down to the build context's functions, the machine's
# extra certificate authorities, and the scripts that make the CUDA toolkit the CUDA stand-ins carry.
RECIPE=$({ sed '/^# context: /,$d' scripts/image_standins.sh; cat scripts/cuda-toolkit.sh scripts/cuda-link-stubs.sh
    cat /usr/local/share/ca-certificates/*.crt 2>/dev/null || true; } | sha256sum | cut -c1-16)

# is_current NAME: NAME exists and was made by this recipe.
is_current() {
    [ "$(B inspect --type image --format '{{index .OCIv1.Config.Labels "inferd.standin"}}' "$1" 2>/dev/null)" \
        = "$RECIPE" ]
}

# finish CONTAINER NAME WHAT: labels, commits and removes CONTAINER as the stand-in NAME.
finish() {
    B config --label "inferd.standin=$RECIPE" --label "inferd.standin.for=$3" "$1"
    B commit --quiet --rm "$1" "$2" >/dev/null
    REMADE=1
    echo "image-check: stand-in $2 made" >&2
}

# inside CONTAINER SCRIPT: runs a shell script inside CONTAINER.
inside() { B run "$1" -- sh -euc "$2"; }

# apt_install CONTAINER PACKAGE...: as Debian's images do it, leaving no package lists behind.
apt_install() {
    local ctr=$1
    shift
    inside "$ctr" "apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
        --no-install-recommends $* >/dev/null && rm -rf /var/lib/apt/lists/*"
}

BASE=localhost/inferd-standin/debian:bookworm

standin_base() {
    is_current "$BASE" && return
    local rootfs=$CACHE/rootfs-bookworm
    if [ ! -f "$rootfs.done" ]; then
        echo "image-check: debootstrap of Debian bookworm (minbase) into $rootfs" >&2
        rm -rf "$rootfs"
        mkdir -p "$CACHE/debs"
        debootstrap --variant=minbase --cache-dir="$CACHE/debs" bookworm "$rootfs" http://deb.debian.org/debian \
            >"$CACHE/debootstrap.log"
        touch "$rootfs.done"
    fi
    local ctr mnt
    ctr=$(B from scratch)
    mnt=$(B mount "$ctr")
    cp -a "$rootfs/." "$mnt/"
    if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
        mkdir -p "$mnt/usr/local/share/ca-certificates"
        cp /usr/local/share/ca-certificates/*.crt "$mnt/usr/local/share/ca-certificates/"
    fi
    B umount "$ctr" >/dev/null
    B config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --cmd bash "$ctr"
    apt_install "$ctr" ca-certificates
    finish "$ctr" "$BASE" "debian:bookworm-slim"
}

standin_rust() {
    local name=docker.io/library/rust:$RUST_VERSION-slim-bookworm
    is_current "$name" && return
    local have
    have=$(rustc --version | cut -d' ' -f2)
    if [ "$have" != "$RUST_VERSION" ]; then
        echo "image-check: the Dockerfiles pin Rust $RUST_VERSION; this machine's toolchain is $have" >&2
        return 1
    fi
    local ctr mnt toolchain=$RUST_VERSION-x86_64-unknown-linux-gnu
    ctr=$(B from --pull=never "$BASE")
    apt_install "$ctr" gcc libc6-dev wget
    mnt=$(B mount "$ctr")
    mkdir -p "$mnt/usr/local/rustup/toolchains/$toolchain" "$mnt/usr/local/cargo/bin"
    tar -C "$(rustc --print sysroot)" --exclude=./share/doc -cf - . \
        | tar -C "$mnt/usr/local/rustup/toolchains/$toolchain" -xf -
    printf 'version = "12"\ndefault_toolchain = "%s"\nprofile = "minimal"\n' "$toolchain" \
        >"$mnt/usr/local/rustup/settings.toml"
    install -m 0755 "$(command -v rustup)" "$mnt/usr/local/cargo/bin/rustup"
    for proxy in cargo rustc rustdoc rust-gdb rust-lldb; do
        ln -f "$mnt/usr/local/cargo/bin/rustup" "$mnt/usr/local/cargo/bin/$proxy"
    done
    B umount "$ctr" >/dev/null
    B config --env RUSTUP_HOME=/usr/local/rustup --env CARGO_HOME=/usr/local/cargo \
        --env PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --env RUST_VERSION="$RUST_VERSION" "$ctr"
    inside "$ctr" 'cargo --version && rustc --version' >&2
    finish "$ctr" "$name" "the official rust:$RUST_VERSION-slim-bookworm"
}

standin_python() {
    local name=docker.io/library/python:3.12-slim
    is_current "$name" && return
    local ctr
    ctr=$(B from --pull=never "$BASE")
    apt_install "$ctr" python3 python3-pip python-is-python3
    # The official image's pip installs into its own Python; Debian's refuses without this marker gone. Python 3.12
    # has no distutils, and its image no setuptools or wheel: Debian's pip works without them, so they go, and a
    # step that needs them fails here as it would there.
    inside "$ctr" 'rm -f /usr/lib/python3*/EXTERNALLY-MANAGED
        cd /usr/lib/python3/dist-packages && rm -rf setuptools* pkg_resources _distutils_hack distutils-precedence.pth wheel*
        rm -rf /usr/lib/python3.*/distutils
        ! python -c "import setuptools" 2>/dev/null && ! python -c "import distutils" 2>/dev/null
        python --version && pip --version' >&2
    B config --env LANG=C.UTF-8 --cmd python3 "$ctr"
    finish "$ctr" "$name" "the official python:3.12-slim"
}

standin_distroless() {
    local name=gcr.io/distroless/cc-debian12:nonroot
    is_current "$name" && return
    local full ctr mnt from
    full=$(B from --pull=never "$BASE")
    apt_install "$full" libgomp1 libstdc++6 libgcc-s1 tzdata netbase
    # Only the packages' own files (and the certificates ca-certificates generates): no shell, no package manager.
    inside "$full" 'dpkg -L libc6 libgcc-s1 libgomp1 libstdc++6 ca-certificates tzdata netbase base-files \
        | while read -r f; do if [ -f "$f" ] || [ -L "$f" ]; then echo "${f#/}"; fi; done; \
        find /etc/ssl/certs /usr/share/ca-certificates -mindepth 1 | sed "s|^/||"; echo etc/ssl/certs' \
        >"$CACHE/distroless.files" </dev/null
    from=$(B mount "$full")
    ctr=$(B from scratch)
    mnt=$(B mount "$ctr")
    # bookworm's merged /usr: the top-level links first, so that the packages' /lib paths land in /usr/lib.
    for link in bin sbin lib lib64; do cp -a "$from/$link" "$mnt/"; done
    mkdir -p "$mnt/usr/bin" "$mnt/usr/sbin" "$mnt/usr/lib" "$mnt/usr/lib64" "$mnt/etc" "$mnt/tmp" "$mnt/home/nonroot" "$mnt/root" "$mnt/var"
    (cd "$from" && tar --no-recursion -cf - -T "$CACHE/distroless.files") | tar -C "$mnt" --keep-directory-symlink -xf -
    chmod 1777 "$mnt/tmp"
    chmod 0700 "$mnt/home/nonroot" "$mnt/root"
    chown 65532:65532 "$mnt/home/nonroot"
    printf '%s\n' 'root:x:0:0:root:/root:/sbin/nologin' 'nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin' \
        'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin' >"$mnt/etc/passwd"
    printf '%s\n' 'root:x:0:' 'nobody:x:65534:' 'tty:x:5:' 'staff:x:50:' 'nonroot:x:65532:' >"$mnt/etc/group"
    if [ -e "$mnt/bin/sh" ] || [ -e "$mnt/usr/bin/dpkg" ]; then
        echo "image-check: the distroless stand-in has a shell or dpkg" >&2
        return 1
    fi
    B umount "$ctr" "$full" >/dev/null
    B rm "$full" >/dev/null
    B config --user 65532 --workingdir /home/nonroot \
        --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt "$ctr"
    finish "$ctr" "$name" "gcr.io/distroless/cc-debian12:nonroot"
}

# cuda_tree CONTAINER: the toolkit's tree from scripts/cuda-toolkit.sh under /usr/local/cuda-<major.minor>.
cuda_tree() {
    local ctr=$1 mnt root dir=/usr/local/cuda-${CUDA_VERSION%.*}
    root=$(scripts/cuda-toolkit.sh)
    # The toolkit must be the release the Dockerfile names, or the stand-in would hide what that release lacks.
    if ! "$root/bin/nvcc" --version | grep -q "release ${CUDA_VERSION%.*},"; then
        echo "image-check: the Dockerfile names CUDA $CUDA_VERSION; scripts/cuda-toolkit.sh makes $("$root/bin/nvcc" \
            --version | tail -n 1)" >&2
        return 1
    fi
    mnt=$(B mount "$ctr")
    mkdir -p "$mnt$dir"
    cp -a "$root/." "$mnt$dir/"
    ln -sfn "cuda-${CUDA_VERSION%.*}" "$mnt/usr/local/cuda"
    ln -sfn "cuda-${CUDA_VERSION%.*}" "$mnt/usr/local/cuda-${CUDA_VERSION%%.*}"
    ln -sfn lib "$mnt$dir/lib64"
    echo /usr/local/cuda/lib64 >"$mnt/etc/ld.so.conf.d/000_cuda.conf"
    B umount "$ctr" >/dev/null
}

cuda_env=(--env NVIDIA_VISIBLE_DEVICES=all --env NVIDIA_DRIVER_CAPABILITIES=compute,utility
          --env CUDA_VERSION="$CUDA_VERSION" --env LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64
          --env PATH=/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin)

standin_cuda_devel() {
    local name=docker.io/nvidia/cuda:$CUDA_VERSION-devel-ubuntu$UBUNTU_VERSION
    is_current "$name" && return
    local ctr
    ctr=$(B from --pull=never "$BASE")
    cuda_tree "$ctr"
    B config "${cuda_env[@]}" --env LIBRARY_PATH=/usr/local/cuda/lib64/stubs "$ctr"
    inside "$ctr" 'nvcc --version | tail -n 1' >&2
    finish "$ctr" "$name" "nvidia/cuda:$CUDA_VERSION-devel-ubuntu$UBUNTU_VERSION"
}

standin_cuda_runtime() {
    local name=docker.io/nvidia/cuda:$CUDA_VERSION-cudnn-runtime-ubuntu$UBUNTU_VERSION
    is_current "$name" && return
    local ctr mnt lib
    ctr=$(B from --pull=never "$BASE")
    cuda_tree "$ctr"
    mnt=$(B mount "$ctr")
    lib=$mnt/usr/local/cuda/lib64
    # A runtime image: no compiler, no headers, no driver stub. The libraries' stubs under their runtime names.
    rm -rf "$mnt/usr/local/cuda/bin" "$mnt/usr/local/cuda/include" "$mnt/usr/local/cuda/nvvm"
    for so in libcublas.so.13 libcublasLt.so.13 libcurand.so.10 libnvrtc.so.13; do
        mv "$lib/stubs/${so%.so.*}.so" "$lib/$so"
    done
    rm -rf "$lib/stubs"
    B umount "$ctr" >/dev/null
    inside "$ctr" ldconfig
    B config "${cuda_env[@]}" "$ctr"
    finish "$ctr" "$name" "nvidia/cuda:$CUDA_VERSION-cudnn-runtime-ubuntu$UBUNTU_VERSION"
}

# make_standins cpu|cuda
make_standins() {
    # Containers a run that stopped half-way left behind.
    B rm --all >/dev/null
    REMADE=0
    standin_base
    standin_rust
    standin_python
    if [ "$1" = cuda ]; then
        standin_cuda_devel
        standin_cuda_runtime
    else
        standin_distroless
    fi
    # A stand-in made again leaves its old image, and the build layers cached on it, unnamed: no build uses them now.
    if [ "$REMADE" = 1 ]; then
        B rmi --prune >/dev/null || true
    fi
}

# context: a copy of the checkout as git sees it (tracked files, and untracked ones it does not ignore) in
# $CACHE/context, so that a stale file lying here cannot make a build pass.
context() {
    rm -rf "$CACHE/context"
    mkdir -p "$CACHE/context"
    git ls-files -z --cached --others --exclude-standard \
        | tar --null --ignore-failed-read -T - -cf - 2>/dev/null | tar -C "$CACHE/context" -xf -
}

# bud DOCKERFILE [buildah bud options]: builds DOCKERFILE (a path) on the context. buildah's RUN now and then fails to seal the
# copy of itself it runs from (EBUSY from the kernel) before the step's command starts: that, and only that, is tried
# again, from the layers already built.
bud() {
    local dockerfile=$1 try
    shift
    for try in 1 2 3; do
        if B bud --pull=never --layers --force-rm --format docker -f "$dockerfile" "$@" "$CACHE/context" \
            2>&1 | tee "$CACHE/bud.log"; then
            return 0
        fi
        grep -q "sealing memfd" "$CACHE/bud.log" || return 1
        echo "image-check: buildah could not start a RUN step (try $try): again" >&2
    done
    return 1
}
