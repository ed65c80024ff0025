//! The OpenAI-compatible embedder against a real HTTP server on 127.0.0.1.

use std::time::Duration;

use vilvona_embed::endpoint::{DIMENSIONS, TestEndpoint};
use vilvona_embed::{EmbedError, Embedder, RemoteEmbedder, RemoteSettings, similarity};

fn settings(endpoint: &TestEndpoint) -> RemoteSettings {
    RemoteSettings {
        base_url: endpoint.base_url(),
        model: "test-model".to_owned(),
        api_key: Some("sk-test".to_owned()),
        dimensions: None,
        batch_size: 4,
        timeout: Duration::from_secs(10),
        retries: 2,
        backoff: Duration::from_millis(1),
        auth_cooldown: Duration::from_secs(600),
    }
}

#[test]
fn texts_are_cut_into_sentences_and_sent_in_batches() {
    let endpoint = TestEndpoint::start().unwrap();
    endpoint.require_key("sk-test");
    let embedder = RemoteEmbedder::new(settings(&endpoint)).unwrap();
    assert_eq!(embedder.name(), "openai:test-model");
    assert!(!embedder.local());
    let texts = [
        ("the deploy failed with a timeout. we rolled it back.", 8),
        ("painting helps me relax", 8),
        ("", 8),
        ("one. two. three. four. five. six.", 2),
        ("a", 8),
        ("b", 8),
    ];
    let vectors = embedder.embed_texts(&texts).unwrap();
    assert_eq!(
        vectors.iter().map(Vec::len).collect::<Vec<_>>(),
        [2, 1, 0, 2, 1, 1]
    );
    // 7 chunks, 4 a request.
    assert_eq!((endpoint.inputs(), endpoint.requests()), (7, 2));
    assert_eq!(endpoint.largest_batch(), 4);
    let norm: f32 = vectors[1][0].iter().map(|x| x * x).sum();
    assert!((norm - 1.0).abs() < 1e-4 && vectors[1][0].len() == DIMENSIONS);
    let query = embedder
        .embed_query("what helps me relax?")
        .unwrap()
        .unwrap();
    assert!(similarity(&query, &vectors[1][0]) > similarity(&query, &vectors[0][0]));
    assert_eq!(embedder.embed_query("  ").unwrap(), None);
}

#[test]
fn unavailable_endpoints_are_retried_then_reported_and_refused_keys_wait_out_a_cooldown() {
    let endpoint = TestEndpoint::start().unwrap();
    let embedder = RemoteEmbedder::new(settings(&endpoint)).unwrap();
    endpoint.fail_with(Some(503));
    let error = embedder.embed_query("hello").unwrap_err();
    assert!(
        matches!(&error, EmbedError::Unavailable(detail) if detail.contains("HTTP 503") && detail.contains("/v1/embeddings")),
        "{error}"
    );
    // The first attempt and two retries.
    assert_eq!(endpoint.requests(), 3);
    endpoint.fail_with(None);
    assert!(embedder.embed_query("hello").unwrap().is_some());

    // A bad request is not retried.
    endpoint.fail_with(Some(400));
    let before = endpoint.requests();
    assert!(matches!(
        embedder.embed_query("hello"),
        Err(EmbedError::Failed(_))
    ));
    assert_eq!(endpoint.requests(), before + 1);

    // Refused credentials: one request, then none until the cooldown has passed.
    endpoint.fail_with(None);
    endpoint.require_key("another key");
    let before = endpoint.requests();
    assert!(matches!(
        embedder.embed_query("hello"),
        Err(EmbedError::Unavailable(detail)) if detail.contains("HTTP 401")
    ));
    assert!(matches!(
        embedder.embed_query("hello"),
        Err(EmbedError::Unavailable(detail)) if detail.contains("cooldown")
    ));
    assert_eq!(endpoint.requests(), before + 1);
}

#[test]
fn an_endpoint_that_does_not_listen_is_unavailable() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let embedder = RemoteEmbedder::new(RemoteSettings {
        base_url: format!("http://127.0.0.1:{port}/v1/"),
        retries: 0,
        ..settings(&TestEndpoint::start().unwrap())
    })
    .unwrap();
    let error = embedder.embed_texts(&[("hello", 1)]).unwrap_err();
    assert!(
        matches!(&error, EmbedError::Unavailable(detail) if detail.contains(&format!("127.0.0.1:{port}/v1/embeddings"))),
        "{error}"
    );
}
