//! The admission handler in-process: AdmissionReview JSON fixtures through the axum router, against
//! a fixed cluster. Covers verdicts, messages, the defaulting patch, unreadable input, a property
//! test over random and truncated bodies, and structured fuzzing of AdmissionReviews and the specs
//! inside them (`WEBHOOK_FUZZ_CASES`, default 3000 reviews, each to both endpoints; docs/reliability.md has the long
//! run).

use axum::{
    Router,
    body::Body,
    http::{Request, StatusCode},
};
use http_body_util::BodyExt;
use kube::discovery::ApiResource;
use serde_json::{Value, json};
use shared::{api::crd::SourceRef, policy::projectable::SourceMode};
use std::{collections::BTreeMap, sync::Arc};
use tower::ServiceExt;
use webhook::{
    cluster_view::{ClusterView, KindScope, UserInfo},
    error::PolicyError,
    handler::MAX_BODY_BYTES,
    metrics::Metrics,
    policy::PolicySettings,
    review::ReviewSettings,
};

mod common;
use common::{admission_router, default_settings};

/// A cluster with fixed answers: ConfigMaps and Secrets are namespaced, Namespaces cluster-scoped,
/// anything else unknown; `sources` maps `namespace/name` to annotations; only alice (group tenants)
/// may read, and not what is `unreadable`.
#[derive(Default)]
struct FixedCluster {
    sources: BTreeMap<String, BTreeMap<String, String>>,
    unreadable: Vec<String>,
}

impl ClusterView for FixedCluster {
    async fn resolve(&self, source: &SourceRef) -> Result<KindScope, PolicyError> {
        Ok(match (source.group.as_str(), source.kind.as_str()) {
            ("", "ConfigMap") => KindScope::Namespaced(ApiResource {
                group: String::new(),
                version: "v1".into(),
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
                plural: "configmaps".into(),
            }),
            ("", "Namespace") => KindScope::Cluster,
            _ => KindScope::Unknown,
        })
    }

    async fn can_get(
        &self,
        user: &UserInfo,
        _: &ApiResource,
        namespace: &str,
        name: &str,
    ) -> Result<bool, PolicyError> {
        // Only alice in group tenants reads anything: proves userInfo reaches the access review.
        let alice =
            user.username.as_deref() == Some("alice") && user.groups.iter().flatten().any(|g| g == "tenants");
        Ok(alice && !self.unreadable.contains(&format!("{namespace}/{name}")))
    }

    async fn annotations(
        &self,
        _: &ApiResource,
        namespace: &str,
        name: &str,
    ) -> Result<Option<BTreeMap<String, String>>, PolicyError> {
        // Two sources the webhook's own reads fail on: RBAC (permanent) and a server error.
        let refusal = |code: u16, reason: &str| {
            let status = kube::core::Status::failure(&format!("configmaps \"{name}\" {reason}"), reason)
                .with_code(code);
            Err(PolicyError::SourceRead(kube::Error::Api(Box::new(status))))
        };
        match name {
            "forbidden" => refusal(403, "Forbidden"),
            "broken" => refusal(500, "InternalError"),
            _ => Ok(self.sources.get(&format!("{namespace}/{name}")).cloned()),
        }
    }
}

fn projectable(value: &str) -> BTreeMap<String, String> {
    BTreeMap::from([("projection.sh/projectable".to_owned(), value.to_owned())])
}

fn app_with(cluster: FixedCluster, settings: ReviewSettings) -> Router {
    admission_router(cluster, settings, Arc::new(Metrics::unregistered()))
}

/// The standard cluster: platform/shared-settings exists and opted in.
fn app() -> Router {
    let cluster = FixedCluster {
        sources: BTreeMap::from([("platform/shared-settings".to_owned(), projectable("true"))]),
        ..Default::default()
    };
    app_with(cluster, default_settings(false))
}

fn fixture() -> Value {
    serde_json::from_str(include_str!("fixtures/projection-create.json")).expect("fixture is JSON")
}

/// The fixture with `spec` replaced.
fn with_spec(spec: Value) -> Value {
    let mut review = fixture();
    review["request"]["object"]["spec"] = spec;
    review
}

