//! The generated CRDs against the real apiserver: the examples are accepted unchanged, bad specs are
//! refused with a message naming the problem, and `kubectl get` shows the printer columns.

use kube::{
    Api, Client, CustomResourceExt, Resource,
    api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams},
};
use projection_tests::{ClusterScopedGuard, TestNamespace, client, install_crds, kubectl_ok, repo_root};
use serde_json::{Value, json};
use shared::api::crd::{ClusterProjection, Projection};

fn projection_api(client: &Client, namespace: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), namespace, &ApiResource::erase::<Projection>(&()))
}

fn cluster_projection_api(client: &Client) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &ApiResource::erase::<ClusterProjection>(&()))
}

fn object(kind: &str, name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "projection.sh/v1",
        "kind": kind,
        "metadata": {"name": name},
        "spec": spec,
    }))
    .expect("valid object")
}

/// Every `projection.sh` document of every file in `examples/`.
fn example_documents() -> Vec<(String, Value)> {
    let dir = repo_root().join("examples");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("examples/ exists")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    let mut docs = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("readable");
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let value: Value = serde::Deserialize::deserialize(doc).expect("valid YAML");
            if value["apiVersion"] == "projection.sh/v1" {
                docs.push((file.display().to_string(), value));
            }
        }
    }
    docs
}

#[tokio::test]
async fn every_example_is_accepted_and_stored_unchanged() {
    let client = client().await;
    install_crds(&client).await;
    let ns = TestNamespace::create(&client, "crd-examples").await;
    let docs = example_documents();
    assert!(
        docs.iter().any(|(_, d)| d["kind"] == "Projection"),
        "examples hold a Projection"
    );
    assert!(
        docs.iter().any(|(_, d)| d["kind"] == "ClusterProjection"),
        "examples hold a ClusterProjection"
    );

    let mut guards = Vec::new();
    for (file, doc) in docs {
        let mut obj: DynamicObject = serde_json::from_value(doc.clone()).expect("object");
        let api = match doc["kind"].as_str() {
            Some("Projection") => projection_api(&client, ns.name()),
            Some("ClusterProjection") => {
                // Cluster-scoped: a unique name so parallel runs never collide.
                let name = format!(
                    "{}-{}",
                    ns.name(),
                    obj.metadata.name.as_deref().unwrap_or_default()
                );
                obj.metadata.name = Some(name.clone());
                guards.push(ClusterScopedGuard::new("clusterprojections.projection.sh", &name));
                cluster_projection_api(&client)
            }
            other => panic!("{file}: unexpected kind {other:?}"),
        };
        obj.metadata.namespace = None;
        let created = api
            .create(&PostParams::default(), &obj)
            .await
            .unwrap_or_else(|e| panic!("{file}: the apiserver refused the example: {e}"));
        // Nothing pruned: every field of the example survives the schema.
        assert_eq!(
            created.data["spec"], doc["spec"],
            "{file}: the stored spec differs from the example"
        );
    }
}

struct Rejection {
    case: &'static str,
    kind: &'static str,
    spec: Value,
    /// Fragments the apiserver's message must contain (the field path and the rule).
    expect: &'static [&'static str],
}

fn configmap_source() -> Value {
    json!({"kind": "ConfigMap", "namespace": "platform-config", "name": "shared-settings"})
}

