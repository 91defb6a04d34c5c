//! One admission review: which resource and operation, whether the spec changed, validation (shared
//! with the controller), the default destination name (mutating endpoint) and the source policy
//! (validating endpoint). No HTTP here.
//!
//! The mutating endpoint validates too: the apiserver checks a custom resource against its CRD
//! schema after mutating webhooks and before validating ones, so only a denial from the mutating
//! webhook reaches the user before the schema's terser messages.

use crate::{
    claim_watch::Candidate,
    cluster_view::{ClusterView, KindScope},
    content_check::{ContentVerdict, check_content},
    error::PolicyError,
    policy::{PolicySettings, PolicyVerdict, check_kubeconfig_access, check_source},
};
use kube::core::{
    DynamicObject,
    admission::{AdmissionRequest, AdmissionResponse, Operation},
};
use serde_json::{Value, json};
use shared::{
    admission::validation::{check_cluster_projection, check_projection},
    api::crd::{ClusterProjectionSpec, ProjectionSpec, SourceRef},
    api::source::cluster_scoped_message,
    copy::content::CopyRules,
    policy::author::{AUTHOR, Author},
    policy::kind_policy::{AllowedPowerKinds, check_kind},
};

/// The two endpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// Validation and source policy.
    Validate,
    /// Validation and defaulting.
    Mutate,
}

impl Endpoint {
    /// Metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Validate => "validate",
            Self::Mutate => "mutate",
        }
    }
}

/// Settings of the review.
#[derive(Clone, Debug)]
pub struct ReviewSettings {
    /// `--tenant-mode`: ClusterProjection creates and spec changes are denied.
    pub tenant_mode: bool,
    /// Source policy.
    pub policy: PolicySettings,
    /// `--allow-power-kinds`: the kinds that grant power a platform lets be projected.
    pub allowed_power_kinds: AllowedPowerKinds,
}

/// How a review ended, for metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Admitted (maybe with a patch or warnings).
    Allowed,
    /// Denied by a rule.
    Denied,
    /// Denied because a policy could not be checked (the error's category, for the errors metric).
    Error(&'static str),
}

impl Verdict {
    /// Metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::Denied => "denied",
            Self::Error(_) => "error",
        }
    }
}

/// The reviewed resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reviewed {
    Projection,
    ClusterProjection,
}

/// Metric label of a request's resource.
pub fn resource_label(request: &AdmissionRequest<DynamicObject>) -> &'static str {
    match reviewed(request) {
        Some(Reviewed::Projection) => "projections",
        Some(Reviewed::ClusterProjection) => "clusterprojections",
        None => "other",
    }
}

/// Metric label of a request's operation.
pub fn operation_label(request: &AdmissionRequest<DynamicObject>) -> &'static str {
    match request.operation {
        Operation::Create => "CREATE",
        Operation::Update => "UPDATE",
        Operation::Delete => "DELETE",
        Operation::Connect => "CONNECT",
    }
}

fn reviewed(request: &AdmissionRequest<DynamicObject>) -> Option<Reviewed> {
    let resource = &request.resource;
    if resource.group != "projection.sh" || request.sub_resource.is_some() {
        return None;
    }
    match resource.resource.as_str() {
        "projections" => Some(Reviewed::Projection),
        "clusterprojections" => Some(Reviewed::ClusterProjection),
        _ => None,
    }
}

/// A spec that passed validation.
enum Checked {
    Projection(ProjectionSpec),
    Cluster(ClusterProjectionSpec),
}

fn spec_of(object: Option<&DynamicObject>) -> Option<&Value> {
    object.and_then(|o| o.data.get("spec"))
}

