//! `/metrics`, `/healthz` and `/readyz` over HTTP/1.1. A handful of GETs from a scraper and a
//! kubelet need no framework: the request head is parsed with `httparse` (already built, under
//! hyper) from a buffer with a fixed cap, so a client that misbehaves costs a few KiB.
//!
//! Connections are bounded, and an idle or slow client cannot keep a probe out: the request
//! head must arrive within [`HEAD_DEADLINE`] (a byte a second never gets there), and when
//! every slot is taken a new connection takes the slot of the one that has waited longest for
//! its request. A probe sends its request at once and is answered in a millisecond, so it is
//! never the one waiting longest; the reserve is every slot whose client has not spoken yet.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

/// The whole request head must fit; these endpoints take no body.
const MAX_HEAD: usize = 8 * 1024;
/// From accept to the end of the request head.
const HEAD_DEADLINE: Duration = Duration::from_secs(2);
/// Writing the answer.
const WRITE_DEADLINE: Duration = Duration::from_secs(5);
const MAX_CONNECTIONS: usize = 64;
/// How long a new connection waits for a slot once one was freed for it.
const SLOT_WAIT: Duration = Duration::from_millis(200);

/// What the endpoints answer with.
pub trait Endpoints: Send + Sync + 'static {
    fn metrics(&self) -> String;
    /// `Err` names what is not ready yet.
    fn ready(&self) -> Result<(), String>;
}

/// The connections still waiting for their request head, oldest first; each is closed when
/// its sender is used (or dropped).
#[derive(Default)]
struct Waiting {
    next: u64,
    queue: BTreeMap<u64, oneshot::Sender<()>>,
}

impl Waiting {
    fn add(&mut self) -> (u64, oneshot::Receiver<()>) {
        let (tx, rx) = oneshot::channel();
        let id = self.next;
        self.next += 1;
        self.queue.insert(id, tx);
        (id, rx)
    }

    /// Closes the connection that has waited longest; false if none waits.
    fn evict_oldest(&mut self) -> bool {
        match self.queue.pop_first() {
            Some((_, tx)) => {
                let _ = tx.send(());
                true
            }
            None => false,
        }
    }
}

/// Answers on `listener` until the task is dropped or aborted.
pub async fn serve(listener: TcpListener, endpoints: Arc<dyn Endpoints>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let waiting = Arc::new(Mutex::new(Waiting::default()));
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            // Out of descriptors or a reset before accept: try again shortly.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let slot = match slots.clone().try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                if !wasm_common::sync::lock(&waiting).evict_oldest() {
                    // Every slot is writing an answer, which ends within its deadline.
                    drop(stream);
                    continue;
                }
                match tokio::time::timeout(SLOT_WAIT, slots.clone().acquire_owned()).await {
                    Ok(Ok(slot)) => slot,
                    _ => {
                        drop(stream);
                        continue;
                    }
                }
            }
        };
        let (id, evicted) = wasm_common::sync::lock(&waiting).add();
        let endpoints = endpoints.clone();
        let waiting = waiting.clone();
        tokio::spawn(async move {
            let _ = connection(stream, &*endpoints, id, evicted, &waiting).await;
            wasm_common::sync::lock(&waiting).queue.remove(&id);
            drop(slot);
        });
    }
}

async fn connection(
    mut stream: TcpStream,
    endpoints: &dyn Endpoints,
    id: u64,
    evicted: oneshot::Receiver<()>,
    waiting: &Mutex<Waiting>,
) -> std::io::Result<()> {
    let request = tokio::select! {
        r = tokio::time::timeout(HEAD_DEADLINE, read_head(&mut stream)) => match r {
            Ok(r) => r?,
            Err(_) => return Ok(()),
        },
        _ = evicted => return Ok(()),
    };
    wasm_common::sync::lock(waiting).queue.remove(&id);
    let Some((status, body, head_only)) = request.map(|r| r.answer(endpoints)) else {
        return Ok(());
    };
    tokio::time::timeout(
        WRITE_DEADLINE,
        write_answer(&mut stream, status, &body, head_only),
    )
    .await
    .unwrap_or(Ok(()))
}

/// What the request head said, or why it is refused.
enum Request {
    Parsed { method: String, path: String },
    Refused(u16, &'static str),
}

impl Request {
    /// Status, body, and whether only the head is sent (`HEAD`).
    fn answer(self, endpoints: &dyn Endpoints) -> (u16, String, bool) {
        match self {
            Request::Parsed { method, path } => {
                let (status, body) = route(&method, &path, endpoints);
                (status, body, method == "HEAD")
            }
            Request::Refused(status, why) => (status, why.to_string(), false),
        }
    }
}

/// The request head; `None` if the client closed first.
async fn read_head(stream: &mut TcpStream) -> std::io::Result<Option<Request>> {
    let mut buf = vec![0u8; MAX_HEAD];
    let mut filled = 0;
    loop {
        if filled == buf.len() {
            return Ok(Some(Request::Refused(431, "request head too large\n")));
        }
        let n = stream.read(&mut buf[filled..]).await?;
        if n == 0 {
            return Ok(None);
        }
        filled += n;
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut req = httparse::Request::new(&mut headers);
        return Ok(Some(match req.parse(&buf[..filled]) {
            Ok(httparse::Status::Partial) => continue,
            Err(httparse::Error::TooManyHeaders) => Request::Refused(431, "too many headers\n"),
            Err(_) => Request::Refused(400, "malformed request\n"),
            Ok(httparse::Status::Complete(_)) => Request::Parsed {
                method: req.method.unwrap_or("").to_string(),
                path: req.path.unwrap_or("").to_string(),
            },
        }));
    }
}

async fn write_answer(
    stream: &mut TcpStream,
    status: u16,
    body: &str,
    head_only: bool,
) -> std::io::Result<()> {
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
    let allow = if status == 405 {
        "allow: GET, HEAD\r\n"
    } else {
        ""
    };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n{allow}connection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    if !head_only {
        stream.write_all(body.as_bytes()).await?;
    }
    stream.shutdown().await
}

fn route(method: &str, path: &str, endpoints: &dyn Endpoints) -> (u16, String) {
    if method != "GET" && method != "HEAD" {
        return (405, "only GET and HEAD are served\n".into());
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