fn rejections() -> Vec<Rejection> {
    let source = configmap_source();
    let with_source = |patch: Value| {
        let mut s = source.clone();
        for (k, v) in patch.as_object().expect("object") {
            s[k] = v.clone();
        }
        s
    };
    vec![
        Rejection {
            case: "lower-case kind",
            kind: "Projection",
            spec: json!({"source": with_source(json!({"kind": "configMap"}))}),
            expect: &["spec.source.kind", "should match"],
        },
        Rejection {
            case: "bad source namespace",
            kind: "Projection",
            spec: json!({"source": with_source(json!({"namespace": "Team_A"}))}),
            expect: &["spec.source.namespace", "should match"],
        },
        Rejection {
            case: "bad source version",
            kind: "Projection",
            spec: json!({"source": with_source(json!({"version": "1"}))}),
            expect: &["spec.source.version", "should match"],
        },
        Rejection {
            case: "bad source group",
            kind: "Projection",
            spec: json!({"source": with_source(json!({"group": "Apps"}))}),
            expect: &["spec.source.group", "should match"],
        },
        Rejection {
            case: "missing source name",
            kind: "Projection",
            spec: json!({"source": {"kind": "ConfigMap", "namespace": "platform-config"}}),
            expect: &["spec.source.name", "Required value"],
        },
        Rejection {
            case: "bad destination name",
            kind: "Projection",
            spec: json!({"source": source.clone(), "destination": {"name": "Not A Name"}}),
            expect: &["spec.destination.name", "should match"],
        },
        Rejection {
            case: "reserved overlay label",
            kind: "Projection",
            spec: json!({"source": source.clone(), "overlay": {"labels": {"projection.sh/owned-by-projection": "x"}}}),
            expect: &["spec.overlay.labels", "reserved"],
        },
        Rejection {
            case: "reserved overlay annotation",
            kind: "ClusterProjection",
            spec: json!({"source": source.clone(), "destination": {"namespaces": ["a"]},
                         "overlay": {"annotations": {"projection.sh/projectable": "true"}}}),
            expect: &["spec.overlay.annotations", "reserved"],
        },
        Rejection {
            case: "both namespaces and namespaceSelector",
            kind: "ClusterProjection",
            spec: json!({"source": source.clone(),
                         "destination": {"namespaces": ["a"], "namespaceSelector": {"matchLabels": {"x": "y"}}}}),
            expect: &[
                "spec.destination",
                "namespaces and namespaceSelector are mutually exclusive",
            ],
        },
        Rejection {
            case: "neither namespaces nor namespaceSelector",
            kind: "ClusterProjection",
            spec: json!({"source": source.clone(), "destination": {"name": "x"}}),
            expect: &[
                "spec.destination",
                "one of namespaces or namespaceSelector must be set",
            ],
        },
        Rejection {
            case: "empty namespaces",
            kind: "ClusterProjection",
            spec: json!({"source": source.clone(), "destination": {"namespaces": []}}),
            expect: &["spec.destination.namespaces", "at least 1 items"],
        },
        Rejection {
            case: "invalid namespace in the list",
            kind: "ClusterProjection",
            spec: json!({"source": source.clone(), "destination": {"namespaces": ["ok", "Not_OK"]}}),
            expect: &["spec.destination.namespaces[1]", "should match"],
        },
        Rejection {
            case: "duplicate namespace in the list",
            kind: "ClusterProjection",
            spec: json!({"source": source.clone(), "destination": {"namespaces": ["a", "a"]}}),
            expect: &["spec.destination.namespaces[1]", "Duplicate value"],
        },
        Rejection {
            case: "empty namespaceSelector",
            kind: "ClusterProjection",
            spec: json!({"source": source.clone(), "destination": {"namespaceSelector": {}}}),
            expect: &["spec.destination", "namespaceSelector must not be empty"],
        },
        Rejection {
            case: "field exclusion of the name",
            kind: "Projection",
            spec: json!({"source": source.clone(), "fields": {"exclude": ["$.metadata.name"]}}),
            expect: &[
                "spec.fields.exclude",
                "must not remove apiVersion, kind, metadata.name",
            ],
        },
        Rejection {
            case: "field exclusion that is no JSONPath",
            kind: "Projection",
            spec: json!({"source": source.clone(), "fields": {"exclude": ["spec.replicas"]}}),
            expect: &["spec.fields.exclude[0]", "should match"],
        },
        Rejection {
            case: "reserved metadata include",
            kind: "Projection",
            spec: json!({"source": source.clone(), "metadata": {"labels": {"include": ["projection.sh/x"]}}}),
            expect: &["spec.metadata.labels.include", "reserved for the operator"],
        },
        Rejection {
            case: "empty keys include",
            kind: "Projection",
            spec: json!({"source": source.clone(), "keys": {"include": []}}),
            expect: &["spec.keys.include", "should have at least 1 items"],
        },
        Rejection {
            case: "missing destination",
            kind: "ClusterProjection",
            spec: json!({"source": source}),
            expect: &["spec.destination", "Required value"],
        },
    ]
}

