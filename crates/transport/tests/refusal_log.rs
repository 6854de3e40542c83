//! The server logs every refused connection as a warning that names the peer's address and
//! the reason, so an admin can find the misconfigured node from the server's log alone.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};

use common::{accept_one, cluster_pair, refused_connect, TIMEOUT};
use tessera_transport::{ClusterSecret, TransportError};

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Current-thread runtime: the accept task runs on this thread, under this subscriber.
#[tokio::test(flavor = "current_thread")]
async fn refusals_are_logged_with_the_peer_address_and_reason() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let (server_identity, mut client_identity) = cluster_pair();
    client_identity.secret = ClusterSecret::generate();
    let (addr, accepted) = accept_one(server_identity, TIMEOUT).await;
    let error = refused_connect(addr, &client_identity).await;
    assert!(
        matches!(error, TransportError::AuthenticationFailed { .. }),
        "{error}"
    );
    let server_error = accepted.await.unwrap().unwrap_err();
    let TransportError::AuthenticationFailed { peer } = server_error else {
        panic!("expected an authentication failure, got {server_error}");
    };
    let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(log.contains("WARN"), "{log}");
    assert!(log.contains("refused a connection"), "{log}");
    assert!(log.contains("does not hold this cluster's secret"), "{log}");
    assert!(log.contains(&peer.to_string()), "peer {peer} not in {log}");
}
