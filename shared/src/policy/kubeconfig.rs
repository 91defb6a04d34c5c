//! What the controller accepts of a kubeconfig a CR points it to (`spec.destination.kubeConfig`):
//! one cluster reached over HTTPS with inline credentials, a bearer token or a client certificate.
//! Nothing in it may make the controller run a program (exec and auth-provider plugins), read one
//! of its own files (paths to a token, certificate or key), or go elsewhere than the cluster named
//! (a proxy), since whoever wrote the Secret would be acting through the controller. Each refusal
//! names the field.

use crate::api::kind::{CrView, Scope};
use crate::policy::author::AccessQuestion;
use base64::{Engine, engine::general_purpose::STANDARD};
use serde_json::Value;
use std::fmt;

/// How the controller reaches a cluster of a kubeconfig it accepted.
#[derive(Clone, PartialEq, Eq)]
pub struct RemoteAccess {
    /// The apiserver's `https://` URL.
    pub server: String,
    /// The CA certificates (PEM) the apiserver's certificate is checked against; `None`: the
    /// system's roots.
    pub certificate_authority: Option<Vec<u8>>,
    /// The name checked in the apiserver's certificate, when not the server's host.
    pub tls_server_name: Option<String>,
    /// Who the controller is there.
    pub credentials: Credentials,
}

/// Inline credentials.
#[derive(Clone, PartialEq, Eq)]
pub enum Credentials {
    /// A bearer token (a ServiceAccount's, typically).
    Token(String),
    /// A client certificate and its key (PEM).
    ClientCertificate {
        /// The certificate.
        certificate: Vec<u8>,
        /// Its private key.
        key: Vec<u8>,
    },
}

impl RemoteAccess {
    /// Which apiserver this is, as a CR's status records it: `server-` and 12 hex digits of a
    /// SHA-256 of its URL (the URL itself is not for every reader of the CR).
    pub fn server_id(&self) -> String {
        use sha2::{Digest, Sha256};
        let digest = Sha256::digest(self.server.as_bytes());
        let hex: String = digest.iter().take(6).map(|b| format!("{b:02x}")).collect();
        format!("server-{hex}")
    }
}

impl Credentials {
    /// The kubeconfig `user` entry holding them inline (what a client is built from).
    pub fn kubeconfig_user(&self) -> Value {
        match self {
            Self::Token(token) => serde_json::json!({"token": token}),
            Self::ClientCertificate { certificate, key } => serde_json::json!({
                "client-certificate-data": STANDARD.encode(certificate),
                "client-key-data": STANDARD.encode(key),
            }),
        }
    }
}

// Never print credentials, not even in a debug log.
impl fmt::Debug for RemoteAccess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let credentials = match self.credentials {
            Credentials::Token(_) => "token",
            Credentials::ClientCertificate { .. } => "client certificate",
        };
        f.debug_struct("RemoteAccess")
            .field("server", &self.server)
            .field("certificate_authority", &self.certificate_authority.is_some())
            .field("tls_server_name", &self.tls_server_name)
            .field("credentials", &credentials)
            .finish()
    }
}

/// The Secret key holding the kubeconfig of the cluster a CR's copies go to.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KubeconfigSecret {
    /// Its namespace: a Projection's own, or the controller's for a ClusterProjection (only the
    /// platform team points copies at clusters for every namespace).
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// The key of its data.
    pub key: String,
}

impl KubeconfigSecret {
    /// The Secret `cr` points to, if its copies go to another cluster; `controller_namespace` is
    /// where a ClusterProjection's is.
    pub fn of(cr: &CrView<'_>, controller_namespace: &str) -> Option<Self> {
        let secret = cr.cluster?;
        let namespace = match cr.scope {
            Scope::OwnNamespace => cr.home().unwrap_or_default(),
            Scope::Namespaces => controller_namespace,
        };
        Some(Self {
            namespace: namespace.to_owned(),
            name: secret.name.clone(),
            key: secret.key().to_owned(),
        })
    }

    /// What the CR's author is asked first: may they get this Secret? (Nobody points the controller
    /// at credentials they could not read themselves.)
    pub fn question(&self) -> AccessQuestion {
        AccessQuestion::read_source("", "secrets", &self.namespace, &self.name)
    }