#[tokio::test]
async fn invalid_specs_are_refused_with_a_message_naming_the_problem() {
    let client = client().await;
    install_crds(&client).await;
    let ns = TestNamespace::create(&client, "crd-rejections").await;
    // Dry run: the full validation runs, and a spec wrongly accepted leaves nothing behind.
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let mut failures = Vec::new();
    for r in rejections() {
        let api = match r.kind {
            "Projection" => projection_api(&client, ns.name()),
            _ => cluster_projection_api(&client),
        };
        match api
            .create(&dry_run, &object(r.kind, "rejected", r.spec.clone()))
            .await
        {
            Ok(_) => failures.push(format!("{}: accepted {}", r.case, r.spec)),
            Err(kube::Error::Api(status)) => {
                let missing: Vec<_> = r
                    .expect
                    .iter()
                    .filter(|f| !status.message.contains(**f))
                    .collect();
                if status.code != 422 || !missing.is_empty() {
                    failures.push(format!(
                        "{}: got {} {:?}, missing {missing:?}",
                        r.case, status.code, status.message
                    ));
                }
            }
            Err(e) => failures.push(format!("{}: unexpected error {e}", r.case)),
        }
    }
    assert!(
        failures.is_empty(),
        "schema rules not enforced:\n{}",
        failures.join("\n")
    );
}