/// Reviews one request at `endpoint`.
pub async fn review<C: ClusterView>(
    endpoint: Endpoint,
    settings: &ReviewSettings,
    cluster: &C,
    request: &AdmissionRequest<DynamicObject>,
) -> (AdmissionResponse, Verdict) {
    let allow = AdmissionResponse::from(request);
    let deny = |message: String| (AdmissionResponse::from(request).deny(message), Verdict::Denied);
    let Some(kind) = reviewed(request) else {
        let r = &request.resource;
        return deny(format!(
            "projection-webhook reviews only projection.sh projections and clusterprojections, not {}/{}",
            r.group, r.resource
        ));
    };
    if !matches!(request.operation, Operation::Create | Operation::Update) {
        return (allow, Verdict::Allowed);
    }
    let spec = spec_of(request.object.as_ref());
    let old_spec = spec_of(request.old_object.as_ref());
    // Metadata-only updates (finalizers, labels) must always pass, or an object admitted before a
    // rule existed could never finish its deletion.
    if request.operation == Operation::Update && spec == old_spec {
        return (allow, Verdict::Allowed);
    }
    if settings.tenant_mode && kind == Reviewed::ClusterProjection {
        return deny(
            "tenant mode: ClusterProjections cannot be created or changed here; use a Projection in \
             your own namespace"
                .to_owned(),
        );
    }
    let namespace = request.namespace.as_deref().unwrap_or_default();
    let checked = match kind {
        Reviewed::Projection => check_projection(namespace, spec).map(Checked::Projection),
        Reviewed::ClusterProjection => check_cluster_projection(spec).map(Checked::Cluster),
    };
    let checked = match checked {
        Ok(checked) => checked,
        Err(invalid) => return deny(invalid.to_string()),
    };
    let (source, destination_name) = match &checked {
        Checked::Projection(s) => (
            s.source.clone(),
            s.destination.as_ref().and_then(|d| d.name.clone()),
        ),
        Checked::Cluster(s) => (s.source.clone(), s.destination.name.clone()),
    };
    // The operator's own kinds, and kinds that grant power unless the platform allows them.
    if let Err(message) = check_kind(&source.group_kind(), &settings.allowed_power_kinds) {
        return deny(message);
    }
    match endpoint {
        Endpoint::Mutate => {
            // Whoever writes the spec is its author: the controller checks the author's access
            // where each copy is made, and the chart's admission policy holds the record to the
            // requesting user even when this webhook is bypassed.
            let username = request.user_info.username.as_deref().unwrap_or_default();
            let groups = request.user_info.groups.as_deref().unwrap_or_default();
            let author = match Author::of(username, groups) {
                Ok(author) => author,
                Err(why) => return deny(format!("cannot record the author of this spec: {why}")),
            };
            let mut operations = vec![author_operation(request.object.as_ref(), &author)];
            operations.extend(default_destination_name(
                spec,
                &source,
                destination_name.as_deref(),
            ));
            (with_patch(allow, operations), Verdict::Allowed)
        }
        Endpoint::Validate => {
            // A caller that is not known to be the apiserver may be anyone claiming any userInfo
            // (system:masters): it must learn nothing about any object, so nothing that reads the
            // cluster runs (access, projectability, content, the other CRs). Nor without the
            // access check: reading the source for a writer who may not read it would tell them
            // whether it exists and how its owner annotated it. The controller checks the author's
            // access and the source's consent where each copy is made. So the webhook reads
            // sources only in this one case, and the chart grants it `get` on them only then.
            if !settings.policy.reads_sources() {
                // Discovery is what every authenticated user may read: a cluster-scoped kind is
                // still refused here, with its message (anything else waits for the controller).
                if let Ok(KindScope::Cluster) = cluster.resolve(&source).await {
                    return deny(cluster_scoped_message(&source));
                }
                return (allow, Verdict::Allowed);
            }
            // Any change of the spec can widen what a copy shows (a removed exclusion, a wider
            // metadata include, another destination), and it makes its writer the author: the
            // writer must be able to read the source, whatever field changed. First, before
            // anything about the source or the other CRs is revealed.
            let mut warnings = match check_source(cluster, settings.policy, &request.user_info, &source).await
            {
                Ok(PolicyVerdict::Allow { warnings }) => warnings,
                Ok(PolicyVerdict::Deny(message)) => return deny(message),
                Err(error) => {
                    return (
                        AdmissionResponse::from(request).deny(policy_failure(&error)),
                        Verdict::Error(error.category()),
                    );
                }
            };
            // A Projection's kubeconfig Secret, like its source, must be one its writer may read.
            if let Checked::Projection(projection) = &checked
                && let Some(kube_config) = projection
                    .destination
                    .as_ref()
                    .and_then(|d| d.kube_config.as_ref())
            {
                match check_kubeconfig_access(cluster, &request.user_info, namespace, &kube_config.secret_ref)
                    .await
                {
                    Ok(None) => {}
                    Ok(Some(denial)) => return deny(denial),
                    Err(error) => {
                        return (
                            AdmissionResponse::from(request).deny(policy_failure(&error)),
                            Verdict::Error(error.category()),
                        );
                    }
                }
            }
            let changed =
                |field: &str| old_spec.and_then(|s| s.get(field)) != spec.and_then(|s| s.get(field));
            // The other CRs: a loop is denied, an overlap warned of (when the copies may have moved).
            if let Some(claims) = cluster.claims()
                && (changed("source") || changed("destination"))
            {
                let candidate = match &checked {
                    Checked::Projection(spec) => Candidate::Projection { namespace, spec },
                    Checked::Cluster(spec) => Candidate::Cluster { spec },
                };
                let verdict = claims.check(&request.name, candidate);
                if let Some(denial) = verdict.denial {
                    return deny(denial);
                }
                warnings.extend(verdict.warnings);
            }
            // After the source policy: only a user who may read the source learns about its keys.
            match check_content(cluster, &source, &checked.copy_rules()).await {
                ContentVerdict::Deny(message) => return deny(message),
                ContentVerdict::Warn(warning) => warnings.push(warning),
                ContentVerdict::Fine => {}
            }
            let mut response = allow;
            response.warnings = (!warnings.is_empty()).then_some(warnings);
            (response, Verdict::Allowed)
        }
    }
}

