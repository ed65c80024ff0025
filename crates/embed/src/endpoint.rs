//! An OpenAI-compatible `/v1/embeddings` endpoint on 127.0.0.1 for tests: a real HTTP
//! server on a thread, whose "model" hashes each word into one of a few dimensions (texts
//! that share words are near). It counts requests and inputs, checks a bearer key, and can
//! be told to fail.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// Dimensions of the test model's vectors.
pub const DIMENSIONS: usize = 32;

/// The server's state, shared with its thread.
#[derive(Debug, Default)]
struct State {
    requests: AtomicUsize,
    inputs: AtomicUsize,
    largest_batch: AtomicUsize,
    /// Every request is answered with this status while set.
    failing: Mutex<Option<u16>>,
    key: Mutex<Option<String>>,
    stopped: AtomicBool,
}

/// A running test endpoint; stops when dropped.
#[derive(Debug)]
pub struct TestEndpoint {
    address: std::net::SocketAddr,
    state: Arc<State>,
}

impl TestEndpoint {
    /// Starts an endpoint on a free port of 127.0.0.1.
    pub fn start() -> std::io::Result<TestEndpoint> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let address = listener.local_addr()?;
        let state = Arc::new(State::default());
        let shared = state.clone();
        std::thread::Builder::new()
            .name("test-embedding-endpoint".to_owned())
            .spawn(move || {
                for stream in listener.incoming() {
                    if shared.stopped.load(Ordering::SeqCst) {
                        return;
                    }
                    if let Ok(stream) = stream {
                        let state = shared.clone();
                        std::thread::spawn(move || answer(stream, &state));
                    }
                }
            })?;
        Ok(TestEndpoint { address, state })
    }

    /// The base URL (`http://127.0.0.1:PORT/v1`).
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.address)
    }

    /// Requests answered or refused so far.
    pub fn requests(&self) -> usize {
        self.state.requests.load(Ordering::SeqCst)
    }

    /// Inputs embedded so far.
    pub fn inputs(&self) -> usize {
        self.state.inputs.load(Ordering::SeqCst)
    }

    /// The most inputs one request carried.
    pub fn largest_batch(&self) -> usize {
        self.state.largest_batch.load(Ordering::SeqCst)
    }

    /// Answers every request with `status` (`None`: embeds again).
    pub fn fail_with(&self, status: Option<u16>) {
        *self
            .state
            .failing
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = status;
    }

    /// Refuses requests without this bearer key (401).
    pub fn require_key(&self, key: &str) {
        *self
            .state
            .key
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(key.to_owned());
    }
}

impl Drop for TestEndpoint {
    fn drop(&mut self) {
        self.state.stopped.store(true, Ordering::SeqCst);
        // Wakes the accepting thread so that it sees the flag.
        let _ = TcpStream::connect(self.address);
    }
}

/// The test model: each word (lowercased, alphanumeric) adds 1 to the dimension its hash
/// picks.
pub fn test_vector(text: &str) -> Vec<f32> {
    let mut vector = vec![0.0_f32; DIMENSIONS];
    for word in text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|word| !word.is_empty())
    {
        let hash = word
            .to_lowercase()
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
                (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
            });
        vector[(hash % DIMENSIONS as u64) as usize] += 1.0;
    }
    vector
}

fn answer(stream: TcpStream, state: &State) {
    let mut reader = BufReader::new(match stream.try_clone() {
        Ok(stream) => stream,
        Err(_) => return,
    });
    let mut length = 0;
    let mut authorization = None;
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        let lower = header.to_ascii_lowercase();
        if let Some(value) = lower.strip_prefix("content-length:") {
            length = value.trim().parse().unwrap_or(0);
        }
        if lower.starts_with("authorization:") {
            authorization = Some(header["authorization:".len()..].trim().to_owned());
        }
    }
    let mut body = vec![0; length];
    if reader.read_exact(&mut body).is_err() {
        return;
    }
    state.requests.fetch_add(1, Ordering::SeqCst);
    let failing = *state.failing.lock().unwrap_or_else(PoisonError::into_inner);
    let key = state
        .key
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let (status, reply) = if let Some(status) = failing {
        (
            status,
            r#"{"error":{"message":"failing as told"}}"#.to_owned(),
        )
    } else if key.is_some_and(|key| authorization != Some(format!("Bearer {key}"))) {
        (401, r#"{"error":{"message":"bad key"}}"#.to_owned())
    } else {
        let request: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        let inputs: Vec<String> = request["input"]
            .as_array()
            .map(|inputs| {
                inputs
                    .iter()
                    .filter_map(|input| input.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        state.inputs.fetch_add(inputs.len(), Ordering::SeqCst);
        state
            .largest_batch
            .fetch_max(inputs.len(), Ordering::SeqCst);
        let data: Vec<serde_json::Value> = inputs
            .iter()
            .enumerate()
            .map(|(index, input)| {
                serde_json::json!({"object": "embedding", "index": index, "embedding": test_vector(input)})
            })
            .collect();
        (
            200,
            serde_json::json!({"object": "list", "data": data, "model": request["model"]})
                .to_string(),
        )
    };
    let mut stream = stream;
    let _ = write!(
        stream,
        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{reply}",
        reply.len()
    );
}
