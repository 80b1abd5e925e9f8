//! A job on a generation model: prompts from a JSON-lines file, completions to
//! `completions.jsonl` in input order.
//!
//! Each input line is a JSON string (the prompt), or an object with `prompt` (text) or
//! `messages` (chat, `[{role, content}]`), and optionally `id`, `max_tokens`, `temperature`
//! and `seed`. Prompts are sorted by their length in tokens and sent in groups of similar
//! length, so that the sequences of a group end at about the same time; each group is a chunk
//! of the job's strategy. Completions are appended as they are done (with their input's index)
//! to `completions.partial.jsonl`, which a rerun resumes, and put in input order at the end.

use std::collections::HashSet;
use std::fs::File;
use std::io::{BufRead, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use serde::{Deserialize, Serialize};
use sheaf_backend::generation::{Event, GenRequest, Prompt, Sampling};
use sheaf_core::{Generate, ModelHandle};

use super::strategy::{Stages, Task, Write};

/// The most bytes of a prompts (or batch) file.
const MAX_FILE_BYTES: u64 = 1 << 30;

/// One input line.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum Line {
    Text(String),
    Object(PromptLine),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct PromptLine {
    #[serde(default)]
    id: Option<serde_json::Value>,
    #[serde(default)]
    prompt: Option<String>,
    #[serde(default)]
    messages: Option<Vec<Message>>,
    #[serde(default)]
    max_tokens: Option<usize>,
    #[serde(default)]
    temperature: Option<f32>,
    #[serde(default)]
    seed: Option<u32>,
}

#[derive(Debug, Clone, Deserialize)]
struct Message {
    role: String,
    content: String,
}

/// One prompt of the job.
#[derive(Debug, Clone)]
pub struct Item {
    index: usize,
    id: Option<serde_json::Value>,
    request: GenRequest,
    tokens: usize,
}

/// One completion, as written.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Completion {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub id: Option<serde_json::Value>,
    pub text: String,
    pub finish_reason: String,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
}

/// Opens a JSON-lines input (prompts, batch requests) of at most [`MAX_FILE_BYTES`].
pub fn open_lines_input(path: &Path) -> anyhow::Result<File> {
    let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    anyhow::ensure!(
        file.metadata()?.len() <= MAX_FILE_BYTES,
        "{} is larger than {} bytes",
        path.display(),
        MAX_FILE_BYTES
    );
    Ok(file)
}

/// Reads every prompt of `path` with the job's defaults; line numbers in errors count from 1.
pub fn read(
    path: &Path,
    handle: &ModelHandle,
    max_tokens: usize,
    temperature: f32,
) -> anyhow::Result<Vec<Item>> {
    let file = open_lines_input(path)?;
    let mut items = Vec::new();
    for (n, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let at = || format!("{} line {}", path.display(), n + 1);
        let parsed: Line = serde_json::from_str(&line).with_context(|| {
            format!(
                "{}: a line is a JSON string, or an object with \"prompt\" or \"messages\"",
                at()
            )
        })?;
        let fields = match parsed {
            Line::Text(prompt) => PromptLine {
                id: None,
                prompt: Some(prompt),
                messages: None,
                max_tokens: None,
                temperature: None,
                seed: None,
            },
            Line::Object(o) => o,
        };
        let prompt = match (fields.prompt, fields.messages) {
            (Some(p), None) => Prompt::Text(p),
            (None, Some(m)) => Prompt::Chat(m.into_iter().map(|m| (m.role, m.content)).collect()),
            _ => anyhow::bail!("{}: give exactly one of \"prompt\" and \"messages\"", at()),
        };
        let tokens = handle
            .tokenize(&prompt, Default::default())
            .map_err(|e| anyhow::anyhow!("{}: {}", at(), e.message))?
            .len();
        let max_tokens = fields.max_tokens.unwrap_or(max_tokens);
        anyhow::ensure!(max_tokens > 0, "{}: max_tokens must be at least 1", at());
        let temperature = fields.temperature.unwrap_or(temperature);
        anyhow::ensure!(
            Sampling::TEMPERATURES.contains(&temperature),
            "{}: temperature {temperature} is not between 0 and 2",
            at()
        );
        let mut request = GenRequest::new(prompt, max_tokens);
        request.sampling.temperature = temperature;
        request.sampling.seed = fields.seed.unwrap_or(0);
        items.push(Item {
            index: items.len(),
            id: fields.id,
            request,
            tokens,
        });
    }
    Ok(items)
}

/// Groups of `size` prompts of similar length (shortest first), leaving out those `done`.
pub fn groups(items: Vec<Item>, done: &HashSet<usize>, size: usize) -> Vec<Vec<Item>> {
    let mut left: Vec<Item> = items
        .into_iter()
        .filter(|i| !done.contains(&i.index))
        .collect();
    left.sort_by_key(|i| (i.tokens, i.index));
    let mut groups = Vec::new();
    let mut rest = left.into_iter().peekable();
    while rest.peek().is_some() {
        groups.push(rest.by_ref().take(size.max(1)).collect());
    }
    groups
}

