//! `/metrics`, `/healthz` and `/readyz` over HTTP/1.1. A handful of GETs from a scraper and a
//! kubelet need no framework: the request head is parsed with `httparse` (already built, under
//! hyper) from a buffer with a fixed cap, each connection has a deadline, and the number of
//! open connections is bounded, so a client that misbehaves costs a few KiB for a few seconds.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The whole request head must fit; these endpoints take no body.
const MAX_HEAD: usize = 8 * 1024;
/// Reading the request and writing the answer, together.
const CONNECTION_DEADLINE: Duration = Duration::from_secs(5);
const MAX_CONNECTIONS: usize = 32;

/// What the endpoints answer with.
pub trait Endpoints: Send + Sync + 'static {
    fn metrics(&self) -> String;
    /// `Err` names what is not ready yet.
    fn ready(&self) -> Result<(), String>;
}

/// Answers on `listener` until the task is dropped or aborted.
pub async fn serve(listener: TcpListener, endpoints: Arc<dyn Endpoints>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            // Out of descriptors or a reset before accept: try again shortly.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            drop(stream);
            continue;
        };
        let endpoints = endpoints.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(CONNECTION_DEADLINE, answer(stream, &*endpoints)).await;
            drop(slot);
        });
    }
}

async fn answer(mut stream: TcpStream, endpoints: &dyn Endpoints) -> std::io::Result<()> {
    let mut buf = vec![0u8; MAX_HEAD];
    let mut filled = 0;
    let (status, body) = loop {
        if filled == buf.len() {
            break (431, "request head too large\n".to_string());
        }
        let n = stream.read(&mut buf[filled..]).await?;
        if n == 0 {
            return Ok(());
        }
        filled += n;
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&buf[..filled]) {
            Ok(httparse::Status::Partial) => continue,
            Err(httparse::Error::TooManyHeaders) => {
                break (431, "too many headers\n".to_string());
            }
            Err(_) => break (400, "malformed request\n".to_string()),
            Ok(httparse::Status::Complete(_)) => {
                break route(req.method.unwrap_or(""), req.path.unwrap_or(""), endpoints);
            }
        }
    };
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        _ => "Service Unavailable",
    };
    let content_type = if body.starts_with("# HELP") {
        "text/plain; version=0.0.4; charset=utf-8"
    } else {
        "text/plain; charset=utf-8"
    };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}

fn route(method: &str, path: &str, endpoints: &dyn Endpoints) -> (u16, String) {
    if method != "GET" && method != "HEAD" {
        return (405, "only GET is served\n".into());
    }
    match path.split('?').next().unwrap_or("") {
        "/metrics" => (200, endpoints.metrics()),
        "/healthz" => (200, "ok\n".into()),
        "/readyz" => match endpoints.ready() {
            Ok(()) => (200, "ready\n".into()),
            Err(why) => (503, format!("not ready: {why}\n")),
        },
        _ => (404, "not found: try /metrics, /healthz or /readyz\n".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed;
    impl Endpoints for Fixed {
        fn metrics(&self) -> String {
            "# HELP x\nx 1\n".into()
        }
        fn ready(&self) -> Result<(), String> {
            Err("ns.a: pulling".into())
        }
    }

    async fn ask(addr: std::net::SocketAddr, request: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(request).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn routes_limits_and_status() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(serve(listener, Arc::new(Fixed)));
        let metrics = ask(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
        assert!(metrics.ends_with("x 1\n"), "{metrics}");
        let ready = ask(addr, b"GET /readyz HTTP/1.1\r\n\r\n").await;
        assert!(ready.starts_with("HTTP/1.1 503"), "{ready}");
        assert!(ready.contains("not ready: ns.a: pulling"), "{ready}");
        let big = format!(
            "GET /healthz HTTP/1.1\r\nx: {}\r\n\r\n",
            "a".repeat(MAX_HEAD)
        );
        assert!(ask(addr, big.as_bytes()).await.starts_with("HTTP/1.1 431"));
        assert!(ask(addr, b"POST /metrics HTTP/1.1\r\n\r\n")
            .await
            .starts_with("HTTP/1.1 405"));
        assert!(ask(addr, b"GET /healthz HTTP/1.1\r\n\r\n")
            .await
            .starts_with("HTTP/1.1 200"));
        server.abort();
    }
}
