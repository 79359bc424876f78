#!/usr/bin/env python3
"""benches/containerdisk.py: create -> Running of a containerDisk VM, cold and warm cache.

    EDGEVIRT_BIN=target/debug/edgevirt BENCH_ROUNDS=3 benches/containerdisk.py

A benchmark, not a test: it prints figures and fails only when something could not be
measured. Needs root, libvirtd, Debian's docker-registry and skopeo, and the test guest's
boot disk (tests/guest/build-guest.sh and tests/guest/build-bootdisk.sh into
$EDGEVIRT_TEST_GUEST, default target/test-guest).

In one run, against one registry on loopback (Debian's docker-registry):
  - edgevirt, cold cache: a VM whose only disk is a containerDisk image the node has never
    pulled (a new image per round: the boot disk plus a marker file, so its digest is new),
    from `POST` of the VM until its VMI is Running; the pull is included.
  - edgevirt, warm cache: the same image again (a new VM), already in the node's cache.
  - baseline: `skopeo copy` of the same cold image from the registry to a local OCI layout,
    the disk taken out of its layer, then `virsh create` of a domain booting it, until
    `virsh domstate` says running.
Reports the medians and the ratios edgevirt/baseline. Each VM and domain is removed before
the next round. Uses loopback, the local libvirt, and a temporary data dir; removes what it
made on exit.
"""

import gzip
import hashlib
import io
import json
import os
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
GUEST = os.environ.get("EDGEVIRT_TEST_GUEST", os.path.join(REPO, "target/test-guest"))
BIN = os.environ.get("EDGEVIRT_BIN", os.path.join(REPO, "target/debug/edgevirt"))
URI = "qemu:///system"
TIMEOUT = 180


def log(*a):
    print("[bench]", *a, file=sys.stderr, flush=True)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_port(port, what, proc):
    deadline = time.time() + 60
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{what} exited")
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"{what} did not listen on {port}")


def sha256(b):
    return "sha256:" + hashlib.sha256(b).hexdigest()


def oci_layout(dest, disk, marker):
    """An OCI layout at dest holding disk as /disk/disk.img (plus a marker file, so each
    round's image has its own digest), tag `v1`."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        t.add(disk, arcname="disk/disk.img")
        data = marker.encode()
        info = tarfile.TarInfo("disk/.marker")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    raw = buf.getvalue()
    layer = gzip.compress(raw, compresslevel=1, mtime=0)
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "rootfs": {"type": "layers", "diff_ids": [sha256(raw)]},
        }
    ).encode()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": sha256(config),
                "size": len(config),
            },
            "layers": [
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": sha256(layer),
                    "size": len(layer),
                }
            ],
        }
    ).encode()
    blobs = os.path.join(dest, "blobs/sha256")
    os.makedirs(blobs)
    for b in (layer, config, manifest):
        with open(os.path.join(blobs, sha256(b)[7:]), "wb") as f:
            f.write(b)
    with open(os.path.join(dest, "oci-layout"), "w") as f:
        json.dump({"imageLayoutVersion": "1.0.0"}, f)
    with open(os.path.join(dest, "index.json"), "w") as f:
        json.dump(
            {
                "schemaVersion": 2,
                "manifests": [
                    {
                        "mediaType": "application/vnd.oci.image.manifest.v1+json",
                        "digest": sha256(manifest),
                        "size": len(manifest),
                        "annotations": {"org.opencontainers.image.ref.name": "v1"},
                    }
                ],
            },
            f,
        )


def run(*cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


class Api:
    def __init__(self, url, token):
        self.url, self.token = url, token
        self.ctx = ssl.create_default_context()
        self.ctx.check_hostname = False
        self.ctx.verify_mode = ssl.CERT_NONE

    def call(self, method, path, body=None):
        req = urllib.request.Request(self.url + path, method=method)
        req.add_header("Authorization", "Bearer " + self.token)
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, data, context=self.ctx, timeout=30) as r:
                return r.status, json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")


VMS = "/apis/kubevirt.io/v1/namespaces/default/virtualmachines"


def vm(name, image):
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachine",
        "metadata": {"name": name},
        "spec": {
            "runStrategy": "Always",
            "template": {
                "spec": {
                    "domain": {
                        "memory": {"guest": "128Mi"},
                        "devices": {
                            "disks": [{"name": "root", "disk": {"bus": "virtio"}}],
                            "autoattachGraphicsDevice": False,
                        },
                    },
                    "volumes": [{"name": "root", "containerDisk": {"image": image}}],
                }
            },
        },
    }


def edgevirt_round(api, name, image):
    t0 = time.monotonic()
    code, v = api.call("POST", VMS, vm(name, image))
    if code != 201:
        sys.exit(f"creating {name}: {code} {v}")
    vmi = f"/apis/kubevirt.io/v1/namespaces/default/virtualmachineinstances/{name}"
    while time.monotonic() - t0 < TIMEOUT:
        code, v = api.call("GET", vmi)
        if code == 200 and v.get("status", {}).get("phase") == "Running":
            ms = (time.monotonic() - t0) * 1000
            api.call("DELETE", f"{VMS}/{name}")
            while api.call("GET", vmi)[0] != 404:
                time.sleep(0.2)
            return ms
        time.sleep(0.02)
    sys.exit(f"{name}: not Running after {TIMEOUT}s")


DOMAIN = """<domain type='qemu'>
  <name>{name}</name>
  <memory unit='MiB'>128</memory>
  <vcpu>1</vcpu>
  <os><type arch='x86_64' machine='q35'>hvm</type><boot dev='hd'/></os>
  <features><acpi/><apic/></features>
  <devices>
    <disk type='file' device='disk'><driver name='qemu' type='raw'/>
      <source file='{disk}'/><target dev='vda' bus='virtio'/></disk>
    <serial type='pty'><target port='0'/></serial>
  </devices>
