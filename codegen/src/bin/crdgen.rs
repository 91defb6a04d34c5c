//! Writes the CRD manifests generated from the Rust types into `charts/projection/crd-manifests/` (rendered by the chart's `templates/crds.yaml`).
//! Run `cargo run -p codegen --bin crdgen` after changing `shared/src/api/crd.rs`.

use std::path::Path;

fn main() -> anyhow::Result<()> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(codegen::crds::CRD_DIR);
    std::fs::create_dir_all(&dir)?;
    for manifest in codegen::crds::manifests()? {
        let path = dir.join(&manifest.file_name);
        std::fs::write(&path, manifest.yaml)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