    /// `<namespace>/<name>`, for messages.
    pub fn path(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// `DestinationClusterInvalid`'s message for this Secret when it does not exist.
    pub fn missing(&self) -> String {
        format!("Secret {} holding the kubeconfig does not exist", self.path())
    }

    /// `DestinationClusterInvalid`'s message for this Secret when it lacks the key.
    pub fn missing_key(&self) -> String {
        format!("Secret {} has no key {:?}", self.path(), self.key)
    }

    /// The access the kubeconfig held under this Secret's key (`bytes`) grants, or
    /// `DestinationClusterInvalid`'s message: not a kubeconfig, or one refused by [`remote_access`].
    pub fn access(&self, bytes: &[u8]) -> Result<RemoteAccess, String> {
        let value: Value = serde_yaml::from_slice(bytes).map_err(|e| {
            format!(
                "key {:?} of Secret {} is not a kubeconfig: {e}",
                self.key,
                self.path()
            )
        })?;
        remote_access(&value).map_err(|refused| {
            format!(
                "the kubeconfig in Secret {} (key {:?}) is refused: {refused}",
                self.path(),
                self.key
            )
        })
    }

    /// `DestinationClusterInvalid`'s message when a client cannot be built from what
    /// [`Self::access`] accepted (a server URL or a CA that does not parse).
    pub fn unusable(&self, why: &str) -> String {
        format!(
            "the kubeconfig in Secret {} (key {:?}) cannot be used: {why}",
            self.path(),
            self.key
        )
    }

    /// Whether this Secret still reaches the apiserver `recorded` (a CR's copies were written to,
    /// `WrittenDestination::cluster`) now that it reaches `now`: a Secret pointed at another cluster
    /// would leave the copies in the first behind, ours and out of reach. Refused, saying what to
    /// do; nothing recorded (copies written before the record was kept) is no proof of anything.
    pub fn same_server(&self, recorded: Option<&str>, now: &str) -> Result<(), String> {
        match recorded {
            Some(recorded) if recorded != now => Err(format!(
                "the kubeconfig in Secret {} now reaches another apiserver ({now}) than the one this CR's copies were written to ({recorded}): they would be left behind there. Point the Secret back, delete this CR (its copies go with it), then point the Secret at the new cluster and create the CR again",
                self.path()
            )),
            _ => Ok(()),
        }
    }

    /// The name metrics and logs give the cluster this Secret reaches: `cluster-` and 12 hex digits
    /// of a SHA-256 of the Secret's namespace, name and key. Never its URL; as many values as
    /// Secrets the CRs name.
    pub fn alias(&self) -> String {
        use sha2::{Digest, Sha256};
        let digest = Sha256::digest(format!("{}\n{}\n{}", self.namespace, self.name, self.key));
        let hex: String = digest.iter().take(6).map(|b| format!("{b:02x}")).collect();
        format!("cluster-{hex}")
    }
}

/// Why a kubeconfig is refused, naming the field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused(pub String);

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Credentials that make the controller run a program, with what to give instead.
const PROGRAMS: [&str; 2] = ["exec", "auth-provider"];
/// Fields that name a file on the controller's own disk.
const USER_FILES: [&str; 3] = ["tokenFile", "client-certificate", "client-key"];
/// What to give instead of what is refused.
const INLINE: &str = "give a token, or client-certificate-data and client-key-data, inline";

/// Reads `kubeconfig` (the Secret's value, parsed) as the controller uses it: the current context's
/// cluster and user (the only context when none is current).
pub fn remote_access(kubeconfig: &Value) -> Result<RemoteAccess, Refused> {
    let refuse = |message: String| Err(Refused(message));
    if !kubeconfig.is_object() {
        return refuse("the kubeconfig is not a YAML or JSON object".into());
    }
    let contexts = named_entries(kubeconfig, "contexts")?;
    let context_name = match kubeconfig.get("current-context").and_then(Value::as_str) {
        Some(name) if !name.is_empty() => name.to_owned(),
        _ => match contexts.as_slice() {
            [(name, _)] => name.clone(),
            _ => {
                return refuse(format!(
                    "current-context is not set and the kubeconfig has {} contexts: set current-context",
                    contexts.len()
                ));
            }
        },
    };
    let Some((_, context)) = contexts.iter().find(|(name, _)| *name == context_name) else {
        return refuse(format!(
            "current-context {context_name:?} names no entry of contexts"
        ));
    };
    let field = |entry: &Value, key: &str| entry.get(key).and_then(Value::as_str).map(str::to_owned);
    let cluster_name = field(context, "cluster").unwrap_or_default();
    let user_name = field(context, "user").unwrap_or_default();
    let Some((_, cluster)) = named_entries(kubeconfig, "clusters")?
        .into_iter()
        .find(|(name, _)| *name == cluster_name)
    else {
        return refuse(format!(
            "context {context_name:?} names cluster {cluster_name:?}, which clusters does not hold"
        ));
    };
    let Some((_, user)) = named_entries(kubeconfig, "users")?
        .into_iter()
        .find(|(name, _)| *name == user_name)
    else {
        return refuse(format!(
            "context {context_name:?} names user {user_name:?}, which users does not hold"
        ));
    };
    let at = |section: &str, name: &str, key: &str| format!("{section}[{name:?}].{key}");

    // The cluster.
    let server = field(&cluster, "server").unwrap_or_default();
    if !server.starts_with("https://") || server.len() <= "https://".len() {
        return refuse(format!(
            "{} must be an https:// URL, not {server:?}",
            at("clusters", &cluster_name, "server")
        ));
    }
    if cluster.get("certificate-authority").is_some() {
        return refuse(format!(
            "{} names a file of the controller's: give certificate-authority-data inline",
            at("clusters", &cluster_name, "certificate-authority")
        ));
    }
    if cluster.get("insecure-skip-tls-verify").and_then(Value::as_bool) == Some(true) {
        return refuse(format!(
            "{} is not allowed: the controller checks the apiserver's certificate (give \
             certificate-authority-data)",
            at("clusters", &cluster_name, "insecure-skip-tls-verify")
        ));
    }
    if cluster.get("proxy-url").is_some() {
        return refuse(format!(
            "{} is not allowed: the controller connects to the server itself",
            at("clusters", &cluster_name, "proxy-url")
        ));
    }
    let certificate_authority = match field(&cluster, "certificate-authority-data") {
        Some(data) => Some(decoded(
            &data,
            &at("clusters", &cluster_name, "certificate-authority-data"),
        )?),
        None => None,
    };

    // The user.
    for program in PROGRAMS {
        if user.get(program).is_some() {
            return refuse(format!(
                "{} would make the controller run a program: {INLINE}",
                at("users", &user_name, program)
            ));
        }
    }
    for file in USER_FILES {
        if user.get(file).is_some() {
            return refuse(format!(
                "{} names a file of the controller's: {INLINE}",
                at("users", &user_name, file)
            ));
        }
    }
    if user.get("username").is_some() || user.get("password").is_some() {
        return refuse(format!(
            "{}: basic authentication is not supported: {INLINE}",
            at("users", &user_name, "username")
        ));
    }
    for impersonation in ["as", "as-uid", "as-groups", "as-user-extra"] {
        if user.get(impersonation).is_some() {
            return refuse(format!(
                "{} is not allowed: the credentials' own identity is the only authority in the \
                 remote cluster",
                at("users", &user_name, impersonation)
            ));
        }
    }
    let token = field(&user, "token").filter(|t| !t.is_empty());
    let certificate = field(&user, "client-certificate-data");
    let key = field(&user, "client-key-data");
    let credentials = match (token, certificate, key) {
        (Some(token), None, None) => Credentials::Token(token),
        (None, Some(certificate), Some(key)) => Credentials::ClientCertificate {
            certificate: decoded(&certificate, &at("users", &user_name, "client-certificate-data"))?,
            key: decoded(&key, &at("users", &user_name, "client-key-data"))?,
        },
        (None, None, None) => {
            return refuse(format!("user {user_name:?} has no credentials: {INLINE}"));
        }
        _ => {
            return refuse(format!(
                "user {user_name:?} must give either a token or both client-certificate-data and \
                 client-key-data"
            ));
        }
    };
    Ok(RemoteAccess {
        server,
        certificate_authority,
        tls_server_name: field(&cluster, "tls-server-name").filter(|n| !n.is_empty()),
        credentials,
    })
}

/// The `{name, <singular>}` entries of a kubeconfig list (`contexts`, `clusters`, `users`), by name.
fn named_entries(kubeconfig: &Value, list: &str) -> Result<Vec<(String, Value)>, Refused> {
    let singular = list.trim_end_matches('s');
    let Some(entries) = kubeconfig.get(list) else {
        return Ok(Vec::new());
    };
    let Some(entries) = entries.as_array() else {
        return Err(Refused(format!("{list} must be a list")));
    };
    entries
        .iter()
        .map(|entry| {
            let name = entry.get("name").and_then(Value::as_str);
            let body = entry.get(singular).filter(|b| b.is_object());
            match (name, body) {
                (Some(name), Some(body)) => Ok((name.to_owned(), body.clone())),
                _ => Err(Refused(format!(
                    "every entry of {list} needs a name and a {singular} object"
                ))),
            }
        })
        .collect()
}

/// Base64 `data` of the field `at`, decoded.
fn decoded(data: &str, at: &str) -> Result<Vec<u8>, Refused> {
    STANDARD
        .decode(data.trim())
        .map_err(|e| Refused(format!("{at} is not base64: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A kubeconfig of one context, with `cluster` and `user` merged into the defaults.
    fn kubeconfig(cluster: Value, user: Value) -> Value {
        let mut c = json!({"server": "https://127.0.0.1:17443", "certificate-authority-data": "Q0E="});
        let mut u = json!({"token": "t0k3n"});
        for (base, extra) in [(&mut c, cluster), (&mut u, user)] {
            for (k, v) in extra.as_object().cloned().unwrap_or_default() {
                if v.is_null() {
                    base.as_object_mut().unwrap().remove(&k);
                } else {
                    base[k] = v;
                }
            }
        }
        json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "remote", "cluster": c}],
            "users": [{"name": "sa", "user": u}],
            "contexts": [{"name": "ctx", "context": {"cluster": "remote", "user": "sa"}}],
        })
    }

