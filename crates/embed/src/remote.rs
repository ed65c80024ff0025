//! A model behind an OpenAI-compatible `/embeddings` endpoint.
//!
//! Texts are cut into sentences, grouped as the static model groups its pieces, and sent in
//! batches through `vilvona-openai`'s client, as the summarizer's requests are: retried with a
//! doubling backoff when the endpoint is unreachable, rate limited or failing, and stopped for
//! a cooldown after refused credentials. Requests go through a thread of the embedder's own,
//! so that a caller inside an async runtime or outside one blocks only itself.

use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::Duration;

use serde_json::{Value, json};
use vilvona_openai::{Client, Endpoint, Failure, Retries};

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
    reply: Sender<Result<Vec<Vec<f32>>, EmbedError>>,
}

/// An embedder that asks an OpenAI-compatible endpoint.
pub struct RemoteEmbedder {
    name: String,
    settings: RemoteSettings,
    calls: Sender<Call>,
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
        let client = Client::new(Endpoint {
            base_url: settings.base_url.clone(),
            api_key: settings.api_key.clone(),
            timeout: settings.timeout,
        })
        .map_err(|failure| EmbedError::Failed(failure.to_string()))?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|error| EmbedError::Failed(format!("starting the HTTP runtime: {error}")))?;
        let (calls, received) = channel();
        let request = Request {
            client,
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
        })
    }

    /// Embeds `inputs` a batch at a time, each batch retried as the settings say.
    fn embed_inputs(&self, inputs: Vec<String>) -> Result<Vec<Vec<f32>>, EmbedError> {
        let mut vectors = Vec::with_capacity(inputs.len());
        for batch in inputs.chunks(self.settings.batch_size.max(1)) {
            let stopped = || EmbedError::Failed("the HTTP thread stopped".to_owned());
            let (reply, answer) = channel();
            self.calls
                .send(Call {
                    inputs: batch.to_vec(),
                    reply,
                })
                .map_err(|_| stopped())?;
            vectors.extend(answer.recv().map_err(|_| stopped())??);
        }
        Ok(vectors)
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
    client: Client,
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
    /// One batch's vectors, retried as the settings say; a failure worth trying later (the
    /// endpoint down, the credentials refused) is `Unavailable`.
    async fn send(&self, inputs: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let settings = &self.settings;
        let retries = Retries {
            retries: settings.retries,
            backoff: settings.backoff,
            auth_cooldown: settings.auth_cooldown,
        };
        let body = |model: &str| {
            let mut body = json!({"model": model, "input": inputs, "encoding_format": "float"});
            if let Some(dimensions) = settings.dimensions {
                body["dimensions"] = json!(dimensions);
            }
            body
        };
        let models = std::slice::from_ref(&settings.model);
        match self
            .client
            .call("embeddings", models, &retries, body, |answer| {
                parse(answer, inputs.len())
            })
            .await
        {
            Ok((_, vectors)) => Ok(vectors),
            Err(failure @ (Failure::Transient(_) | Failure::Refused(_))) => {
                Err(EmbedError::Unavailable(failure.to_string()))
            }
            Err(failure) => Err(EmbedError::Failed(failure.to_string())),
        }
    }
}

/// The response's vectors, normalised, in the inputs' order.
fn parse(value: &Value, inputs: usize) -> Result<Vec<Vec<f32>>, String> {
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
