//! How a job's chunks move through its three stages (load, compute, write):
//!
//! - `sequential`: one chunk at a time, through every stage, before the next is read;
//! - `pipelined`: a reader loads up to `--pipeline-depth` chunks ahead, the model computes them
//!   (up to `--max-concurrent-batches` at once, default 1) while the writer writes the ones done;
//! - `concurrent`: up to `--max-concurrent-batches` chunks are loaded and computed at once, each
//!   on its own, and written in order.
//!
//! Whatever the strategy, chunks are written in input order. A job of files knows its chunks
//! in advance; a job on a stream runs until its source has no more (`load` answers `None`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use clap::ValueEnum;
use futures::{StreamExt, TryStreamExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// The strategy of `--strategy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Strategy {
    Sequential,
    Concurrent,
    Pipelined,
}

/// How far each stage may run ahead.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    pub strategy: Strategy,
    /// Chunks buffered between the stages of `pipelined`.
    pub depth: usize,
    /// Chunks computing at once (`concurrent`, and `pipelined`'s compute stage).
    pub concurrency: usize,
}

/// A boxed future, as the stages return.
pub type Task<'a, T> = Pin<Box<dyn Future<Output = anyhow::Result<T>> + Send + 'a>>;

/// What a job does with a chunk: load its input, and compute its output.
pub trait Stages: Send + Sync + 'static {
    type Input: Send + 'static;
    type Output: Send + 'static;
    /// Reads (and prepares) chunk `k`; `None` when the source has no more.
    fn load(&self, k: usize) -> Task<'_, Option<Self::Input>>;
    /// Runs the model on a loaded chunk.
    fn compute(&self, input: Self::Input) -> Task<'_, Self::Output>;
}

/// Writes computed chunks, in order.
pub trait Write<O>: Send + 'static {
    fn write(&mut self, k: usize, output: O) -> Task<'_, ()>;
}