    /// A CR's copies were written through a Secret reaching one apiserver: the same Secret with
    /// rotated credentials still reaches it; pointed at another apiserver it is refused, naming
    /// both (by digest, never the URL) and what to do; a record without a server proves nothing.
    #[test]
    fn a_secret_pointed_at_another_apiserver_is_refused_for_copies_written_before() {
        let first = remote_access(&kubeconfig(json!({}), json!({}))).expect("accepted");
        let rotated = remote_access(&kubeconfig(json!({}), json!({"token": "n3w"}))).expect("accepted");
        let other = remote_access(&kubeconfig(
            json!({"server": "https://127.0.0.1:18443"}),
            json!({}),
        ))
        .expect("accepted");
        let id = first.server_id();
        assert!(
            id.starts_with("server-") && id.len() == "server-".len() + 12,
            "{id}"
        );
        assert!(!id.contains("127.0.0.1"), "not the URL");
        assert_eq!(rotated.server_id(), id, "rotated credentials, the same apiserver");
        assert_ne!(other.server_id(), id);
        let secret = KubeconfigSecret {
            namespace: "team".into(),
            name: "remote".into(),
            key: "value".into(),
        };
        assert_eq!(secret.same_server(Some(&id), &rotated.server_id()), Ok(()));
        assert_eq!(secret.same_server(None, &other.server_id()), Ok(()));
        let refused = secret
            .same_server(Some(&id), &other.server_id())
            .expect_err("another apiserver");
        assert!(
            refused.starts_with("the kubeconfig in Secret team/remote now reaches another apiserver")
                && refused.contains(&id)
                && refused.contains(&other.server_id())
                && refused.contains("Point the Secret back, delete this CR"),
            "{refused}"
        );
    }