async fn post_raw(app: &Router, path: &str, body: impl Into<Body>) -> (StatusCode, Value) {
    let request = Request::post(path)
        .header("content-type", "application/json")
        .body(body.into())
        .expect("request");
    let response = app.clone().oneshot(request).await.expect("infallible");
    let status = response.status();
    let bytes = response.into_body().collect().await.expect("body").to_bytes();
    let body = serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("response is not JSON ({e}): {}", String::from_utf8_lossy(&bytes)));
    (status, body)
}

/// Posts a review and returns its `response`.
async fn post(app: &Router, path: &str, review: &Value) -> Value {
    let (status, body) = post_raw(app, path, review.to_string()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(body["kind"], "AdmissionReview");
    assert_eq!(body["response"]["uid"], review["request"]["uid"], "uid echoed");
    body["response"].clone()
}

fn denial(response: &Value) -> &str {
    assert_eq!(response["allowed"], false, "{response}");
    response["status"]["message"].as_str().expect("message")
}

#[tokio::test]
async fn a_valid_projection_is_admitted_without_warnings() {
    let response = post(&app(), "/validate", &fixture()).await;
    assert_eq!(response["allowed"], true, "{response}");
    assert!(response.get("warnings").is_none(), "{response}");
    assert!(response.get("patch").is_none(), "validation never patches");
}

/// The author record the webhook writes for the fixture's user, alice.
const ALICE: &str = r#"{"username":"alice","groups":["tenants","system:authenticated"]}"#;

/// The patch operation recording alice as the author of an object without annotations.
fn alice_recorded() -> Value {
    json!({"op": "add", "path": "/metadata/annotations", "value": {"projection.sh/author": ALICE}})
}

#[tokio::test]
async fn mutation_records_the_author_and_defaults_the_destination_name() {
    let response = post(&app(), "/mutate", &fixture()).await;
    assert_eq!(response["allowed"], true, "{response}");
    assert_eq!(response["patchType"], "JSONPatch");
    assert_eq!(
        patch_of(&response),
        json!([alice_recorded(), {"op": "add", "path": "/spec/destination", "value": {"name": "shared-settings"}}])
    );

    let existing = with_spec(
        json!({"source": {"kind": "ConfigMap", "namespace": "platform", "name": "s"}, "destination": {}}),
    );
    let response = post(&app(), "/mutate", &existing).await;
    assert_eq!(
        patch_of(&response),
        json!([alice_recorded(), {"op": "add", "path": "/spec/destination/name", "value": "s"}])
    );

    // A given name is kept; a record already there (another author's, or a forged one) is replaced.
    let mut named = with_spec(
        json!({"source": {"kind": "ConfigMap", "namespace": "platform", "name": "s"}, "destination": {"name": "t"}}),
    );
    named["request"]["object"]["metadata"]["annotations"] =
        json!({"projection.sh/author": r#"{"username":"admin","groups":["system:masters"]}"#, "team": "a"});
    let response = post(&app(), "/mutate", &named).await;
    assert_eq!(response["allowed"], true);
    assert_eq!(
        patch_of(&response),
        json!([{"op": "add", "path": "/metadata/annotations/projection.sh~1author", "value": ALICE}])
    );

    // A user whose name the record cannot carry is refused, saying why.
    let mut odd = fixture();
    odd["request"]["userInfo"]["groups"] = json!(["a\"b"]);
    let message = denial(&post(&app(), "/mutate", &odd).await).to_owned();
    assert!(
        message.starts_with("cannot record the author of this spec"),
        "{message}"
    );
}

#[tokio::test]
async fn both_endpoints_deny_an_invalid_spec_with_every_error() {
    let review = with_spec(json!({"source": {"kind": "configmap", "namespace": "Platform", "name": "s"}}));
    for path in ["/mutate", "/validate"] {
        let response = post(&app(), path, &review).await;
        let message = denial(&response);
        assert!(
            message.contains(
                "spec.source.kind: must match ^[A-Z][a-zA-Z0-9]*$ (PascalCase kind, e.g. ConfigMap)"
            ),
            "{message}"
        );
        assert!(message.contains("spec.source.namespace: must match"), "{message}");
    }
}

#[tokio::test]
async fn a_dashed_key_in_a_field_exclusion_is_denied_with_the_bracket_form_to_write() {
    let review = with_spec(
        json!({"source": {"kind": "Secret", "namespace": "platform", "name": "db"},
                                  "fields": {"exclude": ["$.data.admin-password"]}}),
    );
    for path in ["/mutate", "/validate"] {
        let response = post(&app(), path, &review).await;
        assert_eq!(
            denial(&response),
            "spec.fields.exclude[0]: not a JSONPath expression: Failed to parse rule: --> 1:13 = expected \
             EOI, segment, or ALPHA; write $.data['admin-password'] (a name with '-', '.', '/' or a leading \
             digit needs the bracket form)"
        );
    }
}

#[tokio::test]
async fn metadata_only_updates_pass_even_when_the_spec_is_invalid() {
    let mut review = with_spec(json!({"source": {"kind": "bad"}}));
    review["request"]["operation"] = json!("UPDATE");
    review["request"]["oldObject"] = review["request"]["object"].clone();
    review["request"]["object"]["metadata"]["finalizers"] = json!(["projection.sh/finalizer"]);
    for path in ["/mutate", "/validate"] {
        assert_eq!(post(&app(), path, &review).await["allowed"], true);
    }
}

#[tokio::test]
async fn every_spec_change_is_checked_like_a_new_source() {
    // Any edit makes its writer the author and can widen what a copy shows (an overlay today, a
    // removed field exclusion or a wider metadata include): the source policy runs for each.
    let cluster = FixedCluster::default(); // the source is missing: a warning when checked
    let mut review = fixture();
    review["request"]["operation"] = json!("UPDATE");
    review["request"]["oldObject"] = review["request"]["object"].clone();
    review["request"]["object"]["spec"]["overlay"] = json!({"labels": {"a": "b"}});
    let response = post(&app_with(cluster, default_settings(false)), "/validate", &review).await;
    assert_eq!(response["allowed"], true);
    assert!(
        response.get("warnings").is_some(),
        "the source was checked: {response}"
    );

    // Bob, who may not read the source, removes an exclusion from alice's Projection: denied.
    let mut review = fixture();
    review["request"]["object"]["spec"]["fields"] = json!({"exclude": ["$.data['admin-password']"]});
    review["request"]["operation"] = json!("UPDATE");
    review["request"]["oldObject"] = review["request"]["object"].clone();
    review["request"]["object"]["spec"]
        .as_object_mut()
        .expect("spec")
        .remove("fields");
    review["request"]["userInfo"]["username"] = json!("bob");
    let message = denial(&post(&app(), "/validate", &review).await).to_owned();
    assert!(
        message.starts_with("bob may not get configmaps platform/shared-settings"),
        "{message}"
    );
}

#[tokio::test]
async fn the_operators_own_kinds_and_power_kinds_are_refused_at_admission() {
    for (group, kind, expected) in [
        (
            "projection.sh",
            "Projection",
            "spec.source: projection.sh kinds cannot be projected",
        ),
        (
            "rbac.authorization.k8s.io",
            "RoleBinding",
            "spec.source.kind: RoleBinding.rbac.authorization.k8s.io grants permissions",
        ),
        (
            "",
            "ServiceAccount",
            "spec.source.kind: ServiceAccount is an identity",
        ),
    ] {
        let review = with_spec(
            json!({"source": {"group": group, "kind": kind, "namespace": "platform", "name": "s"}}),
        );
        for path in ["/mutate", "/validate"] {
            let message = denial(&post(&app(), path, &review).await).to_owned();
            assert!(message.starts_with(expected), "{path} {kind}: {message}");
        }
    }
    let mut allowing = default_settings(false);
    allowing.allowed_power_kinds = "ServiceAccount".parse().expect("a power kind");
    let review =
        with_spec(json!({"source": {"kind": "ServiceAccount", "namespace": "platform", "name": "s"}}));
    let response = post(&app_with(FixedCluster::default(), allowing), "/mutate", &review).await;
    assert_eq!(response["allowed"], true, "{response}");
}

#[tokio::test]
async fn a_change_of_spec_keys_is_checked_like_a_new_source() {
    // spec.keys decides what of the source a copy shows: bob, who may not read the source, cannot
    // widen it on alice's Projection; alice can.
    let mut review = fixture();
    review["request"]["operation"] = json!("UPDATE");
    review["request"]["oldObject"] = review["request"]["object"].clone();
    review["request"]["object"]["spec"]["keys"] = json!({"include": ["*"]});
    let response = post(&app(), "/validate", &review).await;
    assert_eq!(response["allowed"], true, "{response}");
    review["request"]["userInfo"]["username"] = json!("bob");
    let response = post(&app(), "/validate", &review).await;
    assert_eq!(response["allowed"], false, "{response}");
    let message = response["status"]["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("bob may not get configmaps platform/shared-settings"),
        "{message}"
    );
}

#[tokio::test]
async fn a_projection_into_another_cluster_names_a_kubeconfig_secret_its_writer_may_read() {
    let cluster = FixedCluster {
        sources: BTreeMap::from([("platform/shared-settings".to_owned(), projectable("true"))]),
        unreadable: vec!["team-a/someone-elses".to_owned()],
    };
    let app = app_with(cluster, default_settings(false));
    let into = |secret: &str| {
        with_spec(json!({
            "source": {"kind": "ConfigMap", "namespace": "platform", "name": "shared-settings"},
            "destination": {"kubeConfig": {"secretRef": {"name": secret}}}}))
    };
    let denied = post(&app, "/validate", &into("someone-elses")).await;
    assert!(
        denial(&denied).starts_with(
            "alice may not get secrets team-a/someone-elses, the kubeconfig of spec.destination.kubeConfig"
        ),
        "{denied}"
    );
    let allowed = post(&app, "/validate", &into("ours")).await;
    assert_eq!(allowed["allowed"], true, "{allowed}");
}

#[tokio::test]
async fn source_policy_verdicts() {
    let cluster = || FixedCluster {
        sources: BTreeMap::from([
            ("platform/vetoed".to_owned(), projectable("false")),
            ("platform/plain".to_owned(), BTreeMap::new()),
            ("platform/secret".to_owned(), projectable("true")),
        ]),
        unreadable: vec!["platform/secret".to_owned()],
    };
    let source = |kind: &str, name: &str| {
        with_spec(json!({"source": {"kind": kind, "namespace": "platform", "name": name}}))
    };

    let app = app_with(cluster(), default_settings(false));
    let vetoed = post(&app, "/validate", &source("ConfigMap", "vetoed")).await;
    assert_eq!(
        denial(&vetoed),
        r#"source platform/vetoed has projection.sh/projectable="false"; owner has opted out of projection"#
    );
    let plain = post(&app, "/validate", &source("ConfigMap", "plain")).await;
    assert_eq!(
        denial(&plain),
        r#"source-mode=allowlist requires annotation projection.sh/projectable="true" on source platform/plain; its owner can opt in with: kubectl annotate configmaps/plain -n platform projection.sh/projectable=true"#
    );
    let secret = post(&app, "/validate", &source("ConfigMap", "secret")).await;
    assert!(
        denial(&secret)
            .starts_with("alice may not get configmaps platform/secret; a projection would expose"),
        "{secret}"
    );
    let mut bob = source("ConfigMap", "plain");
    bob["request"]["userInfo"] = json!({"username": "bob", "groups": ["tenants"]});
    assert!(
        denial(&post(&app, "/validate", &bob).await).starts_with("bob may not get configmaps platform/plain")
    );
    let missing = post(&app, "/validate", &source("ConfigMap", "missing")).await;
    assert_eq!(missing["allowed"], true);
    assert_eq!(
        missing["warnings"],
        json!(["source ConfigMap platform/missing does not exist (yet); the copy is made once it does"])
    );
    let unknown = post(&app, "/validate", &source("Widget", "w")).await;
    assert_eq!(unknown["allowed"], true);
    assert_eq!(
        unknown["warnings"],
        json!(["source kind */Widget is not served by this cluster (yet); the copy is made once it is"])
    );
    let namespace = post(&app, "/validate", &source("Namespace", "n")).await;
    assert_eq!(
        denial(&namespace),
        "*/Namespace is cluster-scoped; projection only mirrors namespaced resources"
    );

    let settings = |check_source_access| ReviewSettings {
        tenant_mode: false,
        policy: PolicySettings {
            source_mode: SourceMode::Permissive,
            check_source_access,
            caller_authenticated: true,
        },
        allowed_power_kinds: Default::default(),
    };
    let permissive = app_with(cluster(), settings(true));
    assert_eq!(
        post(&permissive, "/validate", &source("ConfigMap", "plain")).await["allowed"],
        true
    );
    assert_eq!(
        post(&permissive, "/validate", &source("ConfigMap", "vetoed")).await["allowed"],
        false,
        "false always wins"
    );

    // Without the access check nothing about the source is read: a writer who may not read it
    // would otherwise learn whether it exists and how its owner annotated it. Every source gets
    // the same answer; the controller checks access and consent where copies are made.
    let unchecked = app_with(cluster(), settings(false));
    for name in ["plain", "secret", "vetoed", "missing"] {
        let answer = post(&unchecked, "/validate", &source("ConfigMap", name)).await;
        assert_eq!(answer["allowed"], true, "{name}: {answer}");
        assert!(
            answer.get("warnings").is_none_or(Value::is_null),
            "{name}: {answer}"
        );
    }
    assert_eq!(
        denial(&post(&unchecked, "/validate", &source("Namespace", "n")).await),
        "*/Namespace is cluster-scoped; projection only mirrors namespaced resources",
        "discovery, which every user may read, still refuses cluster-scoped kinds"
    );
}

fn cluster_projection_review(operation: &str) -> Value {
    let mut review = fixture();
    let request = &mut review["request"];
    request["operation"] = json!(operation);
    request["kind"] = json!({"group": "projection.sh", "version": "v1", "kind": "ClusterProjection"});
    request["resource"] =
        json!({"group": "projection.sh", "version": "v1", "resource": "clusterprojections"});
    request["namespace"] = Value::Null;
    request["object"] = json!({
        "apiVersion": "projection.sh/v1", "kind": "ClusterProjection", "metadata": {"name": "fanout"},
        "spec": {"source": {"kind": "ConfigMap", "namespace": "platform", "name": "shared-settings"}, "destination": {"namespaces": ["a", "b"]}}
    });
    review
}

#[tokio::test]
async fn tenant_mode_denies_cluster_projection_writes_only() {
    let tenant = app_with(
        FixedCluster {
            sources: BTreeMap::from([("platform/shared-settings".to_owned(), projectable("true"))]),
            ..Default::default()
        },
        default_settings(true),
    );
    let create = post(&tenant, "/validate", &cluster_projection_review("CREATE")).await;
    assert!(
        denial(&create).starts_with("tenant mode: ClusterProjections cannot be created or changed"),
        "{create}"
    );
    let delete = post(&tenant, "/validate", &cluster_projection_review("DELETE")).await;
    assert_eq!(delete["allowed"], true);
    assert_eq!(
        post(&tenant, "/validate", &fixture()).await["allowed"],
        true,
        "Projections still pass"
    );
    let normal = post(&app(), "/mutate", &cluster_projection_review("CREATE")).await;
    assert_eq!(normal["allowed"], true, "{normal}");
    assert_eq!(
        patch_of(&normal),
        json!([alice_recorded(), {"op": "add", "path": "/spec/destination/name", "value": "shared-settings"}])
    );
}

#[tokio::test]
async fn other_resources_and_missing_specs_are_denied_with_a_reason() {
    let mut other = fixture();
    other["request"]["resource"] = json!({"group": "", "version": "v1", "resource": "configmaps"});
    assert_eq!(
        denial(&post(&app(), "/validate", &other).await),
        "projection-webhook reviews only projection.sh projections and clusterprojections, not /configmaps"
    );
    let mut no_spec = fixture();
    no_spec["request"]["object"]
        .as_object_mut()
        .unwrap()
        .remove("spec");
    assert_eq!(
        denial(&post(&app(), "/validate", &no_spec).await),
        "spec: required"
    );
    let mut no_object = fixture();
    no_object["request"]["object"] = Value::Null;
    assert_eq!(
        denial(&post(&app(), "/mutate", &no_object).await),
        "spec: required"
    );
}

#[tokio::test]
async fn unreadable_requests_get_a_4xx_with_a_well_formed_review() {
    for (body, status) in [
        ("not json".to_owned(), StatusCode::BAD_REQUEST),
        ("{}".to_owned(), StatusCode::BAD_REQUEST),
        (
            json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).to_string(),
            StatusCode::BAD_REQUEST,
        ),
        (
            with_apiversion("admission.k8s.io/v1beta1").to_string(),
            StatusCode::BAD_REQUEST,
        ),
        ("x".repeat(MAX_BODY_BYTES + 1), StatusCode::PAYLOAD_TOO_LARGE),
    ] {
        let (got, body) = post_raw(&app(), "/validate", body).await;
        assert_eq!(got, status, "{body}");
        assert_eq!(body["response"]["allowed"], false);
        assert!(
            !body["response"]["status"]["message"]
                .as_str()
                .unwrap_or_default()
                .is_empty(),
            "{body}"
        );
    }
}

fn with_apiversion(api_version: &str) -> Value {
    let mut review = fixture();
    review["apiVersion"] = json!(api_version);
    review
}

/// A small deterministic generator (xorshift), so failures reproduce without a seed file.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[tokio::test]
async fn random_truncated_and_mangled_bodies_always_get_a_well_formed_answer() {
    let app = app();
    let valid = fixture().to_string().into_bytes();
    let mut random = Random(0x9E37_79B9_7F4A_7C15);
    for round in 0..1500 {
        let body: Vec<u8> = match round % 3 {
            0 => valid[..random.below(valid.len() + 1)].to_vec(),
            1 => {
                let mut mangled = valid.clone();
                for _ in 0..=random.below(8) {
                    let at = random.below(mangled.len());
                    const NOISE: &[u8] = b"{}[]\":,0a\\\x00\xff";
                    mangled[at] = NOISE[random.below(NOISE.len())];
                }
                mangled
            }
            _ => (0..random.below(512)).map(|_| random.next() as u8).collect(),
        };
        for path in ["/validate", "/mutate"] {
            let (status, answer) = post_raw(&app, path, body.clone()).await;
            assert!(
                status == StatusCode::OK || status == StatusCode::BAD_REQUEST,
                "round {round}: {status}"
            );
            assert_eq!(answer["kind"], "AdmissionReview", "round {round}");
            assert_eq!(answer["apiVersion"], "admission.k8s.io/v1", "round {round}");
            assert!(
                answer["response"]["allowed"].is_boolean(),
                "round {round}: {answer}"
            );
        }
    }
}

mod fuzz {
    //! Structured fuzzing: AdmissionReviews whose every field is either plausible or arbitrary JSON,
    //! with specs built from the real field names, so the generated bodies reach validation, the
    //! source policy and the defaulting patch, not only the JSON decoder.

    use super::*;
    use proptest::{
        collection::{btree_map, vec},
        prelude::*,
        test_runner::{Config, TestCaseError, TestRunner},
    };
    use serde_json::Map;

    /// Any JSON value, nested a few levels.
    fn any_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            name().prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                vec(inner.clone(), 0..4).prop_map(Value::from),
                btree_map(name(), inner, 0..4).prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// Names: valid ones, the edge of the limits, and anything.
    fn name() -> impl Strategy<Value = String> {
        prop_oneof![
            4 => "[a-z0-9]([-a-z0-9]{0,14}[a-z0-9])?",
            1 => Just(String::new()),
            1 => Just("a".repeat(253)),
            1 => Just("b".repeat(64)),
            1 => prop::sample::select(vec!["platform", "shared-settings", "team-a", "kube-system", "default", "*", "..", "projection.sh/owned-by", "ConfigMap", "Namespace", "forbidden", "broken"]).prop_map(str::to_owned),
            2 => ".{0,40}",
        ]
    }

    /// A field that is usually a plausible string and sometimes any JSON at all.
    fn field(plausible: impl Strategy<Value = String>) -> impl Strategy<Value = Value> {
        prop_oneof![6 => plausible.prop_map(Value::from), 1 => any_json()]
    }

    /// An object with each of `fields` present or absent, plus sometimes an unknown field.
    fn object(fields: Vec<(&'static str, BoxedStrategy<Value>)>) -> impl Strategy<Value = Value> {
        let present: Vec<_> = fields
            .into_iter()
            .map(|(key, value)| prop::option::weighted(0.8, value).prop_map(move |v| (key, v)))
            .collect();
        (present, prop::option::weighted(0.1, (name(), any_json()))).prop_map(|(fields, extra)| {
            let mut map = Map::new();
            for (key, value) in fields {
                if let Some(value) = value {
                    map.insert(key.to_owned(), value);
                }
            }
            if let Some((key, value)) = extra {
                map.insert(key, value);
            }
            Value::Object(map)
        })
    }

    fn labels() -> impl Strategy<Value = Value> {
        prop_oneof![
            4 => btree_map(prop_oneof![name(), Just("projection.sh/x".to_owned()), "[a-z]{1,8}\\.io/[a-z]{1,8}"], name(), 0..4)
                .prop_map(|m| Value::Object(m.into_iter().map(|(k, v)| (k, Value::from(v))).collect())),
            1 => any_json(),
        ]
    }

    fn source() -> impl Strategy<Value = Value> {
        object(vec![
            (
                "group",
                field(
                    prop::sample::select(vec!["", "apps", "example.com", "projection.sh"])
                        .prop_map(str::to_owned),
                )
                .boxed(),
            ),
            (
                "version",
                field(prop::sample::select(vec!["", "v1", "v1beta1", "V1"]).prop_map(str::to_owned)).boxed(),
            ),
            (
                "kind",
                field(prop_oneof![
                    prop::sample::select(vec!["ConfigMap", "Secret", "Namespace", "Widget", "configmap"])
                        .prop_map(str::to_owned),
                    name()
                ])
                .boxed(),
            ),
            ("namespace", field(name()).boxed()),
            ("name", field(name()).boxed()),
        ])
    }

    fn selector() -> impl Strategy<Value = Value> {
        let requirement = object(vec![
            ("key", field(name()).boxed()),
            (
                "operator",
                field(
                    prop::sample::select(vec!["In", "NotIn", "Exists", "DoesNotExist", "Gt", "in"])
                        .prop_map(str::to_owned),
                )
                .boxed(),
            ),
            (
                "values",
                prop_oneof![
                    vec(name().prop_map(Value::from), 0..3).prop_map(Value::from),
                    any_json()
                ]
                .boxed(),
            ),
        ]);
        object(vec![
            ("matchLabels", labels().boxed()),
            (
                "matchExpressions",
                prop_oneof![vec(requirement, 0..3).prop_map(Value::from), any_json()].boxed(),
            ),
        ])
    }

    fn destination() -> impl Strategy<Value = Value> {
        object(vec![
            ("namespace", field(name()).boxed()),
            ("name", field(name()).boxed()),
            (
                "namespaces",
                prop_oneof![
                    vec(name().prop_map(Value::from), 0..4).prop_map(Value::from),
                    any_json()
                ]
                .boxed(),
            ),
            ("namespaceSelector", selector().boxed()),
        ])
    }

    fn spec() -> impl Strategy<Value = Value> {
        prop_oneof![
            9 => object(vec![
                ("source", source().boxed()),
                ("destination", destination().boxed()),
                ("overlay", object(vec![("labels", labels().boxed()), ("annotations", labels().boxed())]).boxed()),
            ]),
            1 => any_json(),
        ]
    }

    /// An AdmissionReview around a generated Projection or ClusterProjection (or something else).
    fn review() -> impl Strategy<Value = Value> {
        let kind = prop_oneof![
            4 => Just("Projection".to_owned()),
            3 => Just("ClusterProjection".to_owned()),
            1 => name(),
        ];
        let operation = prop::sample::select(vec!["CREATE", "UPDATE", "DELETE", "CONNECT", "create"]);
        let api_version = prop_oneof![
            8 => Just("admission.k8s.io/v1".to_owned()),
            1 => Just("admission.k8s.io/v1beta1".to_owned()),
            1 => name(),
        ];
        let user = object(vec![
            (
                "username",
                field(prop::sample::select(vec!["alice", "bob", "system:admin"]).prop_map(str::to_owned))
                    .boxed(),
            ),
            (
                "groups",
                prop_oneof![
                    Just(json!(["tenants"])),
                    vec(name().prop_map(Value::from), 0..3).prop_map(Value::from),
                    any_json()
                ]
                .boxed(),
            ),
        ]);
        (api_version, kind, operation, name(), name(), user, spec(), prop::option::of(spec()), prop::option::weighted(0.05, any_json()))
            .prop_map(|(api_version, kind, operation, name, namespace, user, spec, old_spec, replacement)| {
                let object = |spec: Value| json!({"apiVersion": "projection.sh/v1", "kind": kind,
                    "metadata": {"name": name, "namespace": namespace}, "spec": spec});
                let mut review = json!({
                    "apiVersion": api_version,
                    "kind": "AdmissionReview",
                    "request": {
                        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                        "kind": {"group": "projection.sh", "version": "v1", "kind": kind},
                        "resource": {"group": "projection.sh", "version": "v1", "resource": format!("{}s", kind.to_lowercase())},
                        "name": name, "namespace": namespace, "operation": operation, "userInfo": user,
                        "object": object(spec),
                        "oldObject": old_spec.map(object),
                    }
                });
                if let Some(replacement) = replacement {
                    review["request"] = replacement;
                }
                review
            })
    }

    /// What every answer must be, whatever came in.
    fn check_answer(review: &Value, status: StatusCode, answer: &Value) -> Result<(), TestCaseError> {
        prop_assert!(
            status == StatusCode::OK || status == StatusCode::BAD_REQUEST,
            "{status}"
        );
        prop_assert_eq!(&answer["kind"], "AdmissionReview");
        prop_assert_eq!(&answer["apiVersion"], "admission.k8s.io/v1");
        let response = &answer["response"];
        let allowed = response["allowed"].as_bool();
        prop_assert!(allowed.is_some(), "allowed is not a boolean: {}", answer);
        if status == StatusCode::OK {
            prop_assert_eq!(&response["uid"], &review["request"]["uid"], "uid echoed");
        }
        if allowed == Some(false) {
            let message = response["status"]["message"].as_str().unwrap_or_default();
            prop_assert!(!message.is_empty(), "a denial says why: {}", answer);
        }
        if !response["patch"].is_null() {
            prop_assert_eq!(&response["patchType"], "JSONPatch");
            let patch: json_patch::Patch = serde_json::from_value(patch_of(response))
                .map_err(|e| TestCaseError::fail(format!("patch is not a JSONPatch ({e}): {answer}")))?;
            let mut object = review["request"]["object"].clone();
            json_patch::patch(&mut object, &patch)
                .map_err(|e| TestCaseError::fail(format!("the patch does not apply ({e}): {answer}")))?;
        }
        Ok(())
    }

    #[test]
    fn generated_reviews_always_get_a_well_formed_answer() {
        let cases = std::env::var("WEBHOOK_FUZZ_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(3000);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let app = app();
        let mut runner = TestRunner::new(Config {
            cases,
            failure_persistence: None,
            ..Config::default()
        });
        // (allowed, denied, unreadable): the generator must reach past the decoder.
        let seen = std::cell::Cell::new((0u32, 0u32, 0u32));
        let outcome = runner.run(&review(), |review| {
            let body = review.to_string();
            for path in ["/validate", "/mutate"] {
                let (status, answer) = runtime.block_on(post_raw(&app, path, body.clone()));
                check_answer(&review, status, &answer)?;
                let (allowed, denied, unreadable) = seen.get();
                seen.set(match (status, answer["response"]["allowed"].as_bool()) {
                    (StatusCode::BAD_REQUEST, _) => (allowed, denied, unreadable + 1),
                    (_, Some(true)) => (allowed + 1, denied, unreadable),
                    _ => (allowed, denied + 1, unreadable),
                });
            }
            Ok(())
        });
        if let Err(failure) = outcome {
            panic!("{failure}");
        }
        let (allowed, denied, unreadable) = seen.get();
        eprintln!("answers: {allowed} allowed, {denied} denied, {unreadable} unreadable (400)");
        assert!(allowed > 0 && denied > 0, "allowed {allowed}, denied {denied}");
    }
}

/// The JSONPatch of a response. kube encodes the patch bytes as a JSON array of numbers, which the
/// apiserver's decoder accepts like a base64 string.
fn patch_of(response: &Value) -> Value {
    let bytes: Vec<u8> = serde_json::from_value(response["patch"].clone()).expect("patch bytes");
    serde_json::from_slice(&bytes).expect("patch is JSON")
}

#[tokio::test]
async fn a_source_the_webhook_cannot_read_is_denied_saying_why_and_counted() {
    let metrics = Arc::new(Metrics::unregistered());
    let app = admission_router(FixedCluster::default(), default_settings(false), metrics.clone());
    let source = |name: &str| {
        with_spec(json!({"source": {"kind": "ConfigMap", "namespace": "platform", "name": name}}))
    };
    let forbidden = post(&app, "/validate", &source("forbidden")).await;
    assert!(
        denial(&forbidden).contains("projection may not read configmaps")
            && denial(&forbidden).contains("supportedKinds"),
        "{forbidden}"
    );
    let broken = post(&app, "/validate", &source("broken")).await;
    assert!(
        denial(&broken).starts_with("cannot check the source right now"),
        "{broken}"
    );
    let counted = metrics
        .errors_total
        .get_or_create(&webhook::metrics::CategoryLabels {
            category: "source_read",
        })
        .get();
    assert_eq!(
        counted, 1,
        "only the failed check counts as an error; RBAC is a verdict"
    );
}
