//! One client for OpenAI-compatible endpoints, used by everything vilvona asks a model: the
//! summarizer and `ask` (`/chat/completions`, through `vilvona-runtime`'s `OpenAiClient`) and
//! the embeddings (`/embeddings`, through `vilvona-embed`'s `RemoteEmbedder`).
//!
//! It knows HTTP and the endpoints' conventions, not what is asked: a caller builds the JSON
//! body and reads the JSON answer. What it keeps alike for every caller:
//!
//! - where the endpoint is (`<base URL>/<path>`), the key (sent as a bearer token; read from
//!   the environment variable a setting names — [`api_key`]) and a time limit per request;
//! - failures sorted by what helps ([`Failure`]): a timeout, a refused connection and
//!   408/409/425/429/5xx are *transient*; 401/403 are *refused* credentials; any other status
//!   is *rejected* (its body kept, so a caller can tell an overflow); an answer that is not JSON
//!   *failed*. Every text names the URL; an HTTP failure quotes the first 300 characters;
//! - [`Client::call`]: a chain of models (the primary, then the fallbacks), each request
//!   retried on transient failures with a doubling backoff ([`Retries`]); refused credentials
//!   stop every request of this client for a cooldown.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Where an endpoint is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// The base URL (`…/v1`); requests go to `<base>/<path>`.
    pub base_url: String,
    /// The key, sent as a bearer token, when the endpoint needs one.
    pub api_key: Option<String>,
    /// Time limit of one request.
    pub timeout: Duration,
}

/// The key a setting gives: its own value, else the environment variable it names.
pub fn api_key(key: Option<String>, env: Option<&str>) -> Option<String> {
    key.or_else(|| env.and_then(|name| std::env::var(name).ok()))
}

/// How a caller's requests are retried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retries {
    /// Retries of a request that failed transiently, per model.
    pub retries: u32,
    /// The first retry's wait, doubled each time (at most 64 times).
    pub backoff: Duration,
    /// How long refused credentials stop every request of the client.
    pub auth_cooldown: Duration,
}

/// Why a request got no usable answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// Worth trying again: a timeout, a connection refused, 408/409/425/429, a 5xx.
    Transient(String),
    /// Credentials refused (401, 403), or refused a moment ago and waiting out the cooldown.
    Refused(String),
    /// Any other HTTP status: trying again would not help. `body` is the whole answer.
    Rejected {
        /// The URL, the status and the answer's first 300 characters.
        detail: String,
        /// The whole answer.
        body: String,
    },
    /// An answer that is not JSON, or not what the caller needs.
    Failed(String),
}

impl Failure {
    /// The failure's text for an operator.
    pub fn detail(&self) -> &str {
        match self {
            Failure::Transient(detail)
            | Failure::Refused(detail)
            | Failure::Failed(detail)
            | Failure::Rejected { detail, .. } => detail,
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.detail())
    }
}

/// A client of one endpoint.
#[derive(Debug)]
pub struct Client {
    http: reqwest::Client,
    endpoint: Endpoint,
    /// Until when refused credentials stop requests.
    refused_until: Mutex<Option<Instant>>,
}

impl Client {
    /// A client of `endpoint`; nothing is sent until asked.
    pub fn new(mut endpoint: Endpoint) -> Result<Client, Failure> {
        let http = reqwest::Client::builder()
            .timeout(endpoint.timeout)
            .build()
            .map_err(|error| Failure::Failed(format!("building the HTTP client: {error}")))?;
        endpoint.base_url = endpoint.base_url.trim_end_matches('/').to_owned();
        Ok(Client {
            http,
            endpoint,
            refused_until: Mutex::new(None),
        })
    }

    /// The endpoint's base URL, without a trailing `/`.
    pub fn base_url(&self) -> &str {
        &self.endpoint.base_url
    }

    /// One request: `body` posted to `<base>/<path>`, its JSON answer.
    pub async fn post(&self, path: &str, body: &Value) -> Result<Value, Failure> {
        let url = format!("{}/{path}", self.endpoint.base_url);
        let mut request = self.http.post(&url).json(body);
        if let Some(key) = &self.endpoint.api_key {
            request = request.bearer_auth(key);
        }
        // A timeout says how long it waited; anything else is the transport's own words.
        let transport = |error: reqwest::Error, doing: &str| {
            Failure::Transient(if error.is_timeout() {
                format!(
                    "{url}: no answer within {} ms",
                    self.endpoint.timeout.as_millis()
                )
            } else {
                format!("{url}: {doing}{error}")
            })
        };
        let response = request.send().await.map_err(|error| transport(error, ""))?;
        let status = response.status();
        let text = response
            .text()
            .await
            .map_err(|error| transport(error, "reading the body: "))?;
        if !status.is_success() {
            let detail = format!(
                "{url}: HTTP {}: {}",
                status.as_u16(),
                text.chars().take(300).collect::<String>()
            );
            return Err(match status.as_u16() {
                401 | 403 => Failure::Refused(detail),
                408 | 409 | 425 | 429 | 500..=599 => Failure::Transient(detail),
                _ => Failure::Rejected { detail, body: text },
            });
        }
        serde_json::from_str(&text)
            .map_err(|error| Failure::Failed(format!("{url}: response is not JSON: {error}")))
    }

    /// `body(model)` posted to `<base>/<path>` for each model in turn until one answers as
    /// `read` needs, each retried on transient failures as `retries` says. Refused credentials
    /// end the call and stop this client's requests for the cooldown. Returns the model that
    /// answered and what `read` made of its answer; the last failure when none did.
    pub async fn call<T>(
        &self,
        path: &str,
        models: &[String],
        retries: &Retries,
        body: impl Fn(&str) -> Value,
        read: impl Fn(&Value) -> Result<T, String>,
    ) -> Result<(String, T), Failure> {
        if self.refused() {
            return Err(Failure::Refused(format!(
                "{}: the credentials were refused; waiting out the cooldown",
                self.endpoint.base_url
            )));
        }
        let mut last = Failure::Transient("no model configured".to_owned());
        for model in models {
            let mut attempt = 0;
            loop {
                let answer = self.post(path, &body(model)).await.and_then(|value| {
                    read(&value).map_err(|problem| {
                        Failure::Failed(format!("{}/{path}: {problem}", self.endpoint.base_url))
                    })
                });
                match answer {
                    Ok(answer) => return Ok((model.clone(), answer)),
                    Err(Failure::Refused(detail)) => {
                        *self
                            .refused_until
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner) =
                            Some(Instant::now() + retries.auth_cooldown);
                        return Err(Failure::Refused(detail));
                    }
                    Err(Failure::Transient(detail)) if attempt < retries.retries => {
                        attempt += 1;
                        tracing::debug!(%model, attempt, %detail, "a request failed; retrying");
                        tokio::time::sleep(
                            retries.backoff.saturating_mul(1 << (attempt - 1).min(6)),
                        )
                        .await;
                    }
                    Err(failure) => {
                        last = failure;
                        break;
                    }
                }
            }
        }
        Err(last)
    }

    /// Whether refused credentials still stop requests.
    fn refused(&self) -> bool {
        let mut until = self
            .refused_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match *until {
            Some(at) if Instant::now() < at => true,
            Some(_) => {
                *until = None;
                false
            }
            None => false,
        }
    }
}
