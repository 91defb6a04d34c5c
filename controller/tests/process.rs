//! The binary as Kubernetes runs it: starts, becomes ready, and exits 0 on SIGTERM; refuses bad
//! flags with exit code 2.

use projection_tests::ServiceProcess;
use std::path::Path;

#[tokio::test]
async fn becomes_ready_and_exits_cleanly_on_sigterm() {
    let _serial = projection_tests::exclusive().await;
    // Ready means the CR caches synced, which needs the CRDs; other suites may not have run first.
    projection_tests::install_crds(&projection_tests::client().await).await;
    let mut controller = ServiceProcess::start(Path::new(env!("CARGO_BIN_EXE_projection-controller")), &[]);
    controller.wait_ready().await;
    let status = controller.terminate();
    assert!(
        status.is_some_and(|s| s.success()),
        "exit status after SIGTERM: {status:?}"
    );
}

#[test]
fn refuses_an_unknown_source_mode_with_exit_code_2() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_projection-controller"))
        .args(["--source-mode", "everything"])
        .output()
        .expect("binary runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--source-mode"));
}
