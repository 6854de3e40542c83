//! What the node daemon's and the drive server's HTTP ports share: binding the address
//! before the process reports itself started (a port in use is an error at startup, not a
//! log line later), a thread with its own small runtime so that nothing served there
//! competes with the I/O path's threads, the OpenMetrics encoding of a registry, and the
//! JSON 404 for paths that are not served.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{anyhow, Context, Result};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use prometheus_client::registry::Registry;

pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Binds `value` (IP:PORT). `remedy` says how to choose another address, for the error.
pub fn bind(value: &str, what: &str, remedy: &str) -> Result<std::net::TcpListener> {
    let addr: SocketAddr = value
        .parse()
        .map_err(|_| anyhow!("{what} `{value}` is not IP:PORT"))?;
    let listener = std::net::TcpListener::bind(addr).with_context(|| {
        format!("cannot serve HTTP on {addr} ({what}): is another program using the port? {remedy}")
    })?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// Serves `app` on `listener` from a thread of its own until the process ends.
pub fn spawn(listener: std::net::TcpListener, app: axum::Router) -> Result<SocketAddr> {
    let bound = listener.local_addr()?;
    std::thread::Builder::new()
        .name("http".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_io()
                .max_blocking_threads(4)
                .build()
            {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!("HTTP server: cannot start its runtime: {e}");
                    return;
                }
            };
            runtime.block_on(async move {
                let listener = match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => l,
                    Err(e) => {
                        tracing::error!("HTTP server on {bound}: {e}");
                        return;
                    }
                };
                if let Err(e) = axum::serve(listener, app).await {
                    tracing::error!("HTTP server on {bound} stopped: {e}");
                }
            });
        })?;
    Ok(bound)
}

/// One scrape of `registry` in the OpenMetrics text format.
pub fn metrics_response(registry: &Arc<Registry>) -> Response {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, registry) {
        Ok(()) => (StatusCode::OK, [(header::CONTENT_TYPE, OPENMETRICS)], body).into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            format!("encoding the metrics failed: {e}\n"),
        )
            .into_response(),
    }
}

/// A 404 with a JSON body that names the path and what is served instead.
pub fn not_found(path: &str, served: &str) -> Response {
    let body = serde_json::json!({
        "error": format!("no such path: {path}; this server serves {served}"),
    });
    (StatusCode::NOT_FOUND, axum::Json(body)).into_response()
}
