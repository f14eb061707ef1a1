#!/usr/bin/env python3
"""Runs a built posenc image the way a pod runs it and talks to it.

Called by scripts/image-test.sh after `buildah bud`. The image's root is
mounted read-only in a private mount namespace, /proc, /dev and /sys are bound
in, and the image's own ENTRYPOINT starts with the image's own Env as its own
USER (10001): what deploy/base's pod spec asks (runAsUser 10001,
readOnlyRootFilesystem). Then, from outside, with real clients:
  - grpc.health.v1 answers SERVING for "", liveness and readiness;
  - reflection lists the services (grpcurl), and describes posenc.v1;
  - a RoPE call made by posenc-cli matches a float64 reference (SPEC 5);
  - /metrics counts that call;
  - SIGTERM drains and the server exits 0.
It also reports the image's size, checks that it adds nothing to its base
but /opt/posenc (the bundle: binaries and their non-system libraries), that
ldd resolves every library inside the image, and, for the cuda target
(--cuda), that CUDA is compiled in, that without a GPU AUTO serves from the
CPU, and that --default_backend=cuda refuses to start.
"""

import argparse
import json
import os
import random
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np


def fail(msg):
    print(f"check_image: FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tree(root):
    """Relative paths of everything under root (not following links)."""
    out = {}
    for d, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(d, name)
            rel = os.path.relpath(p, root)
            st = os.lstat(p)
            out[rel] = st.st_size if os.path.isfile(p) and not os.path.islink(p) else 0
    return out


def namespace_script(rootfs, argv, env):
    """A shell line that makes rootfs a read-only root and execs argv in it."""
    binds = " && ".join(
        f"mount --rbind /{d} {shlex.quote(rootfs)}/{d} && mount --make-rslave {shlex.quote(rootfs)}/{d}"
        for d in ("dev", "sys"))
    env_args = " ".join(shlex.quote(e) for e in env)
    return (f"mount --bind {shlex.quote(rootfs)} {shlex.quote(rootfs)} && "
            f"mount -o remount,bind,ro {shlex.quote(rootfs)} && "
            f"mount -t proc proc {shlex.quote(rootfs)}/proc && {binds} && "
            f"exec chroot --userspec={argv[0]} {shlex.quote(rootfs)} env -i {env_args} "
            + " ".join(shlex.quote(a) for a in argv[1:]))


def rope_reference(x, positions, base):
    """NEOX (rotate-half) RoPE in float64, x [B,S,H,D] with per-token positions [B,S]."""
    d = x.shape[-1]
    inv_freq = 1.0 / (base ** (np.arange(0, d, 2, dtype=np.float64) / d))
    ang = positions[..., None].astype(np.float64) * inv_freq  # [B,S,D/2]
    cos = np.cos(np.concatenate([ang, ang], -1))[:, :, None, :]
    sin = np.sin(np.concatenate([ang, ang], -1))[:, :, None, :]
    x = x.astype(np.float64)
    half = d // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], -1)
    return x * cos + rot * sin


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--buildah", required=True, help="buildah command with its storage flags")
    ap.add_argument("--image", required=True)
    ap.add_argument("--base", required=True)
    ap.add_argument("--cli", required=True)
    ap.add_argument("--grpcurl", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--cuda", action="store_true",
                    help="the cuda target: CUDA compiled in, libraries resolved by ldd, "
                         "AUTO serves from the CPU without a GPU, --default_backend=cuda refuses")
    a = ap.parse_args()
    buildah = shlex.split(a.buildah)

    # ---- what the image is -------------------------------------------------
    info = json.loads(run(buildah + ["inspect", "--type", "image", a.image]))
    cfg = info["OCIv1"]["config"]
    user, entrypoint, env = cfg.get("User"), cfg.get("Entrypoint"), cfg.get("Env", [])
    if user != "10001:10001":
        fail(f"image USER is {user!r}, expected 10001:10001")
    if not entrypoint or not entrypoint[0].startswith("/opt/posenc/bin/"):
        fail(f"image ENTRYPOINT is {entrypoint!r}, expected /opt/posenc/bin/posenc-server")
    sizes = {}
    for line in run(buildah + ["images", "--format", "{{.Name}}:{{.Tag}} {{.Size}}"]).splitlines():
        name, size = line.split(" ", 1)
        sizes[name] = size

    ctr = run(buildah + ["from", "--pull-never", a.image]).strip()
    base_ctr = run(buildah + ["from", "--pull-never", a.base]).strip()
    try:
        rootfs = run(buildah + ["mount", ctr]).strip()
        base_rootfs = run(buildah + ["mount", base_ctr]).strip()
        mine, theirs = tree(rootfs), tree(base_rootfs)
        added = sorted(p for p in mine if p not in theirs)
        stray = [p for p in added if not (p == "opt" or p.startswith("opt/posenc"))]
        if stray:
            fail(f"the image adds more than /opt/posenc to its base: {stray[:10]}")
        bins = sorted(p for p in added if p.startswith("opt/posenc/bin/"))
        libs = sorted(p for p in added if p.startswith("opt/posenc/lib/"))
        bundle_bytes = sum(mine[p] for p in added)
        print(f"image {a.image}: {sizes.get(a.image, '?')} "
              f"(base {a.base}: {sizes.get(a.base, '?')}); adds only /opt/posenc: "
              f"{len(bins)} binaries ({', '.join(os.path.basename(b) for b in bins)}), "
              f"{len(libs)} libraries, {bundle_bytes / 2**20:.1f} MiB")

        # ---- the root really is read-only ----------------------------------
        probe = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c",
             namespace_script(rootfs, ["0:0", "/bin/sh", "-c", "touch /probe"], [])],
            capture_output=True, text=True)
        if probe.returncode == 0 or "Read-only" not in probe.stderr:
            fail(f"root file system is writable (touch /probe: rc {probe.returncode}, "
                 f"{probe.stderr.strip()!r})")

        def in_image(argv, user_spec=user):
            return subprocess.run(
                ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                 namespace_script(rootfs, [user_spec] + argv, env)],
                capture_output=True, text=True, timeout=60)

        # ---- every library the binaries need resolves inside the image -------
        for b in bins:
            r = in_image(["/usr/bin/ldd", "/" + b])
            if r.returncode != 0 or "not found" in r.stdout:
                fail(f"ldd /{b} inside the image:\n{r.stdout}{r.stderr}")
        print(f"ldd: every library of {', '.join(os.path.basename(b) for b in bins)} resolves "
              f"inside the image")
        version = in_image(entrypoint + ["--version"])
        want = "with CUDA" if a.cuda else "without CUDA"
        if version.returncode != 0 or want not in version.stdout:
            fail(f"--version should say {want!r}: {version.stdout}{version.stderr}")
        print(f"version: {' '.join(version.stdout.split())}")
        if a.cuda:
            # What the gpu overlay relies on: told to use CUDA and unable to,
            # the server refuses to start (the pod never turns Ready).
            refused = in_image(entrypoint + ["--default_backend=cuda", "--listen=127.0.0.1:0",
                                             "--metrics_listen="])
            if refused.returncode == 0 or "CUDA" not in refused.stdout + refused.stderr:
                fail(f"--default_backend=cuda without a GPU started (rc {refused.returncode}): "
                     f"{refused.stdout}{refused.stderr}")
            print(f"--default_backend=cuda without a GPU: refused to start (exit "
                  f"{refused.returncode})")

        # ---- run it ----------------------------------------------------------
        port, metrics_port = free_port(), free_port()
        argv = [user] + entrypoint + [f"--listen=127.0.0.1:{port}",
                                      f"--metrics_listen=127.0.0.1:{metrics_port}"]
        log_path = os.path.join(a.work, "server.log")
        log = open(log_path, "w")
        server = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c",
             namespace_script(rootfs, argv, env)], stdout=log, stderr=subprocess.STDOUT)
        try:
            check_running_server(a, port, metrics_port, server, log_path)
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()
    finally:
        subprocess.run(buildah + ["umount", ctr, base_ctr], capture_output=True)
        subprocess.run(buildah + ["rm", ctr, base_ctr], capture_output=True)


