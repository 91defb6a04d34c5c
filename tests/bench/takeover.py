#!/usr/bin/env python3
"""Takeover measurement on the local control plane: a population of Projections (two source
kinds), then, per run, the controller that reconciles one of them is killed (SIGKILL, so its Lease
is not released and must expire), that CR's source is edited at once, and the time until the copy
carries the edit is measured (observed through a watch of the copy). Afterwards, the apiserver
requests the surviving controllers sent for the CRs they took over, per CR taken over (their own
`rest_client_requests_total`, read once their reconciles have stopped).

Two shapes:
- leader election (default): two controllers with --leader-elect; the leader is killed, the
  standby takes every CR. The time since the standby took the Lease (from a watch of the Lease) is
  reported too: its own start-up, without the wait for the Lease to expire. Each run then starts a
  new standby.
- --shards N: N replicas with --shard-by-lease; the replica that owns the edited CR (the OWNER
  of `kubectl projection status`) is killed, the others take its CRs (as many as that column gave
  it). Each run then restarts it under its name, and waits
  until every member acknowledges the ring of all N again.

Reports every run and the medians.

    tests/bench/takeover.py --binary target/debug/projection-controller --runs 5
    tests/bench/takeover.py --shards 2 --projections 5000 --lease 15s --runs 3

At 100,000 Projections the population takes longer to make and remove than the runs: `--keep`
leaves it (and prints its name) and `--reuse NAME` measures on it again, in another shape.

No other controller may run against the cluster meanwhile. Uses the local control plane's
kubeconfig only (`.testenv`, or `$TESTENV_DIR`).
"""
import argparse, json, os, signal, socket, statistics, subprocess, sys, threading, time, urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fanout import ENV, KUBECONFIG, KUBECTL, ROOT, kubectl, request_counts  # noqa: E402  (the same cluster and kubectl)

MEMBER_LABEL = "projection.sh/controller-member=true"
RING_ANNOTATION = "projection.sh/ring-version"
PROBE_LABEL = "bench.projection.sh/takeover-probe"


