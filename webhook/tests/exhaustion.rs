//! A webhook process under an attempt to exhaust it: many HTTP/2 connections each with many
//! concurrent 4 MiB reviews, connections stalled before TLS and in the middle of an HTTP/2 header
//! block. Its peak resident memory must stay under the chart's 256 MiB limit and a legitimate
//! review must keep being answered. Runs the real binary against the local control plane (the
//! webhook needs an apiserver to become ready), only on 127.0.0.1, for a bounded time.

use projection_tests::{ServiceProcess, attack, free_port, testenv_dir};
use std::{sync::Arc, time::Duration};
use tokio_rustls::TlsConnector;

/// The chart's memory limit of a webhook pod.
const POD_MEMORY_LIMIT_KIB: u64 = 256 * 1024;
/// A legitimate review must be answered within this (the chart's webhook timeout is 10 s).
const ANSWER_BOUND: Duration = Duration::from_secs(5);

/// The peak resident set size (`VmHWM`) of process `pid`, in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("process status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status")
}

#[tokio::test]
async fn a_webhook_under_attack_with_large_strings_stays_within_its_memory_limit_and_keeps_answering() {
    under_attack(attack::BodyKind::Padding).await;
}

#[tokio::test]
async fn a_webhook_under_attack_with_dense_json_stays_within_its_memory_limit_and_keeps_answering() {
    under_attack(attack::BodyKind::Dense).await;
}

async fn under_attack(body_kind: attack::BodyKind) {
    // One at a time: each measures a process of its own on a shared machine.
    let _serial = projection_tests::exclusive().await;
    let generated = rcgen::generate_simple_self_signed(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
        .expect("certificate");
    let dir = testenv_dir().join(format!("exhaustion-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("certificate folder");
    let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
    std::fs::write(&cert, generated.cert.pem()).expect("write certificate");
    std::fs::write(&key, generated.signing_key.serialize_pem()).expect("write key");
    let port = free_port();
    let bind = format!("127.0.0.1:{port}");
    let mut webhook = ServiceProcess::start(
        std::path::Path::new(env!("CARGO_BIN_EXE_projection-webhook")),
        &[
            "--bind-address",
            &bind,
            "--tls-cert-file",
            cert.to_str().expect("utf-8 path"),
            "--tls-key-file",
            key.to_str().expect("utf-8 path"),
            "--shutdown-delay",
            "0s",
            // Everything comes from 127.0.0.1 here: as from many pods, the share of one address
            // is not what is measured.
            "--max-connections-per-peer",
            "256",
        ],
    );
    webhook.wait_ready().await;
    let before = peak_rss_kib(webhook.pid());

    let mut roots = rustls::RootCertStore::empty();
    roots.add(generated.cert.der().clone()).expect("trust");
    let mut client =
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
    client.alpn_protocols = vec![b"h2".to_vec()];
    let attack = attack::Attack {
        address: bind.parse().expect("address"),
        server_name: "localhost".into(),
        connections: 16,
        streams_per_connection: 8,
        // Just under the webhook's 4 MiB body limit: each one is read and parsed.
        body_bytes: webhook::handler::MAX_BODY_BYTES - 4096,
        body_kind,
        silent: 50,
        half_headers: 50,
        duration: Duration::from_secs(20),
        probe_every: Duration::from_millis(250),
    };
    let outcome = attack::run(&attack, TlsConnector::from(Arc::new(client))).await;
    let peak = peak_rss_kib(webhook.pid());
    let _ = std::fs::remove_dir_all(&dir);
    let answered: Vec<u16> = outcome.probes.iter().map(|(status, _)| *status).collect();
    eprintln!(
        "{body_kind:?}: peak RSS {} MiB (before the attack {} MiB); large reviews answered {:?}, failed {}; \
         stalled connections closed by the server {}; {} legitimate reviews, slowest {:?}, statuses {:?}",
        peak / 1024,
        before / 1024,
        outcome.large_answered,
        outcome.large_failed,
        outcome.stalled_closed,
        outcome.probes.len(),
        outcome.slowest_probe(),
        answered
            .iter()
            .fold(std::collections::BTreeMap::<u16, usize>::new(), |mut m, s| {
                *m.entry(*s).or_default() += 1;
                m
            }),
    );
    assert!(
        outcome.large_answered.iter().map(|(_, n)| n).sum::<usize>() > 0,
        "the attack never got through to the webhook: it proves nothing"
    );
    assert!(
        peak < POD_MEMORY_LIMIT_KIB,
        "peak RSS {} MiB reached the pod's limit of 256 MiB",
        peak / 1024
    );
    assert!(!outcome.probes.is_empty());
    for (i, (status, took)) in outcome.probes.iter().enumerate() {
        assert!(
            *status != 0,
            "legitimate review {i} got no well-formed answer (after {took:?})"
        );
        assert!(*took <= ANSWER_BOUND, "legitimate review {i} took {took:?}");
    }
    // Large bodies hold at most half the in-flight units: small reviews are never shed by them.
    assert!(
        outcome.probes.iter().all(|(status, _)| *status == 200),
        "a legitimate review was shed: {answered:?}"
    );
}
