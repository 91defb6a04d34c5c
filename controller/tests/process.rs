//! The binary as Kubernetes runs it: starts, logs JSON, and exits 0 on SIGTERM.

use std::path::Path;

#[test]
fn exits_cleanly_on_sigterm() {
    let bin = Path::new(env!("CARGO_BIN_EXE_projection-controller"));
    let status = projection_tests::run_until_sigterm(bin, &[], "projection-controller starting");
    assert!(status.success(), "exit status after SIGTERM: {status}");
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
