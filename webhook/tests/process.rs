//! The binary as Kubernetes runs it: starts, logs JSON, and exits 0 on SIGTERM.

use std::path::Path;

#[test]
fn exits_cleanly_on_sigterm() {
    let bin = Path::new(env!("CARGO_BIN_EXE_projection-webhook"));
    let status = projection_tests::run_until_sigterm(bin, &[], "projection-webhook starting");
    assert!(status.success(), "exit status after SIGTERM: {status}");
}