    fn refused(kubeconfig: &Value) -> String {
        remote_access(kubeconfig).expect_err("refused").0
    }

    #[test]
    fn a_token_or_a_client_certificate_inline_is_accepted() {
        let access = remote_access(&kubeconfig(json!({}), json!({}))).expect("accepted");
        assert_eq!(access.server, "https://127.0.0.1:17443");
        assert_eq!(access.certificate_authority.as_deref(), Some(&b"CA"[..]));
        assert!(access.credentials == Credentials::Token("t0k3n".into()));
        assert!(!format!("{access:?}").contains("t0k3n"), "never printed");

        let certificate = kubeconfig(
            json!({"tls-server-name": "kubernetes"}),
            json!({"token": null, "client-certificate-data": "Q0VSVA==", "client-key-data": "S0VZ"}),
        );
        let access = remote_access(&certificate).expect("accepted");
        assert!(
            access.credentials
                == Credentials::ClientCertificate {
                    certificate: b"CERT".to_vec(),
                    key: b"KEY".to_vec()
                }
        );
        assert_eq!(access.tls_server_name.as_deref(), Some("kubernetes"));
    }

    #[test]
    fn nothing_that_runs_a_program_or_reads_a_file_of_the_controllers() {
        let table = [
            (
                json!({}),
                json!({"exec": {"command": "/bin/sh"}}),
                "users[\"sa\"].exec would make the controller run a program",
            ),
            (
                json!({}),
                json!({"auth-provider": {"name": "gcp"}}),
                "users[\"sa\"].auth-provider would make the controller run a program",
            ),
            (
                json!({}),
                json!({"tokenFile": "/var/run/secrets/token"}),
                "users[\"sa\"].tokenFile names a file",
            ),
            (
                json!({}),
                json!({"token": null, "client-certificate": "/c", "client-key-data": "S0VZ"}),
                "users[\"sa\"].client-certificate names a file",
            ),
            (
                json!({"certificate-authority": "/etc/ca.crt"}),
                json!({}),
                "clusters[\"remote\"].certificate-authority names a file",
            ),
            (
                json!({"insecure-skip-tls-verify": true}),
                json!({}),
                "insecure-skip-tls-verify is not allowed",
            ),
            (
                json!({"proxy-url": "http://127.0.0.1:3128"}),
                json!({}),
                "proxy-url is not allowed",
            ),
            (
                json!({"server": "http://127.0.0.1:8080"}),
                json!({}),
                "server must be an https:// URL",
            ),
            (
                json!({}),
                json!({"username": "admin", "password": "x"}),
                "basic authentication is not supported",
            ),
            (
                json!({}),
                json!({"as": "system:admin"}),
                "users[\"sa\"].as is not allowed",
            ),
            (
                json!({}),
                json!({"token": null}),
                "user \"sa\" has no credentials",
            ),
            (
                json!({}),
                json!({"client-key-data": "S0VZ"}),
                "either a token or both",
            ),
            (
                json!({"certificate-authority-data": "not base64!"}),
                json!({}),
                "certificate-authority-data is not base64",
            ),
        ];
        for (cluster, user, expected) in table {
            let message = refused(&kubeconfig(cluster.clone(), user.clone()));
            assert!(message.contains(expected), "{cluster} {user}: {message}");
        }
    }

