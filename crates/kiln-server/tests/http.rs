//! The server over real sockets on 127.0.0.1 with the tiny Gemma 3
//! fixture: /health answers 503 while the model loads and 200 once it is
//! ready; generation requests meanwhile get 503, not a hang; the router's
//! fallbacks are OpenAI-shaped.

use std::sync::mpsc;
use std::sync::Arc;

use kiln_cpu::CpuBackend;
use kiln_gguf::Gguf;
use kiln_model::Model;
use kiln_runtime::engine::{Engine, EngineConfig};
use kiln_runtime::ChatTemplate;
use kiln_server::request::Limits;
use kiln_server::{AppState, ServerMetrics};
use kiln_tokenizer::Tokenizer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// (status, body) of one request with `Connection: close`.
async fn call(addr: std::net::SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let status = out.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_503_while_loading_then_200() {
    let path = kiln_testdata::fixture("gemma3-tiny/model-f32.gguf");
    let gguf = Arc::new(Gguf::open(path).unwrap());
    let tokenizer = Arc::new(Tokenizer::from_gguf(&gguf).unwrap());
    let (go, wait) = mpsc::channel::<()>();
    let g = gguf.clone();
    let load = move || {
        // Held "loading" until the test says go.
        let _ = wait.recv();
        Ok(Model::load(CpuBackend::with_threads(1), g)?)
    };
    let state = Arc::new(AppState {
        engine: Engine::start(load, tokenizer.clone(), EngineConfig::default()),
        tokenizer,
        chat: ChatTemplate::from_gguf(&gguf).map_err(|e| e.to_string()),
        model_id: "tiny".into(),
        api_key: None,
        max_body_bytes: 1 << 20,
        limits: Limits::default(),
        metrics: ServerMetrics::default(),
        created: 0,
        grammars: Default::default(),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(kiln_server::serve(listener, state.clone(), async {
        let _ = stop_rx.await;
    }));

    let (status, body) = call(addr, "GET", "/health", "").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("\"code\":\"model_loading\""), "{body}");
    let (status, body) = call(addr, "POST", "/v1/completions", r#"{"prompt":"Hi"}"#).await;
    assert_eq!(status, 503, "{body}");

    go.send(()).unwrap();
    let st = state.clone();
    tokio::task::spawn_blocking(move || st.engine.wait_ready())
        .await
        .unwrap()
        .unwrap();
    let (status, body) = call(addr, "GET", "/health", "").await;
    assert_eq!((status, body.as_str()), (200, r#"{"status":"ok"}"#));
    let (status, body) = call(
        addr,
        "POST",
        "/v1/completions",
        r#"{"prompt":"Hi","max_tokens":3,"ignore_eos":true}"#,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"completion_tokens\":3"), "{body}");

    let (status, body) = call(addr, "GET", "/no/such/path", "").await;
    assert_eq!(status, 404);
    assert!(body.contains("\"type\":\"not_found_error\""), "{body}");
    let (status, body) = call(addr, "GET", "/v1/completions", "").await;
    assert_eq!(status, 405, "{body}");
    assert!(body.starts_with("{\"error\":"), "{body}");

    stop_tx.send(()).unwrap();
    server.await.unwrap().unwrap();
}