impl Checked {
    fn copy_rules(&self) -> CopyRules<'_> {
        match self {
            Self::Projection(spec) => CopyRules::of(&spec.controls),
            Self::Cluster(spec) => CopyRules::of(&spec.controls),
        }
    }
}

fn policy_failure(error: &PolicyError) -> String {
    format!("cannot check the source right now ({error}); try again")
}

/// The patch operation recording `author` in the object's annotations (added or replaced).
fn author_operation(object: Option<&DynamicObject>, author: &Author) -> Value {
    let has_annotations = object.is_some_and(|o| o.metadata.annotations.is_some());
    if has_annotations {
        // `add` on an existing member replaces it (RFC 6902); `/` in the key is escaped as `~1`.
        let path = format!(
            "/metadata/annotations/{}",
            AUTHOR.replace('~', "~0").replace('/', "~1")
        );
        json!({"op": "add", "path": path, "value": author.record()})
    } else {
        json!({"op": "add", "path": "/metadata/annotations", "value": {AUTHOR: author.record()}})
    }
}

/// The operation adding `spec.destination.name` (the source's name) when absent.
fn default_destination_name(
    spec: Option<&Value>,
    source: &SourceRef,
    destination_name: Option<&str>,
) -> Option<Value> {
    if destination_name.is_some() {
        return None;
    }
    let has_destination = spec
        .and_then(|s| s.get("destination"))
        .is_some_and(Value::is_object);
    Some(if has_destination {
        json!({"op": "add", "path": "/spec/destination/name", "value": source.name})
    } else {
        json!({"op": "add", "path": "/spec/destination", "value": {"name": source.name}})
    })
}

/// `response` with the JSON patch of `operations`.
fn with_patch(response: AdmissionResponse, operations: Vec<Value>) -> AdmissionResponse {
    let patch: json_patch::Patch = match serde_json::from_value(Value::Array(operations)) {
        Ok(patch) => patch,
        Err(e) => return response.deny(format!("internal error building the patch: {e}")),
    };
    match response.clone().with_patch(patch) {
        Ok(patched) => patched,
        Err(e) => response.deny(format!("internal error encoding the patch: {e}")),
    }
}
