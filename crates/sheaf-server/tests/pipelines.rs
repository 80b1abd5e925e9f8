//! A text pipeline on real models: texts tokenised by a built-in step, embedded by
//! all-MiniLM-L6-v2 through its own queue, and the pooled vectors equal to what
//! `/v1/embeddings` answers for the same texts.

mod common;

use bytes::Bytes;
use common::*;
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tokenize_step_feeds_an_encoder_as_the_embeddings_route_does() {
    let encoder = root().join("model_repository/minilm");
    let tokenizer = encoder.join("tokenizer.json");
    assert!(tokenizer.is_file(), "run scripts/setup.sh");
    let config = std::fs::read_to_string(encoder.join("config.yaml")).unwrap();
    let pipeline = format!(
        "inputs: [text]\nsteps:\n  - tokenize: {{from: text, ids: ids, mask: mask, types: types, \
         tokenizer: {}, max_tokens: 256}}\n  - model: minilm\n    inputs: {{input_ids: ids, \
         attention_mask: mask, token_type_ids: types}}\n    outputs: {{embedding: vector}}\n\
         outputs: [vector]\n",
        tokenizer.display()
    );
    let tokenizer_json = std::fs::read_to_string(&tokenizer).unwrap();
    let server = start_with_files(
        &[("minilm", "model_repository/minilm/1/model.onnx", &config)],
        &[
            ("minilm/tokenizer.json", &tokenizer_json),
            ("embed/pipeline.yaml", &pipeline),
        ],
    )
    .await;
    let texts = [
        "The cat sat on the mat.",
        "A feline rested on a rug beside the fire.",
    ];
    let (status, reply) = server
        .post_json(
            "embed",
            &json!({"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": texts}]}),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    let out = &reply["outputs"][0];
    assert_eq!(
        (out["name"].as_str(), &out["shape"]),
        (Some("vector"), &json!([2, 384]))
    );
    let vectors: Vec<f32> = out["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap() as f32)
        .collect();
    let r = server
        .client
        .post(format!("{}/v1/embeddings", server.url))
        .json(&json!({"model": "minilm", "input": texts, "encoding_format": "float"}))
        .send()
        .await
        .unwrap();
    let route: Value = r.json().await.unwrap();
    for (i, row) in vectors.chunks(384).enumerate() {
        let norm = row.iter().map(|v| v * v).sum::<f32>().sqrt();
        let want: Vec<f32> = route["data"][i]["embedding"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        let cosine: f32 = row.iter().zip(&want).map(|(a, b)| a / norm * b).sum();
        assert!(cosine > 0.9999, "text {i}: cosine {cosine}");
    }
    // Text that is not UTF-8 is refused, naming the step.
    let not_text = [Bytes::from_static(&[0xff, 0xfe])];
    let (status, reply) = server
        .post_bytes("embed", "text", &not_text, Value::Null)
        .await;
    assert_eq!(status, 400);
    let message = reply["error"].as_str().unwrap();
    assert!(
        message.contains("step 1 (tokenize): text 0 is not UTF-8"),
        "{message}"
    );
}
