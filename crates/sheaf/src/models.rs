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
    /// The server's admin key (or, without one, an API key), sent as `Authorization: Bearer`.
    #[arg(long, env = "SHEAF_ADMIN_KEY", global = true, hide_env_values = true)]
    pub key: Option<String>,
    /// A header sent with every request, `NAME:VALUE`: the one a restricted API group of the
    /// server needs (`--header admin-key:SECRET` for `--http-restricted-api
    /// model-repository:admin-key=SECRET`). Repeat it for several.
    #[arg(long = "header", value_name = "NAME:VALUE", global = true)]
    pub headers: Vec<String>,
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
    let client = crate::client::http_client(args.key.as_deref(), &args.headers)?;
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
                let devices = join(&stats["models"][name]["devices"]);
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
            let models = stats["models"].as_object().cloned().unwrap_or_default();
            if let Some(n) = &name {
                if !models.contains_key(n) {
                    bail!("unknown model '{n}'");
                }
            }
            println!(
                "{:<20} {:<11} {:>8} {:>8} {:>9} {:>9} {:>9} {:>8} {:<12} {:>5} {:>5} {:>8}",
                "model",
                "state",
                "requests",
                "batches",
                "avg batch",
                "total ms",
                "mean ms",
                "MiB",
                "devices",
                "loads",
                "evict",
                "idle s"
            );
            let now_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            for (model, s) in models
                .iter()
                .filter(|(m, _)| name.as_ref().is_none_or(|n| n == *m))
            {
                let f = |k: &str| s[k].as_f64().map_or("-".to_string(), |v| format!("{v:.2}"));
                let n = |k: &str| s[k].as_u64().unwrap_or(0);
                println!(
                    "{:<20} {:<11} {:>8} {:>8} {:>9} {:>9} {:>9} {:>8} {:<12} {:>5} {:>5} {:>8}",
                    model,
                    s["state"].as_str().unwrap_or("-"),
                    n("total_requests"),
                    n("total_batches"),
                    f("avg_batch_size"),
                    f("total_inference_time_ms"),
                    f("avg_generation_time_ms"),
                    n("memory_bytes") / (1024 * 1024),
                    join(&s["devices"]),
                    n("load_count"),
                    n("eviction_count"),
                    s["last_used_ms"].as_u64().map_or("-".into(), |t| format!(
                        "{:.1}",
                        now_ms.saturating_sub(t) as f64 / 1e3
                    )),
                );
            }
            if name.is_none() {
                println!();
                println!(
                    "{:<12} {:>7} {:>12} {:>12} {:>12}",
                    "device", "models", "used MiB", "budget MiB", "total MiB"
                );
                for d in stats["per_gpu_stats"]
                    .as_array()
                    .map(Vec::as_slice)
                    .unwrap_or_default()
                {
                    let mib = |k: &str| d[k].as_u64().unwrap_or(0) / (1024 * 1024);
                    println!(
                        "{:<12} {:>7} {:>12} {:>12} {:>12}",
                        d["device"].as_str().unwrap_or("-"),
                        d["models_loaded"].as_u64().unwrap_or(0),
                        mib("memory_used_bytes"),
                        mib("memory_budget_bytes"),
                        mib("memory_total_bytes")
                    );
                }
                println!(
                    "total: {} requests, {} batches, {} models",
                    stats["total_requests"].as_u64().unwrap_or(0),
                    stats["total_batches"].as_u64().unwrap_or(0),
                    models.len()
                );
            }
        }
    }
    Ok(())
}

/// A JSON list of strings, comma-joined.
fn join(list: &Value) -> String {
    list.as_array()
        .map(|d| {
            d.iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default()
}