/// The job's stages: a group's prompts are submitted together, and the group is done when
/// each has its completion.
pub struct PromptJob {
    pub handle: Arc<ModelHandle>,
    pub groups: Vec<Vec<Item>>,
}

impl Stages for PromptJob {
    type Input = usize;
    type Output = Vec<Completion>;

    fn load(&self, k: usize) -> Task<'_, Option<usize>> {
        Box::pin(async move { Ok(Some(k)) })
    }

    fn compute(&self, k: usize) -> Task<'_, Vec<Completion>> {
        Box::pin(async move {
            let runs = self.groups[k]
                .iter()
                .map(|item| complete(&self.handle, item));
            futures::future::try_join_all(runs).await
        })
    }
}

async fn complete(handle: &ModelHandle, item: &Item) -> anyhow::Result<Completion> {
    let fail = |m: String| anyhow::anyhow!("prompt {}: {m}", item.index);
    let mut receivers = handle
        .generate(Generate {
            request: item.request.clone(),
            choices: 1,
            priority: None,
            timeout_us: None,
        })
        .map_err(|e| fail(e.message))?;
    let mut events = receivers.pop().ok_or_else(|| fail("no answer".into()))?;
    let mut text = String::new();
    while let Some(event) = events.recv().await {
        match event {
            Event::Text(piece) => text.push_str(&piece),
            Event::Logprob(_) | Event::PromptLogprobs(_) => {}
            Event::Done(reason, usage) => {
                return Ok(Completion {
                    index: item.index,
                    id: item.id.clone(),
                    text,
                    finish_reason: reason.as_str().to_string(),
                    prompt_tokens: usage.prompt_tokens,
                    completion_tokens: usage.completion_tokens,
                })
            }
            Event::Error(e) => return Err(fail(e.to_string())),
        }
    }
    Err(fail("the engine stopped before the end".into()))
}

/// Appends completions as groups finish, and counts them on the progress bar.
pub struct Completions {
    file: File,
    bar: indicatif::ProgressBar,
}

impl Completions {
    /// The file of completions done so far in `dir`, and their indices (none with `restart`).
    pub fn open(
        dir: &Path,
        restart: bool,
        total: usize,
    ) -> anyhow::Result<(Completions, HashSet<usize>)> {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let path = partial(dir);
        let mut done = HashSet::new();
        let mut keep = 0;
        if !restart && path.exists() {
            for line in std::fs::read_to_string(&path)?.lines() {
                // A line cut short by a crash ends what can be kept.
                let Ok(c) = serde_json::from_str::<Completion>(line) else {
                    break;
                };
                done.insert(c.index);
                keep += 1;
            }
        }
        let file = super::outputs::open_lines(&path, keep)?;
        let bar = super::outputs::progress_bar(total as u64, done.len() as u64);
        Ok((Completions { file, bar }, done))
    }

    /// Puts every completion of `dir` in input order into `completions.jsonl`.
    pub fn finish(self, dir: &Path) -> anyhow::Result<PathBuf> {
        self.bar.finish();
        let text = std::fs::read_to_string(partial(dir))?;
        let mut all: Vec<Completion> = text
            .lines()
            .map(serde_json::from_str)
            .collect::<Result<_, _>>()?;
        all.sort_by_key(|c| c.index);
        all.dedup_by_key(|c| c.index);
        let path = dir.join("completions.jsonl");
        let mut out = Vec::new();
        for c in &all {
            serde_json::to_writer(&mut out, c)?;
            out.push(b'\n');
        }
        std::fs::write(&path, out)?;
        std::fs::remove_file(partial(dir))?;
        Ok(path)
    }
}

fn partial(dir: &Path) -> PathBuf {
    dir.join("completions.partial.jsonl")
}

impl Write<Vec<Completion>> for Completions {
    fn write(&mut self, _k: usize, group: Vec<Completion>) -> Task<'_, ()> {
        Box::pin(async move { tokio::task::block_in_place(|| self.write_now(&group)) })
    }
}

impl Completions {
    fn write_now(&mut self, group: &[Completion]) -> anyhow::Result<()> {
        let mut lines = Vec::new();
        for c in group {
            serde_json::to_writer(&mut lines, c)?;
            lines.push(b'\n');
        }
        self.file.write_all(&lines)?;
        self.file.sync_data()?;
        self.bar.inc(group.len() as u64);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(index: usize, tokens: usize) -> Item {
        Item {
            index,
            id: None,
            request: GenRequest::new(Prompt::Text(String::new()), 1),
            tokens,
        }
    }

    #[test]
    fn groups_hold_prompts_of_similar_length_and_skip_those_done() {
        let items = vec![
            item(0, 50),
            item(1, 3),
            item(2, 40),
            item(3, 4),
            item(4, 45),
        ];
        let done = HashSet::from([3]);
        let groups = groups(items, &done, 2);
        let indices: Vec<Vec<usize>> = groups
            .iter()
            .map(|g| g.iter().map(|i| i.index).collect())
            .collect();
        assert_eq!(indices, vec![vec![1, 2], vec![4, 0]]);
    }
}
