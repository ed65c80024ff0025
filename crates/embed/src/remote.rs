//! A model behind an OpenAI-compatible `/embeddings` endpoint.
//!
//! Texts are cut into sentences, grouped as the static model groups its pieces, and sent in
//! batches. A call is retried with a doubling backoff when the endpoint is unreachable, rate
//! limited or failing; refused credentials stop calls for a cooldown (the summarizer client's
//! policy). Requests go through a thread of the embedder's own, so that a caller inside an
//! async runtime or outside one blocks only itself.

use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::{EmbedError, Embedder, MAX_EMBEDDED_BYTES, floor_char_boundary, grouped, sentences};

/// Bytes of one chunk sent at most (a longer sentence is cut).
const CHUNK_BYTES: usize = 2_000;

/// Where the endpoint is and how to call it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteSettings {
    /// The endpoint's base URL (`…/v1`); requests go to `<base>/embeddings`.
    pub base_url: String,
    /// The model asked.
    pub model: String,
    /// The API key (sent as a bearer token), when the endpoint needs one.
    pub api_key: Option<String>,
    /// Dimensions asked for (models that can shorten their vectors); the model's own when
    /// `None`.
    pub dimensions: Option<usize>,
    /// Texts (chunks) per request at most.
    pub batch_size: usize,
    /// Time limit of one request.
    pub timeout: Duration,
    /// Retries of a failing request.
    pub retries: u32,
    /// The first retry's wait, doubled each time.
    pub backoff: Duration,
    /// How long refused credentials stop requests.
    pub auth_cooldown: Duration,
}

/// One request to the embedder's thread: the inputs and where to answer.
struct Call {
    inputs: Vec<String>,
    reply: Sender<Result<Vec<Vec<f32>>, Failure>>,
}

/// How a request failed.
enum Failure {
    /// Worth retrying (a timeout, a connection refused, 408/409/425/429, a 5xx).
    Transient(String),
    /// Credentials refused (401, 403).
    Refused(String),
    /// Anything else: retrying would not help.
    Failed(String),
}

/// An embedder that asks an OpenAI-compatible endpoint.
pub struct RemoteEmbedder {
    name: String,
    settings: RemoteSettings,
    calls: Sender<Call>,
    circuit_open_until: Mutex<Option<Instant>>,
}

impl std::fmt::Debug for RemoteEmbedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteEmbedder")
            .field("name", &self.name)
            .field("base_url", &self.settings.base_url)
            .finish()
    }
}

impl RemoteEmbedder {
    /// An embedder for `settings`; nothing is sent until texts are embedded.
    pub fn new(settings: RemoteSettings) -> Result<RemoteEmbedder, EmbedError> {
        let client = reqwest::Client::builder()
            .timeout(settings.timeout)
            .build()
            .map_err(|error| EmbedError::Failed(format!("building the HTTP client: {error}")))?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|error| EmbedError::Failed(format!("starting the HTTP runtime: {error}")))?;
        let (calls, received) = channel();
        let url = format!("{}/embeddings", settings.base_url.trim_end_matches('/'));
        let request = Request {
            client,
            url,
            settings: settings.clone(),
        };
        std::thread::Builder::new()
            .name("vilvona-embedding-client".to_owned())
            .spawn(move || serve(&runtime, &request, &received))
            .map_err(|error| EmbedError::Failed(format!("starting the HTTP thread: {error}")))?;
        // The vectors of another size are another model's, as far as comparing goes.
        let name = match settings.dimensions {
            Some(dimensions) => format!("openai:{}/{dimensions}", settings.model),
            None => format!("openai:{}", settings.model),
        };
        Ok(RemoteEmbedder {
            name,
            settings,
            calls,
            circuit_open_until: Mutex::new(None),
        })
    }

    /// Embeds `inputs` a batch at a time, each batch retried as the settings say.
    fn embed_inputs(&self, inputs: Vec<String>) -> Result<Vec<Vec<f32>>, EmbedError> {
        let mut vectors = Vec::with_capacity(inputs.len());
        for batch in inputs.chunks(self.settings.batch_size.max(1)) {
            vectors.extend(self.embed_batch(batch)?);
        }
        Ok(vectors)
    }

    fn embed_batch(&self, batch: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let mut attempt = 0;
        loop {
            if self.circuit_open() {
                return Err(EmbedError::Unavailable(format!(
                    "{}: the credentials were refused; waiting out the cooldown",
                    self.settings.base_url
                )));
            }
            let (reply, answer) = channel();
            let sent = self.calls.send(Call {
                inputs: batch.to_vec(),
                reply,
            });
            let outcome = match sent {
                Ok(()) => answer
                    .recv()
                    .unwrap_or_else(|_| Err(Failure::Failed("the HTTP thread stopped".to_owned()))),
                Err(_) => Err(Failure::Failed("the HTTP thread stopped".to_owned())),
            };
            match outcome {
                Ok(vectors) => return Ok(vectors),
                Err(Failure::Transient(detail)) if attempt < self.settings.retries => {
                    attempt += 1;
                    tracing::debug!(attempt, %detail, "an embedding request failed; retrying");
                    std::thread::sleep(
                        self.settings
                            .backoff
                            .saturating_mul(1 << (attempt - 1).min(6)),
                    );
                }
                Err(Failure::Transient(detail)) => return Err(EmbedError::Unavailable(detail)),
                Err(Failure::Refused(detail)) => {
                    *self
                        .circuit_open_until
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner) =
                        Some(Instant::now() + self.settings.auth_cooldown);
                    return Err(EmbedError::Unavailable(detail));
                }
                Err(Failure::Failed(detail)) => return Err(EmbedError::Failed(detail)),
            }
        }
    }

    fn circuit_open(&self) -> bool {
        let mut open = self
            .circuit_open_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match *open {
            Some(until) if Instant::now() < until => true,
            Some(_) => {
                *open = None;
                false
            }
            None => false,
        }
    }
}

