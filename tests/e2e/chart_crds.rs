//! The CRDs installed and upgraded with the chart (`crds.install`, `crds.keep`), on the second
//! control plane (`tests/control-plane/remote.sh up`, which `scripts/test.sh` starts): the test
//! deletes and re-creates the CRDs there, which on the main cluster would delete every CR of the
//! other tests and of the demo with them. No node runs there: the releases are installed without
//! `--wait` and their pods stay Pending; `webhook.failurePolicy=Ignore` lets a CR be written
//! although no webhook answers.
//!
//! The upgrade is the one users make from a chart before 0.2.0, which kept the CRDs in Helm's
//! `crds/` folder: Helm created them at the first install without any ownership metadata, and
//! refuses to adopt them into the release until the one-time step of docs/getting-started.md
//! ("Upgrading from chart 0.1.x") labels and annotates them. The test runs exactly that step, with
//! Helm 3 (`bin/helm`) and Helm 4 (`bin/helm4`, built by `tests/control-plane/build-gitops.sh`).

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{Api, Client, api::DeleteParams};
use projection_tests::{
    chart::{chart_dir, copy_dir, numbers_as_floats},
    control_plane_bin, gitops,
    remote::{RemoteNamespace, remote_client, remote_kubeconfig_path},
    repo_root, testenv_dir, wait_crd_established, wait_for,
};
use serde_json::Value;
use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
    time::Duration,
};

const CRDS: [&str; 2] = ["projections.projection.sh", "clusterprojections.projection.sh"];
/// The printer column the previous chart's Projection CRD lacks (added in 0.2.0's).
const NEW_COLUMN: &str = "Suspended";
const TIMEOUT: Duration = Duration::from_secs(60);

/// Runs `helm` (3 or 4) against the second cluster, with its folders in `home`.
fn helm(helm: &Path, home: &Path, args: &[&str]) -> Output {
    Command::new(helm)
        .args(args)
        .arg("--kubeconfig")
        .arg(remote_kubeconfig_path())
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", helm.display()))
}

fn ok(what: &str, out: Output) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// kubectl against the second cluster.
fn kubectl(args: &[&str]) -> String {
    let out = Command::new(control_plane_bin().join("kubectl"))
        .arg("--kubeconfig")
        .arg(remote_kubeconfig_path())
        .args(args)
        .output()
        .expect("kubectl runs");
    ok(&format!("kubectl {}", args.join(" ")), out)
}

/// Uninstalls the release (if a failed assertion left it) and removes `home` when dropped.
struct Cleanup<'a> {
    helm: &'a Path,
    home: PathBuf,
    release: String,
    namespace: String,
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        let _ = helm(
            self.helm,
            &self.home,
            &["uninstall", &self.release, "--namespace", &self.namespace],
        );
        let _ = std::fs::remove_dir_all(&self.home);
    }
}

/// The previous chart (0.1.x) as this one would have been with the CRDs in Helm's `crds/` folder
/// and no CRD template, and the Projection CRD one printer column short.
fn previous_chart(dir: &Path) -> PathBuf {
    let chart = dir.join("projection");
    let _ = std::fs::remove_dir_all(&chart);
    copy_dir(&chart_dir(), &chart).expect("chart copied");
    std::fs::rename(chart.join("crd-manifests"), chart.join("crds")).expect("crds/");
    std::fs::remove_file(chart.join("templates/crds.yaml")).expect("the CRD template");
    let chart_yaml = std::fs::read_to_string(chart.join("Chart.yaml")).expect("Chart.yaml");
    let version = chart_yaml
        .lines()
        .find(|l| l.starts_with("version: "))
        .expect("a version");
    std::fs::write(
        chart.join("Chart.yaml"),
        chart_yaml.replace(version, "version: 0.1.0"),
    )
    .expect("Chart.yaml written");
    // Nor the values that came with the template (so that an upgrade with --reuse-values renders
    // with values that lack them, as from a release of 0.1.x).
    let values = std::fs::read_to_string(chart.join("values.yaml")).expect("values.yaml");
    let (start, end) = (
        values.find("\ncrds:\n").expect("crds values"),
        values.find("\nrbac:\n").expect("rbac values"),
    );
    std::fs::write(
        chart.join("values.yaml"),
        format!("{}{}", &values[..start], &values[end..]),
    )
    .expect("values.yaml written");
    let schema_path = chart.join("values.schema.json");
    let mut schema: Value =
        serde_json::from_str(&std::fs::read_to_string(&schema_path).expect("the schema")).expect("JSON");
    schema["properties"]
        .as_object_mut()
        .expect("properties")
        .remove("crds")
        .expect("crds in the schema");
    std::fs::write(&schema_path, schema.to_string()).expect("schema written");
    let path = chart.join("crds/projections.projection.sh.yaml");
    let crd = std::fs::read_to_string(&path).expect("the Projection CRD");
    let column = format!(
        "    - jsonPath: .spec.suspend\n      name: {NEW_COLUMN}\n      priority: 1\n      type: boolean\n"
    );
    assert!(
        crd.contains(&column),
        "the generated CRD has the {NEW_COLUMN} column"
    );
    std::fs::write(&path, crd.replace(&column, "")).expect("the old CRD written");
    chart
}