def grpcurl(a, port, flags, *verb):
    """grpcurl [flags] ADDRESS verb..., over plaintext."""
    return subprocess.run([a.grpcurl, "-plaintext", *flags, f"127.0.0.1:{port}", *verb],
                          capture_output=True, text=True, timeout=20)


def health(a, port, service):
    r = grpcurl(a, port, ["-d", json.dumps({"service": service})], "grpc.health.v1.Health/Check")
    return r.stdout if r.returncode == 0 else ""


def check_running_server(a, port, metrics_port, server, log_path):
    deadline = time.time() + 30
    while '"SERVING"' not in health(a, port, ""):
        if server.poll() is not None or time.time() > deadline:
            fail(f"server did not become SERVING (exit {server.poll()}):\n"
                 + open(log_path).read()[-3000:])
        time.sleep(0.3)
    for service in ("liveness", "posenc.v1.PositionalEncoding"):
        if '"SERVING"' not in health(a, port, service):
            fail(f"health for {service!r} is not SERVING")
    print("health: SERVING for '', liveness and posenc.v1.PositionalEncoding")

    r = grpcurl(a, port, [], "list")
    services = set(r.stdout.split())
    want = {"posenc.v1.PositionalEncoding", "grpc.health.v1.Health"}
    if r.returncode != 0 or not want <= services:
        fail(f"reflection lists {sorted(services)} (rc {r.returncode}: {r.stderr.strip()})")
    r = grpcurl(a, port, [], "describe", "posenc.v1.PositionalEncoding")
    if r.returncode != 0 or "ApplyRope" not in r.stdout:
        fail(f"reflection cannot describe posenc.v1.PositionalEncoding: {r.stderr.strip()}")
    print(f"reflection: {', '.join(sorted(services))}")

    seed = int(os.environ.get("POSENC_SEED", random.randrange(1 << 31)))
    print(f"rope check: seed {seed}")
    rng = np.random.default_rng(seed)
    b, s, h, d, offset, base = 2, 24, 4, 64, int(rng.integers(0, 5000)), 10000.0
    x = rng.standard_normal((b, s, h, d)).astype(np.float32)
    x_path, y_path = os.path.join(a.work, "x.npy"), os.path.join(a.work, "y.npy")
    np.save(x_path, x)
    subprocess.run([a.cli, f"--target=127.0.0.1:{port}", "rope", f"--input={x_path}",
                    f"--output={y_path}", "--dtype=float32", "--layout=bshd", "--style=neox",
                    f"--offset={offset}", f"--base={base}"], check=True, timeout=30)
    y = np.load(y_path)
    positions = offset + np.broadcast_to(np.arange(s), (b, s))
    ref = rope_reference(x, positions, base)
    err = np.linalg.norm(y.astype(np.float64) - ref) / np.linalg.norm(ref)
    if y.shape != x.shape or not err <= 1e-6:
        fail(f"RoPE from the image: relative error {err:.3g} (shape {y.shape}); SPEC 5 asks 1e-6")
    print(f"rope check: [{b},{s},{h},{d}] float32 from position {offset}: "
          f"relative error {err:.2e} (bar 1e-6)")

    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read()
    rope_calls = [l for l in text.decode().splitlines()
                  if l.startswith("posenc_requests_total") and "ApplyRope" in l]
    if not any(float(l.split()[-1]) >= 1 for l in rope_calls):
        fail(f"/metrics does not count the ApplyRope call: {rope_calls}")
    print(f"metrics: {rope_calls[0]}")

    server.send_signal(signal.SIGTERM)
    try:
        rc = server.wait(timeout=40)
    except subprocess.TimeoutExpired:
        fail("server did not exit within 40 s of SIGTERM")
    if rc != 0:
        fail(f"server exited {rc} on SIGTERM:\n" + open(log_path).read()[-3000:])
    print("SIGTERM: drained and exited 0")


if __name__ == "__main__":
    main()
