//! A plain round-robin TCP balancer, as in front of replicas with no sticky sessions: each new
//! connection goes to the next backend. A client that opens a connection per request (no
//! keep-alive) thus alternates backends on every request.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A running balancer; stops when dropped.
pub struct RoundRobin {
    /// Where clients connect.
    pub addr: SocketAddr,
    /// Connections handed to each backend so far.
    counts: Arc<Vec<AtomicUsize>>,
    task: JoinHandle<()>,
}

impl RoundRobin {
    /// A balancer on a loopback port in front of `backends`.
    pub async fn start(backends: Vec<SocketAddr>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let counts: Arc<Vec<AtomicUsize>> =
            Arc::new(backends.iter().map(|_| AtomicUsize::new(0)).collect());
        let task = tokio::spawn({
            let counts = Arc::clone(&counts);
            async move {
                // Dropped with this task, which aborts every connection it carries.
                let mut connections = tokio::task::JoinSet::new();
                for next in 0.. {
                    let Ok((mut client, _)) = listener.accept().await else {
                        continue;
                    };
                    let _ = client.set_nodelay(true);
                    let which = next % backends.len();
                    counts[which].fetch_add(1, Ordering::SeqCst);
                    let backend = backends[which];
                    while connections.try_join_next().is_some() {}
                    connections.spawn(async move {
                        let Ok(mut server) = TcpStream::connect(backend).await else {
                            return;
                        };
                        let _ = server.set_nodelay(true);
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    });
                }
            }
        });
        Self { addr, counts, task }
    }

    /// How many connections each backend has been given.
    pub fn counts(&self) -> Vec<usize> {
        self.counts
            .iter()
            .map(|count| count.load(Ordering::SeqCst))
            .collect()
    }

    /// The balancer's base URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for RoundRobin {
    fn drop(&mut self) {
        self.task.abort();
    }
}
