//! Images at the edge, on real models and real photographs: EfficientNet-Lite0 classifies a
//! cat and an espresso sent as PNG over HTTP and gRPC, with Triton's classification extension
//! naming the classes; the DCGAN generator's faces come back as PNGs that decode to its float
//! output; frames the server holds, named by id, answer as the same frames sent inline; and bad
//! images are refused by name.

mod common;

use bytes::Bytes;
use common::*;
use serde_json::{json, Value};
use sheaf_server::grpc::pb;
use sheaf_server::grpc::pb::grpc_inference_service_client::GrpcInferenceServiceClient;
use sheaf_server::grpc::pb::model_infer_request::{InferInputTensor, InferRequestedOutputTensor};
use sheaf_server::HttpConfig;

fn photo(name: &str) -> Bytes {
    let path = root().join(".cache/test-images").join(name);
    Bytes::from(
        std::fs::read(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (run scripts/setup.sh --test)", path.display())),
    )
}

async fn efficientnet() -> TestServer {
    let labels = root().join("model_repository/efficientnet/labels.txt");
    assert!(labels.is_file(), "run scripts/setup.sh");
    let config = format!(
        "max_batch_size: 8\nlabels: {}\nimage_inputs:\n  input: {{resize: 256, crop: [224, 224], \
         mean: [0.5, 0.5, 0.5], std: [0.5, 0.5, 0.5]}}\n",
        labels.display()
    );
    // The demo pipeline, its labels found from the repository's copy.
    let pipeline = std::fs::read_to_string(root().join("model_repository/classify/pipeline.yaml"))
        .unwrap()
        .replace("../efficientnet/labels.txt", &labels.display().to_string());
    // The demo's opennsfw config (BGR, channels last, Caffe means), at a fixed batch size.
    let nsfw = std::fs::read_to_string(root().join("model_repository/nsfw/config.yaml"))
        .unwrap()
        .replace("max_batch_size: auto", "max_batch_size: 4")
        + &format!(
            "labels: {}\n",
            root().join("model_repository/nsfw/labels.txt").display()
        );
    start_with_files(
        &[
            ("efficientnet", EFFICIENTNET, &config),
            ("nsfw", NSFW, &nsfw),
            ("mlp", MLP, ""),
            (
                "faces",
                FACES,
                "max_batch_size: 8\nimage_outputs:\n  image: {range: [-1, 1]}\n",
            ),
        ],
        &[("classify/pipeline.yaml", &pipeline)],
    )
    .await
}

/// POSTs encoded images to `model`'s `input` over the binary extension, asking for the top
/// `k` classes of `logits`.
async fn classify_http(server: &TestServer, model: &str, images: &[Bytes], k: u64) -> (u16, Value) {
    let outputs = json!([{"name": "logits", "parameters": {"classification": k}}]);
    server.post_bytes(model, "input", images, outputs).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn photographs_are_classified_over_http_and_grpc() {
    let server = efficientnet().await;
    let (cat, coffee) = (photo("cat.png"), photo("coffee.png"));

    // One request of two images: a batch of two, each with its five best classes.
    let (status, reply) =
        classify_http(&server, "efficientnet", &[cat.clone(), coffee.clone()], 5).await;
    assert_eq!(status, 200, "{reply}");
    let out = &reply["outputs"][0];
    assert_eq!(out["datatype"], "BYTES");
    assert_eq!(out["shape"], json!([2, 5]));
    let classes: Vec<&str> = out["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let top = |s: &str| s.split_once(':').unwrap().1.to_string();
    assert_eq!(top(classes[0]), "282:tiger cat", "{classes:?}");
    assert_eq!(top(classes[5]), "967:espresso", "{classes:?}");
    let scores: Vec<f32> = classes[..5]
        .iter()
        .map(|c| c.split(':').next().unwrap().parse().unwrap())
        .collect();
    assert!(
        scores.windows(2).all(|w| w[0] >= w[1]),
        "best first: {scores:?}"
    );

    // opennsfw takes the same photographs, decoded its own way: both are safe, and surely so.
    let outputs = json!([{"name": "outputs", "parameters": {"classification": 1}}]);
    let images = [photo("cat.png"), photo("coffee.png")];
    let (status, reply) = server.post_bytes("nsfw", "input:0", &images, outputs).await;
    assert_eq!(status, 200, "{reply}");
    for class in reply["outputs"][0]["data"].as_array().unwrap() {
        let class = class.as_str().unwrap();
        let score: f32 = class.split(':').next().unwrap().parse().unwrap();
        assert!(class.ends_with(":0:sfw") && score > 0.9, "{reply}");
    }

    // The same over gRPC, one image per request, raw and typed.
    let mut grpc = GrpcInferenceServiceClient::connect(server.grpc_url.clone())
        .await
        .unwrap();
    for (image, want, raw) in [
        (cat, "282:tiger cat", true),
        (coffee, "967:espresso", false),
    ] {
        let mut input = InferInputTensor {
            name: "input".into(),
            datatype: "BYTES".into(),
            shape: vec![1],
            ..Default::default()
        };
        let raw_input_contents = if raw {
            vec![Bytes::from(bytes_wire(&[image]))]
        } else {
            input.contents = Some(pb::InferTensorContents {
                bytes_contents: vec![image],
                ..Default::default()
            });
            vec![]
        };
        let k = pb::InferParameter {
            parameter_choice: Some(pb::infer_parameter::ParameterChoice::Int64Param(1)),
        };
        let reply = grpc
            .model_infer(pb::ModelInferRequest {
                model_name: "efficientnet".into(),
                inputs: vec![input],
                raw_input_contents,
                outputs: vec![InferRequestedOutputTensor {
                    name: "logits".into(),
                    parameters: [("classification".to_string(), k)].into(),
                }],
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let out = &reply.outputs[0];
        assert_eq!(
            (out.datatype.as_str(), out.shape.as_slice()),
            ("BYTES", &[1, 1][..])
        );
        let class = if raw {
            let data = &reply.raw_output_contents[0];
            String::from_utf8(data[4..].to_vec()).unwrap()
        } else {
            String::from_utf8(out.contents.as_ref().unwrap().bytes_contents[0].to_vec()).unwrap()
        };
        assert!(class.ends_with(want), "{class}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_images_and_misplaced_bytes_are_400s_that_say_why() {
    let server = efficientnet().await;
    let cat = photo("cat.png");
    let mut corrupt = cat.to_vec();
    corrupt.truncate(corrupt.len() / 3);
    for (model, images, says) in [
        (
            "efficientnet",
            vec![cat.clone(), Bytes::from(corrupt)],
            "image 1: cannot be decoded",
        ),
        (
            "efficientnet",
            vec![Bytes::from_static(b"GIF89a not really")],
            "image 0",
        ),
        ("mlp", vec![cat.clone()], "takes no encoded images"),
    ] {
        let (status, reply) = classify_http(&server, model, &images, 1).await;
        assert_eq!(status, 400, "{reply}");
        let message = reply["error"].as_str().unwrap();
        assert!(message.contains(says), "{message}");
    }
    // A length prefix that runs past the data.
    let header = json!({"inputs": [{"name": "input", "shape": [1], "datatype": "BYTES",
                                    "parameters": {"binary_data_size": 8}}]});
    let r = server
        .post_binary("efficientnet", &header, &[200, 0, 0, 0, 1, 2, 3, 4])
        .await;
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("declares 200 bytes"));
    // Classification of an output the model does not have.
    let (status, _) = server
        .post_json(
            "mlp",
            &json!({"inputs": [{"name": "input", "shape": [1, 512], "datatype": "FP32",
                                "data": vec![0.0; 512]}],
                    "outputs": [{"name": "nope", "parameters": {"classification": 2}}]}),
        )
        .await;
    assert_eq!(status, 400);
    assert_eq!(server.get("/v2/health/live").await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_faces_come_back_as_pngs_of_the_models_output() {
    let server = efficientnet().await;
    let z = floats(11, 3 * 100);
    let want = in_process(FACES, &[3, 100, 1, 1], &z);
    // A JSON request: PNGs are not text, so they come as binary data after the JSON header.
    let header = json!({"inputs": [{"name": "z", "shape": [3, 100, 1, 1], "datatype": "FP32",
                                    "data": z}]})
    .to_string();
    let r = server
        .client
        .post(server.infer_url("faces"))
        .body(header)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let length: usize = r.headers()["inference-header-content-length"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let body = r.bytes().await.unwrap();
    let head: Value = serde_json::from_slice(&body[..length]).unwrap();
    assert_eq!(head["outputs"][0]["datatype"], "BYTES");
    assert_eq!(head["outputs"][0]["shape"], json!([3]));
    let mut rest = &body[length..];
    for i in 0..3 {
        let n = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let png = image::load_from_memory(&rest[4..4 + n]).unwrap().to_rgb8();
        rest = &rest[4 + n..];
        assert_eq!(png.dimensions(), (64, 64));
        for (p, pixel) in png.pixels().enumerate() {
            for c in 0..3 {
                let v = want[i * 3 * 4096 + c * 4096 + p];
                let expected = (((v + 1.0) / 2.0).clamp(0.0, 1.0) * 255.0).round();
                let got = f32::from(pixel.0[c]);
                assert!(
                    (got - expected).abs() <= 1.0,
                    "face {i}, pixel {p}: {got} vs {expected}"
                );
            }
        }
    }
    assert!(rest.is_empty());
}

/// A float32 NPY file of `rows` × `cols`.
fn npy(path: &std::path::Path, rows: usize, cols: usize, values: &[f32]) {
    let mut header =
        format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({rows}, {cols}), }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    for v in values {
        out.extend_from_slice(&v.to_le_bytes());
    }
    std::fs::write(path, out).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_named_by_id_answer_as_the_same_frames_sent_inline() {
    let dir = tempfile::tempdir().unwrap();
    let frames: Vec<f32> = (0..10).flat_map(|i| floats(100 + i, 512)).collect();
    let store = dir.path().join("frames.npy");
    npy(&store, 10, 512, &frames);
    let raw = dir.path().join("frames.f32");
    std::fs::write(&raw, to_bytes(&frames)).unwrap();
    let labels = root().join("model_repository/efficientnet/labels.txt");
    let photos = root().join(".cache/test-images");
    let server = start(
        &[
            (
                "mlp_npy",
                MLP,
                &format!("frames: {{input: input, source: {}}}\n", store.display()),
            ),
            (
                "mlp_raw",
                MLP,
                &format!("frames: {{input: input, source: {}}}\n", raw.display()),
            ),
            (
                "photos",
                EFFICIENTNET,
                &format!(
                    "labels: {}\nframes: {{input: input, source: {}}}\nimage_inputs:\n  input: \
                     {{resize: 256, mean: [0.5, 0.5, 0.5], std: [0.5, 0.5, 0.5]}}\n",
                    labels.display(),
                    photos.display()
                ),
            ),
        ],
        HttpConfig::default(),
    )
    .await;
    for model in ["mlp_npy", "mlp_raw"] {
        let (status, by_id) = server
            .post_json(
                model,
                &json!({"inputs": [{"name": "frame_ids", "shape": [3], "datatype": "INT64",
                                    "data": [7, 2, 7]}]}),
            )
            .await;
        assert_eq!(status, 200, "{by_id}");
        let inline: Vec<f32> = [7, 2, 7]
            .iter()
            .flat_map(|&i| frames[i * 512..(i + 1) * 512].to_vec())
            .collect();
        let (status, sent) = server
            .post_json(
                model,
                &json!({"inputs": [{"name": "input", "shape": [3, 512], "datatype": "FP32",
                                    "data": inline}]}),
            )
            .await;
        assert_eq!(status, 200, "{sent}");
        let output = |reply: &Value, name: &str| -> Value {
            reply["outputs"]
                .as_array()
                .unwrap()
                .iter()
                .find(|o| o["name"] == name)
                .unwrap()["data"]
                .clone()
        };
        assert_eq!(output(&by_id, "output"), output(&sent, "output"), "{model}");
        assert_eq!(output(&by_id, "frame_ids"), json!([7, 2, 7]));
        let want = in_process(MLP, &[1, 512], &frames[2 * 512..3 * 512]);
        let got: Vec<f32> = output(&by_id, "output").as_array().unwrap()[10..20]
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        assert_close(&got, &want, 1e-4, "frame 2");
        // A frame the store does not hold.
        let (status, reply) = server
            .post_json(
                model,
                &json!({"inputs": [{"name": "frame_ids", "shape": [2], "datatype": "INT64",
                                    "data": [1, 10]}]}),
            )
            .await;
        assert_eq!(status, 400);
        assert!(
            reply["error"]
                .as_str()
                .unwrap()
                .contains("frame 10 is not in the store (frames 0 to 9)"),
            "{reply}"
        );
    }
    // A folder of images, decoded at load: coffee.png is frame 1, cat.png frame 0.
    let (status, reply) = server
        .post_json(
            "photos",
            &json!({"inputs": [{"name": "frame_ids", "shape": [2], "datatype": "INT32",
                                "data": [1, 0]}],
                    "outputs": [{"name": "logits", "parameters": {"classification": 1}},
                                {"name": "frame_ids"}]}),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    let classes = &reply["outputs"][1]["data"];
    assert!(
        classes[0].as_str().unwrap().ends_with(":967:espresso"),
        "{reply}"
    );
    assert!(
        classes[1].as_str().unwrap().ends_with(":282:tiger cat"),
        "{reply}"
    );
}

/// POSTs encoded images to the pipeline `classify`'s `image` input.
async fn pipeline_http(server: &TestServer, images: &[Bytes]) -> (u16, Value) {
    server
        .post_bytes("classify", "image", images, Value::Null)
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_classifies_photographs_and_names_its_failing_step() {
    let server = efficientnet().await;
    let (cat, coffee) = (photo("cat.png"), photo("coffee.png"));
    // JPEG/PNG -> image step -> efficientnet (its own queue) -> classify, over HTTP.
    let (status, reply) = pipeline_http(&server, &[coffee.clone(), cat.clone()]).await;
    assert_eq!(status, 200, "{reply}");
    let out = &reply["outputs"][0];
    assert_eq!(
        (out["name"].as_str(), &out["shape"]),
        (Some("classes"), &json!([2, 5]))
    );
    assert!(
        out["data"][0].as_str().unwrap().ends_with(":967:espresso"),
        "{reply}"
    );
    assert!(
        out["data"][5].as_str().unwrap().ends_with(":282:tiger cat"),
        "{reply}"
    );
    // The model step went through the model's queue: its statistics count the batch.
    let stats = server.stats("efficientnet").await;
    assert!(stats["inference_count"].as_u64().unwrap() >= 2, "{stats}");

    // Over gRPC, concurrent requests overlapping through the pipeline.
    let mut tasks = Vec::new();
    for (image, want) in [
        (cat.clone(), "282:tiger cat"),
        (coffee.clone(), "967:espresso"),
    ]
    .into_iter()
    .cycle()
    .take(6)
    {
        let url = server.grpc_url.clone();
        tasks.push(tokio::spawn(async move {
            let mut grpc = GrpcInferenceServiceClient::connect(url).await.unwrap();
            let reply = grpc
                .model_infer(pb::ModelInferRequest {
                    model_name: "classify".into(),
                    inputs: vec![InferInputTensor {
                        name: "image".into(),
                        datatype: "BYTES".into(),
                        shape: vec![1],
                        ..Default::default()
                    }],
                    raw_input_contents: vec![Bytes::from(bytes_wire(&[image]))],
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            let data = &reply.raw_output_contents[0];
            let first = u32::from_le_bytes([data[0], data[1], data[2], data[3]]) as usize;
            let class = String::from_utf8(data[4..4 + first].to_vec()).unwrap();
            assert!(class.ends_with(want), "{class}");
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }

    // A bad image: a 400 that names the pipeline's step.
    let (status, reply) = pipeline_http(&server, &[Bytes::from_static(b"not an image")]).await;
    assert_eq!(status, 400, "{reply}");
    let message = reply["error"].as_str().unwrap();
    assert!(
        message.starts_with("pipeline 'classify', step 1 (image): input 'image': image 0"),
        "{message}"
    );
    // The index lists the pipeline as a model of its own.
    let (_, index) = server.get("/v2/models/classify").await;
    assert_eq!(index["platform"], "pipeline");
}
