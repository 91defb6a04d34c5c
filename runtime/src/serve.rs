//! The accept loop every server of ours runs (the webhook's HTTPS admission server, the metrics and
//! probe servers of both services): HTTP/1.1 or HTTP/2 (hyper-util's auto builder) over any stream
//! a handshake makes of the TCP connection (TLS, or the TCP stream itself), with limits that keep a
//! misbehaving or hostile client from holding the process's memory or slots:
//!
//! - at most `max_connections` connections at once; beyond that the loop stops accepting, so new
//!   connections wait in the kernel's listen queue until one ends (they cost no memory of ours);
//! - `reserved_connections` of them only for the apiserver's addresses (`apiserver`, when known):
//!   while only that room is left, a connection from any other address is closed at once, so
//!   clients from many addresses (many pods) cannot take every connection from the apiserver;
//! - at most `max_connections_per_peer` of them from one IP address other than the apiserver's: a
//!   connection beyond that is closed at once, so one client (a pod) cannot take every slot from
//!   the others;
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
//!
//! Every limit hit is counted in a [`LimitHits`] family (label `limit`, a fixed set), except the
//! HTTP/2 stream limit, which the client obeys on its side (it waits for a stream to end).

use crate::cidr::{Cidr, any_contains};
use axum::Router;
use hyper::{Request, body::Incoming};
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::conn::auto::Builder,
    service::TowerToHyperService,
};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
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
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once; more wait in the listen queue.
    pub max_connections: usize,
    /// Connections served at once from one IP address (other than the apiserver's); more are
    /// closed at once.
    pub max_connections_per_peer: usize,
    /// The apiserver's addresses: no share per address for them (the apiserver may come through
    /// one proxy address), and `reserved_connections` kept for them.
    pub apiserver: Vec<Cidr>,
    /// Connections of `max_connections` only the `apiserver` addresses may use (none when no
    /// address is listed); at most all but one.
    pub reserved_connections: usize,
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
        apiserver: Vec::new(),
        reserved_connections: 0,
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

    /// How the cap is split: connections anyone may use, and those only the apiserver may.
    pub fn pools(&self) -> (usize, usize) {
        let total = self.max_connections.max(1);
        let reserved = if self.apiserver.is_empty() {
            0
        } else {
            self.reserved_connections.min(total - 1)
        };
        (total - reserved, reserved)
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

/// Where a new connection goes, given who it comes from and the room left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Served with a connection of the apiserver's reserved room.
    Reserved,
    /// Served with a connection anyone may use.
    General,
    /// Closed at once; the [`LimitLabels::limit`] it counts as.
    Closed(&'static str),
}

/// The decision for a connection from an address that is the apiserver's (`from_apiserver`) or
/// already has `peer_connections` connections, while `general_free` and `reserved_free` say which
/// room is left: the apiserver takes its reserved room first, then any; others take only the
/// room anyone may use, within their address's share.
pub fn admit(
    limits: &Limits,
    from_apiserver: bool,
    peer_connections: usize,
    general_free: bool,
    reserved_free: bool,
) -> Admission {
    match (from_apiserver, general_free, reserved_free) {
        (true, _, true) => Admission::Reserved,
        (true, true, false) => Admission::General,
        (true, false, false) => Admission::Closed(LIMIT_CONNECTIONS),
        (false, ..) if peer_connections >= limits.max_connections_per_peer => {
            Admission::Closed(LIMIT_PEER_SHARE)
        }
        (false, true, _) => Admission::General,
        (false, false, _) => Admission::Closed(LIMIT_RESERVED),
    }
}

/// `limit` counted each time the accept loop found the cap reached (new connections then wait in
/// the listen queue).
pub const LIMIT_CONNECTIONS: &str = "connections";
/// ... closed because its address had used its share.
pub const LIMIT_PEER_SHARE: &str = "connections_per_peer";
/// ... closed because only the apiserver's reserved room was left.
pub const LIMIT_RESERVED: &str = "reserved_for_apiserver";
/// ... closed because its TLS handshake did not finish within the header timeout.
pub const LIMIT_HANDSHAKE: &str = "handshake_timeout";
/// ... closed because its first request's headers did not arrive within the header timeout.
pub const LIMIT_HEADER: &str = "header_timeout";
/// ... closed after the idle timeout without a request in flight.
pub const LIMIT_IDLE: &str = "idle_timeout";

/// Labels of [`LimitHits`].
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitLabels {
    /// Which limit: one of the `LIMIT_*` constants of this module, or a handler's own.
    pub limit: &'static str,
}

/// How often each limit was hit.
pub type LimitHits = Family<LimitLabels, Counter>;

fn hit(hits: &LimitHits, limit: &'static str) {
    hits.get_or_create(&LimitLabels { limit }).inc();
}

/// The connections served per peer address.
#[derive(Debug, Default)]
struct Peers(std::sync::Mutex<std::collections::HashMap<IpAddr, usize>>);

/// One connection's place in [`Peers`], given back when dropped.
struct PeerSlot(Arc<Peers>, IpAddr, usize);

impl Peers {
    /// A place for a connection from `ip`, counted until dropped.
    fn enter(self: &Arc<Self>, ip: IpAddr) -> PeerSlot {
        let mut peers = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let count = peers.entry(ip).or_default();
        *count += 1;
        PeerSlot(self.clone(), ip, *count)
    }
}

impl PeerSlot {
    /// The connections from this address when this one arrived, itself included.
    fn count(&self) -> usize {
        self.2
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
    hits: LimitHits,
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
    let (general_room, reserved_room) = limits.pools();
    let general = Arc::new(Semaphore::new(general_room));
    let reserved = Arc::new(Semaphore::new(reserved_room));
    let peers = Arc::new(Peers::default());
    let builder = limits.builder();
    let limits = Arc::new(limits);
    let closing = CancellationToken::new();
    tokio::pin!(shutdown);
    loop {
        // Room first (of either kind): at the cap, new connections stay in the kernel's queue, not
        // in our memory. Only this loop takes room, so what it sees free stays free until it takes it.
        if general.available_permits() == 0 && reserved.available_permits() == 0 {
            hit(&hits, LIMIT_CONNECTIONS);
        }
        tokio::select! {
            () = &mut shutdown => break,
            room = general.acquire() => drop(room),
            room = reserved.acquire() => drop(room),
        }
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
        let from_apiserver = any_contains(&limits.apiserver, peer.ip());
        let peer_slot = peers.enter(peer.ip());
        let admission = admit(
            &limits,
            from_apiserver,
            peer_slot.count() - 1,
            general.available_permits() > 0,
            reserved.available_permits() > 0,
        );
        let slot = match admission {
            Admission::Reserved => reserved.clone().try_acquire_owned(),
            Admission::General => general.clone().try_acquire_owned(),
            Admission::Closed(limit) => {
                hit(&hits, limit);
                tracing::debug!(%peer, limit, "connection closed at once");
                continue; // drops the connection and the peer's place
            }
        };
        let Ok(slot) = slot else {
            continue; // not reached: only this loop takes room
        };
        let (handshake, app, builder, closing, limits, hits) = (
            handshake.clone(),
            app.clone(),
            builder.clone(),
            closing.clone(),
            limits.clone(),
            hits.clone(),
        );
        tokio::spawn(async move {
            let _slots = (slot, peer_slot);
            let handshaken = tokio::time::timeout(limits.header_timeout, handshake(tcp, peer)).await;
            let Ok(Some((io, ext))) = handshaken else {
                // A failed handshake (garbage, a client that gave up) is no limit's doing.
                if handshaken.is_err() {
                    hit(&hits, LIMIT_HANDSHAKE);
                }
                return tracing::debug!(%peer, "handshake failed or timed out");
            };
            connection(io, ext, peer, &limits, &hits, &builder, app, closing).await;
        });
    }
    drop(listener);
    closing.cancel();
    // Every connection gives its room back when it ends.
    let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    let all = async {
        let _ = general.acquire_many(count(general_room)).await;
        let _ = reserved.acquire_many(count(reserved_room)).await;
    };
    tokio::select! {
        () = all => tracing::info!("in-flight requests drained"),
        () = tokio::time::sleep(drain_timeout) => tracing::warn!(?drain_timeout, "drain timeout; closing remaining connections"),
    }
}

/// Serves one connection until it ends, is idle too long, or the server closes.
#[allow(clippy::too_many_arguments)]
async fn connection<Io, Ext>(
    io: Io,
    ext: Ext,
    peer: SocketAddr,
    limits: &Limits,
    hits: &LimitHits,
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
                hit(hits, if now.served == 0 { LIMIT_HEADER } else { LIMIT_IDLE });
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
    fn each_peer_is_counted_and_gives_its_place_back() {
        let peers = Arc::new(Peers::default());
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let first = peers.enter(a);
        let second = peers.enter(a);
        assert_eq!((first.count(), second.count()), (1, 2));
        assert_eq!(peers.enter(b).count(), 1, "another address is counted on its own");
        drop(first);
        assert_eq!(peers.enter(a).count(), 2, "a place given back");
        drop(second);
        assert!(peers.0.lock().unwrap().is_empty(), "no entry left for gone peers");
    }

    #[test]
    fn the_apiserver_keeps_its_reserved_room_and_has_no_share_per_address() {
        let limits = Limits {
            max_connections: 10,
            max_connections_per_peer: 3,
            apiserver: vec!["198.18.0.1".parse().unwrap()],
            reserved_connections: 4,
            ..Limits::PROBES
        };
        assert_eq!(limits.pools(), (6, 4));
        use Admission::*;
        for (from_apiserver, peer, general, reserved, expected) in [
            // The apiserver: its own room first, then anyone's; never its address's share.
            (true, 0, true, true, Reserved),
            (true, 50, true, true, Reserved),
            (true, 50, true, false, General),
            (true, 0, false, false, Closed(LIMIT_CONNECTIONS)),
            // Anyone else: anyone's room, within its share; never the apiserver's.
            (false, 0, true, true, General),
            (false, 2, true, true, General),
            (false, 3, true, true, Closed(LIMIT_PEER_SHARE)),
            (false, 0, false, true, Closed(LIMIT_RESERVED)),
        ] {
            assert_eq!(
                admit(&limits, from_apiserver, peer, general, reserved),
                expected,
                "apiserver {from_apiserver}, {peer} connections, room {general}/{reserved}"
            );
        }
        // Nothing is reserved for an apiserver whose addresses are unknown, and never everything.
        let unknown = Limits {
            apiserver: Vec::new(),
            ..limits.clone()
        };
        assert_eq!(unknown.pools(), (10, 0));
        let greedy = Limits {
            reserved_connections: 99,
            ..limits
        };
        assert_eq!(greedy.pools(), (1, 9));
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