</domain>
"""


def baseline_round(registry, repo, work, name):
    t0 = time.monotonic()
    layout = os.path.join(work, name)
    run(
        "skopeo", "copy", "--quiet", "--src-tls-verify=false",
        f"docker://{registry}/{repo}:v1", f"oci:{layout}:v1",
    )
    with open(os.path.join(layout, "index.json")) as f:
        mdigest = json.load(f)["manifests"][0]["digest"]
    with open(os.path.join(layout, "blobs/sha256", mdigest[7:])) as f:
        ldigest = json.load(f)["layers"][0]["digest"]
    disk = os.path.join(work, name + ".img")
    with tarfile.open(os.path.join(layout, "blobs/sha256", ldigest[7:]), "r:gz") as t:
        src = t.extractfile("disk/disk.img")
        with open(disk, "wb") as out:
            while chunk := src.read(1 << 20):
                out.write(chunk)
    xml = os.path.join(work, name + ".xml")
    with open(xml, "w") as f:
        f.write(DOMAIN.format(name=name, disk=disk))
    run("virsh", "-c", URI, "create", xml)
    while time.monotonic() - t0 < TIMEOUT:
        st = subprocess.run(
            ["virsh", "-c", URI, "domstate", name], capture_output=True, text=True
        ).stdout.strip()
        if st == "running":
            ms = (time.monotonic() - t0) * 1000
            run("virsh", "-c", URI, "destroy", name)
            return ms
        time.sleep(0.02)
    sys.exit(f"{name}: not running after {TIMEOUT}s")


def main():
    bootdisk = os.path.join(GUEST, "bootdisk.img")
    if not os.path.exists(bootdisk):
        sys.exit(f"{bootdisk} is missing: tests/guest/build-bootdisk.sh {GUEST}")
    procs = []
    tmp = tempfile.TemporaryDirectory(dir="/var/tmp", prefix="evbench-cd-")
    work = tmp.name
    domains = []
    had_net = subprocess.run(
        ["virsh", "-c", URI, "net-info", "evbench"], capture_output=True
    ).returncode == 0

    def cleanup(*_):
        for p in procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
        for d in domains:
            subprocess.run(["virsh", "-c", URI, "destroy", d], capture_output=True)
        if not had_net:
            for verb in ("net-destroy", "net-undefine"):
                subprocess.run(["virsh", "-c", URI, verb, "evbench"], capture_output=True)
        tmp.cleanup()

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    try:
        port = free_port()
        registry = f"127.0.0.1:{port}"
        with open(os.path.join(work, "registry.yml"), "w") as f:
            f.write(
                f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n"
                f"    rootdirectory: {work}/registry\nhttp:\n  addr: {registry}\n"
            )
        procs.append(
            subprocess.Popen(
                ["docker-registry", "serve", os.path.join(work, "registry.yml")],
                stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "registry.log"), "w"),
            )
        )
        wait_port(port, "docker-registry", procs[-1])
        # One image per round and side, each with its own digest: every cold pull is cold.
        repos = []
        for i in range(ROUNDS):
            for side in ("ev", "base"):
                repo = f"bench/{side}{i}"
                layout = os.path.join(work, f"layout-{side}{i}")
                oci_layout(layout, bootdisk, f"{side}{i}-{time.time_ns()}")
                run(
                    "skopeo", "copy", "--quiet", "--dest-tls-verify=false",
                    f"oci:{layout}:v1", f"docker://{registry}/{repo}:v1",
                )
                repos.append(repo)
        data = os.path.join(work, "data")
        os.makedirs(data)
        sport = free_port()
        serve = subprocess.Popen(
            [
                BIN, "serve", "--data-dir", data, "--listen", f"127.0.0.1:{sport}",
                "--accel", "qemu", "--nat-network", "evbench", "--nat-prefix", "10.213.61",
                "--node-name", "bench", "--tls",
                "--registry-mirror", f"bench.registry:5000=http://{registry}",
            ],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "serve.log"), "w"),
        )
        procs.append(serve)
        wait_port(sport, "edgevirt serve", serve)
        token = ""
        deadline = time.time() + 30
        while not token and time.time() < deadline:
            try:
                with open(os.path.join(data, "initial-admin")) as f:
                    token = next(
                        (l.split("=", 1)[1].strip() for l in f if l.startswith("token=")), ""
                    )
            except FileNotFoundError:
                time.sleep(0.1)
        api = Api(f"https://127.0.0.1:{sport}", token)
        def node_ready():
            code, node = api.call("GET", "/apis/edgevirt.io/v1/nodes/bench")
            if code != 200:
                return False
            conds = node.get("status", {}).get("conditions", [])
            return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)

        deadline = time.time() + 60
        while not node_ready():
            if time.time() > deadline:
                sys.exit("the node did not become Ready")
            time.sleep(0.2)
        cold, warm, base = [], [], []
        for i in range(ROUNDS):
            image = f"bench.registry:5000/bench/ev{i}:v1"
            cold.append(edgevirt_round(api, f"cold{i}", image))
            warm.append(edgevirt_round(api, f"warm{i}", image))
            name = f"evbench-cd-{i}-{os.getpid()}"
            domains.append(name)
            base.append(baseline_round(registry, f"bench/base{i}", work, name))
            log(f"round {i}: cold {cold[-1]:.0f} ms, warm {warm[-1]:.0f} ms, "
                f"skopeo copy + virsh create {base[-1]:.0f} ms")
        m = statistics.median
        size = os.path.getsize(bootdisk) >> 20
        print(f"containerDisk create -> Running ({ROUNDS} rounds, {size} MiB raw disk, "
              f"gzip layer, loopback registry; medians):")
        print(f"  edgevirt, cold cache (pull included): {m(cold):8.0f} ms  "
              f"{m(cold) / m(base):.2f}x the baseline")
        print(f"  edgevirt, warm cache:                 {m(warm):8.0f} ms  "
              f"{m(warm) / m(base):.2f}x the baseline")
        print(f"  baseline, skopeo copy + virsh create: {m(base):8.0f} ms")
    finally:
        cleanup()


if __name__ == "__main__":
    main()
