//! A model on a device's shared arena is booked at no less than what it counts of the arena,
//! whichever models loaded before it: the process's growth while it loads falls short when
//! the warm-up's release gives back room that earlier models kept. (Its own test binary, so
//! that no other test's loads share the process while it counts.)

mod common;

use common::*;

const MIB: u64 = 1024 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_loaded_after_another_is_booked_at_what_it_counts_alone() {
    // Buckets up to 256, each warmed: what the MLP counts of the arena, loaded first.
    let mlp = "max_batch_size: 256\nsession_per_batch_size: true\n";
    let images = "max_batch_size: 32\nsession_per_batch_size: true\n";
    let models = [("mlp", MLP, mlp), ("efficientnet", EFFICIENTNET, images)];
    let alone = {
        let server = start_explicit(&models).await;
        let counted = server.manager.load("mlp").await.unwrap().memory_bytes;
        assert!(counted > 0, "the MLP counts nothing of the arena");
        counted
    };
    // After EfficientNet-Lite0, whose warm-up kept room in the arena that the MLP's release
    // gives back: the process grew by about a third of that (62 of 181 MiB measured here), and
    // the MLP was booked at that growth.
    let server = start_explicit(&models).await;
    server.manager.load("efficientnet").await.unwrap();
    server.manager.load("mlp").await.unwrap();
    let info = server.manager.model_info("mlp").unwrap();
    let figures = format!(
        "alone it counts {} MiB; after EfficientNet-Lite0 booked at {} MiB ({:?})",
        alone / MIB,
        info.memory_bytes / MIB,
        info.memory_source
    );
    eprintln!("{figures}");
    assert!(info.memory_bytes as f64 >= 0.9 * alone as f64, "{figures}");
}