/// The kubectl commands of the one-time step in docs/getting-started.md ("Upgrading from chart
/// 0.1.x": the `sh` block after it, continuation lines joined), each as its arguments after
/// `kubectl`, for the release `release` in `namespace` instead of the doc's `projection` in
/// `projection-system`.
fn documented_step(release: &str, namespace: &str) -> Vec<Vec<String>> {
    let doc = std::fs::read_to_string(repo_root().join("docs/getting-started.md")).expect("the doc");
    let section = doc
        .split("**Upgrading from chart 0.1.x.**")
        .nth(1)
        .expect("the section on upgrading from 0.1.x");
    let block = section
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("its sh block");
    let commands: Vec<Vec<String>> = block
        .replace("\\\n", " ")
        .lines()
        .filter_map(|line| line.trim().strip_prefix("kubectl "))
        .map(|args| {
            args.split_whitespace()
                .map(|arg| match arg {
                    "meta.helm.sh/release-name=projection" => format!("meta.helm.sh/release-name={release}"),
                    "meta.helm.sh/release-namespace=projection-system" => {
                        format!("meta.helm.sh/release-namespace={namespace}")
                    }
                    other => other.to_owned(),
                })
                .collect()
        })
        .collect();
    let flat = commands.concat().join(" ");
    assert!(
        commands.len() == 2
            && flat.contains(&format!("meta.helm.sh/release-name={release}"))
            && flat.contains(&format!("meta.helm.sh/release-namespace={namespace}"))
            && flat.contains("app.kubernetes.io/managed-by=Helm"),
        "the documented step: {commands:?}"
    );
    commands
}

/// The Projection CRD's printer column names on the apiserver.
async fn columns(crds: &Api<CustomResourceDefinition>) -> Vec<String> {
    let crd = crds.get(CRDS[0]).await.expect("the Projection CRD");
    crd.spec.versions[0]
        .additional_printer_columns
        .iter()
        .flatten()
        .map(|c| c.name.clone())
        .collect()
}

/// The generated CRD `name` (crd-manifests/), as JSON.
fn generated(name: &str) -> Value {
    let path = repo_root()
        .join(codegen::crds::CRD_DIR)
        .join(format!("{name}.yaml"));
    serde_yaml::from_str(&std::fs::read_to_string(&path).expect("a generated CRD")).expect("CRD YAML")
}

/// Deletes our CRDs from the second cluster (every CR there with them) and waits until they are gone.
async fn delete_crds(crds: &Api<CustomResourceDefinition>) {
    for name in CRDS {
        let _ = crds.delete(name, &DeleteParams::default()).await;
    }
    wait_for("the CRDs to be gone", TIMEOUT, || async {
        for name in CRDS {
            if crds.get_opt(name).await.map_err(|e| e.to_string())?.is_some() {
                return Err(format!("{name} is still there"));
            }
        }
        Ok(())
    })
    .await;
}

