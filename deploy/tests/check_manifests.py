#!/usr/bin/env python3
"""Checks the invariants of rendered posenc manifests that schemas cannot.

Usage: check_manifests.py OVERLAY RENDERED.yaml

Reads the server's health-service names from server/server.h and the image's
user and ports from the Dockerfile, so manifests and code cannot drift apart.
Exits non-zero listing every broken invariant.
"""
import json
import pathlib
import re
import sys

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
# Bytes the server needs beyond its admission budget and tables: code,
# thread stacks, gRPC's buffers, allocator slack (measured peak RSS of an
# idle server plus tests/memory_bound_test's margin, rounded up).
PROCESS_OVERHEAD = 512 << 20
# The fixed overhead the server itself counts (kFixedOverheadBytes).
SERVER_FIXED_OVERHEAD = 96 << 20


def quantity(text):
    """Bytes of a Kubernetes memory quantity such as 4Gi or 512Mi."""
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "k": 10**3, "M": 10**6, "G": 10**9}
    m = re.fullmatch(r"(\d+)([KMGT]i|[kMG])?", str(text))
    if not m:
        raise ValueError(f"unsupported quantity {text!r}")
    return int(m.group(1)) * units.get(m.group(2), 1)


def server_constants():
    text = (ROOT / "server" / "server.h").read_text()
    names = dict(re.findall(r'inline constexpr char (k\w+Service)\[\] = "([^"]*)";', text))
    return names["kLivenessService"], names["kReadinessService"]


def dockerfile_facts():
    text = (ROOT / "Dockerfile").read_text()
    users = re.findall(r"^USER\s+(\d+)(?::(\d+))?", text, re.M)
    exposed = {int(p) for line in re.findall(r"^EXPOSE\s+(.+)$", text, re.M) for p in line.split()}
    return users, exposed


