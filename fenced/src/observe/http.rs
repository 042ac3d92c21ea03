//! The HTTP endpoint (`--metrics-listen`): a minimal HTTP/1.1 responder on tokio, one
//! `GET` per connection, `Connection: close`, three fixed paths.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::Observer;

/// Longest request head read (request line and headers).
const MAX_HEAD: usize = 8 * 1024;
/// A client that has not sent its request by then is dropped.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Serves `GET /metrics`, `/healthz` and `/readyz` on `listener` until dropped.
pub async fn serve(listener: TcpListener, observer: Observer) {
    loop {
        match listener.accept().await {
            Ok((conn, _)) => {
                let observer = observer.clone();
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(READ_TIMEOUT, answer(conn, &observer)).await;
                });
            }
            Err(e) => {
                // EMFILE and the like: back off instead of spinning.
                tracing::warn!(error = %e, "metrics listener: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn answer(mut conn: TcpStream, observer: &Observer) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        let n = conn.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
        if head.len() > MAX_HEAD {
            return respond(&mut conn, 431, "text/plain", "request head too large\n").await;
        }
    }
    let text = String::from_utf8_lossy(&head);
    let mut words = text.lines().next().unwrap_or("").split_whitespace();
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    if method != "GET" && method != "HEAD" {
        return respond(&mut conn, 405, "text/plain", "only GET\n").await;
    }
    let now = Instant::now();
    let verdict = |r: Result<(), String>| match r {
        Ok(()) => (200, "ok\n".to_owned()),
        Err(why) => (503, format!("{why}\n")),
    };
    let (code, ctype, body) = match path {
        "/metrics" => (
            200,
            prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
            observer.encode(),
        ),
        "/healthz" => {
            let (c, b) = verdict(observer.healthz(now));
            (c, "text/plain", b)
        }
        "/readyz" => {
            let (c, b) = verdict(observer.ready_at(now));
            (c, "text/plain", b)
        }
        _ => (
            404,
            "text/plain",
            "not found: /metrics, /healthz, /readyz\n".to_owned(),
        ),
    };
    let body = if method == "HEAD" {
        String::new()
    } else {
        body
    };
    respond(&mut conn, code, ctype, &body).await
}

async fn respond(conn: &mut TcpStream, code: u16, ctype: &str, body: &str) -> std::io::Result<()> {
    let reason = match code {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        _ => "Service Unavailable",
    };
    let head = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).await?;
    conn.write_all(body.as_bytes()).await?;
    conn.shutdown().await
}
