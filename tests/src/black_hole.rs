//! A TCP proxy that can black-hole its path: while black-holed it still accepts connections and
//! keeps every connection open, but forwards nothing in either direction, as a peer behind a dead
//! route or a stuck middlebox looks to a client. Restored, it forwards again (bytes held meanwhile
//! included), as TCP would once the route is back; or only for the connections opened from then
//! on, the older ones staying silent for good, as flows look to a client after a NAT or conntrack
//! table lost them. It records when it accepted each connection, so a test sees when a client
//! gave up on its silent connections and opened new ones.

use std::{
    io,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Instant,
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::watch,
    task::{JoinHandle, JoinSet},
};

/// The proxy; stops (dropping every connection) when dropped.
pub struct BlackHoleProxy {
    addr: SocketAddr,
    path: watch::Sender<Path>,
    accepted: Arc<Mutex<Vec<Instant>>>,
    accept_loop: JoinHandle<()>,
}

/// The state of the path, seen by every connection.
#[derive(Clone, Copy)]
struct Path {
    /// Whether anything is forwarded.
    open: bool,
    /// Connections that began forwarding in an earlier epoch than this stay silent for good.
    lost_before: u64,
    /// The epoch a connection that begins forwarding now belongs to.
    epoch: u64,
}

impl Path {
    fn forwards(&self, epoch: u64) -> bool {
        self.open && epoch >= self.lost_before
    }
}

impl BlackHoleProxy {
    /// Listens on an ephemeral loopback port and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let (path, _) = watch::channel(Path {
            open: true,
            lost_before: 0,
            epoch: 0,
        });
        let gate = path.subscribe();
        let accepted = Arc::new(Mutex::new(Vec::new()));
        let record = accepted.clone();
        let accept_loop = tokio::spawn(async move {
            // Owned here, so stopping the loop ends every connection too.
            let mut connections = JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                record.lock().expect("accept record").push(Instant::now());
                connections.spawn(relay(client, upstream, gate.clone()));
            }
        });
        Ok(Self {
            addr,
            path,
            accepted,
            accept_loop,
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops forwarding without closing anything.
    pub fn black_hole(&self) {
        self.path.send_modify(|p| p.open = false);
    }

    /// Forwards again, on every connection.
    pub fn restore(&self) {
        self.path.send_modify(|p| p.open = true);
    }

    /// Forwards again, but only on connections that begin forwarding from now on (those accepted
    /// while black-holed included): the older ones stay silent until their client gives up.
    pub fn restore_new_connections_only(&self) {
        self.path.send_modify(|p| {
            p.epoch += 1;
            p.lost_before = p.epoch;
            p.open = true;
        });
    }

    /// How many connections were accepted at or after `since`, and when the first of them was.
    pub fn accepted_since(&self, since: Instant) -> (usize, Option<Instant>) {
        let accepted = self.accepted.lock().expect("accept record");
        let mut later = accepted.iter().filter(|at| **at >= since);
        let first = later.next().copied();
        (first.map_or(0, |_| 1 + later.count()), first)
    }
}

impl Drop for BlackHoleProxy {
    fn drop(&mut self) {
        self.accept_loop.abort();
    }
}

async fn relay(client: TcpStream, upstream: SocketAddr, mut gate: watch::Receiver<Path>) {
    // A connection accepted while black-holed waits, unanswered, for the path to return.
    let Ok(path) = gate.wait_for(|p| p.open).await.map(|p| *p) else {
        return;
    };
    let epoch = path.epoch;
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let up = pump(&mut client_read, &mut server_write, gate.clone(), epoch);
    let down = pump(&mut server_read, &mut client_write, gate, epoch);
    // Either side closing ends the relay (and closes the other side).
    tokio::select! {
        _ = up => {}
        _ = down => {}
    }
}

async fn pump(
    from: &mut (impl AsyncReadExt + Unpin),
    to: &mut (impl AsyncWriteExt + Unpin),
    mut gate: watch::Receiver<Path>,
    epoch: u64,
) -> io::Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        // Neither reads nor writes while black-holed: the sender's bytes stay unacknowledged
        // above the socket, the receiver sees nothing, and neither sees the connection close.
        if gate.wait_for(|p| p.forwards(epoch)).await.is_err() {
            return Ok(());
        }
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        if gate.wait_for(|p| p.forwards(epoch)).await.is_err() {
            return Ok(());
        }
        to.write_all(&buf[..n]).await?;
    }
}
