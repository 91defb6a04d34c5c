//! The Helm chart. Without a cluster: `helm lint`, the values schema, and assertions on what
//! `helm template` renders (and that the Dockerfiles and the image script agree with it). On the
//! local control plane: the RBAC matrix through SubjectAccessReviews (chart_cluster); on its node,
//! with our images and the real cert-manager: `helm install --wait` in every certificate mode and
//! what users do with it (chart_node). On the second control plane: the CRDs upgraded with the
//! chart from its previous version and kept by `helm uninstall` (chart_crds).

mod chart_cluster;
mod chart_crds;
mod chart_node;

use projection_tests::{
    chart::{Rendered, args_of, container, flag_value, helm, numbers_as_floats, render, render_for_version},
    repo_root,
};
use serde_json::{Value, json};
use std::collections::BTreeSet;

const NS: &str = "projection-system";

fn rendered(values: &[(&str, Value)]) -> Rendered {
    render("projection", NS, values).unwrap_or_else(|e| panic!("helm template failed: {e}"))
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|s| s.as_str().expect("strings").to_owned())
        .collect()
}

/// Every value set a certificate mode needs, so each mode renders on its own.
fn mode_values(mode: &str) -> Vec<(&'static str, Value)> {
    let mut values = vec![("webhook.certificate.mode", json!(mode))];
    if mode == "provided" {
        values.push(("webhook.certificate.provided.secretName", json!("my-webhook-tls")));
        values.push((
            "webhook.certificate.provided.caBundle",
            json!("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"),
        ));
    }
    values
}

const MODES: [&str; 3] = ["self-managed", "cert-manager", "provided"];

