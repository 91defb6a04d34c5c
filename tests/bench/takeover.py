#!/usr/bin/env python3
"""Leader takeover measurement on the local control plane: two controllers with --leader-elect, a
population of Projections (two source kinds), then, per run: the leader is killed (SIGKILL, so its
Lease is not released and must expire), a source is edited at once, and the time until the copy
carries the edit is measured (observed through a watch of the copy), in total and from the moment
the standby took the Lease (observed through a watch of the Lease): the second figure is the
standby's own start-up, without the wait for the Lease to expire. Each run then starts a new
standby for the next. Reports every run and the medians.

    tests/bench/takeover.py --binary target/debug/projection-controller --runs 5

No other controller may run against the cluster meanwhile. Uses .testenv/admin.kubeconfig only.
"""
import argparse, os, signal, statistics, subprocess, sys, threading, time, urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fanout import ENV, KUBECONFIG, KUBECTL, ROOT, kubectl  # noqa: E402  (the same cluster and kubectl)


def wait(what, check, timeout=120, every=0.1):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if check():
            return
        time.sleep(every)
    sys.exit(f"timed out waiting for {what}")


class Controller:
    def __init__(self, binary, namespace, lease, port):
        self.port = port
        self.log = open(os.path.join(ENV, "logs", f"takeover-{port}.log"), "w")
        self.process = subprocess.Popen(
            [binary, "--leader-elect", "--leader-election-lease-duration", lease,
             "--leader-election-namespace", namespace, "--health-probe-bind-address", f"127.0.0.1:{port}"],
            env={**os.environ, "KUBECONFIG": KUBECONFIG, "RUST_LOG": "info"},
            stdout=self.log, stderr=subprocess.STDOUT)

    def ready(self):
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=1).status == 200
        except OSError:
            return False

    def kill(self):
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=20)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(ROOT, "target", "debug", "projection-controller"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--projections", type=int, default=100, help="Projections per source kind")
    ap.add_argument("--lease", default="4s", help="--leader-election-lease-duration")
    ap.add_argument("--settle", type=float, default=5.0, help="seconds a new standby gets before the kill")
    args = ap.parse_args()
    run = f"takeover-{os.getpid()}"
    src, dst = f"{run}-src", f"{run}-dst"
    docs = [f"apiVersion: v1\nkind: Namespace\nmetadata: {{name: {n}}}\n" for n in (src, dst)]
    for i in range(args.projections):
        docs.append(f"""apiVersion: v1
kind: ConfigMap
metadata: {{name: cm-{i:03d}, namespace: {src}, annotations: {{projection.sh/projectable: "true"}}}}
data: {{stamp: "0"}}
""")
        docs.append(f"""apiVersion: v1
kind: Secret
metadata: {{name: s-{i:03d}, namespace: {src}, annotations: {{projection.sh/projectable: "true"}}}}
stringData: {{k: v}}
""")
        for kind, name in (("ConfigMap", f"cm-{i:03d}"), ("Secret", f"s-{i:03d}")):
            docs.append(f"""apiVersion: projection.sh/v1
kind: Projection
metadata: {{name: {name}, namespace: {dst}}}
spec: {{source: {{version: v1, kind: {kind}, namespace: {src}, name: {name}}}}}
""")
    kubectl("apply", "-f", os.path.join(ROOT, "charts", "projection", "crds"))
    kubectl("apply", "-f", "-", stdin="---\n".join(docs))
    controllers = []
    port = 18600 + os.getpid() % 1000
    try:
        leader = Controller(args.binary, src, args.lease, port)
        controllers.append(leader)
        wait("the first leader", leader.ready)
        total = 2 * args.projections

        def all_ready():
            out = kubectl("get", "projections", "-n", dst, "-o",
                          "jsonpath={range .items[*]}{.status.conditions[?(@.type=='Ready')].status}{'\\n'}{end}",
                          check=False)
            return out.split().count("True") == total
        wait("every Projection ready", all_ready, timeout=300, every=0.5)
        results, startups = [], []
        for n in range(1, args.runs + 1):
            port += 1
            standby = Controller(args.binary, src, args.lease, port)
            controllers.append(standby)
            wait("the standby ready", standby.ready)
            time.sleep(args.settle)
            stamp = f"run-{n}-{time.time()}"
            seen = threading.Event()
            watcher = subprocess.Popen([KUBECTL, "--kubeconfig", KUBECONFIG, "get", "configmap", "cm-000", "-n", dst,
                                        "--watch", "-o", "jsonpath={.data.stamp}{'\\n'}"],
                                       stdout=subprocess.PIPE, text=True)
            arrived = {}

            def follow():
                for line in watcher.stdout:
                    if line.strip() == stamp:
                        arrived["at"] = time.monotonic()
                        seen.set()
                        return
            threading.Thread(target=follow, daemon=True).start()
            holder = kubectl("get", "lease", "projection-controller-leader", "-n", src, "-o",
                             "jsonpath={.spec.holderIdentity}").strip()
            lease_watch = subprocess.Popen([KUBECTL, "--kubeconfig", KUBECONFIG, "get", "lease",
                                            "projection-controller-leader", "-n", src, "--watch", "-o",
                                            "jsonpath={.spec.holderIdentity}{'\\n'}"],
                                           stdout=subprocess.PIPE, text=True)

            def follow_lease():
                for line in lease_watch.stdout:
                    if line.strip() and line.strip() != holder and "taken" not in arrived:
                        arrived["taken"] = time.monotonic()
                        return
            threading.Thread(target=follow_lease, daemon=True).start()
            time.sleep(0.5)  # the watches are established (their first line is the current value)
            leader.kill()
            killed = time.monotonic()
            kubectl("patch", "configmap", "cm-000", "-n", src, "--type", "merge", "-p",
                    f'{{"data": {{"stamp": "{stamp}"}}}}')
            if not seen.wait(120):
                sys.exit(f"run {n}: the edit never reached the copy")
            watcher.kill()
            lease_watch.kill()
            took = arrived["at"] - killed
            after_lease = arrived["at"] - arrived.get("taken", killed)
            results.append(took)
            startups.append(after_lease)
            print(f"run {n}: edit reached the copy {took:.2f}s after the leader was killed, "
                  f"{after_lease:.2f}s after the standby took the Lease", flush=True)
            leader = standby
        print(f"median over {len(results)} runs: {statistics.median(results):.2f}s after the kill, "
              f"{statistics.median(startups):.2f}s after the Lease was taken "
              f"(min {min(results):.2f}s, max {max(results):.2f}s; lease {args.lease}, "
              f"{total} Projections, binary {args.binary})")
    finally:
        # The finalizers need a controller to remove the copies first.
        kubectl("delete", "projections", "--all", "-n", dst, "--timeout=180s", check=False)
        for c in controllers:
            if c.process.poll() is None:
                c.stop()
        kubectl("delete", "namespace", src, dst, "--wait=false", check=False)


if __name__ == "__main__":
    main()