def main():
    overlay, path = sys.argv[1], sys.argv[2]
    docs = [d for d in yaml.safe_load_all(pathlib.Path(path).read_text()) if d]
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    errors = []

    def check(cond, msg):
        if not cond:
            errors.append(msg)

    (deploy,) = by_kind["Deployment"]
    configs = {c["metadata"]["name"].rsplit("-", 1)[0]: c for c in by_kind["ConfigMap"]}
    config = configs["posenc-config"]
    env = config["data"]
    pod = deploy["spec"]["template"]["spec"]
    # posenc's own container: the pod's only one, or in the sidecar overlay
    # a native sidecar (an init container) beside the model server's.
    (container,) = [c for c in pod["containers"] + pod.get("initContainers", [])
                    if c["name"] == "posenc"]

    # The KServe model repository: the posenc-models ConfigMap mounted at
    # POSENC_MODEL_DIR, each key a <name>.json object naming an operation.
    models = configs.get("posenc-models")
    check(models is not None, "the posenc-models ConfigMap must exist")
    if models is not None:
        for key, text in models.get("data", {}).items():
            check(key.endswith(".json") and "operation" in json.loads(text),
                  f"posenc-models key {key} must be <name>.json naming an operation")
        vols = [v for v in pod.get("volumes", [])
                if v.get("configMap", {}).get("name") == models["metadata"]["name"]]
        mounted = {m["name"]: m for m in container.get("volumeMounts", [])}
        check(len(vols) == 1 and mounted.get(vols[0]["name"], {}).get("mountPath")
              == env.get("POSENC_MODEL_DIR"), "posenc-models must be mounted at POSENC_MODEL_DIR")
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    liveness_name, readiness_name = server_constants()

    # Ports: flags, container, probes, image.
    listen = env["POSENC_LISTEN"].split(",")
    tcp = [a for a in listen if not a.startswith("unix:")]
    check(len(tcp) == 1, f"POSENC_LISTEN must have one TCP address (probes use it), got {listen}")
    grpc_port = int(tcp[0].rsplit(":", 1)[1])
    metrics_port = int(env["POSENC_METRICS_LISTEN"].rsplit(":", 1)[1])
    check(ports.get("grpc") == grpc_port, f"grpc containerPort {ports.get('grpc')} != --listen port {grpc_port}")
    check(ports.get("metrics") == metrics_port, f"metrics containerPort != --metrics_listen port {metrics_port}")
    annotations = deploy["spec"]["template"]["metadata"].get("annotations", {})
    check(annotations.get("prometheus.io/port") == str(metrics_port), "prometheus.io/port annotation != metrics port")
    for probe, service in (("startupProbe", liveness_name), ("livenessProbe", liveness_name),
                           ("readinessProbe", readiness_name)):
        g = container.get(probe, {}).get("grpc")
        check(g is not None, f"{probe} must be a native gRPC probe")
        if g:
            check(g["port"] == grpc_port, f"{probe} port {g['port']} != grpc port {grpc_port}")
            check(g.get("service") == service, f"{probe} service {g.get('service')!r} != server's {service!r}")
    check(liveness_name != readiness_name, "liveness and readiness must use distinct health services")
    users, exposed = dockerfile_facts()
    check({grpc_port, metrics_port} <= exposed, f"Dockerfile EXPOSE {sorted(exposed)} lacks {grpc_port}/{metrics_port}")

    # Drain fits in the grace period.
    grace = pod["terminationGracePeriodSeconds"]
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    sleep = int(pre_stop[-1]) if pre_stop[0].endswith("sleep") else 0
    drain = int(env["POSENC_DRAIN_SECONDS"])
    check(sleep + drain < grace, f"preStop {sleep}s + drain {drain}s must be < grace {grace}s")

    # Restricted security context.
    psc, csc = pod.get("securityContext", {}), container.get("securityContext", {})
    check(psc.get("runAsNonRoot") is True, "pod runAsNonRoot must be true")
    check(psc.get("seccompProfile", {}).get("type") == "RuntimeDefault", "seccompProfile must be RuntimeDefault")
    check(csc.get("allowPrivilegeEscalation") is False, "allowPrivilegeEscalation must be false")
    check(csc.get("readOnlyRootFilesystem") is True, "readOnlyRootFilesystem must be true")
    check(csc.get("capabilities", {}).get("drop") == ["ALL"], "capabilities must drop ALL")
    check(any(int(u) == psc.get("runAsUser") for u, _ in users),
          f"Dockerfile USER {users} must match runAsUser {psc.get('runAsUser')}")

    # GPUs only where they belong.
    limits = container.get("resources", {}).get("limits", {})
    has_gpu = "nvidia.com/gpu" in limits
    if overlay == "gpu":
        check(limits.get("nvidia.com/gpu") == 1, "gpu overlay must ask for nvidia.com/gpu: 1")
        check(any(t.get("key") == "nvidia.com/gpu" for t in pod.get("tolerations", [])),
              "gpu overlay must tolerate the nvidia.com/gpu taint")
        check("nodeSelector" in pod, "gpu overlay must select GPU nodes")
        check(container["image"].endswith(":cuda"), "gpu overlay must run the CUDA image")
    else:
        check(not has_gpu, f"{overlay} overlay must not ask for GPUs")
        check(not any(t.get("key") == "nvidia.com/gpu" for t in pod.get("tolerations", [])),
              f"{overlay} overlay must not tolerate GPU taints")

    # Services, HPA and PDB select these pods.
    labels = deploy["spec"]["template"]["metadata"]["labels"]
    selects = lambda sel: sel and all(labels.get(k) == v for k, v in sel.items())
    services = {s["metadata"]["name"]: s for s in by_kind["Service"]}
    check("posenc-headless" in services and services["posenc-headless"]["spec"].get("clusterIP") == "None",
          "posenc-headless must be a headless Service (clusterIP: None)")
    for name, svc in services.items():
        check(selects(svc["spec"].get("selector")), f"Service {name} does not select the pods")
        for p in svc["spec"]["ports"]:
            check(p["targetPort"] in ports or p["targetPort"] in ports.values(),
                  f"Service {name} targets unknown port {p['targetPort']}")
            # A native sidecar's named ports are not resolved everywhere.
            check(overlay != "sidecar" or isinstance(p["targetPort"], int),
                  f"sidecar overlay: Service {name} must target port {p['targetPort']} by number")
    (hpa,) = by_kind["HorizontalPodAutoscaler"]
    check(hpa["apiVersion"] == "autoscaling/v2", "HPA must be autoscaling/v2")
    check(hpa["spec"]["scaleTargetRef"]["name"] == deploy["metadata"]["name"], "HPA must target the Deployment")
    (pdb,) = by_kind["PodDisruptionBudget"]
    check(selects(pdb["spec"]["selector"]["matchLabels"]), "PDB does not select the pods")
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    check(any(m["mountPath"] == env["POSENC_TABLE_DIR"] for m in container.get("volumeMounts", [])),
          "the table repository volume must be mounted at POSENC_TABLE_DIR")
    check("tables" in volumes, "the tables volume must exist")

    # A namespace of its own, declared with the objects that live in it.
    namespaces = [n["metadata"]["name"] for n in by_kind.get("Namespace", [])]
    check(len(namespaces) == 1 and namespaces[0] != "default",
          f"exactly one Namespace other than default must be declared, got {namespaces}")
    for d in docs:
        if d["kind"] != "Namespace":
            ns = d["metadata"].get("namespace")
            check(ns in namespaces, f"{d['kind']}/{d['metadata']['name']} is in namespace {ns!r}")

    # Resources: requests and limits for CPU and memory, and the server's own
    # memory budget inside the limit (refusal before the OOM killer).
    resources = container.get("resources", {})
    for kind in ("requests", "limits"):
        for r in ("cpu", "memory"):
            check(r in resources.get(kind, {}), f"container {kind} must set {r}")
    memory_limit = quantity(limits.get("memory", "0"))
    request = int(env.get("POSENC_MAX_REQUEST_BYTES", 0))
    message = int(env.get("POSENC_MAX_MESSAGE_BYTES", 0))
    inflight = int(env.get("POSENC_MAX_INFLIGHT_BYTES", 0))
    tables = int(env.get("POSENC_MAX_TABLE_BYTES", 0))
    check(inflight > 0 and tables > 0 and message > 0 and request > 0,
          "POSENC_MAX_REQUEST_BYTES, POSENC_MAX_MESSAGE_BYTES, POSENC_MAX_INFLIGHT_BYTES and "
          "POSENC_MAX_TABLE_BYTES must be set")
    # Every call being read, and every open stream between messages, holds
    # 2 x the message limit (docs/server.md "Memory"); a message limit past
    # the largest request (+ the server's 4 MiB of framing) only lowers how
    # many fit, and the HPA must add pods before that many are computing.
    check(request + (4 << 20) <= message <= request + (8 << 20),
          f"max_message_bytes {message} must be max_request_bytes {request} + 4 to 8 MiB")
    reads = inflight // (2 * message) if message > 0 else 0
    (hpa_target,) = [int(m["pods"]["target"]["averageValue"])
                     for m in by_kind["HorizontalPodAutoscaler"][0]["spec"]["metrics"]
                     if m["type"] == "Pods" and m["pods"]["metric"]["name"] == "posenc_inflight_requests"]
    check(reads > hpa_target,
          f"max_inflight_bytes {inflight} holds {reads} calls being read (2 x {message} each), "
          f"not more than the HPA's in-flight target {hpa_target}")
    budget = inflight + tables + PROCESS_OVERHEAD
    check(budget <= memory_limit,
          f"in-flight {inflight} + tables {tables} + {PROCESS_OVERHEAD} overhead = {budget} bytes "
          f"exceeds the memory limit {memory_limit}")
    # The server's own start-up check (engine/memory_limit.h PeakMemoryBytes,
    # docs/server.md "Under a memory limit"), which warns where it fails.
    peak = inflight + 2 * message + tables + SERVER_FIXED_OVERHEAD
    check(peak <= memory_limit,
          f"in-flight {inflight} + 2 x message {message} + tables {tables} + "
          f"{SERVER_FIXED_OVERHEAD} = {peak} bytes exceeds the memory limit {memory_limit}: "
          f"the server would warn at start-up")

    # Pull by digest must be possible (overlays name the image, kustomize
    # pins it: see check_deploy.sh), and a pinned image is always re-checked.
    check(container.get("imagePullPolicy") == "Always", "imagePullPolicy must be Always")

    # NetworkPolicy: these pods, the container's two ports in, nothing out
    # (the sidecar overlay's below).
    (policy,) = by_kind.get("NetworkPolicy", [None]) or [None]
    check(policy is not None, "a NetworkPolicy must restrict the pods")
    if policy:
        spec = policy["spec"]
        check(selects(spec["podSelector"].get("matchLabels")), "NetworkPolicy does not select the pods")
        check(set(spec.get("policyTypes", [])) == {"Ingress", "Egress"},
              "NetworkPolicy must govern Ingress and Egress")
        allowed = {p["port"] for rule in spec.get("ingress", []) for p in rule.get("ports", [])}
        check(all(rule.get("ports") for rule in spec.get("ingress", [])),
              "every NetworkPolicy ingress rule must name its ports")
        if overlay != "sidecar":
            check(allowed == {"grpc", "metrics"},
                  f"NetworkPolicy must admit exactly grpc and metrics, got {allowed}")
            check(spec.get("egress") == [], "NetworkPolicy must deny all egress (the server dials nothing)")

    # The table volume: an emptyDir, or a claim that exists and binds
    # somewhere (a storage class named).
    if "tables" in volumes:
        claim = volumes["tables"].get("persistentVolumeClaim")
        check(claim is not None or "emptyDir" in volumes["tables"], "tables must be a PVC or an emptyDir")
        if claim:
            pvcs = {c["metadata"]["name"]: c for c in by_kind.get("PersistentVolumeClaim", [])}
            check(claim["claimName"] in pvcs, f"claim {claim['claimName']} is not rendered")
            pvc = pvcs.get(claim["claimName"], {}).get("spec", {})
            check(pvc.get("storageClassName"), "the table claim must name its storage class")
            check(claim.get("readOnly") is True, "the table volume must be mounted read-only")

    # GPU pods never fall back to serving from the CPU while looking healthy.
    if overlay == "gpu":
        check(env.get("POSENC_DEFAULT_BACKEND") == "cuda",
              "gpu overlay must set POSENC_DEFAULT_BACKEND=cuda (readiness fails without CUDA)")

    # ServiceMonitor: scrapes a Service that has the metrics port.
    for monitor in by_kind.get("ServiceMonitor", []):
        sel = monitor["spec"]["selector"]["matchLabels"]
        matched = [svc for svc in by_kind["Service"]
                   if all(svc["metadata"].get("labels", {}).get(k) == v for k, v in sel.items())]
        check(matched, "ServiceMonitor selects no Service")
        for ep in monitor["spec"]["endpoints"]:
            check(all(any(p["name"] == ep["port"] for p in svc["spec"]["ports"]) for svc in matched),
                  f"ServiceMonitor port {ep['port']!r} missing on a selected Service")
            check(ep.get("path", "/metrics") == "/metrics", "ServiceMonitor path must be /metrics")
    if overlay == "monitoring":
        check(by_kind.get("ServiceMonitor"), "monitoring overlay must render a ServiceMonitor")

    # The sidecar: posenc and the model server share a memory-backed
    # /dev/shm (regions) and the directory of posenc's Unix socket, and
    # posenc serves shared memory.
    sockets = [a[len("unix:"):] for a in listen if a.startswith("unix:")]
    if overlay == "sidecar":
        check(env.get("POSENC_ENABLE_SYSTEM_SHARED_MEMORY") == "true",
              "sidecar overlay must set POSENC_ENABLE_SYSTEM_SHARED_MEMORY=true")
        check(len(sockets) == 1, "sidecar overlay must listen on a Unix socket too")
        check(container in pod.get("initContainers", []) and container.get("restartPolicy") == "Always",
              "sidecar overlay must run posenc as a native sidecar (an init container with "
              "restartPolicy Always: up before the model server starts, down after it stops)")
        others = [c for c in pod["containers"] if c["name"] != "posenc"]
        check(len(others) == 1, "sidecar overlay must run one model-server container beside posenc")
        # Shared memory is for the pod: posenc's gRPC port is closed to other
        # pods, and every port of the model server is open (the policy
        # covers its container too), as is egress.
        numbers = {**ports, **{p["name"]: p["containerPort"] for c in others for p in c.get("ports", [])}}
        admitted = {numbers.get(p, p) for p in allowed} if policy else set()
        check(grpc_port not in admitted,
              f"sidecar NetworkPolicy must not admit posenc's gRPC port {grpc_port}: "
              "other pods could have it map and write the pod's /dev/shm")
        for c in others:
            for p in c.get("ports", []):
                check(p["containerPort"] in admitted,
                      f"sidecar NetworkPolicy blocks {c['name']}'s port {p['containerPort']}")
        check(metrics_port in admitted, "sidecar NetworkPolicy must admit the metrics port")
        check(policy is None or policy["spec"].get("egress") != [],
              "sidecar NetworkPolicy must not deny the model server's egress")
        shm_bytes = int(env.get("POSENC_MAX_SHARED_MEMORY_BYTES", 0))
        for c in [container] + others:
            mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
            shm = volumes.get(mounts.get("/dev/shm", ""), {})
            check(shm.get("emptyDir", {}).get("medium") == "Memory",
                  f"container {c['name']} must mount a memory emptyDir at /dev/shm")
            size = quantity(shm.get("emptyDir", {}).get("sizeLimit", "0"))
            check(0 < shm_bytes <= size,
                  f"POSENC_MAX_SHARED_MEMORY_BYTES {shm_bytes} must be set and within "
                  f"{c['name']}'s /dev/shm sizeLimit {size} (a client writing past a full "
                  "tmpfs gets SIGBUS)")
            if sockets:
                folder = sockets[0].rsplit("/", 1)[0]
                check(folder in mounts, f"container {c['name']} must mount {folder} (the socket)")
            check(not c.get("securityContext", {}).get("runAsUser"),
                  f"container {c['name']} must run as the pod's user (regions are 0600)")
    else:
        check(not sockets, f"{overlay} overlay listens on TCP only")

    if errors:
        print(f"{overlay}: {len(errors)} invariant(s) broken:")
        for e in errors:
            print(f"  - {e}")
        return 1
    print(f"{overlay}: all invariants hold")
    return 0


if __name__ == "__main__":
    sys.exit(main())
