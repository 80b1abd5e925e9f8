//! Generation with the real SmolLM2-135M-Instruct (GGUF, llama.cpp) over the OpenAI-compatible
//! routes: a ChatML question answered correctly, eight concurrent sequences that each keep their
//! own cache and share decode steps, streaming, the context limit, a disconnect that frees its
//! sequence, prefix caching that changes no output, and preemption when the KV cache runs short;
//! and the model's place in the KServe API: metadata, readiness, unload and load over HTTP and
//! gRPC.

#[path = "../../sheaf-server/tests/common/mod.rs"]
mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::root;
use serde_json::{json, Value};
use sheaf_backend::generation::Generator;
use sheaf_core::ControlMode;

/// A server of the binary's backends, generation included.
struct LlmServer(common::TestServer);

impl std::ops::Deref for LlmServer {
    type Target = common::TestServer;

    fn deref(&self) -> &common::TestServer {
        &self.0
    }
}

/// Holds this file's tests one at a time. At each decode step llama.cpp's threads wait for one
/// another by spinning, so two engines on the same cores hold each other back many times over:
/// on 2 cores the tests took 207-375 s two at a time, and 26 s one after another.
async fn alone() -> tokio::sync::MutexGuard<'static, ()> {
    static ENGINES: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    ENGINES.lock().await
}

async fn start() -> LlmServer {
    start_with("n_ctx: 4096").await
}

/// Links the demo's GGUF model into `repo` as `name`, with a `config.yaml` of `config`.
fn link_gguf(repo: &std::path::Path, name: &str, config: &str) {
    let gguf = root().join("model_repository/smollm2/model.gguf");
    assert!(
        gguf.is_file(),
        "{} is missing: run scripts/setup.sh",
        gguf.display()
    );
    std::fs::create_dir_all(repo.join(name)).unwrap();
    std::os::unix::fs::symlink(
        gguf.canonicalize().unwrap(),
        repo.join(name).join("model.gguf"),
    )
    .unwrap();
    std::fs::write(repo.join(name).join("config.yaml"), config).unwrap();
}

/// The backends of `sheaf serve`.
fn backends() -> Vec<Arc<dyn sheaf_backend::Backend>> {
    common::init_runtime();
    vec![
        Arc::new(sheaf_onnx::OnnxBackend::default()),
        Arc::new(sheaf_sim::SimBackend),
        Arc::new(sheaf_llama::GgufBackend),
    ]
}

/// `smollm2`, its engine sized by `generation` (the inside of the config's `generation`
/// section), loaded at start, in the `explicit` control mode.
async fn start_with(generation: &str) -> LlmServer {
    let repo = tempfile::tempdir().unwrap();
    link_gguf(
        repo.path(),
        "smollm2",
        &format!("preload: true\ngeneration: {{{generation}}}\n"),
    );
    serve(
        repo,
        sheaf_core::ServerConfig::default(),
        ControlMode::Explicit,
    )
    .await
}

async fn serve(
    repo: tempfile::TempDir,
    config: sheaf_core::ServerConfig,
    control: ControlMode,
) -> LlmServer {
    LlmServer(common::start_with_backends(repo, backends(), config, control).await)
}

impl LlmServer {
    /// The engine of generation model `name`.
    fn engine_of(&self, name: &str) -> Arc<dyn Generator> {
        let handle = self.manager.get(name, None).expect("the model is loaded");
        handle.generator().expect("a generation model").clone()
    }

    fn engine(&self) -> Arc<dyn Generator> {
        self.engine_of("smollm2")
    }

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

