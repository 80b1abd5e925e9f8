//! The `sheaf` command: a batching model-inference server speaking the KServe v2 protocol.
//!
//! Subcommands:
//! - `serve`: load a model repository and serve it over HTTP and gRPC (and, with `--queue`,
//!   from a NATS JetStream queue);
//! - `bench`: measure throughput and latency, served over HTTP or in-process;
//! - `models`: list, load, unload and inspect the models of a running server;
//! - `run`: run a model over files offline, in process, writing its answers beside them, or
//!   from one JetStream subject to another.

mod backend_config;
mod bench;
mod cli;
mod client;
mod models;
mod run;
mod serve;
mod triton_flags;

use clap::Parser;
use sheaf_backend::affinity;

/// Tensors of hundreds of kilobytes are allocated and freed on every request. glibc's malloc
/// hands such blocks back to the kernel and faults their pages in again on the next request;
/// jemalloc keeps them for reuse, which brought an image-sized gRPC request's cost in the client
/// and the server close to HTTP's (bench/RESULTS.md). ONNX Runtime and llama.cpp keep their own
/// allocators.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    let cli = match cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => match triton_flags::why_not(&e) {
            Some(why) => {
                let _ = e.print();
                eprintln!("{why}");
                return std::process::ExitCode::from(2);
            }
            None => e.exit(),
        },
    };
    if let Err(e) = cli::init_logging(&cli.log) {
        eprintln!("sheaf: {e:#}");
        return std::process::ExitCode::FAILURE;
    }
    affinity::remember_startup_cpus();
    let io_cpus = match &cli.command {
        cli::Command::Serve(args) => args.io_cpus.clone(),
        _ => None,
    };
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all().thread_name("sheaf-io");
    if let Some(cpus) = io_cpus {
        // The main thread runs the server's top task: it is one of the server's threads too.
        if let Err(e) = affinity::pin_current_thread(&cpus) {
            eprintln!("sheaf: --io-cpus: {e}");
            return std::process::ExitCode::FAILURE;
        }
        builder.worker_threads(cpus.cores().len());
        builder.on_thread_start(move || {
            if let Err(e) = affinity::pin_current_thread(&cpus) {
                tracing::warn!("--io-cpus: {e}");
            }
        });
    }
    let runtime = match builder.build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sheaf: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            cli::Command::Serve(args) => serve::run(*args).await,
            cli::Command::Bench(args) => bench::run(*args).await,
            cli::Command::Models(args) => models::run(args).await,
            cli::Command::Run(args) => run::run(*args).await,
        }
    });
    // Work still running on blocking threads (a batch the shutdown timeout cut short) does not
    // hold the exit.
    runtime.shutdown_timeout(std::time::Duration::from_millis(500));
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            // Said once: a second, plain line only where the logged one is not text on stderr
            // (JSON lines, a log file, errors filtered out).
            if !cli::errors_reach_stderr_as_text(&cli.log) {
                eprintln!("sheaf: {e:#}");
            }
            std::process::ExitCode::FAILURE
        }
    }
}