/// Runs chunks `0..chunks` (`None`: until `load` has no more) of `stages` under `plan`,
/// writing each to `writer` in order.
pub async fn run<S: Stages, W: Write<S::Output>>(
    stages: Arc<S>,
    writer: W,
    chunks: Option<usize>,
    plan: Plan,
) -> anyhow::Result<W> {
    let mut writer = writer;
    let chunks = chunks.unwrap_or(usize::MAX);
    match plan.strategy {
        Strategy::Sequential => {
            for k in 0..chunks {
                let Some(input) = stages.load(k).await? else {
                    break;
                };
                let output = stages.compute(input).await?;
                writer.write(k, output).await?;
            }
            Ok(writer)
        }
        Strategy::Concurrent => {
            let mut done = futures::stream::iter(0..chunks)
                .map(|k| {
                    let stages = stages.clone();
                    async move {
                        let Some(input) = stages.load(k).await? else {
                            return anyhow::Ok(None);
                        };
                        let output = stages.compute(input).await?;
                        anyhow::Ok(Some((k, output)))
                    }
                })
                .buffered(plan.concurrency.max(1));
            while let Some(Some((k, output))) = done.try_next().await? {
                writer.write(k, output).await?;
            }
            Ok(writer)
        }
        Strategy::Pipelined => {
            let depth = plan.depth.max(1);
            let (loaded_tx, loaded_rx) = mpsc::channel(depth);
            let reader = {
                let stages = stages.clone();
                tokio::spawn(async move {
                    for k in 0..chunks {
                        let Some(input) = stages.load(k).await? else {
                            break;
                        };
                        if loaded_tx.send((k, input)).await.is_err() {
                            break;
                        }
                    }
                    anyhow::Ok(())
                })
            };
            let (done_tx, mut done_rx) = mpsc::channel::<(usize, S::Output)>(depth);
            let write = tokio::spawn(async move {
                while let Some((k, output)) = done_rx.recv().await {
                    writer.write(k, output).await?;
                }
                anyhow::Ok(writer)
            });
            let mut computed = ReceiverStream::new(loaded_rx)
                .map(|(k, input)| {
                    let stages = stages.clone();
                    async move { anyhow::Ok((k, stages.compute(input).await?)) }
                })
                .buffered(plan.concurrency.max(1));
            let mut failed = None;
            while let Some(next) = computed.next().await {
                match next {
                    Ok(done) => {
                        if done_tx.send(done).await.is_err() {
                            break;
                        }
                    }
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
            drop(computed);
            drop(done_tx);
            let written = write.await?;
            reader.await??;
            if let Some(e) = failed {
                return Err(e);
            }
            written
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    /// Loads and computes take 20 ms each; counts how many computes overlap.
    struct Slow {
        running: AtomicUsize,
        most: AtomicUsize,
    }

    impl Stages for Slow {
        type Input = usize;
        type Output = usize;
        fn load(&self, k: usize) -> Task<'_, Option<usize>> {
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                Ok(Some(k))
            })
        }
        fn compute(&self, input: usize) -> Task<'_, usize> {
            Box::pin(async move {
                let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
                self.most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
                self.running.fetch_sub(1, Ordering::SeqCst);
                Ok(input * 10)
            })
        }
    }

    struct Collect(Vec<(usize, usize)>);

    impl Write<usize> for Collect {
        fn write(&mut self, k: usize, output: usize) -> Task<'_, ()> {
            self.0.push((k, output));
            Box::pin(async { Ok(()) })
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_strategy_writes_every_chunk_in_order() {
        for (strategy, concurrency, most) in [
            (Strategy::Sequential, 4, 1),
            (Strategy::Pipelined, 1, 1),
            (Strategy::Concurrent, 4, 4),
        ] {
            let stages = Arc::new(Slow {
                running: AtomicUsize::new(0),
                most: AtomicUsize::new(0),
            });
            let plan = Plan {
                strategy,
                depth: 2,
                concurrency,
            };
            let out = run(stages.clone(), Collect(Vec::new()), Some(12), plan)
                .await
                .unwrap();
            let expected: Vec<(usize, usize)> = (0..12).map(|k| (k, k * 10)).collect();
            assert_eq!(out.0, expected, "{strategy:?}");
            let overlapped = stages.most.load(Ordering::SeqCst);
            assert!(overlapped <= most, "{strategy:?}: {overlapped} at once");
            if strategy == Strategy::Concurrent {
                assert!(overlapped > 1, "concurrent never overlapped computes");
            }
        }
    }

    struct Failing;

    impl Stages for Failing {
        type Input = usize;
        type Output = usize;
        fn load(&self, k: usize) -> Task<'_, Option<usize>> {
            Box::pin(async move { Ok(Some(k)) })
        }
        fn compute(&self, input: usize) -> Task<'_, usize> {
            Box::pin(async move {
                anyhow::ensure!(input != 3, "chunk 3 failed");
                Ok(input)
            })
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_chunk_stops_the_job_with_its_error() {
        for &strategy in Strategy::value_variants() {
            let plan = Plan {
                strategy,
                depth: 2,
                concurrency: 2,
            };
            let Err(e) = run(Arc::new(Failing), Collect(Vec::new()), Some(8), plan).await else {
                panic!("{strategy:?}: the job did not fail");
            };
            assert!(e.to_string().contains("chunk 3"), "{strategy:?}: {e}");
        }
    }

    /// A source that runs dry after `len` chunks, as a stream does.
    struct Dry(usize);

    impl Stages for Dry {
        type Input = usize;
        type Output = usize;
        fn load(&self, k: usize) -> Task<'_, Option<usize>> {
            Box::pin(async move { Ok((k < self.0).then_some(k)) })
        }
        fn compute(&self, input: usize) -> Task<'_, usize> {
            Box::pin(async move { Ok(input + 1) })
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_open_ended_job_stops_when_its_source_runs_dry() {
        for &strategy in Strategy::value_variants() {
            let plan = Plan {
                strategy,
                depth: 2,
                concurrency: 3,
            };
            let out = run(Arc::new(Dry(5)), Collect(Vec::new()), None, plan)
                .await
                .unwrap();
            let expected: Vec<(usize, usize)> = (0..5).map(|k| (k, k + 1)).collect();
            assert_eq!(out.0, expected, "{strategy:?}");
        }
    }
}