def wait(what, check, timeout=120, every=0.1):
    """Polls `check` until it holds, `every` seconds apart, or as long as a check took when that is
    longer, up to a minute (a list of 100,000 Projections took the loaded apiserver 3 minutes here,
    and polls back to back load the apiserver being measured)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        began = time.time()
        if check():
            return
        time.sleep(max(every, min(60.0, time.time() - began)))
    sys.exit(f"timed out waiting for {what}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Controller:
    def __init__(self, binary, namespace, lease, shard_name=None):
        self.port, self.metrics_port, self.name = free_port(), free_port(), shard_name
        self.log = open(os.path.join(ENV, "logs", f"takeover-{self.port}.log"), "w")
        shape = ["--shard-by-lease"] if shard_name else ["--leader-elect"]
        env = {**os.environ, "KUBECONFIG": KUBECONFIG, "RUST_LOG": "info"}
        if shard_name:
            env["POD_NAME"] = shard_name
        self.process = subprocess.Popen(
            [binary, *shape, "--leader-election-lease-duration", lease,
             "--leader-election-namespace", namespace, "--health-probe-bind-address", f"127.0.0.1:{self.port}",
             "--metrics-bind-address", f"127.0.0.1:{self.metrics_port}"],
            env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def get(self, path, port=None):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port or self.port}{path}", timeout=2) as response:
                return response.status, response.read().decode()
        except OSError:
            return None, ""

    def ready(self):
        return self.get("/readyz")[0] == 200

    def metric(self, name):
        """The sum of every series of `name` on its /metrics."""
        total = 0.0
        for line in self.get("/metrics", self.metrics_port)[1].splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def kill(self):
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=20)


def author_record():
    """The author annotation the webhook would record for us (this kubeconfig's user), byte for byte
    as the admission policy writes it: the controllers copy as their CRs' authors."""
    user = json.loads(kubectl("auth", "whoami", "-o", "json"))["status"]["userInfo"]
    return json.dumps({"username": user["username"], "groups": user.get("groups", [])}, separators=(",", ":"))


def population(src, dst, per_kind):
    author = author_record()
    docs = [f"apiVersion: v1\nkind: Namespace\nmetadata: {{name: {n}}}\n" for n in (src, dst)]
    for i in range(per_kind):
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
            label = f", labels: {{{PROBE_LABEL}: \"true\"}}" if name == "cm-000" else ""
            docs.append(f"""apiVersion: projection.sh/v1
kind: Projection
metadata: {{name: {name}, namespace: {dst}{label}, annotations: {{projection.sh/author: '{author}'}}}}
spec: {{source: {{version: v1, kind: {kind}, namespace: {src}, name: {name}}}}}
""")
    return docs


def create_in_parallel(docs, streams=4):
    """`kubectl create` of `docs` in `streams` processes at once: one kubectl sends its requests one
    after the other, which leaves the apiserver idle between them at 100,000 objects."""
    chunks = [docs[i::streams] for i in range(streams)]
    creators = [subprocess.Popen([KUBECTL, "--kubeconfig", KUBECONFIG, "create", "-f", "-"],
                                 stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                for chunk in chunks if chunk]
    for creator, chunk in zip(creators, chunks):
        threading.Thread(target=lambda c=creator, d=chunk: (c.stdin.write("---\n".join(d)), c.stdin.close()),
                         daemon=True).start()
    for creator in creators:
        if creator.wait() != 0:
            sys.exit(f"kubectl create failed: {creator.stderr.read()[-2000:]}")


def members_settled(namespace, count):
    """Whether `count` member Leases live in `namespace`, all acknowledging one ring version."""
    out = kubectl("get", "leases", "-n", namespace, "-l", MEMBER_LABEL, "-o",
                  "jsonpath={range .items[*]}{.metadata.annotations.projection\\.sh/ring-version}{'\\n'}{end}",
                  check=False)
    versions = out.split("\n")[:-1] if out else []
    return len(versions) == count and versions[0] != "" and len(set(versions)) == 1


def owners(plugin, dst, src):
    """The replica that reconciles each Projection of `dst`, by name, from `kubectl projection
    status -o json` (its `owner`: the ring of the live member Leases, as the replicas compute it)."""
    out = subprocess.run([plugin, "--kubeconfig", KUBECONFIG, "status", "-n", dst, "--controller-namespace", src,
                          "-o", "json"], capture_output=True, text=True).stdout
    try:
        return {line["name"]: line.get("owner") for line in json.loads(out)}
    except (ValueError, KeyError, TypeError):
        return {}


def quiet(controllers, name, still=3.0, limit=180.0):
    """Waits until the sum of `name` over `controllers` stops changing for `still` seconds."""
    deadline, last, since = time.time() + limit, None, time.time()
    while time.time() < deadline:
        now = sum(c.metric(name) for c in controllers)
        if now != last:
            last, since = now, time.time()
        elif time.time() - since >= still:
            return now
        time.sleep(0.5)
    return last


def served_per_cr(before, after, moved):
    """What the apiserver served from the kill until the survivors were quiet, by verb and resource,
    per CR taken over: every client's requests (the script's own reads, the Lease renewals and the
    member Leases' reads included), the largest first; those under 0.01 per CR left out."""
    served = [(after[key] - before.get(key, 0), key) for key in after]
    rows = [f"{count / moved:.2f} {verb} {resource}{'/' + sub if sub else ''}"
            for count, (verb, resource, sub) in sorted(served, reverse=True) if moved and count / moved >= 0.01]
    return "  served per CR taken over: " + (", ".join(rows) or "nothing")


def watch_copy(dst, stamp, arrived, seen):
    watcher = subprocess.Popen([KUBECTL, "--kubeconfig", KUBECONFIG, "get", "configmap", "cm-000", "-n", dst,
                                "--watch", "-o", "jsonpath={.data.stamp}{'\\n'}"], stdout=subprocess.PIPE, text=True)

    def follow():
        for line in watcher.stdout:
            if line.strip() == stamp:
                arrived["at"] = time.monotonic()
                seen.set()
                return
    threading.Thread(target=follow, daemon=True).start()
    return watcher


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(ROOT, "target", "debug", "projection-controller"))
    ap.add_argument("--plugin", default=os.path.join(ROOT, "target", "debug", "kubectl-projection"),
                    help="kubectl-projection, for the OWNER of the edited CR with --shards")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--projections", type=int, default=100, help="Projections per source kind")
    ap.add_argument("--lease", default="4s", help="--leader-election-lease-duration")
    ap.add_argument("--settle", type=float, default=5.0, help="seconds a new standby or member gets before the kill")
    ap.add_argument("--shards", type=int, default=0, help="run this many replicas with --shard-by-lease")
    ap.add_argument("--keep", action="store_true", help="leave the population for --reuse")
    ap.add_argument("--reuse", metavar="NAME", help="measure on the population a --keep run left (its name)")
    args = ap.parse_args()
    # A SIGTERM ends the script through its `finally`, which stops the controllers it started (they
    # outlived it before, and went on against the cluster).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.shards == 1 or args.shards < 0 or args.shards > 16:
        sys.exit("--shards: 2 to 16 replicas (0: leader election)")
    run = args.reuse or f"takeover-{os.getpid()}"
    src, dst = f"{run}-src", f"{run}-dst"
    total = 2 * args.projections
    # Polls that list every Projection are spaced out with their number, so that they do not load
    # the apiserver they measure (a list of 100,000 takes seconds here).
    every = max(1.0, total / 10000)
    if args.reuse:
        found = len(kubectl("get", "projections", "-n", dst, "-o", "name").split())
        if found != total:
            sys.exit(f"--reuse {run}: {found} Projections in {dst}, not the {total} of --projections")
        # The member Leases of an earlier shape's replicas would count as members until they expire.
        kubectl("delete", "leases", "-n", src, "-l", MEMBER_LABEL, check=False)
        print(f"{total} Projections and their sources reused from {run}", flush=True)
    else:
        kubectl("apply", "-f", os.path.join(ROOT, "charts", "projection", "crd-manifests"))
        created = time.monotonic()
        docs = population(src, dst, args.projections)
        kubectl("create", "-f", "-", stdin="---\n".join(docs[:2]))
        create_in_parallel(docs[2:])
        print(f"{total} Projections and their sources created in {time.monotonic() - created:.0f}s", flush=True)
    controllers = []
    try:
        if args.shards:
            for i in range(args.shards):
                controllers.append(Controller(args.binary, src, args.lease, f"{run}-r{i}"))
            for c in controllers:
                wait("a replica ready", c.ready)
            wait("the members to acknowledge one ring", lambda: members_settled(src, args.shards), every=0.5)
        else:
            controllers.append(Controller(args.binary, src, args.lease))
            wait("the first leader", controllers[0].ready)

        def all_ready():
            out = kubectl("get", "projections", "-n", dst, "-o",
                          "jsonpath={range .items[*]}{.status.conditions[?(@.type=='Ready')].status}{'\\n'}{end}",
                          check=False)
            return out.split().count("True") == total
        started = time.monotonic()
        wait("every Projection ready", all_ready, timeout=max(1800, total / 10), every=every)
        # A reused population is Ready before the controllers' first passes end: wait for those.
        quiet(controllers, "controller_runtime_reconcile_total", limit=max(180.0, total / 100))
        print(f"every Projection Ready and the first passes done {time.monotonic() - started:.0f}s after the "
              "controllers were", flush=True)
        results, startups, costs = [], [], []
        for n in range(1, args.runs + 1):
            if args.shards:
                owned = owners(args.plugin, dst, src)
                owner = owned.get("cm-000")
                victim = next((c for c in controllers if c.name == owner), None)
                if victim is None:
                    sys.exit(f"run {n}: no replica named {owner!r} owns cm-000 (is {args.plugin} built?)")
                moving = sum(1 for o in owned.values() if o == victim.name)
            else:
                standby = Controller(args.binary, src, args.lease)
                controllers.append(standby)
                wait("the standby ready", standby.ready)
                victim = controllers[-2]
            time.sleep(args.settle)
            survivors = [c for c in controllers if c is not victim and c.process.poll() is None]
            requests_before = sum(c.metric("rest_client_requests_total") for c in survivors)
            served_before = request_counts()
            takeovers_before = sum(c.metric("projection_shard_takeover_seconds_count") for c in survivors)
            stamp = f"run-{n}-{time.time()}"
            seen, arrived = threading.Event(), {}
            watcher = watch_copy(dst, stamp, arrived, seen)
            lease_watch = None
            if not args.shards:
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
            victim.kill()
            killed = time.monotonic()
            kubectl("patch", "configmap", "cm-000", "-n", src, "--type", "merge", "-p",
                    f'{{"data": {{"stamp": "{stamp}"}}}}')
            if not seen.wait(120):
                sys.exit(f"run {n}: the edit never reached the copy")
            watcher.kill()
            if lease_watch:
                lease_watch.kill()
            took = arrived["at"] - killed
            results.append(took)
            print(f"run {n}: edit reached the copy {took:.2f}s after the kill; counting the requests", flush=True)
            # The survivors' requests for what they took over, once their reconciles have stopped
            # (not their requests: each renews its Lease every third of its duration). With shards,
            # first until they counted every CR taken over: a survivor reconciles none of the others
            # while it lists the ranges it gained, which took longer than `quiet`'s stillness at
            # 50,000 CRs moved.
            counting_until = time.time() + max(180.0, total / 100)
            while args.shards and time.time() < counting_until and sum(
                    c.metric("projection_shard_takeover_seconds_count") for c in survivors) - takeovers_before < moving:
                time.sleep(0.5)
            quiet(survivors, "controller_runtime_reconcile_total", limit=max(180.0, total / 100))
            requests = sum(c.metric("rest_client_requests_total") for c in survivors) - requests_before
            moved = moving if args.shards else total
            counted = sum(c.metric("projection_shard_takeover_seconds_count") for c in survivors) - takeovers_before
            per_cr = requests / moved if moved else float("nan")
            costs.append(per_cr)
            line = f"run {n}: edit reached the copy {took:.2f}s after the kill"
            if not args.shards:
                after_lease = arrived["at"] - arrived.get("taken", killed)
                startups.append(after_lease)
                line += f", {after_lease:.2f}s after the standby took the Lease"
            line += f"; {moved:.0f} CRs taken over, {requests:.0f} requests by the survivors ({per_cr:.2f} per CR)"
            if args.shards:
                line += f", projection_shard_takeover_seconds_count +{counted:.0f}"
            print(line, flush=True)
            print(served_per_cr(served_before, request_counts(), moved), flush=True)
            if args.shards and n < args.runs:
                # The killed replica comes back under its name (as a pod's restarted container would).
                controllers.remove(victim)
                back = Controller(args.binary, src, args.lease, victim.name)
                controllers.append(back)
                wait("the restarted replica ready", back.ready)
                wait("the members to acknowledge one ring", lambda: members_settled(src, args.shards),
                     timeout=300, every=0.5)
        shape = f"{args.shards} shards" if args.shards else "leader election"
        summary = (f"median over {len(results)} runs: {statistics.median(results):.2f}s after the kill "
                   f"(min {min(results):.2f}s, max {max(results):.2f}s)")
        if startups:
            summary += f", {statistics.median(startups):.2f}s after the Lease was taken"
        summary += (f"; {statistics.median(costs):.2f} requests per CR taken over "
                    f"({shape}, lease {args.lease}, {total} Projections, binary {args.binary})")
        print(summary, flush=True)
    finally:
        if args.keep:
            for c in controllers:
                if c.process.poll() is None:
                    c.stop()
            print(f"the population is left for --reuse {run}", flush=True)
        else:
            remove(controllers, src, dst, every, total)


def remove(controllers, src, dst, every, total):
    """The population and the controllers, in that order: the finalizers need a controller to
    remove the copies first. kubectl's own wait for thousands of deletions outlasted the deletions
    by minutes here: the count is polled."""
    kubectl("delete", "projections", "--all", "-n", dst, "--wait=false", check=False)
    deadline = time.time() + max(600, total / 50)
    while time.time() < deadline and kubectl("get", "projections", "-n", dst, "-o", "name", check=False).strip():
        time.sleep(2 * every)
    for c in controllers:
        if c.process.poll() is None:
            c.stop()
    kubectl("delete", "namespace", src, dst, "--wait=false", check=False)


if __name__ == "__main__":
    main()
