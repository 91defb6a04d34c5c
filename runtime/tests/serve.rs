//! The metrics and probe servers (`runtime::http::serve`, plain HTTP) run with the limits of
//! `runtime::serve::Limits::PROBES`: a client that stalls in its headers, over HTTP/1.1 or HTTP/2
//! (prior knowledge), is let go, and others are answered meanwhile.

use prometheus_client::registry::Registry;
use runtime::http::{Readiness, serve};
use std::{sync::Arc, time::Duration};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};
use tokio_util::sync::CancellationToken;

/// Starts the probe server on a free loopback port; its address.
async fn probes() -> (std::net::SocketAddr, CancellationToken) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().expect("address");
    let stop = CancellationToken::new();
    let readiness = Readiness::default();
    readiness.set(true);
    tokio::spawn(
        serve(
            (None, None),
            Some(addr),
            Arc::new(Registry::default()),
            readiness,
            stop.clone().cancelled_owned(),
        )
        .await
        .expect("the probe address binds"),
    );
    // Wait until it listens.
    for _ in 0..200 {
        if TcpStream::connect(addr).await.is_ok() {
            return (addr, stop);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the probe server never listened");
}

#[tokio::test]
async fn a_taken_address_is_an_error_naming_it_before_anything_is_served() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let addr = taken.local_addr().expect("its address");
    let free: std::net::SocketAddr = "127.0.0.1:0".parse().expect("address");
    for (metrics, probes, purpose) in [
        (Some(addr), Some(free), "the metrics"),
        (Some(free), Some(addr), "the probes"),
        (Some(addr), Some(addr), "the metrics and probes"),
    ] {
        let error = match serve(
            (metrics, None),
            probes,
            Arc::new(Registry::default()),
            Readiness::default(),
            CancellationToken::new().cancelled_owned(),
        )
        .await
        {
            Ok(_) => panic!("{purpose}: bound {addr}, which another listener holds"),
            Err(e) => format!("{e:#}"),
        };
        assert!(
            error.starts_with(&format!("cannot listen on {addr} for {purpose}: ")),
            "{error}"
        );
    }
}

/// Reads until the server closes; `None` if it is still open after `limit`.
async fn closed_within(stream: &mut TcpStream, limit: Duration) -> Option<Vec<u8>> {
    let mut received = Vec::new();
    tokio::time::timeout(limit, stream.read_to_end(&mut received))
        .await
        .ok()
        .map(|_| received)
}

async fn healthz(addr: std::net::SocketAddr) -> String {
    let mut tcp = TcpStream::connect(addr).await.expect("connect");
    tcp.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .expect("request");
    let answer = closed_within(&mut tcp, Duration::from_secs(10))
        .await
        .expect("answered and closed");
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test]
async fn stalled_http1_and_http2_clients_are_let_go_and_others_answered() {
    let (addr, stop) = probes().await;
    let mut half_http1 = TcpStream::connect(addr).await.expect("connect");
    half_http1
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nuser-")
        .await
        .expect("half a request");
    let mut half_http2 = TcpStream::connect(addr).await.expect("connect");
    let mut frames = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    frames.extend_from_slice(&[0, 0, 0, 0x4, 0, 0, 0, 0, 0]);
    // HEADERS without END_HEADERS: the block is never finished.
    frames.extend_from_slice(&[0, 0, 3, 0x1, 0, 0, 0, 0, 1, 0x82, 0x86, 0x84]);
    half_http2.write_all(&frames).await.expect("half a header block");
    let mut silent = TcpStream::connect(addr).await.expect("connect");

    assert!(
        healthz(addr).await.starts_with("HTTP/1.1 200"),
        "others are answered"
    );
    // PROBES: 5 s for the first request's headers, then 5 s to close.
    for (what, stream) in [
        ("HTTP/1.1 half request", &mut half_http1),
        ("HTTP/2 half header block", &mut half_http2),
        ("silent connection", &mut silent),
    ] {
        assert!(
            closed_within(stream, Duration::from_secs(30)).await.is_some(),
            "{what}: never let go"
        );
    }
    stop.cancel();
}
