#!/usr/bin/env python3
"""Fan-out measurement on the local control plane: one ClusterProjection selecting N namespaces,
then one source edit. Reports the time until the first and the last copy carry the edit (observed
through a watch of the copies), and the apiserver requests made meanwhile by verb and resource
(from the apiserver's apiserver_request_total, minus the edit itself and the measuring watch).

Run with a controller already running against the cluster (e.g. `scripts/demo.sh`), or pass
--controller to start target/debug/projection-controller. Uses .testenv/admin.kubeconfig only.

    tests/bench/fanout.py --namespaces 200
"""
import argparse, json, os, re, subprocess, sys, threading, time, collections

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ENV = os.environ.get("TESTENV_DIR", os.path.join(ROOT, ".testenv"))  # the control plane of up.sh
KUBECONFIG = os.path.join(ENV, "admin.kubeconfig")
KUBECTL = os.path.join(ENV, "bin", "kubectl")


def kubectl(*args, stdin=None, check=True):
    out = subprocess.run([KUBECTL, "--kubeconfig", KUBECONFIG, *args], input=stdin, capture_output=True, text=True)
    if check and out.returncode != 0:
        sys.exit(f"kubectl {' '.join(args)} failed: {out.stderr}")
    return out.stdout


def request_counts():
    raw = kubectl("get", "--raw", "/metrics")
    counts = collections.Counter()
    for line in raw.splitlines():
        m = re.match(r'apiserver_request_total\{(.*)\} (\S+)', line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        key = (labels.get("verb"), labels.get("resource"), labels.get("subresource", ""))
        counts[key] += float(m.group(2))
    return counts


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--namespaces", type=int, default=200)
    ap.add_argument("--controller", action="store_true", help="start target/debug/projection-controller")
    ap.add_argument("--keep", action="store_true", help="keep the namespaces afterwards")
    args = ap.parse_args()
    run = f"bench-{os.getpid()}"
    label = f"projection.bench/run={run}"
    controller = None
    if args.controller:
        controller = subprocess.Popen([os.path.join(ROOT, "target", "debug", "projection-controller"),
                                       "--health-probe-bind-address", "127.0.0.1:0"],
                                      env={**os.environ, "KUBECONFIG": KUBECONFIG, "RUST_LOG": "warn"},
                                      stderr=subprocess.DEVNULL)
        time.sleep(2)
    try:
        docs = [f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {run}-src\n  labels: {{projection.bench/run: {run}}}\n"]
        docs += [f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {run}-{i:04d}\n  labels: {{projection.bench/run: {run}, projection.bench/target: {run}}}\n"
                 for i in range(args.namespaces)]
        kubectl("apply", "-f", "-", stdin="---\n".join(docs))
        kubectl("apply", "-f", "-", stdin=f"""apiVersion: v1
kind: ConfigMap
metadata: {{name: cfg, namespace: {run}-src, annotations: {{projection.sh/projectable: "true"}}}}
data: {{stamp: "0"}}
---
apiVersion: projection.sh/v1
kind: ClusterProjection
metadata: {{name: {run}, labels: {{projection.bench/run: {run}}}}}
spec:
  source: {{kind: ConfigMap, namespace: {run}-src, name: cfg}}
  destination: {{namespaceSelector: {{matchLabels: {{projection.bench/target: {run}}}}}}}
""")
        deadline = time.time() + 120
        while time.time() < deadline:
            out = kubectl("get", "clusterprojection", run, "-o", "jsonpath={.status.namespacesWritten}", check=False)
            if out.strip() == str(args.namespaces):
                break
            time.sleep(0.2)
        else:
            sys.exit("the fan-out never completed")
        # Let kube-controller-manager finish seeding the new namespaces (ServiceAccounts, root CA).
        previous = request_counts()
        for _ in range(120):
            time.sleep(1)
            current = request_counts()
            if all(current[k] == previous[k] for k in current if k[0] == "POST"):
                break
            previous = current

        # Watch the copies; record when each first shows the new stamp.
        seen = {}
        watcher = subprocess.Popen([KUBECTL, "--kubeconfig", KUBECONFIG, "get", "configmaps", "-A", "-l",
                                    f"projection.sh/owned-by-cluster-projection-uid", "--watch-only", "-o",
                                    "jsonpath={.metadata.namespace} {.data.stamp}{\"\\n\"}"],
                                   stdout=subprocess.PIPE, text=True)
        def consume():
            for line in watcher.stdout:
                ns, _, stamp = line.strip().partition(" ")
                if stamp == "1" and ns.startswith(run) and ns not in seen:
                    seen[ns] = time.time()
        threading.Thread(target=consume, daemon=True).start()
        time.sleep(1)
        before = request_counts()
        start = time.time()
        kubectl("patch", "configmap", "cfg", "-n", f"{run}-src", "--type", "merge", "-p", '{"data":{"stamp":"1"}}')
        while len(seen) < args.namespaces and time.time() < start + 60:
            time.sleep(0.05)
        time.sleep(3)
        after = request_counts()
        watcher.kill()
        if len(seen) < args.namespaces:
            sys.exit(f"only {len(seen)} of {args.namespaces} copies were updated")
        times = sorted(t - start for t in seen.values())
        delta = {k: after[k] - before[k] for k in after if after[k] - before[k] > 0}
        # The edit itself (kubectl patch: GET + PATCH) and the metrics scrape are not the controller's.
        for k in [("GET", "configmaps", ""), ("PATCH", "configmaps", "")]:
            delta[k] = delta.get(k, 0) - 1
        delta = {k: v for k, v in delta.items() if v > 0 and k[1] not in ("", "leases")}
        print(json.dumps({
            "namespaces": args.namespaces,
            "first_copy_seconds": round(times[0], 3),
            "last_copy_seconds": round(times[-1], 3),
            "requests": {f"{v} {r}{'/' + s if s else ''}": int(n) for (v, r, s), n in sorted(delta.items())},
        }, indent=2))
    finally:
        if not args.keep:
            kubectl("delete", "clusterprojection", run, "--wait=true", "--timeout=60s", check=False)
            kubectl("delete", "namespace", "-l", label, "--wait=false", check=False)
        if controller:
            controller.terminate()


if __name__ == "__main__":
    main()
