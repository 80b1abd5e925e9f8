//! Generation with the real SmolLM2-135M-Instruct (GGUF, llama.cpp) over the OpenAI-compatible
//! routes: a ChatML question answered correctly, eight concurrent sequences that each keep their
//! own cache and share decode steps, streaming, the context limit, and a disconnect that frees its
//! sequence.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::root;
use serde_json::{json, Value};
use sheaf_llama::EngineConfig;
use sheaf_server::openai::Generators;
use sheaf_server::AppState;

struct LlmServer {
    url: String,
    client: reqwest::Client,
    generators: Arc<Generators>,
    _repo: tempfile::TempDir,
}

async fn start() -> LlmServer {
    let gguf = root().join("model_repository/smollm2/model.gguf");
    assert!(
        gguf.is_file(),
        "{} is missing: run scripts/setup.sh",
        gguf.display()
    );
    let repo = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(repo.path().join("smollm2")).unwrap();
    std::os::unix::fs::symlink(
        gguf.canonicalize().unwrap(),
        repo.path().join("smollm2/model.gguf"),
    )
    .unwrap();
    let config = EngineConfig {
        n_ctx: 4096,
        ..EngineConfig::default()
    };
    let generators = Arc::new(Generators::load_dir(repo.path(), config).await);
    assert!(generators.get("smollm2").is_some(), "the GGUF model loads");
    let manager = Arc::new(sheaf_core::ModelManager::new(Vec::new()));
    let state = AppState {
        manager,
        generators: generators.clone(),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let router = sheaf_server::router(state, &sheaf_server::HttpConfig::default());
    tokio::spawn(sheaf_server::serve(
        listener,
        router,
        std::future::pending(),
    ));
    LlmServer {
        url,
        client: reqwest::Client::new(),
        generators,
        _repo: repo,
    }
}

impl LlmServer {
    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let r = self
            .client
            .post(format!("{}{path}", self.url))
            .json(&body)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
    }

    async fn chat(&self, question: &str, max_tokens: usize) -> String {
        let (status, reply) = self
            .post(
                "/v1/chat/completions",
                json!({
                    "model": "smollm2",
                    "messages": [{"role": "user", "content": question}],
                    "temperature": 0,
                    "max_tokens": max_tokens,
                }),
            )
            .await;
        assert_eq!(status, 200, "{reply}");
        reply["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generation_over_the_openai_routes() {
    let server = start().await;
    let engine = server.generators.get("smollm2").unwrap().clone();

    // GET /v1/models lists it.
    let models: Value = server
        .client
        .get(format!("{}/v1/models", server.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], "smollm2");

    // A ChatML question, greedy: Paris, with usage.
    let (status, reply) = server
        .post(
            "/v1/chat/completions",
            json!({
                "model": "smollm2",
                "messages": [{"role": "user", "content": "What is the capital of France?"}],
                "temperature": 0,
                "max_tokens": 24,
            }),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    let content = reply["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(content.contains("Paris"), "{content}");
    assert_eq!(reply["object"], "chat.completion");
    let usage = &reply["usage"];
    assert!(usage["prompt_tokens"].as_u64().unwrap() > 5);
    assert_eq!(
        usage["total_tokens"].as_u64().unwrap(),
        usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap()
    );

    // Eight questions of different lengths, joined at different steps: each keeps its own cache
    // and answers its own question; each first token equals its solo run's.
    let questions = [
        ("What is the capital of France?", "Paris"),
        ("Name the capital of Japan.", "Tokyo"),
        ("What is the capital of Italy?", "Rome"),
        ("Please tell me the capital of Germany.", "Berlin"),
        ("What is the capital of Spain?", "Madrid"),
        ("What is the capital of Russia?", "Moscow"),
        ("What is the capital of the United Kingdom?", "London"),
        ("What is the capital of Egypt?", "Cairo"),
    ];
    let mut solo_first = Vec::new();
    for (q, _) in questions {
        solo_first.push(server.chat(q, 1).await);
    }
    let steps_before = engine.stats.steps.load(Ordering::Relaxed);
    let tokens_before = engine.stats.generated_tokens.load(Ordering::Relaxed);
    let server = Arc::new(server);
    let mut tasks = Vec::new();
    for (i, (q, _)) in questions.iter().enumerate() {
        let server = server.clone();
        let q = q.to_string();
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(15 * i as u64)).await;
            server.chat(&q, 24).await
        }));
    }
    let answers: Vec<String> = futures::future::join_all(tasks)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    for (((q, capital), answer), first) in questions.iter().zip(&answers).zip(&solo_first) {
        assert!(answer.contains(capital), "{q} → {answer}");
        assert!(
            answer.starts_with(first.as_str()),
            "{q}: first token {first:?} alone, but {answer:?} in the batch"
        );
    }
    let steps = engine.stats.steps.load(Ordering::Relaxed) - steps_before;
    let tokens = engine.stats.generated_tokens.load(Ordering::Relaxed) - tokens_before;
    assert!(
        steps < tokens,
        "{tokens} tokens in {steps} decode calls: sequences must share decode steps"
    );

    // Streaming: the chunks add up to the greedy answer, and the stream ends with [DONE].
    let body = json!({
        "model": "smollm2",
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "temperature": 0,
        "max_tokens": 24,
        "stream": true,
    });
    let text = server
        .client
        .post(format!("{}/v1/chat/completions", server.url))
        .json(&body)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let data: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "{text}");
    let streamed: String = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str::<Value>(d).unwrap())
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    assert_eq!(streamed, answers[0]);

    // Completions with a stop string: the text ends before it.
    let (status, reply) = server
        .post(
            "/v1/completions",
            json!({
                "model": "smollm2",
                "prompt": "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
                "temperature": 0,
                "max_tokens": 24,
                "stop": ["Paris"],
            }),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    let text = reply["choices"][0]["text"].as_str().unwrap();
    assert!(!text.contains("Paris") && !text.is_empty(), "{text}");
    assert_eq!(reply["choices"][0]["finish_reason"], "stop");

    // A prompt over the context: 400 with the limit.
    let long = "word ".repeat(5000);
    let (status, reply) = server
        .post(
            "/v1/completions",
            json!({"model": "smollm2", "prompt": long, "max_tokens": 4}),
        )
        .await;
    assert_eq!(status, 400, "{reply}");
    let message = reply["error"]["message"].as_str().unwrap();
    assert!(message.contains("4096"), "{message}");

    // Unknown model: 404.
    let (status, _) = server
        .post("/v1/completions", json!({"model": "nope", "prompt": "hi"}))
        .await;
    assert_eq!(status, 404);

    // A client that disconnects frees its sequence.
    let mut body = body.clone();
    body["max_tokens"] = json!(2000);
    body["messages"][0]["content"] = json!("Write a very long story about a dragon.");
    let mut response = server
        .client
        .post(format!("{}/v1/chat/completions", server.url))
        .json(&body)
        .send()
        .await
        .unwrap();
    let _ = response.chunk().await;
    assert_eq!(engine.stats.running.load(Ordering::Relaxed), 1);
    drop(response);
    let mut freed = false;
    for _ in 0..200 {
        if engine.stats.running.load(Ordering::Relaxed) == 0 {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(freed, "the disconnected sequence was not freed");
    assert_eq!(engine.stats.kv_reserved.load(Ordering::Relaxed), 0);
}
