//! The binary as Kubernetes runs it: starts, becomes ready, and exits 0 on SIGTERM; refuses bad
//! flags with exit code 2; serves its metrics over HTTPS when given a certificate.

use projection_tests::{ServiceProcess, http_get, metric_value, wait_for};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use std::{
    path::{Path, PathBuf},
    time::Duration,
};

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

/// A CA for the metrics certificates of a test, and its PEM.
fn metrics_ca() -> (Issuer<'static, KeyPair>, String) {
    let key = KeyPair::generate().expect("a key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    // Its own name: rcgen's default one, also the leaf's, would make the leaf look self-signed.
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "metrics test CA");
    let pem = params.self_signed(&key).expect("a CA").pem();
    (Issuer::new(params, key), pem)
}

/// Writes a certificate for `metrics.test` expiring on January 1st of `year`, and its key, as a
/// mounted Secret would hold them.
fn write_metrics_pair(dir: &Path, ca: &Issuer<'_, KeyPair>, year: i32) {
    let key = KeyPair::generate().expect("a key");
    let mut params = CertificateParams::new(vec!["metrics.test".to_owned()]).expect("params");
    params.not_after = rcgen::date_time_ymd(year, 1, 1);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "metrics.test");
    let cert = params.signed_by(&key, ca).expect("a certificate");
    std::fs::write(dir.join("tls.crt"), cert.pem()).expect("writing tls.crt");
    std::fs::write(dir.join("tls.key"), key.serialize_pem()).expect("writing tls.key");
}

/// `/metrics` as a scraper verifying the CA sees it (curl), or why not.
fn scrape_https(port: u16, ca: &Path) -> Result<String, String> {
    let out = std::process::Command::new("curl")
        .args([
            "--silent",
            "--show-error",
            "--fail",
            "--max-time",
            "5",
            "--cacert",
        ])
        .arg(ca)
        .args(["--resolve", &format!("metrics.test:{port}:127.0.0.1")])
        .arg(format!("https://metrics.test:{port}/metrics"))
        .output()
        .map_err(|e| format!("curl: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// With `--metrics-cert-file` and `--metrics-key-file`, `/metrics` is served over HTTPS with that
/// certificate (verified against its CA; nothing answers plain HTTP there) while the probes stay
/// plain HTTP; a rotated pair is served from the next reload on, its expiry in
/// `projection_controller_metrics_certificate_expiry_timestamp_seconds`. A key without its
/// certificate, or a certificate on the probes' address, is refused at start naming the flag.
#[tokio::test]
async fn serves_metrics_over_https_and_follows_a_rotated_certificate() {
    let _serial = projection_tests::exclusive().await;
    projection_tests::install_crds(&projection_tests::client().await).await;
    let dir: PathBuf = std::env::temp_dir().join(format!("controller-metrics-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    let (ca, ca_pem) = metrics_ca();
    let ca_file = dir.join("ca.crt");
    std::fs::write(&ca_file, ca_pem).expect("writing ca.crt");
    write_metrics_pair(&dir, &ca, 2030);
    let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
    let (cert, key) = (cert.to_str().expect("UTF-8"), key.to_str().expect("UTF-8"));
    let binary = Path::new(env!("CARGO_BIN_EXE_projection-controller"));
    let mut controller = ServiceProcess::start_split(
        binary,
        &[
            "--metrics-cert-file",
            cert,
            "--metrics-key-file",
            key,
            "--metrics-cert-reload-interval",
            "200ms",
        ],
    );
    // Ready through the plain-HTTP probe.
    controller.wait_ready().await;
    let port = controller.metrics_port;
    assert_ne!(
        http_get(port, "/metrics").map(|(code, _)| code),
        Some(200),
        "no plain HTTP on the metrics port"
    );
    let expiry = "projection_controller_metrics_certificate_expiry_timestamp_seconds ";
    let text = scrape_https(port, &ca_file).expect("an HTTPS scrape");
    assert!(text.contains("projection_remote_clusters "), "{text}");
    assert_eq!(metric_value(&text, expiry), Some(1_893_456_000.0), "2030-01-01");

    // Rotated (the files rewritten as a Secret update would): served from the next reload on.
    write_metrics_pair(&dir, &ca, 2031);
    wait_for(
        "the rotated certificate served",
        Duration::from_secs(20),
        || async {
            let text = scrape_https(port, &ca_file)?;
            let reloaded = metric_value(
                &text,
                "projection_controller_metrics_certificate_reloads_total{result=\"success\"} ",
            );
            (metric_value(&text, expiry) == Some(1_924_992_000.0) && reloaded >= Some(1.0))
                .then_some(())
                .ok_or(format!("expiry and reloads not yet the new pair's:\n{text}"))
        },
    )
    .await;
    let status = controller.terminate();
    assert!(status.is_some_and(|s| s.success()), "{status:?}");

    let refused = |args: &[&str]| {
        std::process::Command::new(binary)
            .args(args)
            .output()
            .expect("binary runs")
    };
    let out = refused(&["--metrics-key-file", key]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--metrics-cert-file"));
    let out = refused(&[
        "--metrics-cert-file",
        cert,
        "--metrics-key-file",
        key,
        "--metrics-bind-address",
        "127.0.0.1:0",
        "--health-probe-bind-address",
        "127.0.0.1:0",
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("apart from --health-probe-bind-address"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
