//! `scripts/release.sh` as a release runs it, packaging the plugin binary this test run built
//! (`PLUGIN_BINARY`; without it the script runs `cargo build --release` itself, the one step left
//! out here): the archive a krew user downloads, its SHA-256, and the filled krew manifest. The
//! binary is packaged without its debug info, which a release build has none of either (cargo
//! strips it when the profile has no debug info): a debug build's 200 MB took minutes to compress
//! on a loaded machine.

use serde_json::Value;
use std::{
    path::{Path, PathBuf},
    process::Command,
};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn run(command: &mut Command) -> String {
    let out = command.output().unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(
        out.status.success(),
        "{command:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs the release script into `dist` for version 1.2.3, packaging `binary`.
fn release(dist: &Path, binary: &Path) {
    run(Command::new(root().join("scripts/release.sh"))
        .env("PLUGIN_BINARY", binary)
        .env("VERSION", "1.2.3")
        .env("DIST", dist)
        .env_remove("TARGETS")
        .env_remove("RELEASE_URL"));
}

/// The SHA-256 of a file, as `sha256sum` prints it.
fn sha256(path: &Path) -> String {
    run(Command::new("sha256sum").arg(path))
        .split_whitespace()
        .next()
        .expect("a digest")
        .to_owned()
}

#[test]
fn release_packages_the_plugin_with_its_license_and_fills_the_krew_manifest() {
    // This machine's platform in krew's words (the script's default target is the host's).
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => panic!("no krew arch for {other}"),
    };
    let platform = format!("{}-{arch}", std::env::consts::OS);
    let work = std::env::temp_dir().join(format!("projection-release-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).expect("a folder");
    let binary = work.join("kubectl-projection");
    run(Command::new("strip")
        .arg("--strip-debug")
        .arg("-o")
        .arg(&binary)
        .arg(env!("CARGO_BIN_EXE_kubectl-projection")));
    let dist = work.join("dist");
    release(&dist, &binary);

    // The archive: the binary and LICENSE, nothing else; the binary runs once unpacked.
    let name = format!("kubectl-projection-{platform}.tar.gz");
    let archive = dist.join(&name);
    let listed = run(Command::new("tar").arg("-tzf").arg(&archive));
    assert_eq!(
        listed.lines().collect::<Vec<_>>(),
        ["kubectl-projection", "LICENSE"]
    );
    let unpacked = work.join("unpacked");
    std::fs::create_dir_all(&unpacked).expect("a folder");
    run(Command::new("tar")
        .arg("-xzf")
        .arg(&archive)
        .arg("-C")
        .arg(&unpacked));
    let help = run(Command::new(unpacked.join("kubectl-projection")).arg("--help"));
    assert!(help.contains("status"), "{help}");
    assert_eq!(
        std::fs::read(unpacked.join("LICENSE")).expect("LICENSE unpacked"),
        std::fs::read(root().join("LICENSE")).expect("LICENSE")
    );

    // Its SHA-256, in its own file and in SHA256SUMS.
    let digest = sha256(&archive);
    let line = format!("{digest}  {name}\n");
    assert_eq!(
        std::fs::read_to_string(dist.join(format!("{name}.sha256"))).expect("sha256"),
        line
    );
    assert_eq!(
        std::fs::read_to_string(dist.join("SHA256SUMS")).expect("SHA256SUMS"),
        line
    );

    // The manifest: the version, the archive's URL under the chart's home, its digest, the binary
    // and the license installed; only the platform built; no placeholder left.
    let text = std::fs::read_to_string(dist.join("projection.yaml")).expect("the manifest");
    assert!(!text.contains('<'), "{text}");
    let manifest: Value = serde_yaml::from_str(&text).expect("the manifest is YAML");
    let chart: Value = serde_yaml::from_str(
        &std::fs::read_to_string(root().join("charts/projection/Chart.yaml")).expect("Chart.yaml"),
    )
    .expect("Chart.yaml is YAML");
    let home = chart["home"].as_str().expect("the chart's home");
    assert_eq!(manifest["kind"], "Plugin");
    assert_eq!(manifest["metadata"]["name"], "projection");
    assert_eq!(manifest["spec"]["version"], "v1.2.3");
    assert_eq!(manifest["spec"]["homepage"], home);
    let platforms = manifest["spec"]["platforms"].as_array().expect("platforms");
    assert_eq!(platforms.len(), 1, "{text}");
    let entry = &platforms[0];
    assert_eq!(
        entry["selector"]["matchLabels"],
        serde_json::json!({"os": std::env::consts::OS, "arch": arch})
    );
    assert_eq!(
        entry["uri"],
        format!("{home}/releases/download/v1.2.3/{name}").as_str()
    );
    assert_eq!(entry["sha256"], digest.as_str());
    assert_eq!(entry["bin"], "kubectl-projection");
    assert_eq!(
        entry["files"],
        serde_json::json!([{"from": "kubectl-projection", "to": "."}, {"from": "LICENSE", "to": "."}])
    );

    // Reproducible: the same inputs give the same archive.
    let again = work.join("again");
    release(&again, &binary);
    assert_eq!(sha256(&again.join(&name)), digest);
    let _ = std::fs::remove_dir_all(&work);
}