/// From the previous chart to this one with `helm_bin`: install 0.1.x (Helm creates the CRDs from
/// `crds/`), the upgrade refused until the documented step, then the upgrade changes the CRD; a
/// CR made meanwhile and both CRDs outlive `helm uninstall` (`crds.keep`).
async fn upgrade_from_the_previous_chart(client: &Client, helm_bin: &Path, label: &str) {
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    delete_crds(&crds).await;
    let home = testenv_dir().join(format!("chart-crds-{label}-{}", std::process::id()));
    let old = previous_chart(&home);
    let ns = RemoteNamespace::create(client, &format!("crds-{label}")).await;
    let namespace = ns.name();
    // A release of this run's own: its cluster-scoped objects (named after it) never meet those
    // a killed run left.
    let release = format!("projection-{label}-{}", std::process::id());
    let release = release.as_str();
    let _cleanup = Cleanup {
        helm: helm_bin,
        home: home.clone(),
        release: release.to_owned(),
        namespace: namespace.to_owned(),
    };
    let (old, current) = (old.to_string_lossy(), chart_dir());
    let current = current.to_string_lossy();
    let no_webhook = ["--set", "webhook.failurePolicy=Ignore"];
    let run = |verb: &str, chart: &str| {
        let mut args = vec![verb, release, chart, "--namespace", namespace];
        args.extend(no_webhook);
        helm(helm_bin, &home, &args)
    };
    // The upgrade as docs/getting-started.md writes it: the release's values kept.
    let upgrade = || {
        helm(
            helm_bin,
            &home,
            &[
                "upgrade",
                release,
                &current,
                "--namespace",
                namespace,
                "--reuse-values",
            ],
        )
    };

    ok(&format!("{label} install of 0.1.x"), run("install", &old));
    for name in CRDS {
        wait_crd_established(client, name).await;
    }
    let before = columns(&crds).await;
    assert!(!before.iter().any(|c| c == NEW_COLUMN), "0.1.x's CRD: {before:?}");

    // Helm refuses to adopt objects it did not create for this release.
    let refused = upgrade();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && stderr.contains("invalid ownership metadata"),
        "{label}: the upgrade without the step should be refused: {stderr}"
    );

    // The one-time step of docs/getting-started.md, its very commands (for this release).
    for command in documented_step(release, namespace) {
        let args: Vec<&str> = command.iter().map(String::as_str).collect();
        kubectl(&args);
    }

    ok(&format!("{label} upgrade to the current chart"), upgrade());
    wait_for("the CRD to be upgraded", TIMEOUT, || async {
        let now = columns(&crds).await;
        now.iter()
            .any(|c| c == NEW_COLUMN)
            .then_some(())
            .ok_or_else(|| format!("{now:?}"))
    })
    .await;
    for name in CRDS {
        let live = serde_json::to_value(crds.get(name).await.expect("the CRD")).expect("JSON");
        let want = generated(name);
        for field in ["additionalPrinterColumns", "schema", "subresources"] {
            assert_eq!(
                numbers_as_floats(live["spec"]["versions"][0][field].clone()),
                numbers_as_floats(want["spec"]["versions"][0][field].clone()),
                "{label}: {name}'s {field} is the current chart's"
            );
        }
        let mut names = live["spec"]["names"].clone();
        // The apiserver adds the list kind.
        names.as_object_mut().expect("names").remove("listKind");
        assert_eq!(names, want["spec"]["names"], "{name}");
        let metadata = &live["metadata"];
        assert_eq!(
            metadata["annotations"]["helm.sh/resource-policy"], "keep",
            "{name}"
        );
        assert_eq!(
            metadata["labels"]["app.kubernetes.io/instance"], release,
            "{name}"
        );
        assert_eq!(
            metadata["labels"]["app.kubernetes.io/managed-by"], "Helm",
            "{name}"
        );
    }

    // An upgrade with crds.install=false drops them from the release, and the keep policy leaves
    // them in the cluster; with crds.install=true again the release takes them back.
    let mut args = vec!["upgrade", release, &current, "--namespace", namespace];
    args.extend(no_webhook);
    args.extend(["--set", "crds.install=false"]);
    ok(
        &format!("{label} upgrade with crds.install=false"),
        helm(helm_bin, &home, &args),
    );
    for name in CRDS {
        assert!(crds.get_opt(name).await.expect("get").is_some(), "{name} stays");
    }
    ok(
        &format!("{label} upgrade with crds.install=true"),
        run("upgrade", &current),
    );

    // A CR of the users', then `helm uninstall`: the CRDs and the CR stay.
    let cr = format!(
        "apiVersion: projection.sh/v1\nkind: Projection\nmetadata: {{name: kept, namespace: {namespace}}}\n\
         spec:\n  source: {{version: v1, kind: ConfigMap, namespace: default, name: settings}}\n"
    );
    let file = home.join("cr.yaml");
    std::fs::write(&file, cr).expect("CR written");
    kubectl(&["create", "-f", &file.to_string_lossy()]);
    let uninstalled = ok(
        &format!("{label} uninstall"),
        helm(
            helm_bin,
            &home,
            &["uninstall", release, "--namespace", namespace, "--wait"],
        ),
    );
    for name in CRDS {
        assert!(
            uninstalled.contains(name),
            "helm says which CRDs it kept: {uninstalled}"
        );
        assert!(crds.get_opt(name).await.expect("get").is_some(), "{name} stays");
    }
    kubectl(&["get", "projection", "kept", "--namespace", namespace]);
}

#[tokio::test]
async fn crds_are_upgraded_with_the_chart_from_0_1_and_kept_on_uninstall() {
    let client = remote_client().await;
    upgrade_from_the_previous_chart(&client, &control_plane_bin().join("helm"), "helm3").await;
    upgrade_from_the_previous_chart(&client, &gitops::tool("helm4"), "helm4").await;
    // Leave the second cluster as the other tests expect it: without our CRDs.
    delete_crds(&Api::all(client)).await;
}
