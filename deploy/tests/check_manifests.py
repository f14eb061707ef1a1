#!/usr/bin/env python3
"""Checks the invariants of rendered posenc manifests that schemas cannot.

Usage: check_manifests.py OVERLAY RENDERED.yaml

Reads the server's health-service names from server/server.h and the image's
user and ports from the Dockerfile, so manifests and code cannot drift apart.
Exits non-zero listing every broken invariant.
"""
import pathlib
import re
import sys

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]


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
    (config,) = by_kind["ConfigMap"]
    env = config["data"]
    pod = deploy["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    liveness_name, readiness_name = server_constants()

    # Ports: flags, container, probes, image.
    grpc_port = int(env["POSENC_LISTEN"].rsplit(":", 1)[1])
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
            check(p["targetPort"] in ports, f"Service {name} targets unknown port {p['targetPort']}")
    (hpa,) = by_kind["HorizontalPodAutoscaler"]
    check(hpa["apiVersion"] == "autoscaling/v2", "HPA must be autoscaling/v2")
    check(hpa["spec"]["scaleTargetRef"]["name"] == deploy["metadata"]["name"], "HPA must target the Deployment")
    (pdb,) = by_kind["PodDisruptionBudget"]
    check(selects(pdb["spec"]["selector"]["matchLabels"]), "PDB does not select the pods")
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    check(any(m["mountPath"] == env["POSENC_TABLE_DIR"] for m in container.get("volumeMounts", [])),
          "the table repository volume must be mounted at POSENC_TABLE_DIR")
    check("tables" in volumes, "the tables volume must exist")

    if errors:
        print(f"{overlay}: {len(errors)} invariant(s) broken:")
        for e in errors:
            print(f"  - {e}")
        return 1
    print(f"{overlay}: all invariants hold")
    return 0


if __name__ == "__main__":
    sys.exit(main())