#[test]
fn lint_is_clean_in_every_mode() {
    let chart = repo_root().join("charts/projection");
    let crd_values = [
        vec![],
        vec![("crds.install", json!(false))],
        vec![("crds.keep", json!(false))],
    ];
    for (mode, crd_values) in MODES.into_iter().zip(crd_values) {
        let mut args = vec![
            "lint".to_owned(),
            chart.to_string_lossy().into_owned(),
            "--strict".to_owned(),
        ];
        for (key, value) in mode_values(mode).into_iter().chain(crd_values) {
            args.extend(["--set-json".to_owned(), format!("{key}={value}")]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = helm(&args);
        assert!(
            out.status.success(),
            "helm lint ({mode}) failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn values_schema_rejects_typos_and_bad_values_naming_the_field() {
    let cases: Vec<(&str, Value, &str)> = vec![
        ("controller.replcias", json!(2), "replcias"),
        ("webhok", json!({}), "webhok"),
        ("sourceMode", json!("open"), "/sourceMode"),
        (
            "webhook.certificate.mode",
            json!("certmanager"),
            "/webhook/certificate/mode",
        ),
        (
            "webhook.failurePolicy",
            json!("Sometimes"),
            "/webhook/failurePolicy",
        ),
        (
            "controller.requeueInterval",
            json!("soon"),
            "/controller/requeueInterval",
        ),
        (
            "controller.selectorWriteConcurrency",
            json!(0),
            "/controller/selectorWriteConcurrency",
        ),
        (
            "controller.maxConcurrentReconciles",
            json!(0),
            "/controller/maxConcurrentReconciles",
        ),
        ("supportedKinds", json!([{"apiGroup": ""}]), "resources"),
        (
            "supportedKinds",
            json!([{"apiGroup": "", "resources": []}]),
            "/supportedKinds/0/resources",
        ),
        ("webhook.port", json!(70000), "/webhook/port"),
        // cert-manager's older key: ours is crds.install.
        ("crds.enabled", json!(true), "enabled"),
        ("crds.keep", json!("yes"), "/crds/keep"),
        (
            "webhook.podDisruptionBudget.minAvailable",
            json!("150%"),
            "minAvailable",
        ),
        (
            "webhook.certificate.provided.caBundle",
            json!("not a PEM"),
            "caBundle",
        ),
        (
            "controller.resources",
            json!({"limits": {"memory": "lots"}}),
            "memory",
        ),
        (
            "networkPolicy.apiServer.ports",
            json!([]),
            "/networkPolicy/apiServer/ports",
        ),
        ("controller.extraArgs", json!(["-v"]), "extraArgs"),
        (
            "controller.recreateOnImmutable",
            json!(["jobs.batch"]),
            "/controller/recreateOnImmutable/0",
        ),
        (
            "webhook.accessReviewCacheSeconds",
            json!(3600),
            "/webhook/accessReviewCacheSeconds",
        ),
        (
            "webhook.sourceMetadataCacheSeconds",
            json!(-1),
            "/webhook/sourceMetadataCacheSeconds",
        ),
    ];
    for (key, value, expected) in cases {
        let err = render("projection", NS, &[(key, value.clone())])
            .err()
            .unwrap_or_else(|| panic!("{key}={value} was accepted"));
        assert!(
            err.contains(expected),
            "{key}={value}: the error should name {expected:?}:\n{err}"
        );
    }
}

#[test]
fn template_refuses_inconsistent_values_with_a_clear_message() {
    let cases: Vec<(Vec<(&str, Value)>, &str)> = vec![
        (
            vec![
                ("controller.replicas", json!(2)),
                ("controller.leaderElection.enabled", json!(false)),
            ],
            "controller.leaderElection.enabled",
        ),
        (
            vec![("webhook.replicas", json!(1))],
            "webhook.podDisruptionBudget.minAvailable (1) must be below webhook.replicas (1)",
        ),
        (
            vec![("webhook.certificate.mode", json!("provided"))],
            "webhook.certificate.provided.secretName is required",
        ),
        (
            vec![
                ("webhook.certificate.mode", json!("provided")),
                ("webhook.certificate.provided.secretName", json!("tls")),
            ],
            "webhook.certificate.provided.caBundle is required",
        ),
        (
            vec![("webhook.hostNetwork", json!(true)), ("webhook.port", json!(443))],
            "webhook.hostNetwork: webhook.port 443 is below 1024",
        ),
        (
            vec![
                ("webhook.hostNetwork", json!(true)),
                ("webhook.port", json!(10250)),
            ],
            "webhook.port 10250 is the kubelet's port",
        ),
    ];
    for (values, expected) in cases {
        let err = render("projection", NS, &values)
            .err()
            .unwrap_or_else(|| panic!("{values:?} was accepted"));
        assert!(err.contains(expected), "{values:?}: {err}");
    }
}

#[test]
fn deployments_are_hardened_and_probe_the_right_ports() {
    for mode in MODES {
        let r = rendered(&mode_values(mode));
        for (name, replicas) in [("projection-controller", 1), ("projection-webhook", 2)] {
            let deployment = r.get("Deployment", name);
            assert_eq!(deployment["spec"]["replicas"], replicas, "{name}");
            let pod = &deployment["spec"]["template"]["spec"];
            assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{name}");
            assert_eq!(pod["securityContext"]["runAsUser"], 65532, "{name}");
            assert_eq!(pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault");
            let c = container(deployment);
            assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true, "{name}");
            assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false, "{name}");
            assert_eq!(
                c["securityContext"]["capabilities"]["drop"],
                json!(["ALL"]),
                "{name}"
            );
            assert!(
                c["resources"]["requests"]["memory"].is_string(),
                "{name} has requests"
            );
            assert!(
                c["resources"]["limits"]["memory"].is_string(),
                "{name} has a memory limit"
            );
            // Probes hit the port the binary is told to serve them on.
            let health_port = container_port(c, "health");
            assert_eq!(
                flag_value(deployment, "--health-probe-bind-address"),
                Some(format!(":{health_port}")),
                "{name}"
            );
            assert_eq!(
                flag_value(deployment, "--metrics-bind-address"),
                Some(format!(":{}", container_port(c, "metrics")))
            );
            assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
            assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
            assert_eq!(c["readinessProbe"]["httpGet"]["port"], "health");
            // POD_NAMESPACE feeds the leader Lease namespace and the webhook's Secret namespace.
            assert!(
                c["env"]
                    .as_array()
                    .expect("env")
                    .iter()
                    .any(|e| e["name"] == "POD_NAMESPACE"
                        && e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"),
                "{name}"
            );
        }
        let controller = r.get("Deployment", "projection-controller");
        let args = args_of(controller);
        assert!(args.contains(&"--leader-elect".to_owned()), "{args:?}");
        assert!(args.contains(&"--source-mode=allowlist".to_owned()), "{args:?}");
        // Only ConfigMaps and Secrets are recreated unless the platform opts kinds in.
        assert_eq!(flag_value(controller, "--recreate-on-immutable"), None);
        let opted = rendered(&[(
            "controller.recreateOnImmutable",
            json!(["PersistentVolumeClaim", "Job.batch"]),
        )]);
        assert_eq!(
            flag_value(
                opted.get("Deployment", "projection-controller"),
                "--recreate-on-immutable"
            )
            .as_deref(),
            Some("PersistentVolumeClaim,Job.batch")
        );
        assert_eq!(
            controller["spec"]["template"]["spec"]["serviceAccountName"],
            "projection-controller"
        );

        let webhook = r.get("Deployment", "projection-webhook");
        assert_eq!(
            flag_value(webhook, "--access-review-cache-ttl").as_deref(),
            Some("5s")
        );
        assert_eq!(
            flag_value(webhook, "--source-metadata-cache-ttl").as_deref(),
            Some("5s")
        );
        let pod = &webhook["spec"]["template"]["spec"];
        assert_eq!(pod["serviceAccountName"], "projection-webhook");
        let anti = &pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0];
        assert_eq!(anti["podAffinityTerm"]["topologyKey"], "kubernetes.io/hostname");
        let pod_labels = &webhook["spec"]["template"]["metadata"]["labels"];
        assert_labels_select(
            &anti["podAffinityTerm"]["labelSelector"]["matchLabels"],
            pod_labels,
        );

        // The Service and the PDB select the webhook pods, and the Service reaches the HTTPS port.
        let service = r.get("Service", "projection-webhook");
        assert_labels_select(&service["spec"]["selector"], pod_labels);
        assert_eq!(service["spec"]["ports"][0]["targetPort"], "https");
        assert_eq!(service["spec"]["ports"][0]["name"], "https");
        assert_eq!(
            flag_value(webhook, "--bind-address"),
            Some(format!("0.0.0.0:{}", container_port(container(webhook), "https")))
        );
        let pdb = r.get("PodDisruptionBudget", "projection-webhook");
        assert_eq!(pdb["spec"]["minAvailable"], 1);
        assert_labels_select(&pdb["spec"]["selector"]["matchLabels"], pod_labels);
        // The controller's pods are not selected by the webhook Service.
        let controller_labels = &controller["spec"]["template"]["metadata"]["labels"];
        assert!(!selects(&service["spec"]["selector"], controller_labels));
    }
}

#[test]
fn the_webhook_on_the_nodes_network_serves_on_its_port_one_pod_per_node() {
    let default = rendered(&[]);
    let pod = &default.get("Deployment", "projection-webhook")["spec"]["template"]["spec"];
    assert!(pod.get("hostNetwork").is_none(), "off by default");
    let r = rendered(&[
        ("webhook.hostNetwork", json!(true)),
        ("webhook.port", json!(10443)),
    ]);
    let deployment = r.get("Deployment", "projection-webhook");
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["dnsPolicy"], "ClusterFirstWithHostNet");
    assert!(
        pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"].is_array(),
        "two replicas cannot bind one port on one node: {}",
        pod["affinity"]
    );
    assert_eq!(
        flag_value(deployment, "--bind-address"),
        Some("0.0.0.0:10443".to_owned())
    );
    assert_eq!(container_port(container(deployment), "https"), 10443);
    let service = r.get("Service", "projection-webhook");
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "https");
    // The controller stays on the pod network.
    let controller = &r.get("Deployment", "projection-controller")["spec"]["template"]["spec"];
    assert!(controller.get("hostNetwork").is_none());
}

fn container_port(container: &Value, name: &str) -> u64 {
    container["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .find(|p| p["name"] == name)
        .and_then(|p| p["containerPort"].as_u64())
        .unwrap_or_else(|| panic!("no container port {name}"))
}

fn selects(selector: &Value, labels: &Value) -> bool {
    selector
        .as_object()
        .is_some_and(|s| !s.is_empty() && s.iter().all(|(k, v)| labels[k] == *v))
}

fn assert_labels_select(selector: &Value, labels: &Value) {
    assert!(selects(selector, labels), "{selector} does not select {labels}");
}

#[test]
fn webhook_configurations_match_each_certificate_mode() {
    for mode in MODES {
        let r = rendered(&mode_values(mode));
        let webhook = r.get("Deployment", "projection-webhook");
        let volumes = &webhook["spec"]["template"]["spec"]["volumes"];
        for kind in ["ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"] {
            let config = r.get(kind, "projection-webhook");
            let hooks = config["webhooks"].as_array().expect("webhooks");
            assert_eq!(hooks.len(), 1, "{kind}");
            let hook = &hooks[0];
            assert_eq!(hook["failurePolicy"], "Fail", "{mode} {kind}");
            assert_eq!(hook["sideEffects"], "None");
            assert_eq!(
                hook["rules"],
                json!([{"apiGroups": ["projection.sh"], "apiVersions": ["v1"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["projections", "clusterprojections"], "scope": "*"}]),
                "scoped to the two resources"
            );
            assert!(
                hook["matchConditions"][0]["expression"]
                    .as_str()
                    .is_some_and(|e| e.contains("object.spec != oldObject.spec")),
                "metadata-only updates skip the webhook"
            );
            let service = &hook["clientConfig"]["service"];
            assert_eq!(service["name"], "projection-webhook");
            assert_eq!(service["namespace"], NS);
            let path = if kind.starts_with("Validating") {
                "/validate"
            } else {
                "/mutate"
            };
            assert_eq!(service["path"], path);
            let annotation = &config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"];
            let ca_bundle = &hook["clientConfig"]["caBundle"];
            match mode {
                "cert-manager" => {
                    let certificate = r.get("Certificate", "projection-webhook");
                    assert_eq!(*annotation, format!("{NS}/projection-webhook"));
                    assert!(ca_bundle.is_null(), "cainjector fills it");
                    let dns = strings(&certificate["spec"]["dnsNames"]);
                    assert!(dns.contains(&format!("projection-webhook.{NS}.svc")), "{dns:?}");
                    assert_eq!(
                        volumes[0]["secret"]["secretName"],
                        certificate["spec"]["secretName"]
                    );
                    let issuer = r.get("Issuer", "projection-webhook-selfsigned");
                    assert!(issuer["spec"]["selfSigned"].is_object());
                    assert_eq!(
                        certificate["spec"]["issuerRef"]["name"],
                        "projection-webhook-selfsigned"
                    );
                }
                "provided" => {
                    assert!(annotation.is_null());
                    let pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
                    use base64::Engine as _;
                    assert_eq!(*ca_bundle, base64::engine::general_purpose::STANDARD.encode(pem));
                    assert_eq!(volumes[0]["secret"]["secretName"], "my-webhook-tls");
                    assert!(r.of_kind("Certificate").is_empty() && r.of_kind("Issuer").is_empty());
                }
                _ => {
                    assert!(annotation.is_null());
                    assert!(ca_bundle.is_null(), "the webhook patches it");
                    assert!(volumes.is_null(), "no mounted certificate");
                    assert_eq!(
                        flag_value(webhook, "--validating-webhook-configuration").as_deref(),
                        Some("projection-webhook")
                    );
                    assert_eq!(
                        flag_value(webhook, "--mutating-webhook-configuration").as_deref(),
                        Some("projection-webhook")
                    );
                    assert_eq!(
                        flag_value(webhook, "--service-name").as_deref(),
                        Some("projection-webhook")
                    );
                    assert_eq!(
                        flag_value(webhook, "--self-managed-certificate-secret").as_deref(),
                        Some("projection-webhook-tls")
                    );
                }
            }
        }
        if mode != "self-managed" {
            assert_eq!(
                flag_value(webhook, "--tls-cert-file").as_deref(),
                Some("/tls/tls.crt")
            );
            let mount = &container(webhook)["volumeMounts"][0];
            assert_eq!(mount["mountPath"], "/tls");
            assert_eq!(mount["readOnly"], true);
        }
    }
    // A named issuer is used as given; no self-signed Issuer then.
    let r = rendered(&[
        ("webhook.certificate.mode", json!("cert-manager")),
        (
            "webhook.certificate.certManager.issuerRef",
            json!({"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}),
        ),
    ]);
    assert!(r.of_kind("Issuer").is_empty());
    assert_eq!(
        r.get("Certificate", "projection-webhook")["spec"]["issuerRef"],
        json!({"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"})
    );
}

/// The rules of a rendered (Cluster)Role as (apiGroups, resources, verbs) triples.
fn rules(role: &Value) -> Vec<(Vec<String>, Vec<String>, Vec<String>)> {
    role["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .map(|r| {
            (
                strings(&r["apiGroups"]),
                strings(&r["resources"]),
                strings(&r["verbs"]),
            )
        })
        .collect()
}

/// The verbs a role grants on `group`/`resource` (wildcards honoured).
fn verbs_on(role: &Value, group: &str, resource: &str) -> BTreeSet<String> {
    rules(role)
        .into_iter()
        .filter(|(groups, resources, _)| {
            groups.iter().any(|g| g == group || g == "*")
                && resources.iter().any(|r| r == resource || r == "*")
        })
        .flat_map(|(_, _, verbs)| verbs)
        .collect()
}

fn set(verbs: &[&str]) -> BTreeSet<String> {
    verbs.iter().map(|v| (*v).to_owned()).collect()
}

#[test]
fn the_default_install_grants_no_cluster_scoped_kind_or_subresource() {
    // Every (group, resource) any Role or ClusterRole of the default install names, in every
    // certificate mode: the copied kinds (ConfigMaps and Secrets), the operator's own resources,
    // and what the services need to run. No wildcard, no other subresource, no other cluster-scoped
    // kind (a leaked token cannot mint tokens, exec into pods or touch RBAC).
    let needed: BTreeSet<(&str, &str)> = [
        ("", "configmaps"),
        ("", "secrets"),
        ("", "namespaces"),
        ("projection.sh", "projections"),
        ("projection.sh", "clusterprojections"),
        ("projection.sh", "projections/status"),
        ("projection.sh", "clusterprojections/status"),
        ("projection.sh", "projections/finalizers"),
        ("projection.sh", "clusterprojections/finalizers"),
        ("events.k8s.io", "events"),
        ("coordination.k8s.io", "leases"),
        ("apiextensions.k8s.io", "customresourcedefinitions"),
        ("apiregistration.k8s.io", "apiservices"),
        ("authorization.k8s.io", "subjectaccessreviews"),
        // `helm test`'s pod: reads the controller's Deployment (by name) in the release namespace.
        ("apps", "deployments"),
        ("admissionregistration.k8s.io", "validatingwebhookconfigurations"),
        ("admissionregistration.k8s.io", "mutatingwebhookconfigurations"),
        // Copies written as their author (v1.36): whom the controller may impersonate, names the
        // apiserver checks rather than objects (it refuses system:masters whatever a rule says),
        // and the start-up probe's SelfSubjectReview.
        ("authentication.k8s.io", "users"),
        ("authentication.k8s.io", "groups"),
        ("authentication.k8s.io", "serviceaccounts"),
        ("authentication.k8s.io", "selfsubjectreviews"),
    ]
    .into();
    for mode in MODES {
        let r = rendered(&mode_values(mode));
        for kind in ["ClusterRole", "Role"] {
            for role in r.of_kind(kind) {
                let name = role["metadata"]["name"].as_str().unwrap_or_default();
                for (groups, resources, verbs) in rules(role) {
                    assert!(
                        !verbs.iter().any(|v| v == "*"),
                        "{mode} {kind} {name}: a wildcard verb on {resources:?}"
                    );
                    for group in &groups {
                        for resource in &resources {
                            assert!(
                                needed.contains(&(group.as_str(), resource.as_str())),
                                "{mode} {kind} {name} grants {verbs:?} on {group}/{resource}"
                            );
                        }
                    }
                }
            }
        }
        let controller = r.get("ClusterRole", "projection-controller");
        assert_eq!(verbs_on(controller, "", "secrets"), writes_as_author());
        // Impersonation is for the projected kinds' writes only: never reads, deletes or other kinds.
        assert!(verbs_on(controller, "", "pods").is_empty());
        assert_eq!(
            verbs_on(controller, "authentication.k8s.io", "users"),
            set(&["impersonate:user-info"])
        );
        assert!(verbs_on(controller, "", "serviceaccounts/token").is_empty());
        assert!(verbs_on(controller, "", "pods/exec").is_empty());
        assert!(verbs_on(controller, "rbac.authorization.k8s.io", "rolebindings").is_empty());
    }
}

/// The controller's verbs on a projected kind where copies are written as their author (the chart's
/// default on v1.36, the version the tests render for): no create or update of its own.
fn writes_as_author() -> BTreeSet<String> {
    set(&[
        "get",
        "list",
        "watch",
        "patch",
        "delete",
        "impersonate-on:user-info:create",
        "impersonate-on:user-info:patch",
        "impersonate-on:serviceaccount:create",
        "impersonate-on:serviceaccount:patch",
    ])
}

/// `controller.writeCopiesAs` picks the controller's verbs on the projected kinds: `auto` on v1.36
/// and `author` impersonate for writes; `controller`, `authorAccess: trusted` and `auto` before v1.36
/// write as the controller; the flag follows.
#[test]
fn who_writes_copies_decides_the_controllers_verbs_and_flag() {
    let own = set(&["get", "list", "watch", "create", "update", "patch", "delete"]);
    let trusted = [
        ("authorAccess", json!("trusted")),
        (
            "webhook.clientAuth.caBundle",
            json!("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"),
        ),
    ];
    for (values, version, verbs, flag) in [
        (vec![], None, writes_as_author(), "author"),
        (
            vec![("controller.writeCopiesAs", json!("author"))],
            Some("1.35.0"),
            writes_as_author(),
            "author",
        ),
        (
            vec![("controller.writeCopiesAs", json!("controller"))],
            None,
            own.clone(),
            "controller",
        ),
        (vec![], Some("1.35.0"), own.clone(), "controller"),
        (trusted.to_vec(), None, own.clone(), "controller"),
    ] {
        let r = match version {
            Some(v) => render_for_version("projection", NS, &values, v),
            None => render("projection", NS, &values),
        }
        .unwrap_or_else(|e| panic!("helm template failed: {e}"));
        let role = r.get("ClusterRole", "projection-controller");
        assert_eq!(verbs_on(role, "", "configmaps"), verbs, "{values:?} {version:?}");
        let args = strings(
            &r.get("Deployment", "projection-controller")["spec"]["template"]["spec"]["containers"][0]["args"],
        );
        assert!(args.contains(&format!("--write-copies-as={flag}")), "{args:?}");
    }
}

#[test]
fn controller_rbac_follows_supported_kinds_and_keeps_what_it_needs() {
    let narrowed = json!([{"apiGroup": "", "resources": ["configmaps"]}, {"apiGroup": "apps", "resources": ["deployments"]}]);
    for (kinds, wildcard) in [
        (json!([{"apiGroup": "*", "resources": ["*"]}]), true),
        (narrowed, false),
        (json!([]), false),
    ] {
        let r = rendered(&[("supportedKinds", kinds.clone())]);
        let role = r.get("ClusterRole", "projection-controller");
        let write = writes_as_author();
        // Always kept, whatever supportedKinds says.
        assert!(verbs_on(role, "events.k8s.io", "events").is_superset(&set(&["create", "patch"])));
        assert!(verbs_on(role, "", "namespaces").is_superset(&set(&["get", "list", "watch"])));
        assert!(
            verbs_on(role, "apiextensions.k8s.io", "customresourcedefinitions")
                .is_superset(&set(&["list", "watch"]))
        );
        assert!(
            verbs_on(role, "apiregistration.k8s.io", "apiservices").is_superset(&set(&["list", "watch"]))
        );
        assert!(
            verbs_on(role, "projection.sh", "projections")
                .is_superset(&set(&["get", "list", "watch", "patch"]))
        );
        assert!(verbs_on(role, "projection.sh", "clusterprojections/status").contains("patch"));
        let lease = r.get("Role", "projection-controller-leader-election");
        assert_eq!(lease["metadata"]["namespace"], NS);
        assert!(
            verbs_on(lease, "coordination.k8s.io", "leases").is_superset(&set(&["get", "create", "update"]))
        );
        // What supportedKinds grants, and nothing else.
        assert_eq!(verbs_on(role, "", "secrets") == write, wildcard, "{kinds}");
        if kinds.as_array().is_some_and(|k| k.len() == 2) {
            assert_eq!(verbs_on(role, "", "configmaps"), write);
            assert_eq!(verbs_on(role, "apps", "deployments"), write);
            assert!(verbs_on(role, "apps", "statefulsets").is_empty());
        }
        let binding = r.get("ClusterRoleBinding", "projection-controller");
        assert_eq!(binding["roleRef"]["name"], "projection-controller");
        assert_eq!(
            binding["subjects"],
            json!([{"kind": "ServiceAccount", "name": "projection-controller", "namespace": NS}])
        );
    }
}

#[test]
fn sharding_is_one_value_that_replaces_leader_election() {
    let lease_verbs = |r: &Rendered| {
        verbs_on(
            r.get("Role", "projection-controller-leader-election"),
            "coordination.k8s.io",
            "leases",
        )
    };
    let default = rendered(&[("controller.replicas", json!(2))]);
    let controller = default.get("Deployment", "projection-controller");
    assert!(args_of(controller).contains(&"--leader-elect".to_owned()));
    assert!(!args_of(controller).contains(&"--shard-by-lease".to_owned()));
    assert_eq!(lease_verbs(&default), set(&["get", "create", "update", "patch"]));

    let sharded = rendered(&[
        ("controller.replicas", json!(3)),
        ("controller.sharding.enabled", json!(true)),
    ]);
    let controller = sharded.get("Deployment", "projection-controller");
    let args = args_of(controller);
    assert!(args.contains(&"--shard-by-lease".to_owned()), "{args:?}");
    assert!(!args.contains(&"--leader-elect".to_owned()), "{args:?}");
    assert_eq!(
        flag_value(controller, "--leader-election-lease-duration").as_deref(),
        Some("15s")
    );
    assert_eq!(controller["spec"]["replicas"], 3);
    let env = &container(controller)["env"];
    assert!(
        env.as_array()
            .expect("env")
            .iter()
            .any(|e| e["name"] == "POD_NAME" && e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"),
        "the ring places each replica by its pod's name: {env}"
    );
    // Each replica lists the others' Leases and deletes its own (and long-expired ones).
    assert_eq!(
        lease_verbs(&sharded),
        set(&["get", "list", "create", "update", "patch", "delete"])
    );
    // A drain takes one replica at a time; without shards there is no controller budget.
    let budget = sharded.get("PodDisruptionBudget", "projection-controller");
    assert_eq!(budget["spec"]["maxUnavailable"], 1);
    assert_labels_select(
        &budget["spec"]["selector"]["matchLabels"],
        &controller["spec"]["template"]["metadata"]["labels"],
    );
    assert!(!default.has("PodDisruptionBudget", "projection-controller"));
    // Without leader election too (sharding replaces it).
    let alone = rendered(&[
        ("controller.replicas", json!(3)),
        ("controller.leaderElection.enabled", json!(false)),
        ("controller.sharding.enabled", json!(true)),
    ]);
    assert!(
        args_of(alone.get("Deployment", "projection-controller")).contains(&"--shard-by-lease".to_owned())
    );
    assert_eq!(lease_verbs(&alone), lease_verbs(&sharded));
}

#[test]
fn webhook_rbac_is_minimal() {
    for mode in MODES {
        let mut values = mode_values(mode);
        values.push((
            "supportedKinds",
            json!([{"apiGroup": "", "resources": ["configmaps"]}]),
        ));
        let r = rendered(&values);
        let role = r.get("ClusterRole", "projection-webhook");
        assert_eq!(
            verbs_on(role, "authorization.k8s.io", "subjectaccessreviews"),
            set(&["create"])
        );
        // By default (no client authentication) the webhook never reads a source: no right to.
        assert!(
            verbs_on(role, "", "configmaps").is_empty(),
            "{mode}: no source read without webhook.clientAuth"
        );
        assert!(verbs_on(role, "", "secrets").is_empty(), "{mode}");
        let mut authenticated = values.clone();
        authenticated.push(("webhook.clientAuth.configMapName", json!("apiserver-client-ca")));
        let with_auth = rendered(&authenticated);
        let role_with_auth = with_auth.get("ClusterRole", "projection-webhook");
        assert_eq!(
            verbs_on(role_with_auth, "", "configmaps"),
            set(&["get"]),
            "{mode}: with webhook.clientAuth, sources: get only"
        );
        assert!(
            verbs_on(role_with_auth, "", "secrets").is_empty(),
            "only supportedKinds"
        );
        authenticated.push(("webhook.checkSourceAccess", json!(false)));
        let unchecked = rendered(&authenticated);
        assert!(
            verbs_on(
                unchecked.get("ClusterRole", "projection-webhook"),
                "",
                "configmaps"
            )
            .is_empty(),
            "{mode}: with the access check off the webhook reads no source"
        );
        for (group, resource) in [
            ("projection.sh", "projections"),
            ("projection.sh", "clusterprojections"),
            ("", "namespaces"),
        ] {
            let unnamed: BTreeSet<String> = role["rules"]
                .as_array()
                .expect("rules")
                .iter()
                .filter(|r| r.get("resourceNames").is_none())
                .filter(|r| {
                    strings(&r["apiGroups"]) == [group]
                        && strings(&r["resources"]).iter().any(|x| x == resource)
                })
                .flat_map(|r| strings(&r["verbs"]))
                .collect();
            assert_eq!(
                unnamed,
                set(&["list", "watch"]),
                "the CR index watches {resource}, and writes nothing"
            );
        }
        // One namespace read by name: kube-system, this cluster's identity (loops through a
        // kubeconfig that reaches this very cluster).
        let named: Vec<&Value> = role["rules"]
            .as_array()
            .expect("rules")
            .iter()
            .filter(|r| r.get("resourceNames").is_some())
            .filter(|r| strings(&r["resources"]) == ["namespaces"])
            .collect();
        assert_eq!(named.len(), 1, "{mode}: {named:?}");
        assert_eq!(named[0]["resourceNames"], json!(["kube-system"]));
        assert_eq!(strings(&named[0]["verbs"]), ["get"]);
        let self_managed = mode == "self-managed";
        assert_eq!(
            r.has("Role", "projection-webhook-certificate"),
            self_managed,
            "{mode}"
        );
        let webhook_configs = verbs_on(
            role,
            "admissionregistration.k8s.io",
            "validatingwebhookconfigurations",
        );
        assert_eq!(webhook_configs.contains("patch"), self_managed, "{mode}");
        if self_managed {
            let config_rule = role["rules"]
                .as_array()
                .expect("rules")
                .iter()
                .find(|r| r["apiGroups"][0] == "admissionregistration.k8s.io")
                .expect("a rule for its webhook configurations");
            assert_eq!(config_rule["resourceNames"], json!(["projection-webhook"]));
            let secrets = r.get("Role", "projection-webhook-certificate");
            for rule in secrets["rules"].as_array().expect("rules") {
                let verbs = strings(&rule["verbs"]);
                if verbs != ["create"] {
                    assert_eq!(rule["resourceNames"], json!(["projection-webhook-tls"]), "{rule}");
                }
            }
        }
    }
}

#[test]
fn only_the_self_managed_webhook_is_held_to_changing_the_ca_bundle_of_its_configurations() {
    let name = "projection-webhook-configurations";
    for mode in MODES {
        let r = rendered(&mode_values(mode));
        let self_managed = mode == "self-managed";
        assert_eq!(
            r.has("ValidatingAdmissionPolicy", name),
            self_managed,
            "{mode}: only the mode in which the webhook may patch them"
        );
        assert_eq!(r.has("ValidatingAdmissionPolicyBinding", name), self_managed);
        if !self_managed {
            continue;
        }
        let policy = r.get("ValidatingAdmissionPolicy", name);
        assert_eq!(policy["spec"]["failurePolicy"], "Fail");
        let condition = policy["spec"]["matchConditions"][0]["expression"]
            .as_str()
            .expect("a match condition");
        assert_eq!(
            condition,
            format!("request.userInfo.username == 'system:serviceaccount:{NS}:projection-webhook'"),
            "matched by the webhook's own ServiceAccount"
        );
        let binding = r.get("ValidatingAdmissionPolicyBinding", name);
        assert_eq!(binding["spec"]["policyName"], name);
        assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
    }
    let r = rendered(&[("webhook.serviceAccount.name", json!("hooks"))]);
    let condition = &r.get("ValidatingAdmissionPolicy", name)["spec"]["matchConditions"][0]["expression"];
    assert!(
        condition.as_str().is_some_and(|c| c.ends_with(":hooks'")),
        "{condition}"
    );
    let r = rendered(&[(
        "webhook.certificate.selfManaged.configurationPolicy",
        json!(false),
    )]);
    assert!(
        !r.has("ValidatingAdmissionPolicy", name),
        "turned off for clusters before 1.30"
    );
}

#[test]
fn trusted_author_access_needs_the_webhooks_authenticated_check() {
    let ca = json!("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n");
    let trusted = ("authorAccess", json!("trusted"));
    // The default webhook authenticates nobody: trusted would leave every author unchecked.
    let Err(err) = render("projection", NS, std::slice::from_ref(&trusted)) else {
        panic!("trusted without client authentication was accepted");
    };
    for named in [
        "authorAccess: trusted",
        "webhook.clientAuth.caBundle or webhook.clientAuth.configMapName",
        "authorAccess: enforce",
    ] {
        assert!(err.contains(named), "{named}: {err}");
    }
    assert!(
        !err.contains("webhook.checkSourceAccess"),
        "only what is missing: {err}"
    );
    for (extra, named) in [
        (
            ("webhook.checkSourceAccess", json!(false)),
            "webhook.checkSourceAccess: true",
        ),
        (
            ("webhook.failurePolicy", json!("Ignore")),
            "webhook.failurePolicy: Fail",
        ),
    ] {
        let values = [
            trusted.clone(),
            ("webhook.clientAuth.caBundle", ca.clone()),
            extra.clone(),
        ];
        let err = render("projection", NS, &values)
            .err()
            .unwrap_or_else(|| panic!("{extra:?} was accepted with trusted"));
        assert!(err.contains(named), "{named}: {err}");
        assert!(!err.contains("webhook.clientAuth.caBundle or"), "{err}");
    }
    // The accepted combination: the webhook authenticates the apiserver and checks every author.
    for client_auth in [
        ("webhook.clientAuth.caBundle", ca.clone()),
        ("webhook.clientAuth.configMapName", json!("apiserver-client-ca")),
    ] {
        let r = rendered(&[trusted.clone(), client_auth]);
        let controller = r.get("Deployment", "projection-controller");
        assert_eq!(
            flag_value(controller, "--author-access").as_deref(),
            Some("trusted")
        );
        let webhook = r.get("Deployment", "projection-webhook");
        assert!(args_of(webhook).contains(&"--client-ca-file=/client-ca/ca.crt".to_owned()));
        assert_eq!(
            flag_value(webhook, "--check-source-access").as_deref(),
            Some("true")
        );
    }
    // enforce needs none of it.
    let r = rendered(&[]);
    assert_eq!(
        flag_value(r.get("Deployment", "projection-controller"), "--author-access").as_deref(),
        Some("enforce")
    );
}

#[test]
fn user_roles_aggregate_projections_but_never_clusterprojections() {
    let r = rendered(&[]);
    let edit = r.get("ClusterRole", "projection-projections-edit");
    let labels = &edit["metadata"]["labels"];
    assert_eq!(labels["rbac.authorization.k8s.io/aggregate-to-edit"], "true");
    assert_eq!(labels["rbac.authorization.k8s.io/aggregate-to-admin"], "true");
    assert!(labels["rbac.authorization.k8s.io/aggregate-to-view"].is_null());
    assert!(verbs_on(edit, "projection.sh", "projections").contains("deletecollection"));
    assert_eq!(
        verbs_on(edit, "projection.sh", "projections/status"),
        set(&["get"])
    );
    assert!(verbs_on(edit, "projection.sh", "clusterprojections").is_empty());

    let view = r.get("ClusterRole", "projection-projections-view");
    assert_eq!(
        view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"],
        "true"
    );
    assert_eq!(
        verbs_on(view, "projection.sh", "projections"),
        set(&["get", "list", "watch"])
    );

    let admin = r.get("ClusterRole", "projection-clusterprojections-admin");
    assert!(
        admin["metadata"]["labels"]
            .as_object()
            .expect("labels")
            .keys()
            .all(|k| !k.starts_with("rbac.authorization.k8s.io/aggregate")),
        "never aggregated"
    );
    assert!(verbs_on(admin, "projection.sh", "clusterprojections").contains("create"));
    assert!(verbs_on(admin, "projection.sh", "projections").is_empty());

    let r = rendered(&[("rbac.aggregate", json!(false))]);
    assert!(!r.has("ClusterRole", "projection-projections-edit"));
    assert!(!r.has("ClusterRole", "projection-projections-view"));
    assert!(r.has("ClusterRole", "projection-clusterprojections-admin"));
}

#[test]
fn optional_objects_appear_only_when_asked() {
    let r = rendered(&[]);
    assert!(
        r.of_kind("ServiceMonitor").is_empty(),
        "no ServiceMonitor by default"
    );
    assert!(!r.has("Service", "projection-controller-metrics"));
    // NetworkPolicies are on by default (issue 30): see network_policies_by_default_...
    assert_eq!(r.of_kind("NetworkPolicy").len(), 2);
    let r = rendered(&[("networkPolicy.enabled", json!(false))]);
    assert!(
        r.of_kind("NetworkPolicy").is_empty(),
        "networkPolicy.enabled=false removes them"
    );

    let r = rendered(&[("webhook.podDisruptionBudget.enabled", json!(false))]);
    assert!(r.of_kind("PodDisruptionBudget").is_empty());
    let r = rendered(&[("webhook.podDisruptionBudget.maxUnavailable", json!(1))]);
    let pdb = r.get("PodDisruptionBudget", "projection-webhook");
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    assert!(pdb["spec"]["minAvailable"].is_null(), "one of the two only");

    let prometheus =
        json!([{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]);
    let r = rendered(&[
        ("metrics.serviceMonitor.enabled", json!(true)),
        ("networkPolicy.enabled", json!(true)),
        ("networkPolicy.metricsFrom", prometheus.clone()),
    ]);
    for component in ["controller", "webhook"] {
        let deployment = r.get("Deployment", &format!("projection-{component}"));
        let pod_labels = &deployment["spec"]["template"]["metadata"]["labels"];
        let service = r.get("Service", &format!("projection-{component}-metrics"));
        assert_labels_select(&service["spec"]["selector"], pod_labels);
        assert_eq!(service["spec"]["ports"][0]["targetPort"], "metrics");
        let monitor = r.get("ServiceMonitor", &format!("projection-{component}-metrics"));
        assert_eq!(monitor["spec"]["endpoints"][0]["port"], "metrics");
        assert_eq!(monitor["spec"]["namespaceSelector"]["matchNames"], json!([NS]));
        assert!(selects(
            &monitor["spec"]["selector"]["matchLabels"],
            &service["metadata"]["labels"]
        ));

        let policy = r.get("NetworkPolicy", &format!("projection-{component}"));
        assert_labels_select(&policy["spec"]["podSelector"]["matchLabels"], pod_labels);
        let api = &policy["spec"]["egress"][0];
        let ports: Vec<u64> = api["ports"]
            .as_array()
            .expect("ports")
            .iter()
            .filter_map(|p| p["port"].as_u64())
            .collect();
        assert_eq!(ports, [443, 6443], "the apiserver on both usual ports");
        let dns = &policy["spec"]["egress"][1];
        assert_eq!(
            dns["to"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
            "kube-system"
        );
        let ingress_ports: BTreeSet<u64> = policy["spec"]["ingress"]
            .as_array()
            .expect("ingress")
            .iter()
            .flat_map(|rule| rule["ports"].as_array().cloned().unwrap_or_default())
            .filter_map(|p| p["port"].as_u64())
            .collect();
        let container = container(deployment);
        // Every served port but the probes' (the kubelet comes from the node, always let in).
        let expected: BTreeSet<u64> = container["ports"]
            .as_array()
            .expect("ports")
            .iter()
            .filter(|p| p["name"] != "health")
            .filter_map(|p| p["containerPort"].as_u64())
            .collect();
        assert_eq!(
            ingress_ports, expected,
            "{component}: every served port but the probes', nothing else"
        );
        let metrics_rule = policy["spec"]["ingress"]
            .as_array()
            .expect("ingress")
            .iter()
            .find(|rule| rule["ports"][0]["port"] == 8080)
            .expect("a metrics rule");
        assert_eq!(
            metrics_rule["from"], prometheus,
            "{component}: metrics only from metricsFrom"
        );
    }
    let r = rendered(&[
        ("networkPolicy.enabled", json!(true)),
        ("networkPolicy.apiServer.ports", json!([8443])),
    ]);
    assert_eq!(
        r.get("NetworkPolicy", "projection-controller")["spec"]["egress"][0]["ports"],
        json!([{"port": 8443, "protocol": "TCP"}])
    );
}

/// `metrics.tls.enabled`: both components serve /metrics over HTTPS from one Secret (the chart's
/// Certificate for both metrics Services in the cert-manager mode, or the user's), mounted and
/// passed as `--metrics-cert-file`/`--metrics-key-file`; the ServiceMonitors scrape with scheme
/// https, verifying the Secret's `ca.crt` for the Service's name. Without a Secret to use, the
/// chart refuses to render, naming the value.
#[test]
fn metrics_over_https_mount_one_certificate_and_the_service_monitors_follow() {
    let r = rendered(&[("metrics.serviceMonitor.enabled", json!(true))]);
    assert!(!r.has("Certificate", "projection-metrics"));
    for component in ["controller", "webhook"] {
        let monitor = r.get("ServiceMonitor", &format!("projection-{component}-metrics"));
        assert_eq!(monitor["spec"]["endpoints"][0]["scheme"], "http");
        let args = strings(&container(r.get("Deployment", &format!("projection-{component}")))["args"]);
        assert!(
            !args.iter().any(|a| a.starts_with("--metrics-cert-file")),
            "{args:?}"
        );
    }

    let r = rendered(&[
        ("metrics.tls.enabled", json!(true)),
        ("metrics.serviceMonitor.enabled", json!(true)),
        ("webhook.certificate.mode", json!("cert-manager")),
    ]);
    let certificate = r.get("Certificate", "projection-metrics");
    assert_eq!(certificate["spec"]["secretName"], "projection-metrics-tls");
    assert_eq!(
        certificate["spec"]["issuerRef"]["name"],
        r.get("Certificate", "projection-webhook")["spec"]["issuerRef"]["name"],
        "the webhook's issuer"
    );
    let names = strings(&certificate["spec"]["dnsNames"]);
    for component in ["controller", "webhook"] {
        let service = format!("projection-{component}-metrics.{NS}.svc");
        assert!(names.contains(&service), "{names:?}");
        let deployment = r.get("Deployment", &format!("projection-{component}"));
        let container = container(deployment);
        let args = strings(&container["args"]);
        assert!(
            args.contains(&"--metrics-cert-file=/metrics-tls/tls.crt".to_owned()),
            "{args:?}"
        );
        assert!(
            args.contains(&"--metrics-key-file=/metrics-tls/tls.key".to_owned()),
            "{args:?}"
        );
        let mounts = container["volumeMounts"].as_array().expect("mounts");
        assert!(
            mounts
                .iter()
                .any(|m| m["name"] == "metrics-tls" && m["mountPath"] == "/metrics-tls")
        );
        let volumes = deployment["spec"]["template"]["spec"]["volumes"]
            .as_array()
            .expect("volumes");
        assert!(
            volumes
                .iter()
                .any(|v| v["name"] == "metrics-tls" && v["secret"]["secretName"] == "projection-metrics-tls"),
            "{volumes:?}"
        );
        // The probes stay plain HTTP, on their own port.
        assert_eq!(container["readinessProbe"]["httpGet"]["port"], "health");
        let endpoint =
            &r.get("ServiceMonitor", &format!("projection-{component}-metrics"))["spec"]["endpoints"][0];
        assert_eq!(endpoint["scheme"], "https");
        assert_eq!(endpoint["tlsConfig"]["serverName"], service.as_str());
        assert_eq!(
            endpoint["tlsConfig"]["ca"]["secret"],
            json!({"name": "projection-metrics-tls", "key": "ca.crt"})
        );
    }

    // A Secret of one's own, in any certificate mode; none in the self-managed mode is refused.
    let r = rendered(&[
        ("metrics.tls.enabled", json!(true)),
        ("metrics.tls.secretName", json!("my-metrics-tls")),
    ]);
    assert!(!r.has("Certificate", "projection-metrics"));
    let volumes = &r.get("Deployment", "projection-controller")["spec"]["template"]["spec"]["volumes"];
    assert_eq!(volumes[0]["secret"]["secretName"], "my-metrics-tls");
    let err = render("projection", NS, &[("metrics.tls.enabled", json!(true))])
        .expect_err("no Secret to serve the metrics with");
    assert!(
        err.contains("metrics.tls.enabled needs metrics.tls.secretName"),
        "{err}"
    );
}

#[test]
fn network_policies_by_default_open_only_the_admission_port() {
    let r = rendered(&[]);
    let ingress = |component: &str| {
        r.get("NetworkPolicy", &format!("projection-{component}"))["spec"]["ingress"].clone()
    };
    // The controller serves nothing to other pods: metrics and probes closed (the node still probes).
    assert_eq!(ingress("controller"), json!([]));
    // The webhook: the admission port only. `helm template` cannot look the apiserver's addresses
    // up and none is configured: from any source.
    let webhook = ingress("webhook");
    assert_eq!(webhook.as_array().expect("rules").len(), 1, "{webhook}");
    assert_eq!(webhook[0]["ports"], json!([{"port": 9443, "protocol": "TCP"}]));
    assert!(
        webhook[0]["from"].is_null(),
        "no apiserver address known: {webhook}"
    );
    for component in ["controller", "webhook"] {
        let egress = &r.get("NetworkPolicy", &format!("projection-{component}"))["spec"]["egress"];
        assert_eq!(
            egress.as_array().expect("egress").len(),
            2,
            "apiserver and DNS only: {egress}"
        );
    }
    // 0.0.0.0/0 is no value of the chart any more.
    let all = serde_json::to_string(&r.of_kind("NetworkPolicy")).expect("JSON");
    assert!(!all.contains("0.0.0.0/0"), "{all}");

    // Narrowed to the control plane's addresses.
    let control_plane = json!([{"ipBlock": {"cidr": "10.0.0.0/24"}}]);
    let r = rendered(&[("networkPolicy.webhookFrom", control_plane.clone())]);
    let webhook = &r.get("NetworkPolicy", "projection-webhook")["spec"]["ingress"];
    assert_eq!(webhook[0]["from"], control_plane);
    // A CNI that does not let the node in can be given the probes' peers.
    let node = json!([{"ipBlock": {"cidr": "192.168.0.10/32"}}]);
    let r = rendered(&[("networkPolicy.healthFrom", node.clone())]);
    let controller = &r.get("NetworkPolicy", "projection-controller")["spec"]["ingress"];
    assert_eq!(controller[0]["ports"], json!([{"port": 8081, "protocol": "TCP"}]));
    assert_eq!(controller[0]["from"], node);
}

/// Issue 35: with the apiserver's addresses known, the admission port takes connections only from
/// them, both components reach only them on the apiserver's ports, and the webhook reserves
/// connections for them.
#[test]
fn the_apiservers_addresses_narrow_both_policies_and_reach_the_webhooks_flags() {
    let r = rendered(&[
        ("apiServer.cidrs", json!(["10.0.0.0/24", "192.168.7.4/32"])),
        ("networkPolicy.apiServer.cidrs", json!(["172.20.0.1/32"])),
    ]);
    let blocks = |cidrs: &[&str]| {
        json!(
            cidrs
                .iter()
                .map(|c| json!({"ipBlock": {"cidr": c}}))
                .collect::<Vec<_>>()
        )
    };
    let webhook = &r.get("NetworkPolicy", "projection-webhook")["spec"];
    assert_eq!(webhook["ingress"].as_array().expect("rules").len(), 1);
    assert_eq!(
        webhook["ingress"][0]["ports"],
        json!([{"port": 9443, "protocol": "TCP"}])
    );
    assert_eq!(
        webhook["ingress"][0]["from"],
        blocks(&["10.0.0.0/24", "192.168.7.4/32"]),
        "the apiserver's sources only"
    );
    for component in ["controller", "webhook"] {
        let egress = &r.get("NetworkPolicy", &format!("projection-{component}"))["spec"]["egress"];
        assert_eq!(
            egress[0]["to"],
            blocks(&["10.0.0.0/24", "192.168.7.4/32", "172.20.0.1/32"]),
            "{component}: the apiserver's addresses only"
        );
        assert_eq!(
            egress[0]["ports"],
            json!([{"port": 443, "protocol": "TCP"}, {"port": 6443, "protocol": "TCP"}])
        );
    }
    let args = args_of(r.get("Deployment", "projection-webhook"));
    for flag in [
        "--apiserver-cidrs=10.0.0.0/24,192.168.7.4/32",
        "--apiserver-reserved-connections=64",
    ] {
        assert!(args.contains(&flag.to_owned()), "{flag} missing: {args:?}");
    }
    // The controller's policy has no ingress rule for them: it serves nothing.
    assert_eq!(
        r.get("NetworkPolicy", "projection-controller")["spec"]["ingress"],
        json!([])
    );

    // Explicit peers win over the addresses; the addresses still bound the egress and reach the
    // webhook.
    let anyone = json!([{"ipBlock": {"cidr": "0.0.0.0/0"}}]);
    let r = rendered(&[
        ("apiServer.cidrs", json!(["10.0.0.0/24"])),
        ("networkPolicy.webhookFrom", anyone.clone()),
    ]);
    let webhook = &r.get("NetworkPolicy", "projection-webhook")["spec"];
    assert_eq!(webhook["ingress"][0]["from"], anyone);
    assert_eq!(webhook["egress"][0]["to"], blocks(&["10.0.0.0/24"]));
    // Without the NetworkPolicy the webhook still reserves its connections.
    let r = rendered(&[
        ("apiServer.cidrs", json!(["10.0.0.0/24"])),
        ("networkPolicy.enabled", json!(false)),
    ]);
    assert!(r.of_kind("NetworkPolicy").is_empty());
    let args = args_of(r.get("Deployment", "projection-webhook"));
    assert!(
        args.contains(&"--apiserver-cidrs=10.0.0.0/24".to_owned()),
        "{args:?}"
    );
    // No address known (helm template without apiServer.cidrs): no flag, nothing reserved.
    let args = args_of(rendered(&[]).get("Deployment", "projection-webhook"));
    assert!(
        !args.iter().any(|a| a.starts_with("--apiserver-cidrs")),
        "{args:?}"
    );
    // A value that is no CIDR block is refused by the schema.
    let bad = render("projection", NS, &[("apiServer.cidrs", json!(["10.0.0.1"]))]);
    assert!(
        bad.is_err_and(|e| e.contains("apiServer")),
        "a bare address is refused"
    );
}

#[test]
fn webhook_limits_and_client_authentication_reach_its_flags() {
    let r = rendered(&[]);
    let webhook = r.get("Deployment", "projection-webhook");
    let args = args_of(webhook);
    for flag in [
        "--max-connections=256",
        "--max-connections-per-peer=64",
        "--max-in-flight-reviews=64",
        "--header-timeout=10s",
        "--idle-timeout=60s",
        "--body-timeout=3s",
        "--http2-max-concurrent-streams=8",
        "--apiserver-reserved-connections=64",
        "--access-review-cache-bytes=4194304",
    ] {
        assert!(args.contains(&flag.to_owned()), "{flag} missing: {args:?}");
    }
    // No client CA by default: callers unauthenticated, nothing mounted.
    assert!(
        !args.iter().any(|a| a.starts_with("--client-ca-file")),
        "{args:?}"
    );
    assert!(!r.has("ConfigMap", "projection-webhook-client-ca"));

    let pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
    let r = rendered(&[("webhook.clientAuth.caBundle", json!(pem))]);
    let webhook = r.get("Deployment", "projection-webhook");
    assert!(args_of(webhook).contains(&"--client-ca-file=/client-ca/ca.crt".to_owned()));
    assert_eq!(
        r.get("ConfigMap", "projection-webhook-client-ca")["data"]["ca.crt"],
        pem
    );
    let pod = &webhook["spec"]["template"]["spec"];
    let volume = pod["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .find(|v| v["name"] == "client-ca")
        .expect("the client CA volume");
    assert_eq!(volume["configMap"]["name"], "projection-webhook-client-ca");
    assert_eq!(
        volume["configMap"]["items"],
        json!([{"key": "ca.crt", "path": "ca.crt"}])
    );
    let mounted = container(webhook)["volumeMounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .any(|m| m["name"] == "client-ca" && m["mountPath"] == "/client-ca");
    assert!(mounted, "the client CA is mounted at /client-ca");

    // An existing ConfigMap instead.
    let r = rendered(&[
        ("webhook.clientAuth.configMapName", json!("apiserver-client-ca")),
        ("webhook.clientAuth.configMapKey", json!("bundle.pem")),
    ]);
    assert!(!r.has("ConfigMap", "projection-webhook-client-ca"));
    let pod = &r.get("Deployment", "projection-webhook")["spec"]["template"]["spec"];
    let volume = pod["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .find(|v| v["name"] == "client-ca")
        .expect("the client CA volume");
    assert_eq!(volume["configMap"]["name"], "apiserver-client-ca");
    assert_eq!(
        volume["configMap"]["items"],
        json!([{"key": "bundle.pem", "path": "ca.crt"}])
    );
    // Both at once is refused.
    let both = render(
        "projection",
        NS,
        &[
            ("webhook.clientAuth.configMapName", json!("x")),
            ("webhook.clientAuth.caBundle", json!(pem)),
        ],
    );
    assert!(both.is_err_and(|e| e.contains("caBundle or configMapName")));
}

#[test]
fn names_follow_the_release_and_fit_kubernetes_limits() {
    let r = render("acme", NS, &[]).expect("renders");
    assert!(r.has("Deployment", "acme-projection-controller"));
    assert!(r.has("ValidatingWebhookConfiguration", "acme-projection-webhook"));
    let long = "a-very-long-release-name-that-goes-on-and-on-and-on";
    let r = render(long, NS, &[]).expect("renders");
    for object in &r.0 {
        let name = object["metadata"]["name"].as_str().expect("named");
        // Service names are DNS labels (63); other names may be longer, but stay readable.
        let limit = if object["kind"] == "Service" { 63 } else { 253 };
        assert!(name.len() <= limit, "{name} is longer than {limit} characters");
        let labels = object["metadata"]["labels"].as_object().expect("labelled");
        for value in labels.values() {
            assert!(value.as_str().is_some_and(|v| v.len() <= 63), "label {value}");
        }
    }
    // Images default to the chart's appVersion and can be pinned by digest.
    let r = rendered(&[]);
    let image = container(r.get("Deployment", "projection-controller"))["image"].clone();
    assert_eq!(image, "projection-sh/projection-controller:0.1.0");
    let digest = format!("sha256:{}", "a".repeat(64));
    let r = rendered(&[("webhook.image.digest", json!(digest))]);
    assert_eq!(
        container(r.get("Deployment", "projection-webhook"))["image"],
        format!("projection-sh/projection-webhook@{digest}")
    );
}

/// One Dockerfile's facts, read from its text.
struct Dockerfile {
    build_bin: String,
    runtime_base: String,
    runtime_runs: bool,
    user: String,
    exposed: BTreeSet<u64>,
    entrypoint: Vec<String>,
    copied: String,
    /// `LABEL key="value"` pairs of the runtime stage.
    labels: Vec<(String, String)>,
    /// `ARG NAME=default` lines of the runtime stage.
    runtime_args: Vec<(String, String)>,
}

/// The instructions of a Dockerfile stage, continuation lines joined, comments dropped.
fn instructions(stage: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut continued = false;
    for line in stage.lines() {
        if line.trim_start().starts_with('#') {
            continue;
        }
        let (text, continues) = match line.trim_end().strip_suffix('\\') {
            Some(t) => (t, true),
            None => (line.trim_end(), false),
        };
        match out.last_mut() {
            Some(last) if continued => {
                last.push(' ');
                last.push_str(text.trim());
            }
            _ => out.push(text.trim().to_owned()),
        }
        continued = continues;
    }
    out.retain(|l| !l.is_empty());
    out
}

fn read_dockerfile(name: &str) -> Dockerfile {
    let text = std::fs::read_to_string(repo_root().join(name)).expect("Dockerfile exists");
    let stages: Vec<&str> = text.split("\nFROM ").collect();
    assert!(stages.len() >= 2, "{name} is multi-stage");
    let build = instructions(stages[stages.len() - 2]);
    let runtime = stages[stages.len() - 1];
    // Every cargo build of the build stage: the dependency-only one before the sources are copied,
    // then ours. Both reproducible, both of the same binary.
    let builds: Vec<(usize, &String)> = build
        .iter()
        .enumerate()
        .filter(|(_, l)| l.starts_with("RUN ") && l.contains("cargo build"))
        .collect();
    let sources_copied = build
        .iter()
        .position(|l| l == "COPY . .")
        .unwrap_or_else(|| panic!("{name} copies the sources with COPY . ."));
    assert!(
        builds.iter().any(|(i, _)| *i < sources_copied) && builds.iter().any(|(i, _)| *i > sources_copied),
        "{name}: dependencies are built in a layer of their own, before the sources are copied: {build:#?}"
    );
    let mut bins = BTreeSet::new();
    for (_, line) in &builds {
        let cargo = &line[line.find("cargo build").expect("cargo build")..];
        assert!(
            cargo.contains("--locked"),
            "{name}: reproducible builds use --locked: {line}"
        );
        assert!(cargo.contains("--release"), "{name}: {line}");
        bins.insert(
            cargo
                .split_whitespace()
                .skip_while(|w| *w != "--bin")
                .nth(1)
                .expect("--bin names the binary")
                .to_owned(),
        );
    }
    assert_eq!(
        bins.len(),
        1,
        "{name}: every cargo build builds the same binary: {bins:?}"
    );
    let build_bin = bins.into_iter().next().expect("one binary");
    let runtime_lines = instructions(runtime);
    let value = |directive: &str| {
        runtime_lines
            .iter()
            .find_map(|l| l.strip_prefix(directive))
            .unwrap_or_else(|| panic!("{name}: no {directive}in the runtime stage"))
            .trim()
            .to_owned()
    };
    let labels = runtime_lines
        .iter()
        .filter_map(|l| l.strip_prefix("LABEL "))
        .flat_map(|l| {
            // key="value" pairs; values hold no spaces but may hold `${...}`.
            l.split_whitespace()
                .filter_map(|pair| pair.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.trim_matches('"').to_owned()))
                .collect::<Vec<_>>()
        })
        .collect();
    let runtime_args = runtime_lines
        .iter()
        .filter_map(|l| l.strip_prefix("ARG "))
        .filter_map(|a| a.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.trim_matches('"').to_owned()))
        .collect();
    Dockerfile {
        build_bin,
        runtime_base: runtime.lines().next().expect("FROM line").trim().to_owned(),
        runtime_runs: runtime_lines.iter().any(|l| l.starts_with("RUN ")),
        user: value("USER "),
        exposed: value("EXPOSE ")
            .split_whitespace()
            .map(|p| p.parse().expect("numeric port"))
            .collect(),
        entrypoint: serde_json::from_str(&value("ENTRYPOINT ")).expect("exec-form ENTRYPOINT"),
        copied: value("COPY "),
        labels,
        runtime_args,
    }
}

#[test]
fn dockerfiles_match_the_workspace_and_the_chart() {
    let r = rendered(&[]);
    let pod_security =
        &r.get("Deployment", "projection-controller")["spec"]["template"]["spec"]["securityContext"];
    for (component, crate_dir) in [("controller", "controller"), ("webhook", "webhook")] {
        let file = read_dockerfile(&format!("Dockerfile.{component}"));
        let binary = format!("projection-{component}");
        // The binary is one the workspace builds.
        let manifest =
            std::fs::read_to_string(repo_root().join(crate_dir).join("Cargo.toml")).expect("manifest");
        assert!(
            manifest.contains(&format!("name = \"{binary}\"")),
            "{crate_dir}/Cargo.toml declares {binary}"
        );
        assert_eq!(file.build_bin, binary);
        assert!(
            file.copied
                .ends_with(&format!("/target/release/{binary} /{binary}")),
            "{}",
            file.copied
        );
        assert_eq!(
            file.entrypoint,
            [format!("/{binary}")],
            "only the binary, no shell"
        );
        // Nothing but the binary at runtime: scratch (or distroless), no RUN, non-root.
        assert!(
            file.runtime_base == "scratch" || file.runtime_base.contains("distroless"),
            "{}",
            file.runtime_base
        );
        assert!(!file.runtime_runs, "no RUN in the runtime stage (no shell there)");
        assert_eq!(
            file.user,
            format!("{}:{}", pod_security["runAsUser"], pod_security["runAsGroup"]),
            "the image user is the chart's"
        );
        // The exposed ports are exactly the ports the chart's container declares.
        let deployment = r.get("Deployment", &binary);
        let c = container(deployment);
        assert!(c["command"].is_null(), "the chart relies on the image ENTRYPOINT");
        assert!(
            c["image"].as_str().is_some_and(|i| i.contains(&binary)),
            "{}",
            c["image"]
        );
        let ports: BTreeSet<u64> = c["ports"]
            .as_array()
            .expect("ports")
            .iter()
            .filter_map(|p| p["containerPort"].as_u64())
            .collect();
        assert_eq!(file.exposed, ports, "{component}: EXPOSE and the chart's ports");
        // The images built here for the local node (tests/control-plane/images.sh) are the same.
        let script = image_script_entry(&binary);
        assert_eq!(script.user, file.user, "images.sh: USER of {binary}");
        assert_eq!(script.exposed, file.exposed, "images.sh: EXPOSE of {binary}");
        assert_eq!(
            script.entrypoint, file.entrypoint,
            "images.sh: ENTRYPOINT of {binary}"
        );
    }
    // The build image's Rust is not older than the workspace's rust-version.
    let manifest = std::fs::read_to_string(repo_root().join("Cargo.toml")).expect("manifest");
    let required = manifest
        .lines()
        .find_map(|l| l.strip_prefix("rust-version = "))
        .expect("rust-version")
        .trim_matches('"')
        .to_owned();
    for component in ["controller", "webhook"] {
        let text =
            std::fs::read_to_string(repo_root().join(format!("Dockerfile.{component}"))).expect("read");
        let image = text
            .lines()
            .find_map(|l| l.strip_prefix("FROM rust:"))
            .expect("a rust build image");
        let version = image.split('-').next().expect("version tag");
        assert!(
            version_at_least(version, &required),
            "Dockerfile.{component} builds with Rust {version}, the workspace needs {required}"
        );
        // By tag, and by the digest a release passes (`--build-arg RUST_DIGEST=@sha256:...`),
        // declared before the first FROM so that FROM can use it.
        let (before_from, _) = text.split_once("\nFROM ").expect("a FROM");
        assert!(
            before_from.lines().any(|l| l.starts_with("ARG RUST_DIGEST")),
            "Dockerfile.{component} declares RUST_DIGEST before FROM"
        );
        assert!(
            image.contains("${RUST_DIGEST} AS build"),
            "Dockerfile.{component}: the builder is rust:<tag>${{RUST_DIGEST}}: {image}"
        );
    }

    // OCI labels: where the source is (the chart's `sources`), its license (the workspace's, whose
    // text is LICENSE) and the version (by default the chart's appVersion).
    let chart = chart_yaml();
    let license = manifest
        .lines()
        .find_map(|l| l.strip_prefix("license = "))
        .expect("the workspace's license")
        .trim_matches('"')
        .to_owned();
    for component in ["controller", "webhook"] {
        let file = read_dockerfile(&format!("Dockerfile.{component}"));
        let label = |key: &str| {
            file.labels
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
                .unwrap_or_else(|| panic!("Dockerfile.{component}: no LABEL {key}: {:?}", file.labels))
        };
        assert_eq!(label("org.opencontainers.image.source"), chart["sources"][0]);
        assert_eq!(label("org.opencontainers.image.licenses"), license);
        assert_eq!(label("org.opencontainers.image.version"), "${VERSION}");
        assert_eq!(
            file.runtime_args,
            [(
                "VERSION".to_owned(),
                chart["appVersion"].as_str().expect("appVersion").to_owned()
            )],
            "Dockerfile.{component}: VERSION defaults to the chart's appVersion"
        );
    }
}

/// charts/projection/Chart.yaml as JSON values.
fn chart_yaml() -> Value {
    let text = std::fs::read_to_string(repo_root().join("charts/projection/Chart.yaml")).expect("Chart.yaml");
    serde_yaml::from_str(&text).expect("Chart.yaml is YAML")
}

#[test]
fn chart_metadata_is_ready_to_publish() {
    let chart = chart_yaml();
    // The author policy (ValidatingAdmissionPolicy) and matchConditions need 1.30.
    assert_eq!(chart["kubeVersion"], ">=1.30.0-0");
    let manifest = std::fs::read_to_string(repo_root().join("Cargo.toml")).expect("manifest");
    let workspace_version = manifest
        .lines()
        .find_map(|l| l.strip_prefix("version = "))
        .expect("the workspace's version")
        .trim_matches('"');
    assert_eq!(
        chart["appVersion"], workspace_version,
        "appVersion is the binaries' version"
    );
    let home = chart["home"].as_str().expect("home");
    assert!(home.starts_with("https://"), "{home}");
    assert!(
        chart["sources"][0]
            .as_str()
            .is_some_and(|s| s.starts_with("https://"))
    );
    assert!(chart["maintainers"][0]["name"].is_string(), "a maintainer");

    let annotations = &chart["annotations"];
    // Artifact Hub: the license is the repository's (LICENSE, Apache-2.0 as the workspace says).
    assert_eq!(annotations["artifacthub.io/license"], "Apache-2.0");
    assert!(manifest.contains("license = \"Apache-2.0\""));
    let license = std::fs::read_to_string(repo_root().join("LICENSE")).expect("LICENSE");
    assert!(license.contains("Apache License") && license.contains("Version 2.0, January 2004"));
    let links: Value = serde_yaml::from_str(annotations["artifacthub.io/links"].as_str().expect("links"))
        .expect("links are YAML");
    for link in links.as_array().expect("a list of links") {
        assert!(link["name"].is_string(), "{link}");
        assert!(
            link["url"].as_str().is_some_and(|u| u.starts_with("https://")),
            "{link}"
        );
    }
    // The CRDs Artifact Hub lists are those the chart renders, with their kinds and versions.
    let listed: Value = serde_yaml::from_str(annotations["artifacthub.io/crds"].as_str().expect("crds"))
        .expect("the CRD list is YAML");
    let mut listed: Vec<(String, String, String)> = listed
        .as_array()
        .expect("a list of CRDs")
        .iter()
        .map(|c| {
            assert!(
                c["displayName"].is_string() && c["description"].is_string(),
                "{c}"
            );
            let field = |k: &str| c[k].as_str().unwrap_or_else(|| panic!("{k} of {c}")).to_owned();
            (field("name"), field("kind"), field("version"))
        })
        .collect();
    listed.sort();
    let dir = repo_root().join(codegen::crds::CRD_DIR);
    let mut installed: Vec<(String, String, String)> = std::fs::read_dir(dir)
        .expect("crd-manifests/")
        .map(|e| {
            let crd: Value =
                serde_yaml::from_str(&std::fs::read_to_string(e.expect("entry").path()).expect("a CRD file"))
                    .expect("CRD YAML");
            let versions = crd["spec"]["versions"].as_array().expect("versions");
            assert_eq!(versions.len(), 1, "one version each");
            (
                crd["metadata"]["name"].as_str().expect("name").to_owned(),
                crd["spec"]["names"]["kind"].as_str().expect("kind").to_owned(),
                versions[0]["name"].as_str().expect("version").to_owned(),
            )
        })
        .collect();
    installed.sort();
    assert_eq!(listed, installed);
}

#[test]
fn helm_test_runs_the_webhook_image_with_the_least_it_needs() {
    for mode in MODES {
        let r = rendered(&mode_values(mode));
        let pod = r.get("Pod", "projection-test");
        assert_eq!(pod["metadata"]["annotations"]["helm.sh/hook"], "test");
        assert_eq!(
            pod["metadata"]["annotations"]["helm.sh/hook-delete-policy"],
            "before-hook-creation,hook-succeeded"
        );
        let spec = &pod["spec"];
        assert_eq!(spec["restartPolicy"], "Never");
        let webhook = r.get("Deployment", "projection-webhook");
        let c = &spec["containers"][0];
        // The webhook's image (the only one a release brings), its pull policy and hardening.
        assert_eq!(c["image"], container(webhook)["image"]);
        assert_eq!(c["imagePullPolicy"], container(webhook)["imagePullPolicy"]);
        assert_eq!(c["securityContext"], container(webhook)["securityContext"]);
        assert_eq!(
            spec["securityContext"],
            webhook["spec"]["template"]["spec"]["securityContext"]
        );
        assert!(
            c["command"].is_null(),
            "the image's ENTRYPOINT, projection-webhook"
        );
        let args = strings(&c["args"]);
        assert_eq!(args[0], "test", "{args:?}");
        // What it checks is what the chart installs.
        let name = |kind: &str| {
            r.get(kind, "projection-webhook")["webhooks"][0]["name"]
                .as_str()
                .expect("a webhook name")
                .to_owned()
        };
        assert!(
            args.contains(&format!(
                "--webhook-names={},{}",
                name("MutatingWebhookConfiguration"),
                name("ValidatingWebhookConfiguration")
            )),
            "{args:?}"
        );
        assert!(args.contains(&"--controller-deployment=projection-controller".to_owned()));
        assert!(r.has("Deployment", "projection-controller"));
        assert!(args.contains(&"--timeout=60s".to_owned()), "{args:?}");
        // Its account: create Projections (a dry run) and read the controller's Deployment.
        assert_eq!(spec["serviceAccountName"], "projection-test");
        assert!(r.has("ServiceAccount", "projection-test"));
        let role = r.get("Role", "projection-test");
        assert_eq!(
            role["rules"],
            json!([
                {"apiGroups": ["projection.sh"], "resources": ["projections"], "verbs": ["create"]},
                {"apiGroups": ["apps"], "resources": ["deployments"],
                 "resourceNames": ["projection-controller"], "verbs": ["get"]},
            ])
        );
        let binding = r.get("RoleBinding", "projection-test");
        assert_eq!(binding["roleRef"]["name"], "projection-test");
        assert_eq!(
            binding["subjects"],
            json!([{"kind": "ServiceAccount", "name": "projection-test", "namespace": NS}])
        );
        for (kind, name) in [
            ("ServiceAccount", "projection-test"),
            ("Role", "projection-test"),
            ("RoleBinding", "projection-test"),
        ] {
            let annotations = &r.get(kind, name)["metadata"]["annotations"];
            assert_eq!(annotations["helm.sh/hook"], "test", "{kind}");
            assert_eq!(annotations["helm.sh/hook-weight"], "-1", "{kind}: before the pod");
        }
    }
    let r = rendered(&[("test.enabled", json!(false))]);
    assert!(!r.has("Pod", "projection-test") && !r.has("Role", "projection-test"));
    let r = rendered(&[("test.timeout", json!("3m"))]);
    assert!(
        strings(&r.get("Pod", "projection-test")["spec"]["containers"][0]["args"])
            .contains(&"--timeout=3m".to_owned())
    );
}

#[test]
fn template_refuses_a_cluster_older_than_kube_version() {
    let chart = repo_root().join("charts/projection");
    let chart = chart.to_string_lossy();
    let out = helm(&["template", "projection", &chart, "--kube-version", "1.29.9"]);
    assert!(!out.status.success(), "1.29 was accepted");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("chart requires kubeVersion: >=1.30.0-0"),
        "the error names the requirement: {stderr}"
    );
    for version in ["1.30.0", "1.36.3", "v1.30.2-gke.1000"] {
        let out = helm(&["template", "projection", &chart, "--kube-version", version]);
        assert!(
            out.status.success(),
            "{version}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// One image of the table `OUR_IMAGES` in tests/control-plane/images.sh (name, user, ports,
/// entrypoint), read from its text.
fn image_script_entry(name: &str) -> Dockerfile {
    let path = repo_root().join("tests/control-plane/images.sh");
    let text = std::fs::read_to_string(&path).expect("images.sh exists");
    let table = text
        .split_once("OUR_IMAGES=(")
        .and_then(|(_, rest)| rest.split_once("\n)"))
        .expect("images.sh has an OUR_IMAGES table")
        .0;
    let fields: Vec<&str> = table
        .lines()
        .map(|l| l.trim().trim_matches('"'))
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("images.sh builds no image {name}"))
        .split_whitespace()
        .collect();
    assert_eq!(
        fields.len(),
        4,
        "images.sh: {fields:?} is name, user, ports, entrypoint"
    );
    Dockerfile {
        build_bin: name.to_owned(),
        runtime_base: "scratch".to_owned(),
        runtime_runs: false,
        user: fields[1].to_owned(),
        exposed: fields[2]
            .split(',')
            .map(|p| p.parse().expect("numeric port"))
            .collect(),
        entrypoint: vec![fields[3].to_owned()],
        copied: format!("{} {}", name, fields[3]),
        labels: Vec::new(),
        runtime_args: Vec::new(),
    }
}

fn version_at_least(have: &str, need: &str) -> bool {
    let parse = |v: &str| -> Vec<u64> { v.split('.').map(|p| p.parse().unwrap_or(0)).collect() };
    parse(have) >= parse(need)
}

#[test]
fn chart_crds_are_the_generated_ones() {
    // The staleness test in `codegen` regenerates them; here: the chart ships both, nothing else,
    // and none in Helm's crds/ folder, which Helm would install on its own at the first install
    // (and then the template's create would fail on objects it does not own).
    let chart = repo_root().join("charts/projection");
    assert!(!chart.join("crds").exists(), "no crds/ folder in the chart");
    let dir = repo_root().join(codegen::crds::CRD_DIR);
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .expect("crd-manifests/")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(
        files,
        [
            "clusterprojections.projection.sh.yaml",
            "projections.projection.sh.yaml"
        ]
    );

    // Rendered by default: each generated file as it is, plus the chart's labels and the keep
    // policy (helm uninstall leaves them, and every user's CRs with them).
    let r = rendered(&[]);
    let deployment_labels = &r.get("Deployment", "projection-controller")["metadata"]["labels"];
    let crds = r.of_kind("CustomResourceDefinition");
    assert_eq!(crds.len(), 2, "both CRDs rendered");
    for file in &files {
        let generated: Value =
            serde_yaml::from_str(&std::fs::read_to_string(dir.join(file)).expect("a CRD file"))
                .expect("CRD YAML");
        let name = generated["metadata"]["name"].as_str().expect("name");
        let mut crd = r.get("CustomResourceDefinition", name).clone();
        assert_eq!(
            crd["metadata"]["annotations"],
            json!({"helm.sh/resource-policy": "keep"}),
            "{name}"
        );
        let labels = crd["metadata"]["labels"].as_object().expect("labels").clone();
        for (key, value) in labels.iter() {
            assert_eq!(
                &deployment_labels[key], value,
                "{name}: label {key} as the chart's others"
            );
        }
        assert_eq!(labels["app.kubernetes.io/managed-by"], "Helm");
        assert_eq!(labels["app.kubernetes.io/instance"], "projection");
        let metadata = crd["metadata"].as_object_mut().expect("metadata");
        metadata.remove("labels");
        metadata.remove("annotations");
        // Helm's toYaml writes the float `0.0` as `0`: the same JSON number to the apiserver.
        assert_eq!(
            numbers_as_floats(crd),
            numbers_as_floats(generated.clone()),
            "{name}: rendered as generated"
        );
    }

    // No `crds` key at all (`helm upgrade --reuse-values` from 0.1.x, whose values lack it): both
    // default to true.
    let r = rendered(&[("crds", Value::Null)]);
    let crds = r.of_kind("CustomResourceDefinition");
    assert_eq!(crds.len(), 2);
    for crd in crds {
        assert_eq!(crd["metadata"]["annotations"]["helm.sh/resource-policy"], "keep");
    }

    // crds.keep=false: no policy, so helm uninstall deletes them.
    let r = rendered(&[("crds.keep", json!(false))]);
    for crd in r.of_kind("CustomResourceDefinition") {
        assert!(crd["metadata"]["annotations"].is_null(), "{crd}");
    }
    assert_eq!(r.of_kind("CustomResourceDefinition").len(), 2);
    // crds.install=false: no CRD at all (managed elsewhere, or by another release).
    for keep in [true, false] {
        let r = rendered(&[("crds.install", json!(false)), ("crds.keep", json!(keep))]);
        assert!(r.of_kind("CustomResourceDefinition").is_empty());
        assert!(r.has("Deployment", "projection-controller"), "the rest renders");
    }
}
