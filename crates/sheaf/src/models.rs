//! `sheaf models`: a client for a running server's model repository (list, load, unload, stats),
//! over the KServe repository extension and the statistics endpoints.

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use serde_json::Value;

#[derive(Debug, Args)]
pub struct ModelsArgs {
    /// Server base URL (HTTP).
    #[arg(long, default_value = "http://127.0.0.1:8000", global = true)]
    pub url: String,
    #[command(subcommand)]
    pub command: ModelsCommand,
}

#[derive(Debug, Subcommand)]
pub enum ModelsCommand {
    /// Every model with its version, state, devices and reason.
    List,
    /// Load a model (explicit or on_demand control mode).
    Load { name: String },
    /// Unload a model once its requests are answered.
    Unload { name: String },
    /// Usage statistics: all models, or one.
    Stats { name: Option<String> },
}

pub async fn run(args: ModelsArgs) -> anyhow::Result<()> {
    let client = reqwest::Client::new();
    let post = |path: String| {
        let client = client.clone();
        let url = format!("{}{path}", args.url);
        async move {
            let r = client
                .post(&url)
                .json(&serde_json::json!({}))
                .send()
                .await
                .with_context(|| format!("cannot reach {url}"))?;
            let status = r.status();
            let body: Value = r.json().await.unwrap_or(Value::Null);
            if !status.is_success() {
                bail!(
                    "{status}: {}",
                    body["error"].as_str().unwrap_or("request failed")
                );
            }
            Ok(body)
        }
    };
    match args.command {
        ModelsCommand::List => {
            let index = post("/v2/repository/index".into()).await?;
            let stats: Value = client
                .get(format!("{}/stats", args.url))
                .send()
                .await?
                .json()
                .await
                .unwrap_or(Value::Null);
            println!(
                "{:<24} {:>8} {:<12} {:<20} reason",
                "model", "version", "state", "devices"
            );
            for m in index.as_array().map(Vec::as_slice).unwrap_or_default() {
                let name = m["name"].as_str().unwrap_or_default();
                let devices = stats["models"][name]["devices"]
                    .as_array()
                    .map(|d| {
                        d.iter()
                            .filter_map(Value::as_str)
                            .collect::<Vec<_>>()
                            .join(",")
                    })
                    .unwrap_or_default();
                println!(
                    "{:<24} {:>8} {:<12} {:<20} {}",
                    name,
                    m["version"].as_str().unwrap_or_default(),
                    m["state"].as_str().unwrap_or_default(),
                    devices,
                    m["reason"].as_str().unwrap_or_default()
                );
            }
        }
        ModelsCommand::Load { name } => {
            post(format!("/v2/repository/models/{name}/load")).await?;
            println!("loaded {name}");
        }
        ModelsCommand::Unload { name } => {
            post(format!("/v2/repository/models/{name}/unload")).await?;
            println!("unloaded {name}");
        }
        ModelsCommand::Stats { name } => {
            let stats: Value = client
                .get(format!("{}/stats", args.url))
                .send()
                .await?
                .error_for_status()?
                .json()
                .await?;
            println!(
                "{:<24} {:>10} {:>9} {:>10} {:>10} {:>9} {:>9}",
                "model", "requests", "batches", "avg batch", "avg ms", "p50 ms", "p99 ms"
            );
            let models = stats["models"].as_object().cloned().unwrap_or_default();
            if let Some(n) = &name {
                if !models.contains_key(n) {
                    bail!("unknown model '{n}'");
                }
            }
            for (model, s) in models
                .iter()
                .filter(|(m, _)| name.as_ref().is_none_or(|n| n == *m))
            {
                let f = |k: &str| s[k].as_f64().map_or("-".to_string(), |v| format!("{v:.2}"));
                println!(
                    "{:<24} {:>10} {:>9} {:>10} {:>10} {:>9} {:>9}",
                    model,
                    s["total_requests"].as_u64().unwrap_or(0),
                    s["total_batches"].as_u64().unwrap_or(0),
                    f("avg_batch_size"),
                    f("avg_request_time_ms"),
                    f("p50_latency_ms"),
                    f("p99_latency_ms")
                );
            }
        }
    }
    Ok(())
}
