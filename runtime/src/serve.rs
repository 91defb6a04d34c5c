//! The accept loop every server of ours runs (the webhook's HTTPS admission server, the metrics and
//! probe servers of both services): HTTP/1.1 or HTTP/2 (hyper-util's auto builder) over any stream
//! a handshake makes of the TCP connection (TLS, or the TCP stream itself), with limits that keep a
//! misbehaving or hostile client from holding the process's memory or slots:
//!
//! - at most `max_connections` connections at once; beyond that the loop stops accepting, so new
//!   connections wait in the kernel's listen queue until one ends (they cost no memory of ours);
//! - at most `max_connections_per_peer` of them from one IP address: a connection beyond that is
//!   closed at once, so one client (a pod) cannot take every slot from the others (the apiserver);
//! - the handshake and the first request must arrive within `header_timeout`, and HTTP/1.1 request
//!   headers within it too (hyper's own timer);
//! - a connection with no request in flight for `idle_timeout` is closed (HTTP/2: GOAWAY), which also
//!   ends an HTTP/2 client that stopped in the middle of a header block (no request is dispatched
//!   until the block is complete, so such a connection counts as idle);
//! - HTTP/2: bounded concurrent streams, header list size, reset streams and flow-control windows,
//!   and keep-alive pings to notice peers that vanished;
//! - a connection asked to close that does not finish within `header_timeout` is dropped.
//!
//! Request bodies are not read here: each handler bounds its own body in size and time.

use axum::Router;
use hyper::{Request, body::Incoming};
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::conn::auto::Builder,
    service::TowerToHyperService,
};
use std::{
    future::Future,
    net::{IpAddr, SocketAddr},
    sync::Arc,
    time::Duration,
};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::{TcpListener, TcpStream},
    sync::{Semaphore, watch},
};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

/// The limits of one server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once; more wait in the listen queue.
    pub max_connections: usize,
    /// Connections served at once from one IP address; more are closed at once.
    pub max_connections_per_peer: usize,
    /// Time for the handshake and the first request's headers, and for any HTTP/1.1 request's
    /// headers once it has started; also the grace a closing connection gets.
    pub header_timeout: Duration,
    /// A connection with no request in flight for this long is closed.
    pub idle_timeout: Duration,
    /// HTTP/2 streams one connection may have open at once.
    pub max_concurrent_streams: u32,
    /// HTTP/2 keep-alive: a PING after this long without a frame from the peer ...
    pub keep_alive_interval: Duration,
    /// ... which must be answered within this long, or the connection is closed.
    pub keep_alive_timeout: Duration,
    /// Largest header list (HTTP/2, decoded) of a request, in bytes.
    pub max_header_list_size: u32,
    /// HTTP/2 streams a client may open and reset before they were answered, before the connection
    /// is closed (the "rapid reset" attack).
    pub max_pending_reset_streams: usize,
    /// HTTP/2 flow-control windows: how much request body a client may send ahead of the handler
    /// reading it, per stream and per connection. This is what the server buffers per connection at
    /// most, beyond the requests being handled.
    pub stream_window_bytes: u32,
    /// See `stream_window_bytes`.
    pub connection_window_bytes: u32,
}

impl Limits {
    /// The metrics and probe servers: a scraper and the kubelet, each with a connection or two, and
    /// tiny GET requests.
    pub const PROBES: Self = Self {
        max_connections: 32,
        max_connections_per_peer: 16,
        header_timeout: Duration::from_secs(5),
        idle_timeout: Duration::from_secs(60),
        max_concurrent_streams: 8,
        keep_alive_interval: Duration::from_secs(30),
        keep_alive_timeout: Duration::from_secs(10),
        max_header_list_size: 16 * 1024,
        max_pending_reset_streams: 8,
        stream_window_bytes: 64 * 1024,
        connection_window_bytes: 64 * 1024,
    };

    /// How long a connection may go on with `active` requests in flight after having served
    /// `served` of them, before it is closed as idle: `None` while a request is in flight (each
    /// request is bounded by its handler), the header timeout before the first request, the idle
    /// timeout after one.
    pub fn idle_limit(&self, active: usize, served: u64) -> Option<Duration> {
        match (active, served) {
            (1.., _) => None,
            (0, 0) => Some(self.header_timeout),
            (0, _) => Some(self.idle_timeout),
        }
    }

    fn builder(&self) -> Builder<TokioExecutor> {
        let mut builder = Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(self.header_timeout)
            .max_buf_size(64 * 1024);
        builder
            .http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(self.max_concurrent_streams)
            .keep_alive_interval(self.keep_alive_interval)
            .keep_alive_timeout(self.keep_alive_timeout)
            .max_header_list_size(self.max_header_list_size)
            .max_pending_accept_reset_streams(self.max_pending_reset_streams)
            .max_local_error_reset_streams(self.max_pending_reset_streams)
            .initial_stream_window_size(self.stream_window_bytes)
            .initial_connection_window_size(self.connection_window_bytes)
            .max_send_buf_size(256 * 1024);
        builder
    }
}

/// The connections served per peer address.
#[derive(Debug, Default)]
struct Peers(std::sync::Mutex<std::collections::HashMap<IpAddr, usize>>);

/// One connection's place in [`Peers`], given back when dropped.
struct PeerSlot(Arc<Peers>, IpAddr);

impl Peers {
    /// A place for a connection from `ip`, unless it already has `max`.
    fn enter(self: &Arc<Self>, ip: IpAddr, max: usize) -> Option<PeerSlot> {
        let mut peers = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let count = peers.entry(ip).or_default();
        if *count >= max {
            return None;
        }
        *count += 1;
        Some(PeerSlot(self.clone(), ip))
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut peers = (self.0)
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(count) = peers.get_mut(&self.1) {
            *count -= 1;
            if *count == 0 {
                peers.remove(&self.1);
            }
        }
    }
}

