//! The dynamic batcher, seen from a real HTTP client: concurrent requests share backend calls,
//! items come back the same as when run alone, and large requests are split and reassembled.

mod common;

use common::*;
use futures::future::join_all;
use sheaf_server::HttpConfig;

const ITEM: usize = 3 * 224 * 224;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn items_batched_with_others_match_their_solo_runs_on_a_real_cnn() {
    // A long delay makes the concurrent requests below meet in shared batches.
    let server = start(
        &[(
            "orientation",
            ORIENTATION,
            "batching: {policy: fixed}\nmax_batch_size: 8\nmax_queue_delay_us: 300000\n",
        )],
        HttpConfig::default(),
    )
    .await;
    let items: Vec<Vec<f32>> = (0..6).map(|i| floats(i, ITEM)).collect();
    let solo: Vec<Vec<f32>> = items
        .iter()
        .map(|x| in_process(ORIENTATION, &[1, 3, 224, 224], x))
        .collect();

    // Served alone, one request at a time: the same as in-process.
    for i in [0, 3] {
        let out = server
            .infer_binary("orientation", "x", &[1, 3, 224, 224], &items[i])
            .await;
        assert_close(&out[0].1, &solo[i], 1e-4, &format!("item {i} served alone"));
    }
    let before = batch_sizes(&server.stats("orientation").await);
    assert_eq!(before, vec![1, 1]);

    // Mixed requests at once, items repeated across requests.
    let groups: Vec<Vec<usize>> = vec![vec![0], vec![1, 2], vec![3, 4, 5], vec![2], vec![5, 0]];
    let results = join_all(groups.iter().map(|g| {
        let data: Vec<f32> = g.iter().flat_map(|&i| items[i].iter().copied()).collect();
        let shape = [g.len(), 3, 224, 224];
        let server = &server;
        async move { server.infer_binary("orientation", "x", &shape, &data).await }
    }))
    .await;
    for (g, out) in groups.iter().zip(&results) {
        let (shape, values) = &out[0];
        assert_eq!(shape, &vec![g.len(), 4]);
        for (k, &i) in g.iter().enumerate() {
            assert_close(
                &values[k * 4..(k + 1) * 4],
                &solo[i],
                1e-4,
                &format!("item {i} in request {g:?}"),
            );
        }
    }
    let stats = server.stats("orientation").await;
    assert_eq!(stats["inference_count"], 2 + 9);
    let sizes = batch_sizes(&stats);
    assert!(
        sizes[2..].iter().any(|&b| b > 1),
        "the mixed requests never shared a batch: {sizes:?}"
    );
    assert!(
        sizes.iter().all(|&b| b <= 8),
        "a batch exceeded max_batch_size: {sizes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_single_item_requests_take_fewer_backend_calls() {
    let server = start(
        &[(
            "mlp",
            MLP,
            "batching: {policy: fixed}\nmax_batch_size: 16\nmax_queue_delay_us: 200000\n",
        )],
        HttpConfig::default(),
    )
    .await;
    let n = 32;
    let inputs: Vec<Vec<f32>> = (0..n).map(|i| floats(100 + i as u64, 512)).collect();
    let outputs = join_all(
        inputs
            .iter()
            .map(|x| server.infer_binary("mlp", "input", &[1, 512], x)),
    )
    .await;
    for (i, (x, out)) in inputs.iter().zip(&outputs).enumerate() {
        assert_close(
            &out[0].1,
            &in_process(MLP, &[1, 512], x),
            1e-4,
            &format!("request {i}"),
        );
    }
    let stats = server.stats("mlp").await;
    let calls = stats["execution_count"].as_u64().unwrap();
    assert_eq!(stats["inference_count"], n as u64);
    assert_eq!(stats["inference_stats"]["success"]["count"], n as u64);
    assert!(
        calls < n as u64,
        "{n} requests took {calls} backend calls: {stats}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_item_request_is_split_and_comes_back_whole_and_in_order() {
    let server = start(
        &[(
            "mlp",
            MLP,
            "batching: {policy: fixed}\nmax_batch_size: 8\nmax_queue_delay_us: 1000\n",
        )],
        HttpConfig::default(),
    )
    .await;
    let data = floats(7, 100 * 512);
    let small = floats(8, 512);
    let (big, other) = tokio::join!(
        server.infer_binary("mlp", "input", &[100, 512], &data),
        server.infer_binary("mlp", "input", &[1, 512], &small),
    );
    let (shape, values) = &big[0];
    assert_eq!(shape, &vec![100, 10]);
    for i in 0..100 {
        let want = in_process(MLP, &[1, 512], &data[i * 512..(i + 1) * 512]);
        assert_close(
            &values[i * 10..(i + 1) * 10],
            &want,
            1e-4,
            &format!("item {i} of 100"),
        );
    }
    assert_close(
        &other[0].1,
        &in_process(MLP, &[1, 512], &small),
        1e-4,
        "the small request",
    );
    let stats = server.stats("mlp").await;
    let sizes = batch_sizes(&stats);
    assert_eq!(sizes.iter().sum::<u64>(), 101);
    assert!(
        sizes.iter().all(|&b| b <= 8),
        "a batch exceeded max_batch_size: {sizes:?}"
    );
    assert!(
        sizes.len() >= 13,
        "100 items in batches of 8 need at least 13 calls: {sizes:?}"
    );
}

/// Sends one MLP item per seed, all at once, and checks each answer against in-process.
async fn mlp_items_together(server: &TestServer, seeds: std::ops::Range<u64>, what: &str) {
    let inputs: Vec<Vec<f32>> = seeds.map(|i| floats(i, 512)).collect();
    let outputs = join_all(
        inputs
            .iter()
            .map(|x| server.infer_binary("mlp", "input", &[1, 512], x)),
    )
    .await;
    for (x, out) in inputs.iter().zip(&outputs) {
        assert_eq!(out[0].0, vec![1, 10]);
        assert_close(&out[0].1, &in_process(MLP, &[1, 512], x), 1e-4, what);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_are_padded_to_allowed_sizes_and_the_padding_never_reaches_clients() {
    let server = start(
        &[(
            "mlp",
            MLP,
            "batching: {policy: fixed}\nmax_batch_size: 8\nmax_queue_delay_us: 300000\nallowed_batch_sizes: [8, 4]\n",
        )],
        HttpConfig::default(),
    )
    .await;
    mlp_items_together(&server, 200..203, "padded batch").await;
    let stats = server.stats("mlp").await;
    assert_eq!(
        stats["inference_count"], 4,
        "3 items ran as a batch of 4: {stats}"
    );
    assert_eq!(batch_sizes(&stats), vec![4]);
    let (_, config) = server.get("/v2/models/mlp/config").await;
    assert_eq!(config["max_batch_size"], 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_per_batch_size_pads_batches_to_power_of_two_buckets() {
    let server = start(
        &[(
            "mlp",
            MLP,
            "batching: {policy: fixed}\nmax_batch_size: 12\nmax_queue_delay_us: 300000\n\
             session_per_batch_size: true\n",
        )],
        HttpConfig::default(),
    )
    .await;
    // Buckets 1, 2, 4, 8 and 12: 3 items run as 4, then 5 items as 8.
    mlp_items_together(&server, 300..303, "bucketed batch of 3").await;
    mlp_items_together(&server, 310..315, "bucketed batch of 5").await;
    let stats = server.stats("mlp").await;
    assert_eq!(batch_sizes(&stats), vec![4, 8], "{stats}");
    assert_eq!(stats["inference_count"], 12, "{stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bound_buckets_take_each_request_straight_into_their_rows() {
    // The path CUDA devices take, on the CPU: each bucket's session bound to buffers of its
    // instance, the batcher handing over the requests unassembled, the instance copying each
    // into its rows and zeroing the padding.
    let server = start(
        &[(
            "mlp",
            MLP,
            "batching: {policy: fixed}\nmax_batch_size: 12\nmax_queue_delay_us: 300000\n\
             session_per_batch_size: true\nio_binding: true\n",
        )],
        HttpConfig::default(),
    )
    .await;
    mlp_items_together(&server, 400..403, "bound batch of 3").await;
    mlp_items_together(&server, 410..415, "bound batch of 5").await;
    // A request of several items among single ones: its rows come back in order.
    let (many, one) = (floats(420, 3 * 512), floats(421, 512));
    let (a, b) = futures::join!(
        server.infer_binary("mlp", "input", &[3, 512], &many),
        server.infer_binary("mlp", "input", &[1, 512], &one),
    );
    assert_eq!(a[0].0, vec![3, 10]);
    assert_close(
        &a[0].1,
        &in_process(MLP, &[3, 512], &many),
        1e-4,
        "3 items bound",
    );
    assert_close(
        &b[0].1,
        &in_process(MLP, &[1, 512], &floats(421, 512)),
        1e-4,
        "1 item bound",
    );
    let stats = server.stats("mlp").await;
    // 3 items as 4, 5 as 8, then 3 + 1 as 4.
    assert_eq!(batch_sizes(&stats), vec![4, 4, 8], "{stats}");
    // The instance's copy is counted as the batch's input stage.
    assert!(
        stats["inference_stats"]["compute_input"]["ns"]
            .as_u64()
            .unwrap()
            > 0,
        "{stats}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_batch_size_auto_settles_on_a_probed_size() {
    let server = start(
        &[("mlp", MLP, "max_batch_size: auto\n")],
        HttpConfig::default(),
    )
    .await;
    let handle = server.manager.get("mlp", None).unwrap();
    let chosen = handle.max_batch_size;
    assert!(
        chosen.is_power_of_two() && chosen <= 256,
        "auto chose {chosen}"
    );
    let (_, config) = server.get("/v2/models/mlp/config").await;
    assert_eq!(config["max_batch_size"], chosen);
    let x = floats(9, 512);
    let out = server.infer_binary("mlp", "input", &[1, 512], &x).await;
    assert_close(
        &out[0].1,
        &in_process(MLP, &[1, 512], &x),
        1e-4,
        "after auto",
    );
}

/// Sends one `[1, len]` request per length at once to the `varlen` model (y = 2x + 1, z = sum x)
/// and checks each answer has its own length back. Returns the executed batch sizes.
async fn varlen_round(server: &TestServer, lengths: &[usize]) -> Vec<u64> {
    let inputs: Vec<Vec<f32>> = lengths.iter().map(|&n| floats(n as u64, n)).collect();
    let replies = join_all(inputs.iter().map(|x| {
        let body = serde_json::json!({"inputs": [{"name": "x", "shape": [1, x.len()], "datatype": "FP32", "data": x}]});
        let server = &server;
        async move { server.post_json("varlen", &body).await }
    }))
    .await;
    for (x, (status, reply)) in inputs.iter().zip(replies) {
        assert_eq!(status, 200, "{reply}");
        let outputs = reply["outputs"].as_array().unwrap();
        assert_eq!(
            outputs[0]["shape"],
            serde_json::json!([1, x.len()]),
            "y keeps its own length"
        );
        let y: Vec<f32> = outputs[0]["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        let want: Vec<f32> = x.iter().map(|v| 2.0 * v + 1.0).collect();
        assert_close(&y, &want, 1e-5, "y");
        assert_eq!(outputs[1]["shape"], serde_json::json!([1]));
        let z = outputs[1]["data"][0].as_f64().unwrap() as f32;
        assert_close(
            &[z],
            &[x.iter().sum::<f32>()],
            1e-4,
            "z: zero padding leaves the sum alone",
        );
    }
    batch_sizes(&server.stats("varlen").await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn variable_length_requests_share_a_padded_batch_and_get_their_own_lengths_back() {
    let base = "batching: {policy: fixed}\nmax_batch_size: 8\nmax_queue_delay_us: 300000\n";
    let padded = start(
        &[("varlen", VARLEN, &format!("{base}padding: {{value: 0}}\n"))],
        HttpConfig::default(),
    )
    .await;
    assert_eq!(
        varlen_round(&padded, &[3, 5, 8]).await,
        vec![3],
        "one padded batch"
    );
    let bucketed = start(
        &[(
            "varlen",
            VARLEN,
            &format!("{base}padding: {{value: 0, bucket_width: 4}}\n"),
        )],
        HttpConfig::default(),
    )
    .await;
    let mut sizes = varlen_round(&bucketed, &[3, 5, 8]).await;
    sizes.sort();
    assert_eq!(
        sizes,
        vec![1, 2],
        "lengths 5 and 8 share the 5..=8 bucket; 3 goes alone"
    );
    let budgeted = start(
        &[(
            "varlen",
            VARLEN,
            &format!("{base}padding: {{value: 0, max_batch_tokens: 16}}\n"),
        )],
        HttpConfig::default(),
    )
    .await;
    let mut sizes = varlen_round(&budgeted, &[3, 5, 8]).await;
    sizes.sort();
    assert_eq!(
        sizes,
        vec![1, 2],
        "16 positions hold two items padded to 8, never all three"
    );
    let unpadded = start(&[("varlen", VARLEN, base)], HttpConfig::default()).await;
    assert_eq!(
        varlen_round(&unpadded, &[3, 5, 8]).await,
        vec![1, 1, 1],
        "without padding, lengths never mix"
    );
}
