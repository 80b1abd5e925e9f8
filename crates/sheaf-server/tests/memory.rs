//! A model's memory is measured at load: the growth of the process's resident memory while a
//! real ONNX model loads alone on the CPU. (Its own test binary, so that no other test's loads
//! share the process while it measures.)

mod common;

use common::*;
use sheaf_core::MemorySource;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_loaded_alone_on_the_cpu_is_measured() {
    let server = start(&[("nsfw", NSFW, "")], sheaf_server::HttpConfig::default()).await;
    let info = server.manager.model_info("nsfw").unwrap();
    let file = std::fs::metadata(model_file(NSFW)).unwrap().len();
    assert_eq!(info.memory_source, MemorySource::Measured);
    // The weights are in memory once loaded: at least half the file, and not absurdly more.
    assert!(
        info.memory_bytes >= file / 2 && info.memory_bytes <= file * 20,
        "measured {} bytes for a {file}-byte model",
        info.memory_bytes
    );
    assert_eq!(server.manager.memory_used(), [info.memory_bytes]);
    let (_, stats) = server.get("/v2/models/nsfw/stats").await;
    assert_eq!(stats["model_stats"][0]["memory_source"], "measured");
    assert_eq!(stats["model_stats"][0]["memory_usage"][0]["type"], "CPU");

    // With memory_mb in its config, the configured figure is what the ledger books.
    let configured = start(
        &[("nsfw", NSFW, "memory_mb: 7\n")],
        sheaf_server::HttpConfig::default(),
    )
    .await;
    let info = configured.manager.model_info("nsfw").unwrap();
    assert_eq!(
        (info.memory_source, info.memory_bytes),
        (MemorySource::Config, 7 * 1024 * 1024)
    );
}