/// Requests in flight on one connection, and how many it has served.
#[derive(Clone, Copy, Debug, Default)]
struct Activity {
    active: usize,
    served: u64,
}

/// Ends a request's count when its handler finishes (or is dropped).
struct InFlight(Arc<watch::Sender<Activity>>);

impl InFlight {
    fn start(activity: &Arc<watch::Sender<Activity>>) -> Self {
        activity.send_modify(|a| {
            a.active += 1;
            a.served += 1;
        });
        Self(activity.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.send_modify(|a| a.active -= 1);
    }
}

/// Serves `app` on `listener` until `shutdown` resolves, then closes every connection gracefully
/// (in-flight requests finish; idle ones close at once) and waits up to `drain_timeout` for them.
///
/// `handshake` turns each accepted TCP connection into the stream HTTP is spoken over, plus a value
/// every request of that connection carries as an extension (e.g. who the TLS client proved to
/// be); `None` drops the connection. It runs within `limits.header_timeout`.
pub async fn serve<H, Fut, Io, Ext>(
    listener: TcpListener,
    limits: Limits,
    handshake: H,
    app: Router,
    shutdown: impl Future<Output = ()>,
    drain_timeout: Duration,
) where
    H: Fn(TcpStream, SocketAddr) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Option<(Io, Ext)>> + Send + 'static,
    Io: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    Ext: Clone + Send + Sync + 'static,
{
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let peers = Arc::new(Peers::default());
    let builder = limits.builder();
    let closing = CancellationToken::new();
    tokio::pin!(shutdown);
    loop {
        // A slot first: at the cap, new connections stay in the kernel's queue, not in our memory.
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break, // never closed
            },
            () = &mut shutdown => break,
        };
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Usually EMFILE: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Some(peer_slot) = peers.enter(peer.ip(), limits.max_connections_per_peer) else {
            tracing::debug!(%peer, "too many connections from this address; closed");
            continue; // drops the connection and the slot
        };
        let (handshake, app, builder, closing) =
            (handshake.clone(), app.clone(), builder.clone(), closing.clone());
        tokio::spawn(async move {
            let _slots = (slot, peer_slot);
            let Ok(Some((io, ext))) = tokio::time::timeout(limits.header_timeout, handshake(tcp, peer)).await
            else {
                return tracing::debug!(%peer, "handshake failed or timed out");
            };
            connection(io, ext, peer, limits, &builder, app, closing).await;
        });
    }
    drop(listener);
    closing.cancel();
    // Every connection gives its slot back when it ends.
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    tokio::select! {
        _ = slots.acquire_many(all) => tracing::info!("in-flight requests drained"),
        () = tokio::time::sleep(drain_timeout) => tracing::warn!(?drain_timeout, "drain timeout; closing remaining connections"),
    }
}

/// Serves one connection until it ends, is idle too long, or the server closes.
async fn connection<Io, Ext>(
    io: Io,
    ext: Ext,
    peer: SocketAddr,
    limits: Limits,
    builder: &Builder<TokioExecutor>,
    app: Router,
    closing: CancellationToken,
) where
    Io: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    Ext: Clone + Send + Sync + 'static,
{
    let activity = Arc::new(watch::Sender::new(Activity::default()));
    let counted = activity.clone();
    let service = tower::service_fn(move |mut request: Request<Incoming>| {
        request.extensions_mut().insert(ext.clone());
        let in_flight = InFlight::start(&counted);
        let response = app.clone().oneshot(request);
        async move {
            let response = response.await;
            drop(in_flight);
            response
        }
    });
    let connection = builder.serve_connection(TokioIo::new(io), TowerToHyperService::new(service));
    tokio::pin!(connection);
    let mut changes = activity.subscribe();
    let grace = loop {
        let now = *changes.borrow_and_update();
        let idle = async {
            match limits.idle_limit(now.active, now.served) {
                Some(limit) => tokio::time::sleep(limit).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            ended = &mut connection => {
                if let Err(e) = ended {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
                return;
            }
            _ = changes.changed() => {}
            () = idle => {
                tracing::debug!(%peer, served = now.served, "closing an idle connection");
                break limits.header_timeout;
            }
            () = closing.cancelled() => break Duration::MAX,
        }
    };
    connection.as_mut().graceful_shutdown();
    // In-flight requests finish; a peer that does not let go is dropped (on shutdown, the drain
    // timeout of `serve` ends the process instead).
    let _ = tokio::time::timeout(grace, connection).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_peer_gets_at_most_its_share_and_gets_it_back() {
        let peers = Arc::new(Peers::default());
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let first = peers.enter(a, 2).expect("1 of 2");
        let _second = peers.enter(a, 2).expect("2 of 2");
        assert!(peers.enter(a, 2).is_none(), "a third from the same address");
        let _other = peers.enter(b, 2).expect("another address has its own share");
        drop(first);
        let _again = peers.enter(a, 2).expect("a place given back");
        drop((_second, _again, _other));
        assert!(peers.0.lock().unwrap().is_empty(), "no entry left for gone peers");
    }

    #[test]
    fn a_connection_is_idle_only_without_a_request_in_flight() {
        let limits = Limits {
            header_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(60),
            ..Limits::PROBES
        };
        assert_eq!(
            limits.idle_limit(0, 0),
            Some(Duration::from_secs(5)),
            "before the first request"
        );
        assert_eq!(limits.idle_limit(1, 1), None, "a request in flight");
        assert_eq!(limits.idle_limit(3, 10), None);
        assert_eq!(
            limits.idle_limit(0, 1),
            Some(Duration::from_secs(60)),
            "between requests"
        );
    }
}
