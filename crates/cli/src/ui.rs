//! `vilvona ui`: the context panel in a browser, beside any host. A small HTTP server on
//! 127.0.0.1 serves the page (the same module OpenClaw's Control UI mounts) and answers its
//! requests from [`crate::views`] over a read-only host, so it can watch a store a gateway is
//! writing. Every request for data needs the random token printed with the URL. With
//! `--allow-repair` it also rebuilds the recall index when the page asks (after a preview).
//!
//! The OpenClaw plugin starts one of these beside its `serve` child and forwards the panel's
//! session actions to it, so both pages read the same answers.

use std::io::Write as _;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use vilvona_core::admin::TokenPrices;
use vilvona_runtime::Host;

use crate::Global;

/// The panel module, as the plugin ships it for OpenClaw's Control UI.
const PANEL_JS: &str = include_str!("../../../bindings/openclaw/dist/control-ui/index.js");
/// Its styles.
const PANEL_CSS: &str = include_str!("../../../bindings/openclaw/dist/control-ui/index.css");
/// The page around the panel when no host gives it one.
const PAGE_HTML: &str = include_str!("ui/index.html");
/// The page's script: the token, the session picker, the panel mounted.
const PAGE_JS: &str = include_str!("ui/page.js");

/// A request's head and body may take this many bytes.
const REQUEST_BYTES: usize = 64 * 1024;

/// Most connections served at once: past it a new connection is closed at once (a local
/// program opening connections without end cannot take the server's memory or descriptors).
const CONNECTIONS: usize = 64;

/// How long a connection may take to send its request; a slower one is answered 408.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How long one connection may take in all (a repair included).
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(600);

/// How long the server waits after an accept failed (out of descriptors, say) before it
/// accepts again.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// What the server shares with each connection.
struct Served {
    /// The read-only host every view reads through.
    host: Host,
    /// The token a request for data must bear.
    token: String,
    /// Where a repair opens its writing host (`None`: read-only, no repairs).
    repairs: Option<Global>,
    /// Prices per million tokens for the turns the host did not price.
    prices: Option<TokenPrices>,
}

/// Runs the server until the process is stopped. `port` 0 takes a free one. With
/// `allow_repair`, the page may rebuild the recall index (after a preview and a confirmation).
pub(crate) async fn ui(
    global: &Global,
    port: u16,
    allow_repair: bool,
    exit_with_stdin: bool,
    prices: Option<TokenPrices>,
) -> Result<ExitCode> {
    if exit_with_stdin {
        // The parent holds the other end: when it ends, however it ends, so does this.
        tokio::spawn(async {
            let mut sink = tokio::io::sink();
            let _ = tokio::io::copy(&mut tokio::io::stdin(), &mut sink).await;
            std::process::exit(0);
        });
    }
    let host = global.reader().await?;
    let listener = TcpListener::bind(("127.0.0.1", port))
        .await
        .with_context(|| format!("listening on 127.0.0.1:{port}"))?;
    let address = listener.local_addr()?;
    let served = Arc::new(Served {
        host,
        token: random_token()?,
        repairs: allow_repair.then(|| global.clone()),
        prices,
    });
    // One line on stdout, flushed: the URL to open (a parent process reads it too).
    println!("vilvona ui: http://{address}/#token={}", served.token);
    std::io::stdout().flush()?;
    eprintln!(
        "vilvona ui: serving {} {}; stop with Ctrl-C",
        global.state_dir.display(),
        if allow_repair {
            "(repairs allowed, each after a preview)"
        } else {
            "read-only"
        }
    );
    let slots = Arc::new(tokio::sync::Semaphore::new(CONNECTIONS));
    loop {
        // An accept that fails (no descriptors left, a connection reset before it was taken)
        // fails that connection, not the server.
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                tracing::warn!(%error, "vilvona ui could not accept a connection; accepting again");
                tokio::time::sleep(ACCEPT_PAUSE).await;
                continue;
            }
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            tracing::debug!(
                "vilvona ui serves {CONNECTIONS} connections already; closing a new one"
            );
            continue;
        };
        let served = Arc::clone(&served);
        tokio::spawn(async move {
            let _slot = slot;
            match tokio::time::timeout(CONNECTION_TIMEOUT, serve_connection(stream, &served)).await
            {
                Ok(Err(error)) => tracing::debug!(%error, "a ui connection ended"),
                Err(_) => tracing::debug!("a ui connection took too long and was closed"),
                Ok(Ok(())) => {}
            }
        });
    }
}