    /// A KServe tensor inference request for the generation model.
    async fn tensor_infer(&self) -> (u16, Value) {
        self.post(
            "/v2/models/smollm2/infer",
            json!({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0]}]}),
        )
        .await
    }

    async fn get(&self, path: &str) -> Value {
        let r = self.client.get(format!("{}{path}", self.url)).send().await;
        r.unwrap().json().await.unwrap()
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
    let _alone = alone().await;
    let server = start().await;
    let engine = server.engine();

    // GET /v1/models lists it.
    let models: Value = server.get("/v1/models").await;
    assert_eq!(models["data"][0]["id"], "smollm2");
    // The repository index lists it too, like any model of the repository.
    let (_, index) = server.post("/v2/repository/index", json!({})).await;
    assert_eq!(index[0]["name"], "smollm2");
    assert_eq!(index[0]["state"], "READY");

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
    let steps_before = engine.stats().steps.load(Ordering::Relaxed);
    let tokens_before = engine.stats().generated_tokens.load(Ordering::Relaxed);
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
    let steps = engine.stats().steps.load(Ordering::Relaxed) - steps_before;
    let tokens = engine.stats().generated_tokens.load(Ordering::Relaxed) - tokens_before;
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

    // A client that disconnects frees its sequence. Counting goes on for 2,000 tokens (about
    // 20 s on 2 cores) unless the sequence is dropped.
    let counting = json!({
        "model": "smollm2",
        "prompt": "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,",
        "temperature": 0,
        "max_tokens": 2000,
        "stream": true,
    });
    let mut response = server
        .client
        .post(format!("{}/v1/completions", server.url))
        .json(&counting)
        .send()
        .await
        .unwrap();
    let _ = response.chunk().await;
    let running = || engine.stats().running.load(Ordering::Relaxed);
    for _ in 0..500 {
        if running() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(running(), 1, "the counting sequence runs");
    let generated = || engine.stats().generated_tokens.load(Ordering::Relaxed);
    let before = generated();
    drop(response);
    while running() != 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Freed within a few decode steps, long before its 2,000 tokens: counted, not timed.
    let after_drop = generated() - before;
    assert!(
        after_drop < 200,
        "{after_drop} tokens were generated after the client left"
    );

    // /stats and /metrics show the generation figures.
    let stats: Value = server.get("/stats").await;
    let g = &stats["generation"]["smollm2"];
    assert!(g["generated_tokens"].as_u64().unwrap() > 50, "{g}");
    assert!(g["tokens_per_second_while_decoding"].as_f64().unwrap() > 0.0);
    assert_eq!(g["running_sequences"], 0);
    let metrics = server.manager.encode_metrics();
    common::promtool_check(&metrics);

    // The dashboard draws a generation row with the same count.
    let profile = tempfile::tempdir().unwrap();
    let (page, dir) = (format!("{}/", server.url), profile.path().to_path_buf());
    let dom = tokio::task::spawn_blocking(move || common::render(&page, &dir))
        .await
        .unwrap();
    let row = &dom[dom.find("id=\"gen-smollm2\"").expect("a generation row")..];
    let needle = "class=\"generated\">";
    let cell = &row[row.find(needle).unwrap() + needle.len()..];
    assert_eq!(
        &cell[..cell.find('<').unwrap()],
        g["generated_tokens"].to_string()
    );
    for line in [
        r#"sheaf_generation_time_to_first_token_seconds_count{model="smollm2"}"#,
        r#"sheaf_generation_inter_token_latency_seconds_count{model="smollm2"}"#,
        r#"sheaf_generation_tokens_total{model="smollm2",kind="completion"}"#,
        r#"sheaf_generation_sequences{model="smollm2",state="running"} 0"#,
        r#"sheaf_generation_prefix_cache_hits_total{model="smollm2"}"#,
    ] {
        assert!(metrics.contains(line), "{line} missing:\n{metrics}");
    }
    assert_eq!(engine.stats().running.load(Ordering::Relaxed), 0);
}

fn chat_body(system: &str, question: &str, max_tokens: usize) -> Value {
    json!({
        "model": "smollm2",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "temperature": 0,
        "max_tokens": max_tokens,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_prefix_is_computed_once_and_changes_no_output() {
    let _alone = alone().await;
    let system = "You are a helpful geography assistant. Answer every question with one short, \
                  accurate sentence that names the city.";
    let cached = start().await;
    let uncached = start_with("n_ctx: 4096, prefix_slots: 0").await;
    let engine = cached.engine();
    let (status, first) = cached
        .post(
            "/v1/chat/completions",
            chat_body(system, "What is the capital of France?", 16),
        )
        .await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(engine.stats().prefix_hits.load(Ordering::Relaxed), 0);
    for question in [
        "What is the capital of Italy?",
        "What is the capital of Spain?",
    ] {
        let (_, hit) = cached
            .post("/v1/chat/completions", chat_body(system, question, 16))
            .await;
        let (_, cold) = uncached
            .post("/v1/chat/completions", chat_body(system, question, 16))
            .await;
        assert_eq!(
            hit["choices"][0]["message"]["content"], cold["choices"][0]["message"]["content"],
            "{question}"
        );
    }
    assert_eq!(engine.stats().prefix_hits.load(Ordering::Relaxed), 2);
    // The system prompt (more than 20 tokens) was not prefilled again.
    let reused = engine.stats().prefix_tokens_reused.load(Ordering::Relaxed);
    assert!(reused >= 40, "{reused} prompt tokens reused");
    let other = uncached.engine();
    assert!(
        engine.stats().prompt_tokens.load(Ordering::Relaxed) + reused
            == other.stats().prompt_tokens.load(Ordering::Relaxed)
                + first["usage"]["prompt_tokens"].as_u64().unwrap(),
        "the saved prefill is exactly the reused tokens"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_cache_runs_short_the_newest_sequence_waits_and_every_request_finishes() {
    let _alone = alone().await;
    let server = Arc::new(start_with("n_ctx: 256, prefix_slots: 0").await);
    let engine = server.engine();
    let mut tasks = Vec::new();
    for topic in ["a dragon", "a robot", "the sea", "a forest"] {
        let server = server.clone();
        tasks.push(tokio::spawn(async move {
            server
                .post(
                    "/v1/chat/completions",
                    json!({
                        "model": "smollm2",
                        "messages": [{"role": "user", "content": format!("Write a long story about {topic}.")}],
                        "temperature": 0,
                        "max_tokens": 150,
                    }),
                )
                .await
        }));
    }
    for task in tasks {
        let (status, reply) = task.await.unwrap();
        assert_eq!(status, 200, "{reply}");
        let tokens = reply["usage"]["completion_tokens"].as_u64().unwrap();
        let reason = reply["choices"][0]["finish_reason"].as_str().unwrap();
        assert!(reason == "stop" || tokens == 150, "{reason} after {tokens}");
    }
    assert!(
        engine.stats().preemptions.load(Ordering::Relaxed) > 0,
        "four long stories must not fit 256 cells at once"
    );
    // The engine publishes its figures after the step that sent the last answer: wait for it.
    let mut kv_used = engine.stats().kv_used.load(Ordering::Relaxed);
    for _ in 0..200 {
        if kv_used == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        kv_used = engine.stats().kv_used.load(Ordering::Relaxed);
    }
    assert_eq!(
        kv_used, 0,
        "every cell released once every request finished"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_engine_refuses_at_once_with_503() {
    let _alone = alone().await;
    let server = Arc::new(start_with("max_seqs: 1, max_waiting: 1").await);
    // One long stream holds the only slot.
    let mut long = server
        .client
        .post(format!("{}/v1/completions", server.url))
        .json(&json!({
            "model": "smollm2",
            "prompt": "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,",
            "temperature": 0,
            "max_tokens": 2000,
            "stream": true,
        }))
        .send()
        .await
        .unwrap();
    let _ = long.chunk().await;
    // One request may wait in the queue and one in the engine's inbox; the rest are refused.
    let short = json!({"model": "smollm2", "prompt": "Hello", "max_tokens": 2});
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let (server, short) = (server.clone(), short.clone());
            tokio::spawn(async move { server.post("/v1/completions", short).await })
        })
        .collect();
    // The refused ones come back while the slot is still held.
    for _ in 0..1000 {
        if tasks.iter().filter(|t| t.is_finished()).count() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(long);
    let replies: Vec<(u16, Value)> = futures::future::join_all(tasks)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let refused: Vec<&Value> = replies
        .iter()
        .filter(|(s, _)| *s == 503)
        .map(|(_, r)| r)
        .collect();
    assert!(refused.len() >= 2, "{replies:?}");
    assert!(refused[0]["error"]["message"]
        .as_str()
        .unwrap()
        .contains("already waiting"));
    assert!(
        replies.iter().any(|(s, _)| *s == 200),
        "a queued request is served once the slot frees: {replies:?}"
    );
    // More prompts in one request than the queue holds could never all be queued.
    let (status, body) = server
        .post(
            "/v1/completions",
            json!({"model": "smollm2", "prompt": ["a", "b"], "max_tokens": 1}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("2 prompts, but this model queues at most 1 requests"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kserve_api_describes_unloads_and_loads_a_generation_model() {
    let _alone = alone().await;
    use sheaf_server::grpc::pb;
    let server = start().await;
    let mut grpc = pb::grpc_inference_service_client::GrpcInferenceServiceClient::connect(
        server.grpc_url.clone(),
    )
    .await
    .unwrap();

    // Metadata and readiness, over HTTP and gRPC: a llama.cpp model without tensors.
    let meta = server.get("/v2/models/smollm2").await;
    assert_eq!(meta["platform"], "llama.cpp");
    assert_eq!(meta["inputs"], json!([]));
    let ready = server
        .client
        .get(format!("{}/v2/models/smollm2/ready", server.url));
    assert_eq!(ready.send().await.unwrap().status(), 200);
    let meta = grpc
        .model_metadata(pb::ModelMetadataRequest {
            name: "smollm2".into(),
            version: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(meta.platform, "llama.cpp");
    let ready = |grpc: &mut pb::grpc_inference_service_client::GrpcInferenceServiceClient<_>| {
        let mut grpc = grpc.clone();
        async move {
            grpc.model_ready(pb::ModelReadyRequest {
                name: "smollm2".into(),
                version: String::new(),
            })
            .await
            .unwrap()
            .into_inner()
            .ready
        }
    };
    assert!(ready(&mut grpc).await);

    // Tensor inference on it says where to go instead.
    let (status, reply) = server.tensor_infer().await;
    assert_eq!(status, 400);
    assert!(
        reply["error"]
            .as_str()
            .unwrap()
            .contains("/v1/chat/completions"),
        "{reply}"
    );

    // Its weights and KV cache are booked on the CPU.
    let info = server.engine().info().clone();
    assert!(
        info.size_bytes > 50 << 20 && info.kv_cache_bytes > 0,
        "{info:?}"
    );
    assert_eq!(server.manager.memory_used(), [info.memory_bytes()]);
    assert_eq!(server.manager.device_usage()[0].models, 1);
    let (_, index) = server.post("/v2/repository/index", json!({})).await;
    assert_eq!(index[0]["devices"], json!(["cpu"]), "{index}");

    // Unload while a sequence runs: the sequence finishes whole, and the unload answers after it.
    let engine = server.engine();
    let stats = engine.stats();
    let answer = {
        let client = server.client.clone();
        let url = format!("{}/v1/completions", server.url);
        tokio::spawn(async move {
            let body = json!({"model": "smollm2", "prompt": "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,",
                              "temperature": 0, "max_tokens": 48});
            let r = client.post(url).json(&body).send().await.unwrap();
            r.json::<Value>().await.unwrap()
        })
    };
    // Up to 60 s for the sequence to start: on a loaded machine the prompt takes a while.
    for _ in 0..6000 {
        if stats.running.load(Ordering::Relaxed) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(stats.running.load(Ordering::Relaxed), 1);
    let (status, reply) = server
        .post("/v2/repository/models/smollm2/unload", json!({}))
        .await;
    assert_eq!(status, 200, "{reply}");
    // The engine publishes its counts once a step is done, just after the sequence is dropped
    // (which is what the unload waits for): they read 0 soon after.
    for _ in 0..500 {
        if stats.running.load(Ordering::Relaxed) == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(stats.running.load(Ordering::Relaxed), 0);
    let answer = answer.await.unwrap();
    assert_eq!(answer["choices"][0]["finish_reason"], "length", "{answer}");
    assert_eq!(answer["usage"]["completion_tokens"], 48, "{answer}");
    assert_eq!(server.manager.memory_used(), [0], "the booking is released");

    drop(engine);

    // Unloaded: listed as such, gone from /v1/models and refused as any unloaded model is.
    let (_, index) = server.post("/v2/repository/index", json!({})).await;
    assert_eq!(index[0]["state"], "UNAVAILABLE", "{index}");
    assert_eq!(index[0]["reason"], "not loaded");
    assert_eq!(index[0]["platform"], "llama.cpp");
    assert_eq!(server.get("/v1/models").await["data"], json!([]));
    let (status, reply) = server
        .post(
            "/v1/chat/completions",
            json!({"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}]}),
        )
        .await;
    assert_eq!(status, 503, "{reply}");
    assert!(reply["error"]["message"]
        .as_str()
        .unwrap()
        .contains("not loaded"));
    assert!(!ready(&mut grpc).await);

    // In the on_demand control mode, the first request loads it.
    let repo = tempfile::tempdir().unwrap();
    link_gguf(repo.path(), "smollm2", "generation: {n_ctx: 4096}\n");
    let loading = serve(repo, Default::default(), ControlMode::OnDemand).await;
    assert_eq!(loading.manager.generators(), Vec::<String>::new());
    // Listed before it loads: a client picks it from /v1/models, and its request loads it.
    let listed = loading.get("/v1/models").await;
    assert_eq!(listed["data"][0]["id"], "smollm2", "{listed}");
    assert!(listed["data"][0].get("max_model_len").is_none(), "{listed}");
    assert_eq!(loading.get("/v1/models/smollm2").await["id"], "smollm2");
    assert!(loading
        .chat("What is the capital of France?", 24)
        .await
        .contains("Paris"));
    assert_eq!(loading.manager.generators(), ["smollm2"]);
    assert_eq!(
        loading.get("/v1/models").await["data"][0]["max_model_len"],
        4096
    );
    drop(loading);

    // Loaded again over gRPC, it answers as before.
    grpc.repository_model_load(pb::RepositoryModelLoadRequest {
        model_name: "smollm2".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    assert!(ready(&mut grpc).await);
    assert!(server
        .chat("What is the capital of France?", 24)
        .await
        .contains("Paris"));
    let index = grpc
        .repository_index(pb::RepositoryIndexRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(index.models[0].state, "READY");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_by_the_shutdown_timeout_ends_with_an_error_event() {
    let _alone = alone().await;
    let server = start().await;
    let body = json!({
        "model": "smollm2",
        "messages": [{"role": "user", "content": "Write a long story about a dragon and a knight."}],
        "temperature": 0,
        "max_tokens": 2000,
        "stream": true,
    });
    let mut response = server
        .client
        .post(format!("{}/v1/chat/completions", server.url))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let first = response.chunk().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("data: "));
    // A shutdown begins: new requests are refused in OpenAI's shape, the stream goes on.
    server.state.drain.begin();
    let (status, reply) = server.post("/v1/chat/completions", body.clone()).await;
    assert_eq!(status, 503, "{reply}");
    assert_eq!(reply["error"]["type"], "server_overloaded", "{reply}");
    assert_eq!(server.state.drain.in_flight(), 1);
    // The timeout ends it: the stream's last event says why, and no [DONE] follows.
    server.state.drain.cut();
    let mut rest = String::new();
    while let Some(chunk) = response.chunk().await.unwrap() {
        rest.push_str(&String::from_utf8_lossy(&chunk));
    }
    let last = rest
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .next_back()
        .unwrap_or_default()
        .to_string();
    let event: Value = serde_json::from_str(&last).unwrap_or_else(|_| panic!("{rest}"));
    assert!(
        event["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("shut down before this answer was complete"),
        "{event}"
    );
    assert_eq!(server.state.drain.in_flight(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_k_min_p_penalties_and_logit_bias_change_what_is_sampled() {
    let _alone = alone().await;
    let server = start().await;
    let ask = |extra: Value| {
        let mut body = json!({
            "model": "smollm2",
            "messages": [{"role": "user", "content": "Name three colours and say why you like them."}],
            "max_tokens": 32,
        });
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let server = &server;
        async move {
            let (status, reply) = server.post("/v1/chat/completions", body).await;
            assert_eq!(status, 200, "{reply}");
            reply["choices"][0]["message"]["content"]
                .as_str()
                .unwrap()
                .to_string()
        }
    };
    let greedy = ask(json!({"temperature": 0})).await;
    // top_k 1, or min_p 1, leaves only the most likely token: sampling at temperature 1 is
    // then greedy, whatever the seed.
    for seed in [1, 7] {
        let top_k = ask(json!({"temperature": 1.0, "top_k": 1, "seed": seed})).await;
        assert_eq!(top_k, greedy, "top_k 1, seed {seed}");
        let min_p = ask(json!({"temperature": 1.0, "min_p": 1.0, "seed": seed})).await;
        assert_eq!(min_p, greedy, "min_p 1, seed {seed}");
    }
    // A bias of +100 on one token makes it every token.
    let forced = ask(json!({"temperature": 0, "logit_bias": {"28": 100}, "max_tokens": 6})).await;
    assert!(!forced.is_empty() && forced.len() % 6 == 0, "{forced:?}");
    assert_eq!(forced, forced[..forced.len() / 6].repeat(6), "{forced:?}");
    // Penalties on what was already generated change the greedy answer.
    let penalized =
        ask(json!({"temperature": 0, "frequency_penalty": 2.0, "presence_penalty": 2.0})).await;
    assert_ne!(penalized, greedy);
    // A token id beyond the vocabulary is a 400 that says so.
    let (status, reply) = server
        .post(
            "/v1/chat/completions",
            json!({"model": "smollm2", "messages": [{"role": "user", "content": "hi"}],
                   "logit_bias": {"99999999": 5}}),
        )
        .await;
    assert_eq!(status, 400, "{reply}");
    assert!(reply["error"]["message"]
        .as_str()
        .unwrap()
        .contains("vocabulary"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_and_detokenize_use_the_models_own_tokenizer() {
    let _alone = alone().await;
    let server = start().await;
    // A chat is counted as a completion counts its prompt.
    let messages = json!([{"role": "user", "content": "What is the capital of France?"}]);
    let (status, tokenized) = server
        .post(
            "/tokenize",
            json!({"model": "smollm2", "messages": messages}),
        )
        .await;
    assert_eq!(status, 200, "{tokenized}");
    let (status, answer) = server
        .post(
            "/v1/chat/completions",
            json!({"model": "smollm2", "messages": messages, "max_tokens": 1}),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(tokenized["count"], answer["usage"]["prompt_tokens"]);
    assert_eq!(
        tokenized["tokens"].as_array().unwrap().len() as u64,
        tokenized["count"].as_u64().unwrap()
    );
    assert_eq!(tokenized["max_model_len"], 4096);
    // A text comes back from its tokens.
    let (status, text) = server
        .post(
            "/tokenize",
            json!({"model": "smollm2", "prompt": "Paris is lovely in spring."}),
        )
        .await;
    assert_eq!(status, 200, "{text}");
    let (status, back) = server
        .post(
            "/detokenize",
            json!({"model": "smollm2", "tokens": text["tokens"]}),
        )
        .await;
    assert_eq!(status, 200, "{back}");
    assert!(
        back["prompt"]
            .as_str()
            .unwrap()
            .ends_with("Paris is lovely in spring."),
        "{back}"
    );
    // Errors in OpenAI's shape: an id outside the vocabulary, both or neither input, a field
    // that is not vLLM's, an unknown model.
    for (path, body, status) in [
        (
            "/detokenize",
            json!({"model": "smollm2", "tokens": [1, 99999999]}),
            400,
        ),
        ("/tokenize", json!({"model": "smollm2"}), 400),
        (
            "/tokenize",
            json!({"model": "smollm2", "prompt": "a", "messages": messages}),
            400,
        ),
        (
            "/tokenize",
            json!({"model": "smollm2", "prompt": "a", "add_generation": true}),
            400,
        ),
        ("/tokenize", json!({"model": "nope", "prompt": "a"}), 404),
    ] {
        let (got, reply) = server.post(path, body.clone()).await;
        assert_eq!(got, status, "{body}: {reply}");
        assert!(reply["error"]["message"].is_string(), "{reply}");
    }
    let (status, empty) = server
        .post("/detokenize", json!({"model": "smollm2", "tokens": []}))
        .await;
    assert_eq!(status, 200);
    assert_eq!(empty["prompt"], "");
}

/// Infers one `[1, 512]` row on the MLP copy `model` over KServe JSON; the output row.
async fn infer_mlp(server: &LlmServer, model: &str, x: &[f32]) -> Vec<f32> {
    let body = json!({"inputs": [{"name": "input", "shape": [1, 512], "datatype": "FP32",
                                  "data": x}]});
    let (status, reply) = server
        .post(&format!("/v2/models/{model}/infer"), body)
        .await;
    assert_eq!(status, 200, "{model}: {reply}");
    reply["outputs"][0]["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap() as f32)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generation_and_tensor_models_share_one_ledger_and_are_evicted_alike() {
    let _alone = alone().await;
    // Two GGUF models and two ONNX models, at most two loaded at once, loaded on demand.
    let repo = tempfile::tempdir().unwrap();
    for name in ["smollm2", "smollm2_b"] {
        link_gguf(repo.path(), name, "generation: {n_ctx: 1024}\n");
    }
    for name in ["mlp", "mlp_b"] {
        std::fs::create_dir_all(repo.path().join(name)).unwrap();
        std::os::unix::fs::symlink(
            common::model_file(common::MLP).canonicalize().unwrap(),
            repo.path().join(name).join("model.onnx"),
        )
        .unwrap();
    }
    let config = sheaf_core::ServerConfig::from_yaml("max_models: 2\n").unwrap();
    let server = serve(repo, config, ControlMode::OnDemand).await;
    assert_eq!(server.manager.models_held(), 0);
    let x = common::floats(7, 512);
    let want = common::in_process(common::MLP, &[1, 512], &x);
    for round in 0..2 {
        for name in ["smollm2", "mlp", "smollm2_b", "mlp_b"] {
            if name.starts_with("smollm2") {
                let (status, reply) = server
                    .post(
                        "/v1/chat/completions",
                        json!({"model": name, "temperature": 0, "max_tokens": 24,
                               "messages": [{"role": "user",
                                             "content": "What is the capital of France?"}]}),
                    )
                    .await;
                assert_eq!(status, 200, "{name}: {reply}");
                let answer = reply["choices"][0]["message"]["content"].as_str().unwrap();
                assert!(answer.contains("Paris"), "{name}, round {round}: {answer}");
            } else {
                let got = infer_mlp(&server, name, &x).await;
                common::assert_close(&got, &want, 1e-4, name);
            }
            // The ledger never holds more than the cap, whatever the kinds.
            assert!(server.manager.models_held() <= 2, "{name}, round {round}");
            let ready = server.manager.index(true);
            assert!(ready.len() <= 2, "{ready:?}");
            assert!(ready.iter().any(|m| m.name == name), "{name} is loaded");
        }
    }
    // Each generation model was evicted while idle, and loaded again when asked for.
    for name in ["smollm2", "smollm2_b", "mlp"] {
        let info = server.manager.model_info(name).unwrap();
        assert!(info.evictions >= 1 && info.loads >= 2, "{name}: {info:?}");
    }
    let smollm2 = server.manager.model_info("smollm2_b").unwrap();
    assert_eq!(smollm2.platform, "llama.cpp");
    assert!(
        smollm2.memory_bytes > 50 << 20,
        "booked at its size: {smollm2:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_generation_model_is_unloaded_and_preload_and_placement_apply() {
    let _alone = alone().await;
    let repo = tempfile::tempdir().unwrap();
    link_gguf(
        repo.path(),
        "smollm2",
        "preload: true\npreferred_device: cpu\ngeneration: {n_ctx: 1024}\n",
    );
    link_gguf(repo.path(), "lazy", "generation: {n_ctx: 1024}\n");
    link_gguf(
        repo.path(),
        "on_gpu",
        "preferred_device: cuda:0\ngeneration: {n_ctx: 1024}\n",
    );
    let config =
        sheaf_core::ServerConfig::from_yaml("devices: [cpu, \"cuda:0\"]\nidle_timeout_s: 1\n")
            .unwrap();
    let server = serve(repo, config, ControlMode::Explicit).await;
    // `preload` loads at start in the explicit mode, on the device it names; the others wait.
    let info = server.manager.model_info("smollm2").unwrap();
    assert_eq!(info.state, sheaf_core::ModelState::Ready);
    assert_eq!(info.devices, ["cpu"]);
    assert_eq!(
        server.manager.model_info("lazy").unwrap().state,
        sheaf_core::ModelState::Unavailable
    );
    // This build runs llama.cpp on the CPU: a model placed on a GPU says so.
    let Err(error) = server.manager.load("on_gpu").await else {
        panic!("a GGUF model loaded on cuda:0 in a CPU build");
    };
    assert!(
        error.message.contains("cuda:0") && error.message.contains("`cuda` feature"),
        "{error}"
    );
    // Unused for the idle timeout, it is unloaded.
    let mut state = sheaf_core::ModelState::Ready;
    for _ in 0..600 {
        state = server.manager.model_info("smollm2").unwrap().state;
        if state == sheaf_core::ModelState::Unavailable {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(state, sheaf_core::ModelState::Unavailable);
    assert_eq!(server.manager.memory_used(), [0, 0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_higher_priority_request_is_admitted_first_and_a_waiting_one_times_out() {
    let _alone = alone().await;
    let repo = tempfile::tempdir().unwrap();
    link_gguf(
        repo.path(),
        "smollm2",
        "preload: true\npriority_levels: 2\ngeneration: {n_ctx: 2048, max_seqs: 1}\n",
    );
    let server = Arc::new(serve(repo, Default::default(), ControlMode::Explicit).await);
    let engine = server.engine();
    let waiting = |n: usize| {
        let engine = engine.clone();
        async move {
            for _ in 0..1000 {
                if engine.stats().waiting.load(Ordering::Relaxed) == n {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            panic!("{n} requests never waited");
        }
    };
    // A long stream holds the only sequence slot.
    let mut long = server
        .client
        .post(format!("{}/v1/completions", server.url))
        .json(
            &json!({"model": "smollm2", "prompt": "1, 2, 3, 4, 5,", "temperature": 0,
                      "max_tokens": 1500, "stream": true}),
        )
        .send()
        .await
        .unwrap();
    let _ = long.chunk().await;
    let finished = Arc::new(std::sync::Mutex::new(Vec::new()));
    let ask = |label: &'static str, extra: Value| {
        let (server, finished) = (server.clone(), finished.clone());
        let mut body = json!({"model": "smollm2", "prompt": "Hello", "max_tokens": 2});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        tokio::spawn(async move {
            let reply = server.post("/v1/completions", body).await;
            finished.lock().unwrap().push(label);
            reply
        })
    };
    // The low level arrives first, then the high one.
    let low = ask("low", json!({"priority": 2}));
    waiting(1).await;
    let high = ask("high", json!({"priority": 1}));
    waiting(2).await;
    // A request that may wait 0.2 s is answered with a timeout while the slot is still held.
    let (status, reply) = ask("timed out", json!({"priority": 2, "timeout": 0.2}))
        .await
        .unwrap();
    assert_eq!(status, 504, "{reply}");
    assert!(reply["error"]["message"]
        .as_str()
        .unwrap()
        .contains("timed out"));
    assert_eq!(engine.stats().running.load(Ordering::Relaxed), 1);
    assert_eq!(engine.stats().timeouts.load(Ordering::Relaxed), 1);
    // A level beyond the model's is refused at once.
    let (status, reply) = server
        .post(
            "/v1/completions",
            json!({"model": "smollm2", "prompt": "Hi", "priority": 3}),
        )
        .await;
    assert_eq!(status, 400, "{reply}");
    assert!(reply["error"]["message"]
        .as_str()
        .unwrap()
        .contains("priority 3"));
    // The slot frees: the high level runs before the low one, which came first.
    drop(long);
    for task in [high, low] {
        let (status, reply) = task.await.unwrap();
        assert_eq!(status, 200, "{reply}");
    }
    assert_eq!(*finished.lock().unwrap(), ["timed out", "high", "low"]);
}

/// `sheaf bench --generate` against the server: a level runs `--requests` in all, or its
/// clients send until `--duration` has passed (a level of time, as every other pattern's),
/// else twice its concurrency.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_generate_levels_run_a_count_or_a_duration() {
    let _alone = alone().await;
    let server = start().await;
    let out = tempfile::tempdir().unwrap();
    let (url, dir) = (server.url.clone(), out.path().to_path_buf());
    let level = move |flags: &[&str]| {
        let json = dir.join("levels.json");
        let run = std::process::Command::new(env!("CARGO_BIN_EXE_sheaf"))
            .args([
                "bench",
                "--generate",
                "--model",
                "smollm2",
                "--max-tokens",
                "4",
            ])
            .args(["--url", &url])
            .args(flags)
            .arg("--json")
            .arg(&json)
            .output()
            .unwrap();
        assert!(run.status.success(), "{run:?}");
        let levels: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
        assert_eq!(levels[0]["errors"], 0, "{levels}");
        (
            levels[0]["requests"].as_u64().unwrap(),
            levels[0]["seconds"].as_f64().unwrap(),
        )
    };
    let (counted, timed, default) = tokio::task::spawn_blocking(move || {
        (
            level(&["--concurrency", "2", "--requests", "3"]),
            level(&["--concurrency", "2", "--duration", "2"]),
            level(&["--concurrency", "2"]),
        )
    })
    .await
    .unwrap();
    assert_eq!(counted.0, 3);
    assert_eq!(default.0, 4);
    // Each client sends until the two seconds have passed: at least one request each, and the
    // level lasts them out, however fast or slow its requests are.
    assert!(timed.0 >= 2 && timed.1 >= 2.0, "{timed:?}");
}
