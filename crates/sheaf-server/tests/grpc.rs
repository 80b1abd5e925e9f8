//! KServe v2 over gRPC with a real tonic client on a real socket: health, metadata, Triton model
//! config and statistics, raw and typed tensors, streaming, and status codes.

mod common;

use bytes::Bytes;
use common::*;
use futures::future::join_all;
use sheaf_server::grpc::pb;
use sheaf_server::grpc::pb::grpc_inference_service_client::GrpcInferenceServiceClient;
use sheaf_server::grpc::pb::model_infer_request::InferInputTensor;
use sheaf_server::HttpConfig;
use tonic::transport::Channel;
use tonic::Code;

async fn client(server: &TestServer) -> GrpcInferenceServiceClient<Channel> {
    GrpcInferenceServiceClient::connect(server.grpc_url.clone())
        .await
        .unwrap()
}

fn raw_request(
    model: &str,
    id: &str,
    input: &str,
    shape: &[i64],
    data: &[f32],
) -> pb::ModelInferRequest {
    pb::ModelInferRequest {
        model_name: model.into(),
        id: id.into(),
        inputs: vec![InferInputTensor {
            name: input.into(),
            datatype: "FP32".into(),
            shape: shape.to_vec(),
            ..Default::default()
        }],
        raw_input_contents: vec![Bytes::from(to_bytes(data))],
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_metadata_config_and_statistics() {
    let server = start(
        &[
            (
                "mlp",
                MLP,
                "batching: {policy: fixed}\nmax_batch_size: 64\nmax_queue_delay_us: 700\npreferred_batch_sizes: [16, 32]\n",
            ),
            ("fixed", FIXED, ""),
        ],
        HttpConfig::default(),
    )
    .await;
    let mut c = client(&server).await;
    assert!(
        c.server_live(pb::ServerLiveRequest {})
            .await
            .unwrap()
            .into_inner()
            .live
    );
    assert!(
        c.server_ready(pb::ServerReadyRequest {})
            .await
            .unwrap()
            .into_inner()
            .ready
    );
    let ready = |name: &str| pb::ModelReadyRequest {
        name: name.into(),
        version: String::new(),
    };
    assert!(
        c.model_ready(ready("mlp"))
            .await
            .unwrap()
            .into_inner()
            .ready
    );
    assert!(
        !c.model_ready(ready("nope"))
            .await
            .unwrap()
            .into_inner()
            .ready
    );
    let meta = c
        .server_metadata(pb::ServerMetadataRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(meta.name, "sheaf");
    assert!(meta.extensions.contains(&"binary_tensor_data".to_string()));

    let m = c
        .model_metadata(pb::ModelMetadataRequest {
            name: "mlp".into(),
            version: "1".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (m.name.as_str(), m.platform.as_str()),
        ("mlp", "onnxruntime_onnx")
    );
    assert_eq!(m.inputs[0].shape, vec![-1, 512]);
    assert_eq!(m.outputs[0].datatype, "FP32");

    let config = c
        .model_config(pb::ModelConfigRequest {
            name: "mlp".into(),
            version: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .config
        .unwrap();
    assert_eq!(config.max_batch_size, 64);
    assert_eq!(config.input[0].dims, vec![512]);
    assert_eq!(config.input[0].data_type, pb::DataType::TypeFp32 as i32);
    assert_eq!(config.output[0].dims, vec![10]);
    match config.scheduling_choice {
        Some(pb::model_config::SchedulingChoice::DynamicBatching(d)) => {
            assert_eq!(d.preferred_batch_size, vec![16, 32]);
            assert_eq!(d.max_queue_delay_microseconds, 700);
        }
        other => panic!("no dynamic batching: {other:?}"),
    }
    let fixed = c
        .model_config(pb::ModelConfigRequest {
            name: "fixed".into(),
            version: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .config
        .unwrap();
    assert_eq!(fixed.max_batch_size, 0);
    assert_eq!(fixed.input[0].dims, vec![2, 3]);
    assert!(fixed.scheduling_choice.is_none());

    let x = floats(5, 3 * 512);
    c.model_infer(raw_request("mlp", "", "input", &[3, 512], &x))
        .await
        .unwrap();
    let stats = c
        .model_statistics(pb::ModelStatisticsRequest {
            name: "mlp".into(),
            version: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let s = &stats.model_stats[0];
    assert_eq!((s.inference_count, s.execution_count), (3, 1));
    assert_eq!(
        s.inference_stats
            .as_ref()
            .unwrap()
            .success
            .as_ref()
            .unwrap()
            .count,
        1
    );
    assert_eq!(s.batch_stats[0].batch_size, 3);
    let all = c
        .model_statistics(pb::ModelStatisticsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(all.model_stats.len(), 2);
    let index = c
        .repository_index(pb::RepositoryIndexRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        index
            .models
            .iter()
            .map(|m| (m.name.as_str(), m.state.as_str()))
            .collect::<Vec<_>>(),
        vec![("fixed", "READY"), ("mlp", "READY")]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_and_typed_contents_give_the_in_process_result() {
    let server = start(&[("orientation", ORIENTATION, "")], HttpConfig::default()).await;
    let mut c = client(&server).await;
    let x = floats(21, 2 * 3 * 224 * 224);
    let want = in_process(ORIENTATION, &[2, 3, 224, 224], &x);

    let raw = c
        .model_infer(raw_request(
            "orientation",
            "r-1",
            "x",
            &[2, 3, 224, 224],
            &x,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(raw.id, "r-1");
    assert_eq!(raw.outputs[0].shape, vec![2, 4]);
    assert!(raw.outputs[0].contents.is_none());
    assert_close(&from_bytes(&raw.raw_output_contents[0]), &want, 1e-5, "raw");

    let mut typed = raw_request("orientation", "t-1", "x", &[2, 3, 224, 224], &[]);
    typed.raw_input_contents.clear();
    typed.inputs[0].contents = Some(pb::InferTensorContents {
        fp32_contents: x.clone(),
        ..Default::default()
    });
    let reply = c.model_infer(typed).await.unwrap().into_inner();
    assert!(reply.raw_output_contents.is_empty());
    assert_close(
        &reply.outputs[0].contents.as_ref().unwrap().fp32_contents,
        &want,
        1e-5,
        "typed",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_of_200_frames_answers_in_order_and_survives_a_bad_frame() {
    let server = start(
        &[(
            "mlp",
            MLP,
            "batching: {policy: fixed}\nmax_batch_size: 16\nmax_queue_delay_us: 2000\n",
        )],
        HttpConfig::default(),
    )
    .await;
    let mut c = client(&server).await;
    let frames: Vec<Vec<f32>> = (0..200).map(|i| floats(1000 + i, 512)).collect();
    let requests: Vec<pb::ModelInferRequest> = frames
        .iter()
        .enumerate()
        .map(|(i, x)| {
            // Frame 100 has the wrong shape: it must fail alone, and the stream must stay open.
            let shape: &[i64] = if i == 100 { &[1, 256] } else { &[1, 512] };
            let data = if i == 100 { &x[..256] } else { &x[..] };
            raw_request("mlp", &format!("frame-{i}"), "input", shape, data)
        })
        .collect();
    let mut answers = c
        .model_stream_infer(futures::stream::iter(requests))
        .await
        .unwrap()
        .into_inner();
    let mut seen = 0;
    while let Some(answer) = answers.message().await.unwrap() {
        let response = answer.infer_response.unwrap();
        assert_eq!(
            response.id,
            format!("frame-{seen}"),
            "answers arrive in request order"
        );
        if seen == 100 {
            assert!(
                answer.error_message.contains("has shape [1, 256]"),
                "{}",
                answer.error_message
            );
        } else {
            assert_eq!(answer.error_message, "");
            if seen % 40 == 0 {
                assert_close(
                    &from_bytes(&response.raw_output_contents[0]),
                    &in_process(MLP, &[1, 512], &frames[seen]),
                    1e-5,
                    "frame",
                );
            }
        }
        seen += 1;
    }
    assert_eq!(seen, 200);
    let stats = server.stats("mlp").await;
    assert_eq!(stats["inference_count"], 199);
    assert!(
        stats["execution_count"].as_u64().unwrap() < 199,
        "stream frames never shared a batch: {stats}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_carry_the_right_status_codes() {
    let server = start(
        &[
            (
                "mlp",
                MLP,
                "batching: {policy: fixed}\nmax_batch_size: 8\nmax_queue_delay_us: 1000000\nmax_queue_size: 2\n",
            ),
            ("broken", FIXED, "max_batch_size: 4\n"),
        ],
        HttpConfig::default(),
    )
    .await;
    let mut c = client(&server).await;
    let x = floats(1, 512);
    let code = |r: Result<tonic::Response<pb::ModelInferResponse>, tonic::Status>| r.unwrap_err();
    let e = code(
        c.model_infer(raw_request("nope", "", "input", &[1, 512], &x))
            .await,
    );
    assert_eq!(e.code(), Code::NotFound);
    assert!(e.message().contains("unknown model 'nope'"));
    let e = code(
        c.model_infer(raw_request("mlp", "", "input", &[1, 256], &x[..256]))
            .await,
    );
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().contains("has shape [1, 256]"),
        "{}",
        e.message()
    );
    let mut wrong_type = raw_request("mlp", "", "input", &[1, 512], &x);
    wrong_type.inputs[0].datatype = "FP64".into();
    wrong_type.raw_input_contents = vec![Bytes::from(vec![0u8; 512 * 8])];
    let e = code(c.model_infer(wrong_type).await);
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message()
            .contains("datatype FP64, but the model expects FP32"),
        "{}",
        e.message()
    );
    let e = code(
        c.model_infer(raw_request("broken", "", "x", &[2, 3], &[0.0; 6]))
            .await,
    );
    assert_eq!(e.code(), Code::Unavailable);
    assert!(
        e.message().contains("no batch dimension"),
        "{}",
        e.message()
    );

    // A queue of two items, held by a long delay: concurrent requests overflow it.
    let replies = join_all((0..8).map(|_| {
        let mut c = c.clone();
        let r = raw_request("mlp", "", "input", &[1, 512], &x);
        async move { c.model_infer(r).await }
    }))
    .await;
    let exhausted = replies
        .iter()
        .filter(|r| matches!(r, Err(e) if e.code() == Code::ResourceExhausted))
        .count();
    let ok = replies.iter().filter(|r| r.is_ok()).count();
    assert_eq!(
        ok + exhausted,
        8,
        "every request is answered, with success or overload"
    );
    assert!(exhausted >= 1 && ok >= 1, "ok {ok}, exhausted {exhausted}");
}