/// A repair the page asked for: its preview (`confirm` false: what it would do and whether
/// the store needs it), or the repair itself. Two: rebuilding the recall index from the
/// database, as `vilvona doctor --fix` does, and re-summarizing a session's truncated
/// summaries with the configured summarizer.
async fn repair(served: &Served, request: &Value) -> Result<Value> {
    let Some(global) = &served.repairs else {
        anyhow::bail!("this vilvona ui is read-only (start it with --allow-repair)");
    };
    let confirmed = request["confirm"] == true;
    match request["repair"].as_str().unwrap_or_default() {
        "rebuild-index" if !confirmed => {
            let check = crate::views::health(&served.host).await?;
            Ok(json!({
                "repair": "rebuild-index",
                "needed": check["indexNeedsRebuild"],
                "detail": check["detail"],
                "will": "rebuild the recall index from the database, beside the old one, then swap it in; searches read the database meanwhile, and nothing in the database changes",
            }))
        }
        "rebuild-index" => {
            let host = global.host().await?;
            let documents = crate::session::admin(&host).await?.rebuild_index().await?;
            Ok(json!({"repair": "rebuild-index", "rebuilt": documents}))
        }
        "resummarize" => {
            let session = request["session"]
                .as_str()
                .ok_or_else(|| anyhow::anyhow!("the \"resummarize\" repair needs a \"session\""))?;
            // The preview reads through the read-only host; the repair writes through its own.
            let writer;
            let host = match confirmed {
                true => {
                    writer = global.host().await?;
                    &writer
                }
                false => &served.host,
            };
            let (key, record) = crate::session::find_session(host, session).await?;
            let done = crate::session::admin(host)
                .await?
                .resummarize(&crate::session::caller(&key, &record), confirmed)
                .await?;
            let mut answer = serde_json::to_value(&done)?;
            answer["repair"] = json!("resummarize");
            answer["needed"] = json!(done.flagged > 0);
            answer["will"] = json!(format!(
                "rewrite the {} summaries a stand-in wrote in this session's context (truncated, or by a fallback summarizer) with {}, each in its place and over the same sources; one it cannot fit stays as it is",
                done.flagged, done.summarizer
            ));
            Ok(answer)
        }
        other => anyhow::bail!("unknown repair \"{other}\" (rebuild-index, resummarize)"),
    }
}

/// 32 hex digits from the system's random source.
fn random_token() -> Result<String> {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut random| std::io::Read::read_exact(&mut random, &mut bytes))
        .context("reading /dev/urandom for the ui's token")?;
    Ok(bytes.iter().map(|byte| format!("{byte:02x}")).collect())
}

