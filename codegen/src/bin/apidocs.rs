//! Writes `docs/api-reference.md`, rendered from the CRD schemas generated from the Rust types.
//! Run `cargo run -p codegen --bin apidocs` after changing `shared/src/api/crd.rs` (with `crdgen`).

use std::path::Path;

fn main() -> anyhow::Result<()> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(codegen::api_reference::API_REFERENCE_PATH);
    std::fs::write(&path, codegen::api_reference::render())?;
    println!("wrote {}", path.display());
    Ok(())
}
