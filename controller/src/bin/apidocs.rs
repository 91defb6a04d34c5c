//! Writes `docs/api-reference.md`, rendered from the CRD schemas generated from the Rust types.
//! Run `cargo run -p controller --bin apidocs` after changing `shared/src/crd.rs` (with `crdgen`).

use std::path::Path;

fn main() -> anyhow::Result<()> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(shared::api_reference::API_REFERENCE_PATH);
    std::fs::write(&path, shared::api_reference::render())?;
    println!("wrote {}", path.display());
    Ok(())
}