/// One request, one answer, then the connection closes.
async fn serve_connection(mut stream: TcpStream, served: &Served) -> Result<()> {
    let Ok(request) = tokio::time::timeout(READ_TIMEOUT, read_request(&mut stream)).await else {
        return respond(&mut stream, 408, "text/plain", b"the request took too long").await;
    };
    let Some(request) = request? else {
        return respond(&mut stream, 400, "text/plain", b"bad request").await;
    };
    match (request.method.as_str(), request.path.as_str()) {
        ("GET", "/") => respond(&mut stream, 200, "text/html", PAGE_HTML.as_bytes()).await,
        ("GET", "/page.js") => {
            respond(&mut stream, 200, "text/javascript", PAGE_JS.as_bytes()).await
        }
        ("GET", "/index.js") => {
            respond(&mut stream, 200, "text/javascript", PANEL_JS.as_bytes()).await
        }
        ("GET", "/index.css") => respond(&mut stream, 200, "text/css", PANEL_CSS.as_bytes()).await,
        ("POST", path @ ("/api/view" | "/api/repair")) => {
            if request.bearer.as_deref() != Some(served.token.as_str()) {
                return respond_json(
                    &mut stream,
                    401,
                    &json!({"error": "a token is needed: open the URL vilvona ui printed"}),
                )
                .await;
            }
            let answer = match serde_json::from_slice::<Value>(&request.body) {
                Err(error) => Err(anyhow::anyhow!("the request is not JSON: {error}")),
                Ok(asked) if path == "/api/repair" => repair(served, &asked).await,
                Ok(view) => crate::views::answer(&served.host, &view, served.prices)
                    .await
                    .map(|mut answer| {
                        // The page offers a repair only where one is allowed.
                        if view["view"] == "health" {
                            answer["canRepair"] = json!(served.repairs.is_some());
                        }
                        answer
                    }),
            };
            match answer {
                Ok(value) => respond_json(&mut stream, 200, &value).await,
                Err(error) => {
                    let chain: Vec<String> = error.chain().map(ToString::to_string).collect();
                    respond_json(&mut stream, 422, &json!({"error": chain.join(": ")})).await
                }
            }
        }
        _ => respond(&mut stream, 404, "text/plain", b"not found").await,
    }
}

struct Request {
    method: String,
    path: String,
    bearer: Option<String>,
    body: Vec<u8>,
}

/// Reads a request's head and its body (by Content-Length); `None` when it is not HTTP or too
/// large.
async fn read_request(stream: &mut TcpStream) -> Result<Option<Request>> {
    let mut buffer = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        if buffer.len() > REQUEST_BYTES {
            return Ok(None);
        }
        let read = stream.read(&mut chunk).await?;
        if read == 0 {
            return Ok(None);
        }
        buffer.extend_from_slice(&chunk[..read]);
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut first = lines.next().unwrap_or_default().split(' ');
    let (Some(method), Some(target)) = (first.next(), first.next()) else {
        return Ok(None);
    };
    let path = target.split(['?', '#']).next().unwrap_or("/").to_owned();
    let mut length = 0usize;
    let mut bearer = None;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match name.trim().to_ascii_lowercase().as_str() {
            "content-length" => length = value.parse().unwrap_or(usize::MAX),
            "authorization" => bearer = value.strip_prefix("Bearer ").map(str::to_owned),
            _ => {}
        }
    }
    if length > REQUEST_BYTES {
        return Ok(None);
    }
    let mut body = buffer[head_end..].to_vec();
    while body.len() < length {
        let read = stream.read(&mut chunk).await?;
        if read == 0 {
            return Ok(None);
        }
        body.extend_from_slice(&chunk[..read]);
    }
    body.truncate(length);
    Ok(Some(Request {
        method: method.to_owned(),
        path,
        bearer,
        body,
    }))
}

async fn respond_json(stream: &mut TcpStream, status: u16, value: &Value) -> Result<()> {
    respond(
        stream,
        status,
        "application/json",
        &serde_json::to_vec(value)?,
    )
    .await
}

async fn respond(stream: &mut TcpStream, status: u16, kind: &str, body: &[u8]) -> Result<()> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        408 => "Request Timeout",
        _ => "Unprocessable Content",
    };
    // The page runs only its own scripts and styles and talks only to this server.
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {kind}; charset=utf-8\r\nContent-Length: {}\r\nCache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\nContent-Security-Policy: default-src 'self'; img-src 'self' data:\r\nReferrer-Policy: no-referrer\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body).await?;
    stream.shutdown().await?;
    Ok(())
}
