//! Rendering of the CRD manifests from the Rust types. The `crdgen` binary writes them into the
//! chart; a test fails when the committed files are stale.

use kube::CustomResourceExt;
use shared::api::crd::{ClusterProjection, Projection};

/// A CRD manifest: its file name in `charts/projection/crds/` and its YAML.
pub struct CrdManifest {
    /// File name, e.g. `projections.projection.sh.yaml`.
    pub file_name: String,
    /// The rendered YAML document.
    pub yaml: String,
}

/// Where the generated files live, relative to the workspace root.
pub const CRD_DIR: &str = "charts/projection/crds";

const HEADER: &str = "# Generated from the Rust types in shared/src/api/crd.rs by `cargo run -p codegen --bin crdgen`.\n# Do not edit by hand.\n";

/// Renders both CRDs.
pub fn manifests() -> Result<Vec<CrdManifest>, serde_yaml::Error> {
    [Projection::crd(), ClusterProjection::crd()]
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
