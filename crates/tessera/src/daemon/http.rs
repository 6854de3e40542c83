//! The daemon's HTTP port (`metricsAddress`, a per-node parameter, `no` by default): the
//! Prometheus metrics at `/metrics`, the read-only JSON API at `/api/v1/...` and the web
//! dashboard at `/`, whose assets are compiled into the binary so that it works on a
//! cluster without internet access.
//!
//! Everything served is read-only: every route is a GET, no API path maps to a request
//! that changes state (the mapping in `api` is a closed list), and other methods get 405.
//! Unknown paths get a 404 with a JSON body.
//!
//! Off by default: a fixed default port would collide between daemons of one host (tests,
//! several one-node clusters), and an admin who wants the port names the address
//! (`127.0.0.1:9710` keeps it on the host, `0.0.0.0:9710` offers it to the network).
//!
//! The server runs on its own thread and its own single-threaded runtime (`http_server`);
//! API requests that read the configuration or the arrays run on that runtime's blocking
//! pool, so a slow one never stalls a scrape, and nothing here touches the I/O path.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Result;
use axum::extract::{Path, Query};
use axum::http::{header, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::registry::Registry;

use super::api::ApiError;
use super::{metrics, Daemon};
use crate::http_server;

/// Starts the HTTP server if this node's `metricsAddress` names an address. The address
/// is bound before this returns, so a port in use stops the daemon's start with an error
/// that says what to do.
pub(super) fn start(daemon: &Arc<Daemon>) -> Result<Option<SocketAddr>> {
    let value = daemon
        .member
        .state()
        .params
        .get("metricsAddress", Some(daemon.member.me()));
    if value == "no" {
        return Ok(None);
    }
    let remedy = format!(
        "choose another with `tessera config set metricsAddress=IP:PORT -N {}` or turn it off \
         with `metricsAddress=no`, then start again",
        daemon.cluster.node_name
    );
    let listener = http_server::bind(&value, "metricsAddress", &remedy)?;
    let app = router(Arc::clone(daemon), Arc::new(metrics::registry(daemon)));
    let bound = http_server::spawn(listener, app)?;
    tracing::info!(
        "serving Prometheus metrics on http://{bound}/metrics, the API on \
         http://{bound}/api/v1 and the dashboard on http://{bound}/"
    );
    Ok(Some(bound))
}

/// The dashboard's files, compiled in.
const ASSETS: &[(&str, &str, &[u8])] = &[
    (
        "index.html",
        "text/html; charset=utf-8",
        include_bytes!("../../assets/dashboard/index.html"),
    ),
    (
        "dashboard.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../../assets/dashboard/dashboard.js"),
    ),
    (
        "dashboard.css",
        "text/css; charset=utf-8",
        include_bytes!("../../assets/dashboard/dashboard.css"),
    ),
    (
        "uPlot.iife.min.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../../assets/dashboard/uPlot.iife.min.js"),
    ),
    (
        "uPlot.min.css",
        "text/css; charset=utf-8",
        include_bytes!("../../assets/dashboard/uPlot.min.css"),
    ),
];

fn asset(name: &str) -> Response {
    match ASSETS.iter().find(|(n, _, _)| *n == name) {
        Some((_, kind, body)) => ([(header::CONTENT_TYPE, *kind)], *body).into_response(),
        None => not_found(&format!("/dashboard/{name}")),
    }
}

fn not_found(path: &str) -> Response {
    http_server::not_found(path, "/metrics, /api/v1 and the dashboard at /")
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, message) = match self {
            ApiError::NotFound(m) => (StatusCode::NOT_FOUND, m),
            ApiError::Conflict(m) => (StatusCode::CONFLICT, m),
            ApiError::BadRequest(m) => (StatusCode::BAD_REQUEST, m),
            ApiError::Failed(m) => (StatusCode::INTERNAL_SERVER_ERROR, m),
        };
        (status, axum::Json(serde_json::json!({ "error": message }))).into_response()
    }
}

async fn api(daemon: Arc<Daemon>, path: String, query: HashMap<String, String>) -> Response {
    let answer = tokio::task::spawn_blocking(move || daemon.api_get(&path, &query)).await;
    match answer {
        Ok(Ok(value)) => axum::Json(value).into_response(),
        Ok(Err(e)) => e.into_response(),
        Err(e) => ApiError::Failed(format!("the request failed: {e}")).into_response(),
    }
}

fn router(daemon: Arc<Daemon>, registry: Arc<Registry>) -> axum::Router {
    let for_root = Arc::clone(&daemon);
    axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let registry = Arc::clone(&registry);
                // Encoded on a blocking thread: a client mount's free space is its file
                // system manager's answer over the node transport, which blocks.
                async move {
                    tokio::task::spawn_blocking(move || http_server::metrics_response(&registry))
                        .await
                        .unwrap_or_else(|e| {
                            ApiError::Failed(format!("encoding the metrics failed: {e}"))
                                .into_response()
                        })
                }
            }),
        )
        .route("/", get(|| async { asset("index.html") }))
        .route(
            "/dashboard/{name}",
            get(|Path(name): Path<String>| async move { asset(&name) }),
        )
        .route(
            "/api/v1",
            get(move |Query(q): Query<HashMap<String, String>>| {
                api(Arc::clone(&for_root), String::new(), q)
            }),
        )
        .route(
            "/api/v1/{*path}",
            get(
                move |Path(path): Path<String>, Query(q): Query<HashMap<String, String>>| {
                    api(Arc::clone(&daemon), path, q)
                },
            ),
        )
        .fallback(|uri: Uri| async move { not_found(uri.path()) })
}