    #[test]
    fn a_projections_secret_is_in_its_namespace_a_cluster_projections_in_the_controllers() {
        use crate::api::{
            crd::{ClusterProjection, Projection},
            kind::ProjectionCr,
        };
        let source =
            json!({"group": "", "version": "v1", "kind": "ConfigMap", "namespace": "src", "name": "cfg"});
        let projection: Projection = serde_json::from_value(json!({
            "apiVersion": "projection.sh/v1", "kind": "Projection",
            "metadata": {"name": "p", "namespace": "team"},
            "spec": {"source": source, "destination": {"kubeConfig": {"secretRef": {"name": "remote"}}}},
        }))
        .unwrap();
        let secret = KubeconfigSecret::of(&projection.view(), "projection-system").expect("remote");
        assert_eq!(
            (secret.path(), secret.key.as_str()),
            ("team/remote".to_owned(), "value")
        );
        assert_eq!(secret.question().describe(), "get secrets team/remote");
        let alias = secret.alias();
        assert!(
            alias.starts_with("cluster-") && alias.len() == "cluster-".len() + 12,
            "{alias}"
        );
        assert_eq!(alias, secret.clone().alias(), "stable");

        let cluster: ClusterProjection = serde_json::from_value(json!({
            "apiVersion": "projection.sh/v1", "kind": "ClusterProjection",
            "metadata": {"name": "c"},
            "spec": {"source": source, "destination": {"namespaces": ["a"],
                     "kubeConfig": {"secretRef": {"name": "fleet", "key": "eu.yaml"}}}},
        }))
        .unwrap();
        let secret = KubeconfigSecret::of(&cluster.view(), "projection-system").expect("remote");
        assert_eq!(secret.path(), "projection-system/fleet");
        assert_eq!(secret.key, "eu.yaml");
        assert_ne!(secret.alias(), alias, "another Secret, another alias");

        let local: Projection = serde_json::from_value(json!({
            "apiVersion": "projection.sh/v1", "kind": "Projection",
            "metadata": {"name": "p", "namespace": "team"}, "spec": {"source": source},
        }))
        .unwrap();
        assert_eq!(KubeconfigSecret::of(&local.view(), "projection-system"), None);
    }

    #[test]
    fn the_context_used_is_the_current_one_or_the_only_one() {
        let mut config = kubeconfig(json!({}), json!({}));
        assert!(remote_access(&config).is_ok(), "the only context");
        config["contexts"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "other", "context": {"cluster": "nowhere", "user": "sa"}}));
        assert!(refused(&config).contains("current-context is not set and the kubeconfig has 2 contexts"));
        config["current-context"] = json!("other");
        assert!(refused(&config).contains("names cluster \"nowhere\", which clusters does not hold"));
        config["current-context"] = json!("ctx");
        assert!(remote_access(&config).is_ok());
        config["current-context"] = json!("gone");
        assert!(refused(&config).contains("current-context \"gone\" names no entry"));
        assert!(refused(&json!("text")).contains("not a YAML or JSON object"));
        assert!(refused(&json!({"contexts": {"a": 1}})).contains("contexts must be a list"));
    }
}
