//! Rendering of the CRD manifests from the Rust types. The `crdgen` binary writes them into the
//! chart; a test fails when the committed files are stale.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{CustomResourceDefinition, JSON};
use kube::CustomResourceExt;
use shared::api::crd::{ClusterProjection, Projection};

/// A CRD manifest: its file name in `charts/projection/crd-manifests/` and its YAML.
pub struct CrdManifest {
    /// File name, e.g. `projections.projection.sh.yaml`.
    pub file_name: String,
    /// The rendered YAML document.
    pub yaml: String,
}

/// Where the generated files live, relative to the workspace root.
pub const CRD_DIR: &str = "charts/projection/crd-manifests";

const HEADER: &str = "# Generated from the Rust types in shared/src/api/crd.rs by `cargo run -p codegen --bin crdgen`.\n# Do not edit by hand.\n";

/// Both CRDs as the cluster gets them: derived from the Rust types, with the status defaulted.
pub fn definitions() -> [CustomResourceDefinition; 2] {
    let mut crds = [Projection::crd(), ClusterProjection::crd()];
    for crd in &mut crds {
        default_status_to_unobserved(crd);
    }
    crds
}

/// A CR the controller has not reported on yet reads `status: {observedGeneration: 0}`, not no
/// status at all. The apiserver applies a schema default whenever it reads the object from
/// storage (create drops a status sent with the object, so no request could set it): kstatus then
/// sees generation 1 against observed 0 and answers InProgress, where a CR with no status would
/// read Current before the controller's first write. No derive attribute reaches the root
/// `status` property, hence this edit of the generated schema.
fn default_status_to_unobserved(crd: &mut CustomResourceDefinition) {
    for version in &mut crd.spec.versions {
        let status = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
            .and_then(|s| s.properties.as_mut())
            .and_then(|p| p.get_mut("status"));
        if let Some(status) = status {
            status.default = Some(JSON(serde_json::json!({"observedGeneration": 0})));
        }
    }
}

/// Renders both CRDs.
pub fn manifests() -> Result<Vec<CrdManifest>, serde_yaml::Error> {
    definitions()
        .into_iter()
        .map(|crd| {
            let name = crd.metadata.name.clone().unwrap_or_default();
            Ok(CrdManifest {
                file_name: format!("{name}.yaml"),
                yaml: format!("{HEADER}{}", serde_yaml::to_string(&crd)?),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn committed_crds_match_the_rust_types() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(CRD_DIR);
        for manifest in manifests().expect("CRDs render") {
            let path = dir.join(&manifest.file_name);
            let committed = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
            assert!(
                committed == manifest.yaml,
                "{} is stale: run `cargo run -p codegen --bin crdgen` and commit the result",
                path.display()
            );
        }
    }
}