/// A text's chunks as sent: its sentences (each cut at [`CHUNK_BYTES`]), grouped into at
/// most `most`.
fn chunks(text: &str, most: usize) -> Vec<String> {
    let text = &text[..floor_char_boundary(text, MAX_EMBEDDED_BYTES)];
    let pieces: Vec<&str> = sentences(text)
        .map(|sentence| &sentence[..floor_char_boundary(sentence, CHUNK_BYTES)])
        .collect();
    let lengths: Vec<usize> = pieces.iter().map(|piece| piece.len()).collect();
    grouped(&lengths, most)
        .into_iter()
        .map(|group| pieces[group].join(" "))
        .map(|chunk| chunk[..floor_char_boundary(&chunk, CHUNK_BYTES * 4)].to_owned())
        .collect()
}

impl Embedder for RemoteEmbedder {
    fn name(&self) -> &str {
        &self.name
    }

    fn embed_texts(&self, texts: &[(&str, usize)]) -> Result<Vec<Vec<Vec<f32>>>, EmbedError> {
        let per_text: Vec<Vec<String>> = texts
            .iter()
            .map(|(text, most)| chunks(text, *most))
            .collect();
        let mut vectors = self
            .embed_inputs(per_text.iter().flatten().cloned().collect())?
            .into_iter();
        // A zero vector (nothing to compare) is left out, as the static model leaves out a
        // chunk with no known token.
        Ok(per_text
            .iter()
            .map(|chunks| {
                vectors
                    .by_ref()
                    .take(chunks.len())
                    .filter(|vector| !vector.is_empty())
                    .collect()
            })
            .collect())
    }

    fn embed_query(&self, text: &str) -> Result<Option<Vec<f32>>, EmbedError> {
        let text = text.trim();
        if text.is_empty() {
            return Ok(None);
        }
        let query = text[..floor_char_boundary(text, CHUNK_BYTES * 4)].to_owned();
        Ok(self
            .embed_inputs(vec![query])?
            .pop()
            .filter(|vector| !vector.is_empty()))
    }

    fn local(&self) -> bool {
        false
    }
}

/// What the thread needs to send a request.
struct Request {
    client: reqwest::Client,
    url: String,
    settings: RemoteSettings,
}

/// The embedder's thread: answers calls until the embedder is dropped.
fn serve(runtime: &tokio::runtime::Runtime, request: &Request, calls: &Receiver<Call>) {
    while let Ok(call) = calls.recv() {
        let outcome = runtime.block_on(request.send(&call.inputs));
        let _ = call.reply.send(outcome);
    }
}

impl Request {
    async fn send(&self, inputs: &[String]) -> Result<Vec<Vec<f32>>, Failure> {
        let url = &self.url;
        let mut body = json!({
            "model": self.settings.model,
            "input": inputs,
            "encoding_format": "float",
        });
        if let Some(dimensions) = self.settings.dimensions {
            body["dimensions"] = json!(dimensions);
        }
        let mut request = self.client.post(url).json(&body);
        if let Some(key) = &self.settings.api_key {
            request = request.bearer_auth(key);
        }
        let transport = |error: reqwest::Error| {
            Failure::Transient(if error.is_timeout() {
                format!(
                    "{url}: no answer within {} ms",
                    self.settings.timeout.as_millis()
                )
            } else {
                format!("{url}: {error}")
            })
        };
        let response = request.send().await.map_err(transport)?;
        let status = response.status();
        let text = response.text().await.map_err(transport)?;
        if !status.is_success() {
            let detail = format!(
                "{url}: HTTP {}: {}",
                status.as_u16(),
                text.chars().take(300).collect::<String>()
            );
            return Err(match status.as_u16() {
                401 | 403 => Failure::Refused(detail),
                408 | 409 | 425 | 429 | 500..=599 => Failure::Transient(detail),
                _ => Failure::Failed(detail),
            });
        }
        parse(&text, inputs.len()).map_err(|problem| Failure::Failed(format!("{url}: {problem}")))
    }
}

/// The response's vectors, normalised, in the inputs' order.
fn parse(text: &str, inputs: usize) -> Result<Vec<Vec<f32>>, String> {
    let value: Value =
        serde_json::from_str(text).map_err(|error| format!("the response is not JSON: {error}"))?;
    let data = value["data"]
        .as_array()
        .ok_or("the response has no `data` list")?;
    let mut vectors: Vec<Option<Vec<f32>>> = vec![None; inputs];
    for (at, item) in data.iter().enumerate() {
        let index = item["index"].as_u64().map_or(at, |index| index as usize);
        let embedding: Vec<f32> = item["embedding"]
            .as_array()
            .ok_or_else(|| format!("data[{at}] has no `embedding` list"))?
            .iter()
            .map(|x| x.as_f64().map(|x| x as f32))
            .collect::<Option<_>>()
            .ok_or_else(|| format!("data[{at}].embedding holds something that is not a number"))?;
        if embedding.is_empty() || embedding.len() % 2 == 1 {
            return Err(format!(
                "data[{at}].embedding has {} dimensions (an even number is needed)",
                embedding.len()
            ));
        }
        let slot = vectors
            .get_mut(index)
            .ok_or_else(|| format!("data[{at}].index {index} is beyond the {inputs} inputs"))?;
        *slot = Some(crate::normalised(embedding).unwrap_or_default());
    }
    vectors
        .into_iter()
        .enumerate()
        .map(|(at, vector)| vector.ok_or_else(|| format!("no embedding for input {at}")))
        .collect()
}