#[tokio::test]
async fn status_schema_is_enforced_on_the_status_subresource() {
    let client = client().await;
    install_crds(&client).await;
    let ns = TestNamespace::create(&client, "crd-status").await;
    let api = projection_api(&client, ns.name());
    api.create(
        &PostParams::default(),
        &object("Projection", "p", json!({"source": configmap_source()})),
    )
    .await
    .expect("created");
    let status = |condition_status: &str| {
        json!({"apiVersion": "projection.sh/v1", "kind": "Projection", "status": {
            "destinationName": "p",
            "conditions": [{"type": "Ready", "status": condition_status, "reason": "Projected",
                            "message": "", "observedGeneration": 1,
                            "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})
    };
    let params = PatchParams::apply("projection-tests").force();
    let err = api
        .patch_status("p", &params, &Patch::Apply(status("Maybe")))
        .await
        .expect_err("a condition status outside True/False/Unknown must be refused");
    assert!(err.to_string().contains("status.conditions[0].status"), "{err}");
    let patched = api
        .patch_status("p", &params, &Patch::Apply(status("True")))
        .await
        .expect("valid status");
    assert_eq!(patched.data["status"]["conditions"][0]["observedGeneration"], 1);
}

#[tokio::test]
async fn kubectl_get_shows_the_printer_columns() {
    let client = client().await;
    install_crds(&client).await;
    let ns = TestNamespace::create(&client, "crd-columns").await;
    let api = projection_api(&client, ns.name());
    api.create(
        &PostParams::default(),
        &object("Projection", "cols", json!({"source": configmap_source()})),
    )
    .await
    .expect("created");
    api.patch_status(
        "cols",
        &PatchParams::apply("projection-tests").force(),
        &Patch::Apply(
            json!({"apiVersion": "projection.sh/v1", "kind": "Projection", "status": {
            "destinationName": "renamed-copy",
            "conditions": [{"type": "Ready", "status": "True", "reason": "Projected", "message": "",
                            "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}),
        ),
    )
    .await
    .expect("status written");

    let out = kubectl_ok(&["get", "proj", "-A"]);
    let header = out.lines().next().unwrap_or_default();
    let columns: Vec<_> = header.split_whitespace().collect();
    assert_eq!(
        columns,
        [
            "NAMESPACE",
            "NAME",
            "KIND",
            "SOURCE-NAMESPACE",
            "SOURCE-NAME",
            "DESTINATION-NAME",
            "READY",
            "REASON",
            "AGE"
        ],
        "{out}"
    );
    let row = out
        .lines()
        .find(|l| l.starts_with(ns.name()))
        .unwrap_or_else(|| panic!("no row in\n{out}"));
    let cells: Vec<_> = row.split_whitespace().collect();
    assert_eq!(
        &cells[..8],
        [
            ns.name(),
            "cols",
            "ConfigMap",
            "platform-config",
            "shared-settings",
            "renamed-copy",
            "True",
            "Projected"
        ]
    );

    let name = format!("{}-cols", ns.name());
    let _guard = ClusterScopedGuard::new("clusterprojections.projection.sh", &name);
    cluster_projection_api(&client)
        .create(
            &PostParams::default(),
            &object(
                "ClusterProjection",
                &name,
                json!({"source": configmap_source(),
                "destination": {"namespaceSelector": {"matchLabels": {"tier": "production"}}}}),
            ),
        )
        .await
        .expect("created");
    let out = kubectl_ok(&["get", "cproj", &name, "-o", "wide"]);
    let columns: Vec<_> = out
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        columns,
        [
            "NAME",
            "KIND",
            "SOURCE-GROUP",
            "SOURCE-NAMESPACE",
            "SOURCE-NAME",
            "DESTINATION-NAME",
            "TARGETS",
            "FAILED",
            "SELECTOR",
            "READY",
            "REASON",
            "MESSAGE",
            "SUSPENDED",
            "AGE"
        ],
        "{out}"
    );
    assert!(
        out.contains(r#"{"tier":"production"}"#),
        "selector column shows the labels:\n{out}"
    );
}

#[tokio::test]
async fn kubectl_get_selects_the_crs_reading_one_source_by_its_namespace_and_name() {
    let client = client().await;
    install_crds(&client).await;
    let ns = TestNamespace::create(&client, "crd-select").await;
    let api = projection_api(&client, ns.name());
    let source =
        |namespace: &str, name: &str| json!({"kind": "ConfigMap", "namespace": namespace, "name": name});
    for (name, source) in [
        ("reads-settings", source("platform-config", "shared-settings")),
        ("reads-settings-too", source("platform-config", "shared-settings")),
        ("reads-other", source("platform-config", "other-settings")),
        ("reads-elsewhere", source("team-x", "shared-settings")),
    ] {
        api.create(
            &PostParams::default(),
            &object("Projection", name, json!({"source": source})),
        )
        .await
        .expect("created");
    }
    let cluster_name = format!("{}-select", ns.name());
    let _guard = ClusterScopedGuard::new("clusterprojections.projection.sh", &cluster_name);
    cluster_projection_api(&client)
        .create(
            &PostParams::default(),
            &object(
                "ClusterProjection",
                &cluster_name,
                json!({"source": source(ns.name(), "shared-settings"),
                    "destination": {"namespaces": ["team-y"]}}),
            ),
        )
        .await
        .expect("created");
    let names = |out: String| -> Vec<String> {
        let mut names: Vec<String> = out.lines().map(str::to_owned).collect();
        names.sort();
        names
    };
    let selected = kubectl_ok(&[
        "get",
        "proj",
        "-n",
        ns.name(),
        "--field-selector",
        "spec.source.namespace=platform-config,spec.source.name=shared-settings",
        "-o",
        "name",
    ]);
    assert_eq!(
        names(selected),
        [
            "projection.projection.sh/reads-settings",
            "projection.projection.sh/reads-settings-too"
        ]
    );
    let by_name = kubectl_ok(&[
        "get",
        "proj",
        "-n",
        ns.name(),
        "--field-selector",
        "spec.source.name=shared-settings",
        "-o",
        "name",
    ]);
    assert_eq!(names(by_name).len(), 3, "any namespace's shared-settings");
    let clusters = kubectl_ok(&[
        "get",
        "cproj",
        "--field-selector",
        &format!("spec.source.namespace={}", ns.name()),
        "-o",
        "name",
    ]);
    assert_eq!(
        names(clusters),
        [format!("clusterprojection.projection.sh/{cluster_name}")]
    );
}

#[test]
fn the_api_names_are_the_go_operators() {
    assert_eq!(Projection::crd_name(), "projections.projection.sh");
    assert_eq!(ClusterProjection::crd_name(), "clusterprojections.projection.sh");
    assert_eq!(Projection::shortnames(), ["proj"]);
    assert_eq!(ClusterProjection::shortnames(), ["cproj"]);
    assert_eq!(Projection::api_version(&()), "projection.sh/v1");
}
