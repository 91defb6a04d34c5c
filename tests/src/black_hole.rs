//! A TCP proxy that can black-hole its path: while black-holed it still accepts connections and
//! keeps every connection open, but forwards nothing in either direction, as a peer behind a dead
//! route or a stuck middlebox looks to a client. Restored, it forwards again (bytes held meanwhile
//! included), as TCP would once the route is back.

use std::{io, net::SocketAddr};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::watch,
    task::{JoinHandle, JoinSet},
};

/// The proxy; stops (dropping every connection) when dropped.
pub struct BlackHoleProxy {
    addr: SocketAddr,
    forwarding: watch::Sender<bool>,
    accept_loop: JoinHandle<()>,
}

impl BlackHoleProxy {
    /// Listens on an ephemeral loopback port and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let (forwarding, _) = watch::channel(true);
        let gate = forwarding.subscribe();
        let accept_loop = tokio::spawn(async move {
            // Owned here, so stopping the loop ends every connection too.
            let mut connections = JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                connections.spawn(relay(client, upstream, gate.clone()));
            }
        });
        Ok(Self {
            addr,
            forwarding,
            accept_loop,
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops forwarding without closing anything.
    pub fn black_hole(&self) {
        self.forwarding.send_replace(false);
    }

    /// Forwards again.
    pub fn restore(&self) {
        self.forwarding.send_replace(true);
    }
}

impl Drop for BlackHoleProxy {
    fn drop(&mut self) {
        self.accept_loop.abort();
    }
}

async fn relay(client: TcpStream, upstream: SocketAddr, mut gate: watch::Receiver<bool>) {
    // A connection accepted while black-holed waits, unanswered, for the path to return.
    if gate.wait_for(|open| *open).await.is_err() {
        return;
    }
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let up = pump(&mut client_read, &mut server_write, gate.clone());
    let down = pump(&mut server_read, &mut client_write, gate);
    // Either side closing ends the relay (and closes the other side).
    tokio::select! {
        _ = up => {}
        _ = down => {}
    }
}

async fn pump(
    from: &mut (impl AsyncReadExt + Unpin),
    to: &mut (impl AsyncWriteExt + Unpin),
    mut gate: watch::Receiver<bool>,
) -> io::Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        // Neither reads nor writes while black-holed: the sender's bytes stay unacknowledged
        // above the socket, the receiver sees nothing, and neither sees the connection close.
        if gate.wait_for(|open| *open).await.is_err() {
            return Ok(());
        }
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        if gate.wait_for(|open| *open).await.is_err() {
            return Ok(());
        }
        to.write_all(&buf[..n]).await?;
    }
}
