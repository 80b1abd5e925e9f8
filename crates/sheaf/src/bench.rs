//! `sheaf bench`: load generation (placeholder until written).

use clap::Args;

#[derive(Debug, Args)]
pub struct BenchArgs {}

pub async fn run(_args: BenchArgs) -> anyhow::Result<()> {
    anyhow::bail!("not yet")
}
